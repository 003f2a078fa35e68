package controlplane_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestUpstreamFacts documents what real apiservers publish, the facts kube-mvp is built on
// (docs/testing.md, "Testing with real parts"): A is v1.37.1 with every API, B is v1.36.4 with batch/v1 turned off.
func TestUpstreamFacts(t *testing.T) {
	ctx := testutil.Context(t, 20*time.Minute)
	// Not skipped under -short: make test checks these facts too.
	cp := controlplane.StartForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: controlplane.MixedServers()})
	a, b := cp.Server("cp-a"), cp.Server("cp-b")
	client, err := a.Client()
	if err != nil {
		t.Fatal(err)
	}

	// Identity Leases: one per apiserver, named by its ID, with hostname label, holder
	// "<id>_<uuid>" and the peer-advertise address taken from --advertise-address:--secure-port.
	ids := map[string]string{} // hostname -> ID
	testutil.WaitFor(t, ctx, 60*time.Second, "both identity Leases", func() error {
		leases, err := client.CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "apiserver.kubernetes.io/identity=kube-apiserver"})
		if err != nil {
			return err
		}
		if len(leases.Items) != 2 {
			return fmt.Errorf("want 2 identity Leases, have %d", len(leases.Items))
		}
		for _, l := range leases.Items {
			host := l.Labels["kubernetes.io/hostname"]
			srv := cp.Server(host)
			if srv == nil {
				return fmt.Errorf("Lease %s has hostname label %q, not one of our servers", l.Name, host)
			}
			if want := objects.APIServerIDFor(host); l.Name != want {
				t.Errorf("Lease %s of host %s: kube-mvp derives the name %s from the hostname", l.Name, host, want)
			}
			if l.Spec.HolderIdentity == nil || !strings.HasPrefix(*l.Spec.HolderIdentity, l.Name+"_") {
				t.Errorf("Lease %s holderIdentity %v is not <id>_<uuid>", l.Name, l.Spec.HolderIdentity)
			}
			if got := l.Annotations["kubernetes.io/peer-advertise-address"]; got != srv.Address() {
				t.Errorf("Lease %s (%s): peer-advertise-address %q, want %q", l.Name, host, got, srv.Address())
			}
			if l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds != 3600 {
				t.Errorf("Lease %s: leaseDurationSeconds %v, want 3600", l.Name, l.Spec.LeaseDurationSeconds)
			}
			ids[host] = l.Name
		}
		return nil
	})
	if ids["cp-a"] == ids["cp-b"] {
		t.Fatalf("both servers share the ID %s: the UTS namespaces did not separate their hostnames", ids["cp-a"])
	}

	// StorageVersion batch.jobs lists only A as serving batch/v1.
	testutil.WaitFor(t, ctx, 60*time.Second, "StorageVersion batch.jobs", func() error {
		sv, err := client.InternalV1alpha1().StorageVersions().Get(ctx, "batch.jobs", metav1.GetOptions{})
		if err != nil {
			return err
		}
		var serving []string
		for _, e := range sv.Status.StorageVersions {
			if slices.Contains(e.ServedVersions, "batch/v1") {
				serving = append(serving, e.APIServerID)
			}
		}
		if !slices.Equal(serving, []string{ids["cp-a"]}) {
			return fmt.Errorf("batch/v1 served by %v, want only cp-a (%s)", serving, ids["cp-a"])
		}
		return nil
	})
	sv, err := client.InternalV1alpha1().StorageVersions().Get(ctx, "core.pods", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("StorageVersion core.pods: %v", err)
	}
	for _, e := range sv.Status.StorageVersions {
		if !slices.Equal(e.ServedVersions, []string{"v1"}) {
			t.Errorf("core.pods entry for %s: servedVersions %v, want [v1]", e.APIServerID, e.ServedVersions)
		}
	}

	// The 404 kube-mvp exists to prevent, and the 200 from the server that has the API.
	for _, c := range []struct {
		srv  *controlplane.Server
		want int
	}{{a, 200}, {b, 404}} {
		cl, err := c.srv.Client()
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
		got := 200
		if err != nil {
			got = httpCode(err)
		}
		if got != c.want {
			t.Errorf("GET /apis/batch/v1/namespaces/default/jobs on %s: %d (%v), want %d", c.srv.Spec.Name, got, err, c.want)
		}
	}

	// What each version publishes, for docs/testing.md.
	for _, srv := range []*controlplane.Server{a, b} {
		cl, _ := srv.Client()
		_, lists, err := cl.Discovery().ServerGroupsAndResources()
		if err != nil {
			t.Fatalf("discovery of %s: %v", srv.Spec.Name, err)
		}
		n := 0
		var gvs []string
		for _, l := range lists {
			n += len(l.APIResources)
			gv, _ := schema.ParseGroupVersion(l.GroupVersion)
			gvs = append(gvs, gv.String())
		}
		slices.Sort(gvs)
		t.Logf("%s (%s) publishes %d group/versions, %d resources incl. subresources: %s", srv.Spec.Name, srv.Spec.Version, len(gvs), n, strings.Join(gvs, " "))
	}
}

