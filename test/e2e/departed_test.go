package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestDepartedAPIServerMemory: a cluster as real clusters run, without the StorageVersion API
// (the peer-proxy gate at its default: on since 1.36, so these Leases carry their address;
// --apiserver-addresses is given as a 1.35 cluster needs it, and is used only for a Lease
// without one). cp-a
// alone serves batch/v1. When it goes away, kube-mvp remembers what it served: jobs answer
// 503 with Retry-After, never 404, while its Lease is stale (killed), and for the grace period
// after its Lease is deleted (stopped gracefully); then 404. The memory survives an
// xds-server restart (it lives in a ConfigMap).
func TestDepartedAPIServerMemory(t *testing.T) {
	ctx := testutil.Context(t, 20*time.Minute)
	// Cluster defaults: no StorageVersionAPI gate, no internal.apiserver.k8s.io/v1alpha1.
	servers := []controlplane.ServerSpec{
		{Name: "cp-a", Version: "v1.37.1", Args: []string{"--feature-gates=APIServerIdentity=true", "--runtime-config=batch/v1=true"}},
		{Name: "cp-b", Version: "v1.36.4", Args: []string{"--feature-gates=APIServerIdentity=true", "--runtime-config=batch/v1=false"}},
	}
	e := newEnv(t, ctx, servers...)
	a, b := e.cp.Server("cp-a"), e.cp.Server("cp-b")
	adminB := e.adminClient(b)
	if _, err := adminB.Discovery().ServerResourcesForGroupVersion("internal.apiserver.k8s.io/v1alpha1"); err == nil {
		t.Fatal("the StorageVersion API is served: this test is about clusters without it")
	}
	const grace = 10 * time.Second
	k := e.startKubeMVP(ctx, "front", "", func(o *harness.Options) {
		o.XDSServerArgs = []string{
			"--apiserver-addresses", "cp-a=" + a.Address() + ",cp-b=" + b.Address(),
			"--departed-apiserver-grace", grace.String(),
			"--memory-configmap", "default/kube-mvp-memory",
		}
	})
	hc := e.rawClient(&e.cp.PKI.Admin)
	jobsURL := k.Endpoint() + "/apis/batch/v1/namespaces/default/jobs"
	get := func(url string) (int, status, string) {
		t.Helper()
		res, err := hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode == http.StatusOK {
			res.Body.Close()
			return res.StatusCode, status{}, ""
		}
		if res.StatusCode == http.StatusNotFound {
			// cp-b, without batch/v1, answers with its plain "404 page not found".
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			return res.StatusCode, status{Code: 404, Message: string(body)}, ""
		}
		return res.StatusCode, decodeStatus(t, res), res.Header.Get("Retry-After")
	}
	// A 503 must be kube-mvp's own answer: a Status, with Retry-After.
	check503 := func(what string, code int, st status, retryAfter string) {
		t.Helper()
		if code != http.StatusServiceUnavailable || st.Kind != "Status" || st.Reason != "ServiceUnavailable" || retryAfter == "" {
			t.Fatalf("%s: %d %+v Retry-After %q, want a 503 ServiceUnavailable Status with Retry-After", what, code, st, retryAfter)
		}
	}
	waitFor(t, ctx, "jobs served through kube-mvp", func() error {
		if code, st, _ := get(jobsURL); code != http.StatusOK {
			return fmt.Errorf("%d %+v", code, st)
		}
		return nil
	})
	idA := leaseOf(t, ctx, adminB, "cp-a")
	waitFor(t, ctx, "cp-a's discovery in the memory ConfigMap", func() error {
		return rememberedIn(ctx, adminB, idA, "batch/v1")
	})

	// (a) Killed: its Lease stays and goes stale. Never 404; once xds-server sees the Lease
	// stale, extproc itself answers 503 (the message names batch/v1).
	e.cp.Kill("cp-a")
	deadline := time.Now().Add(livenessWindow + 30*time.Second)
	for sawOwn := false; !sawOwn; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no 503 from kube-mvp itself within %s of killing cp-a", livenessWindow+30*time.Second)
		}
		code, st, ra := get(jobsURL)
		if code == http.StatusNotFound {
			t.Fatalf("404 for jobs after cp-a was killed: %+v", st)
		}
		if code == http.StatusServiceUnavailable && strings.Contains(st.Message, "batch/v1") {
			check503("jobs, cp-a killed", code, st, ra)
			sawOwn = true
		}
	}
	// Well past the grace period: a stale Lease keeps it remembered.
	for end := time.Now().Add(grace + 5*time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		for _, url := range []string{jobsURL, k.Endpoint() + "/apis/batch/v1"} {
			code, st, ra := get(url)
			check503(url+", cp-a's Lease stale", code, st, ra)
		}
	}
	if src := sourceOf(t, k, idA); src.From != topology.SourceRemembered || src.Since.IsZero() {
		t.Errorf("/debug/topology source of cp-a: %+v, want remembered, with a time", src)
	}

	// xds-server restarts: it reads the memory back from the ConfigMap (cp-a never comes
	// back live for it to learn from).
	if err := k.RestartXDSServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the new xds-server remembers cp-a", func() error {
		if src := sourceOf(t, k, idA); src.From != topology.SourceRemembered {
			return fmt.Errorf("source of cp-a %+v", src)
		}
		return nil
	})
	for i := 0; i < 10; i++ {
		code, st, ra := get(jobsURL)
		check503("jobs after the xds-server restart", code, st, ra)
		time.Sleep(200 * time.Millisecond)
	}

	// Back: routed normally at once.
	if err := e.cp.Restart(ctx, "cp-a", ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "jobs served again by cp-a", func() error {
		if code, st, _ := get(jobsURL); code != http.StatusOK {
			return fmt.Errorf("%d %+v", code, st)
		}
		return nil
	})

	// (b) Stopped gracefully: it deletes its Lease. 503 (never 404) until the grace period
	// has passed since the deletion, then 404, the apiservers' own answer.
	stopped := make(chan error, 1)
	go func() { stopped <- e.cp.Stop("cp-a") }()
	var leaseGone, first404 time.Time
	saw503AfterDeletion := false
	deadline = time.Now().Add(3 * time.Minute)
	for first404.IsZero() {
		if time.Now().After(deadline) {
			t.Fatalf("no 404 within 3 minutes of stopping cp-a (Lease gone at %s)", leaseGone)
		}
		if leaseGone.IsZero() {
			_, err := adminB.CoordinationV1().Leases(objects.IdentityLeaseNamespace).Get(ctx, idA, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				leaseGone = time.Now()
			}
		}
		code, st, ra := get(jobsURL)
		switch {
		case code == http.StatusNotFound && leaseGone.IsZero():
			t.Fatalf("404 for jobs while cp-a's Lease exists: %+v", st)
		case code == http.StatusNotFound:
			first404 = time.Now()
		case code == http.StatusServiceUnavailable && !leaseGone.IsZero() && strings.Contains(st.Message, "batch/v1"):
			check503("jobs, cp-a's Lease deleted", code, st, ra)
			saw503AfterDeletion = true
		case code == http.StatusServiceUnavailable && st.Kind != "Status":
			// Until the new table arrives the data plane answers for the stopped server
			// itself (its local reply, also a Status).
			t.Fatalf("503 without a Status: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !saw503AfterDeletion {
		t.Error("no 503 from kube-mvp itself after cp-a's Lease was deleted: the grace period did not hold")
	}
	// The grace period runs from when xds-server saw the deletion, which is after it
	// happened and so at most a poll after we saw it; half of it is a safe lower bound.
	if d := first404.Sub(leaseGone); d < grace/2 {
		t.Errorf("first 404 %s after cp-a's Lease was deleted, want after the grace period (%s)", d, grace)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "cp-a forgotten in the memory ConfigMap", func() error {
		if err := rememberedIn(ctx, adminB, idA, ""); err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}

// leaseOf is the ID (identity Lease name) of the apiserver with hostname name.
func leaseOf(t *testing.T, ctx context.Context, c kubernetes.Interface, hostname string) string {
	t.Helper()
	var id string
	waitFor(t, ctx, "the identity Lease of "+hostname, func() error {
		leases, err := c.CoordinationV1().Leases(objects.IdentityLeaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: objects.IdentityLabel + "=" + objects.IdentityLabelValue})
		if err != nil {
			return err
		}
		for _, l := range leases.Items {
			if l.Labels[objects.HostnameLabel] == hostname {
				id = l.Name
				return nil
			}
		}
		return fmt.Errorf("none among %d", len(leases.Items))
	})
	return id
}

// rememberedIn checks that the memory ConfigMap has an entry for id that lists groupVersion
// (any entry when empty).
func rememberedIn(ctx context.Context, c kubernetes.Interface, id, groupVersion string) error {
	cm, err := c.CoreV1().ConfigMaps("default").Get(ctx, "kube-mvp-memory", metav1.GetOptions{})
	if err != nil {
		return err
	}
	m, err := memory.Decode(cm.Data)
	if err != nil {
		return err
	}
	r, ok := m[id]
	if !ok {
		return fmt.Errorf("no entry for %s", id)
	}
	for _, res := range r.Served {
		if groupVersion == "" || res.GroupVersion().String() == groupVersion {
			return nil
		}
	}
	return fmt.Errorf("%s's entry lacks %s", id, groupVersion)
}

// sourceOf is where xds-server's /debug/topology says id's capabilities came from.
func sourceOf(t *testing.T, k *harness.KubeMVP, id string) topology.Source {
	t.Helper()
	res, err := http.Get(k.XDSAdmin + "/debug/topology")
	if err != nil {
		return topology.Source{From: err.Error()}
	}
	defer res.Body.Close()
	var v xds.TopologyView
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		return topology.Source{From: err.Error()}
	}
	for _, s := range v.APIServers {
		if s.ID == id {
			return s.Source
		}
	}
	return topology.Source{}
}
