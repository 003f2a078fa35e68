package objects_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestOneAPIServerPerHost: whoever may write Leases in kube-system cannot bend routing with
// a second identity. A Lease that claims a real apiserver's host under another name is
// refused outright (kube-apiserver names its Lease after its hostname); a Lease of a new host
// that claims a real apiserver's address (its discovery then verifies, since the real
// apiserver answers there) never becomes a second endpoint at that address, nor does a
// remembered apiserver whose old address a live one now holds. Every refusal is listed
// in Topology.Refused and returned as an error.
func TestOneAPIServerPerHost(t *testing.T) {
	idZ := objects.APIServerIDFor("z")
	at := func(id, host, address string, created time.Time) objects.Objects {
		l := leaseAt(idA, t0) // a's shape, then renamed
		l.Name, l.Labels[objects.HostnameLabel], l.Annotations[objects.PeerAdvertiseAnnotation] = id, host, address
		holder := id + "_1"
		l.Spec.HolderIdentity = &holder
		l.CreationTimestamp = metav1.NewTime(created)
		return objects.Objects{Leases: append(leaseList(t0), l)}
	}
	build := func(objs objects.Objects, served map[string][]topology.Resource) (*topology.Topology, []error) {
		t.Helper()
		objs.Discovery = map[string]*apidiscoveryv2.APIGroupDiscoveryList{}
		for id, rs := range served {
			objs.Discovery[id] = discoveryOf(rs)
		}
		return objects.Build(objs, objects.Options{Now: t0})
	}
	refused := func(t *testing.T, topo *topology.Topology, errs []error, id, reason string) {
		t.Helper()
		i := slices.IndexFunc(topo.Refused, func(r topology.Refusal) bool { return r.ID == id })
		if i < 0 || !strings.Contains(topo.Refused[i].Reason, reason) {
			t.Errorf("refusals %+v, want %s refused: %q", topo.Refused, id, reason)
		}
		if !slices.ContainsFunc(errs, func(err error) bool {
			return strings.Contains(err.Error(), id) && strings.Contains(err.Error(), reason)
		}) {
			t.Errorf("errors %v name no refusal of %s", errs, id)
		}
	}

	t.Run("a second Lease for a real host", func(t *testing.T) {
		// It points at b's address, so its discovery would verify (b answers there).
		objs := at("apiserver-evil2", "a", addressOf(idB), t0)
		topo, errs := build(objs, map[string][]topology.Resource{idA: servedOf(idA), idB: servedOf(idB), "apiserver-evil2": servedOf(idB)})
		refused(t, topo, errs, "apiserver-evil2", "names its Lease "+idA)
		if _, ok := topo.Server("apiserver-evil2"); ok {
			t.Error("the impostor is an apiserver of the topology")
		}
		if d := topo.DecideResource(jobs); d.Outcome != topology.Subset || !slices.Equal(d.Servers, []string{idA}) {
			t.Errorf("jobs: %v %v, want a alone", d.Outcome, d.Servers)
		}
	})

	for _, c := range []struct {
		name     string
		created  time.Time // z's Lease; a's and b's were created at t0 - 1h
		wantHost string
	}{
		{"a new host at a real apiserver's address", t0, idB},
		{"a host whose Lease is older", t0.Add(-2 * time.Hour), idZ},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs := at(idZ, "z", addressOf(idB), c.created)
			topo, errs := build(objs, map[string][]topology.Resource{idA: servedOf(idA), idB: servedOf(idB), idZ: servedOf(idB)})
			lost := idZ
			if c.wantHost == idZ {
				lost = idB
			}
			refused(t, topo, errs, lost, "its address is also claimed by apiserver "+c.wantHost)
			hosts := topo.Hosts()
			if !slices.Contains(hosts, c.wantHost) || slices.Contains(hosts, lost) || len(hosts) != 2 {
				t.Errorf("hosts %v, want %s and a, one per address", hosts, c.wantHost)
			}
			if d := topo.DecideResource(jobs); d.Outcome != topology.Subset || !slices.Equal(d.Servers, []string{idA}) {
				t.Errorf("jobs: %v %v, want a alone", d.Outcome, d.Servers)
			}
		})
	}

	t.Run("a remembered apiserver at a live one's address", func(t *testing.T) {
		// c departed; b now has its old address.
		objs := objects.Objects{Leases: leaseList(t0), Remembered: memory.Memory{
			idC: {Hostname: "c", Address: addressOf(idB), Served: []topology.Resource{jobs}, LastSeen: t0.Add(-time.Minute)},
		}}
		topo, errs := build(objs, map[string][]topology.Resource{idA: servedOf(idA), idB: servedOf(idB)})
		refused(t, topo, errs, idC, "its address is also claimed by apiserver "+idB)
		if hosts := topo.Hosts(); !slices.Equal(hosts, slices.Sorted(slices.Values([]string{idA, idB}))) {
			t.Errorf("hosts %v, want a and b only", hosts)
		}
		if d := topo.DecideResource(jobs); d.Outcome != topology.Subset || !slices.Equal(d.Servers, []string{idA}) {
			t.Errorf("jobs: %v %v, want a alone (c is remembered, not a host)", d.Outcome, d.Servers)
		}
	})

	t.Run("a remembered entry for a host under another ID", func(t *testing.T) {
		objs := objects.Objects{Leases: leaseList(t0), Remembered: memory.Memory{
			"apiserver-evil": {Hostname: "a", Address: "10.6.6.6:6443", Served: []topology.Resource{pods}, LastSeen: t0},
		}}
		topo, errs := build(objs, map[string][]topology.Resource{idA: servedOf(idA), idB: servedOf(idB)})
		refused(t, topo, errs, "apiserver-evil", "has the ID "+idA)
		if _, ok := topo.Server("apiserver-evil"); ok {
			t.Error("the forged entry is an apiserver of the topology")
		}
	})
}

// leaseList is a's and b's fresh Leases, created an hour before.
func leaseList(renewed time.Time) []coordinationv1.Lease {
	var out []coordinationv1.Lease
	for _, id := range []string{idA, idB} {
		l := leaseAt(id, renewed)
		l.CreationTimestamp = metav1.NewTime(t0.Add(-time.Hour))
		out = append(out, l)
	}
	return out
}