func httpCode(err error) int {
	if s, ok := err.(apierrors.APIStatus); ok {
		return int(s.Status().Code)
	}
	return -1
}

// TestClusterDefaultsFacts checks DefaultsOf against the real binaries: one server of each
// pinned release, started with ClusterDefaults (as real clusters run them). None serves the
// StorageVersion API; the identity Lease carries the peer-advertise address exactly where
// DefaultsOf says so (from 1.36 on, where UnknownVersionInteroperabilityProxy is beta, on by
// default). It also logs, from their discovery, what each release serves that the one before
// does not (the rolling upgrade loads such an API: NewInV136).
func TestClusterDefaultsFacts(t *testing.T) {
	ctx := testutil.Context(t, 20*time.Minute)
	var specs []controlplane.ServerSpec
	for i, v := range controlplane.Versions {
		specs = append(specs, controlplane.ServerSpec{Name: fmt.Sprintf("cp-%c", 'a'+i), Version: v, ClusterDefaults: true})
	}
	cp := controlplane.StartForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: specs})
	client, err := cp.Server("cp-a").Client()
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, ctx, 60*time.Second, "every identity Lease, each with or without an address as DefaultsOf says", func() error {
		leases, err := client.CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "apiserver.kubernetes.io/identity=kube-apiserver"})
		if err != nil {
			return err
		}
		if len(leases.Items) != len(specs) {
			return fmt.Errorf("want %d identity Leases, have %d", len(specs), len(leases.Items))
		}
		for _, l := range leases.Items {
			srv := cp.Server(l.Labels["kubernetes.io/hostname"])
			if srv == nil {
				return fmt.Errorf("Lease %s: hostname %q is none of ours", l.Name, l.Labels["kubernetes.io/hostname"])
			}
			if want := objects.APIServerIDFor(srv.Spec.Name); l.Name != want {
				t.Errorf("%s (%s): Lease %s, but kube-mvp derives %s from the hostname", srv.Spec.Name, srv.Spec.Version, l.Name, want)
			}
			d, err := controlplane.DefaultsOf(srv.Spec.Version)
			if err != nil {
				return err
			}
			got, has := l.Annotations["kubernetes.io/peer-advertise-address"]
			switch {
			case d.PeerAdvertiseAddress != has:
				t.Errorf("%s (%s): Lease has the peer-advertise address: %v, DefaultsOf says %v", srv.Spec.Name, srv.Spec.Version, has, d.PeerAdvertiseAddress)
			case has && got != srv.Address():
				t.Errorf("%s (%s): peer-advertise address %q, want %q", srv.Spec.Name, srv.Spec.Version, got, srv.Address())
			case srv.LeaseHasAddress() != has:
				t.Errorf("%s (%s): LeaseHasAddress() %v, the Lease says %v", srv.Spec.Name, srv.Spec.Version, srv.LeaseHasAddress(), has)
			}
		}
		return nil
	})

	served := map[string]map[string]bool{} // version -> "group/version resource"
	for _, spec := range specs {
		srv := cp.Server(spec.Name)
		cl, err := srv.Client()
		if err != nil {
			t.Fatal(err)
		}
		_, lists, err := cl.Discovery().ServerGroupsAndResources()
		if err != nil {
			t.Fatalf("discovery of %s: %v", spec.Name, err)
		}
		served[spec.Version] = map[string]bool{}
		for _, l := range lists {
			for _, r := range l.APIResources {
				served[spec.Version][l.GroupVersion+" "+r.Name] = true
			}
		}
		d, _ := controlplane.DefaultsOf(spec.Version)
		if got := served[spec.Version]["internal.apiserver.k8s.io/v1alpha1 storageversions"]; got != d.StorageVersionAPI {
			t.Errorf("%s (%s): serves the StorageVersion API: %v, DefaultsOf says %v", spec.Name, spec.Version, got, d.StorageVersionAPI)
		}
	}
	for i := 1; i < len(specs); i++ {
		older, newer := specs[i-1].Version, specs[i].Version
		var added []string
		for r := range served[newer] {
			if !served[older][r] {
				added = append(added, r)
			}
		}
		slices.Sort(added)
		t.Logf("served by %s with its defaults, not by %s: %q", newer, older, added)
	}
	// The API TestRollingUpgrade's cluster-defaults variant loads while v1.35.8 servers are
	// upgraded to v1.36.4: MutatingAdmissionPolicy, GA in 1.36, in a group/version that both
	// releases serve.
	const newIn136 = "admissionregistration.k8s.io/v1 mutatingadmissionpolicies"
	if !served["v1.36.4"][newIn136] || served["v1.35.8"][newIn136] {
		t.Errorf("%s: served by v1.36.4 %v, by v1.35.8 %v; want only by v1.36.4", newIn136, served["v1.36.4"][newIn136], served["v1.35.8"][newIn136])
	}
}
