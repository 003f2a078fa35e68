package makebeforebreak

import (
	"slices"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestNamesOfReturningAPIServer: the names a routing table lets extproc route to (what the
// make-before-break publisher compares) are all known to the last table, but that it is live
// again, when an apiserver Envoy kept as a host comes back serving something only it serves:
// its set of one is in Envoy's endpoints already, so the table goes out at once, unchanged
// by narrowing. A brand-new apiserver, or a new
// serving set of two, is a new name (Envoy's endpoints must first list it).
func TestNamesOfReturningAPIServer(t *testing.T) {
	pods := topology.Resource{Version: "v1", Resource: "pods"}
	policies := topology.Resource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicies"}
	var afterEnvoys *plan.Envoys // the last built
	build := func(servers []topology.APIServer, served map[topology.Resource][]string, remembered ...string) Names {
		t.Helper()
		afterEnvoys = envoysOf(t, servers, served, remembered...)
		return namesOf(afterEnvoys)
	}
	a := topology.APIServer{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true}
	b := topology.APIServer{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true}
	c := topology.APIServer{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true}
	departedA := a
	departedA.Alive = false

	// a restarts: departed (remembered at its address), then back with a new API.
	before := build([]topology.APIServer{departedA, b}, map[topology.Resource][]string{pods: {"id-a", "id-b"}}, "id-a")
	after := build([]topology.APIServer{a, b}, map[topology.Resource][]string{pods: {"id-a", "id-b"}, policies: {"id-a"}})
	for name := range after {
		if !before[name] && name != (Name{KindLive, "id-a"}) {
			t.Errorf("a came back: %q is new to the last table", name)
		}
	}
	if got := narrowTo(afterEnvoys, before).For("").Routes.Lookup(policies).Cluster; got != contract.ClusterSubsetPrefix+"cp-a" {
		t.Errorf("a came back: the narrowed table routes its new API to %q", got)
	}
	if !after.Cluster(contract.ClusterSubsetPrefix + "cp-a") {
		t.Errorf("names %v lack a's serving set", after)
	}
	// Forgotten (not a host any more), it is new again.
	forgotten := build([]topology.APIServer{b}, map[topology.Resource][]string{pods: {"id-b"}})
	if forgotten[Name{KindHost, "id-a"}] || !after[Name{KindHost, "id-a"}] {
		t.Errorf("a forgotten: names %v", forgotten)
	}
	// A new serving set of two known apiservers is a new name; so is a new apiserver.
	three := build([]topology.APIServer{a, b, c}, map[topology.Resource][]string{pods: {"id-a", "id-b", "id-c"}})
	two := build([]topology.APIServer{a, b, c}, map[topology.Resource][]string{pods: {"id-a", "id-b", "id-c"}, policies: {"id-a", "id-c"}})
	if n := contract.ClusterSubsetPrefix + "cp-a+cp-c"; three.Cluster(n) || !two.Cluster(n) {
		t.Errorf("serving set %s: known before it is named", n)
	}
	if after[Name{KindHost, "id-c"}] || !three[Name{KindHost, "id-c"}] {
		t.Error("a new apiserver is no new name")
	}
}

// TestNarrowTo: a table that names a serving set Envoy may not have yet is narrowed to the
// largest known subset of its members (a known apiserver's set of one always is), so it can
// go out at once; a set with no known member becomes Unavailable (503), never the default
// route (404). Sidecar plans are narrowed too; routes to known sets stay as they are.
func TestNarrowTo(t *testing.T) {
	jobs := topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	widgets := topology.Resource{Group: "apps", Version: "v1", Resource: "widgets"}
	pods := topology.Resource{Version: "v1", Resource: "pods"}
	fresh := topology.Resource{Group: "new.io", Version: "v1", Resource: "things"}
	a := topology.APIServer{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true}
	b := topology.APIServer{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true}
	c := topology.APIServer{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true}
	d := topology.APIServer{ID: "id-d", Hostname: "cp-d", Address: "10.0.0.4:6443", Alive: true, Verified: true}
	gadgets := topology.Resource{Group: "apps", Version: "v1", Resource: "gadgets"}
	// r departed (remembered at its address, so a host of the serving-sets cluster) and
	// comes back; its ID sorts first.
	r := topology.APIServer{ID: "id-0", Hostname: "cp-r", Address: "10.0.0.9:6443", Alive: true, Verified: true}
	departedR := r
	departedR.Alive = false
	envoys := func(servers []topology.APIServer, served map[topology.Resource][]string) *plan.Envoys {
		t.Helper()
		return envoysOf(t, servers, served, "id-0")
	}
	// Known: a, b and c as live hosts, r as a departed one; jobs on c alone, widgets on a and b.
	before := envoys([]topology.APIServer{a, b, c, departedR}, map[topology.Resource][]string{
		pods: {"id-a", "id-b", "id-c"}, jobs: {"id-c"}, widgets: {"id-a", "id-b"},
	})
	known := namesOf(before)
	// Now: d is new; jobs on a and c (a new set), widgets unchanged, fresh only on d.
	after := envoys([]topology.APIServer{a, b, c, d, r}, map[topology.Resource][]string{
		pods: {"id-a", "id-b", "id-c", "id-d", "id-0"}, jobs: {"id-a", "id-c"}, widgets: {"id-a", "id-b"}, fresh: {"id-d"},
		gadgets: {"id-0", "id-b"},
	})
	narrowed := narrowTo(after, known)
	for _, local := range []string{"", "id-b"} {
		rs := narrowed.For(local).Routes
		check := func(r topology.Resource, outcome topology.Outcome, cluster string) {
			t.Helper()
			got := rs.Lookup(r)
			if got.Outcome != outcome || got.Cluster != cluster {
				t.Errorf("plan %q, %s: %s %q, want %s %q", local, r, got.Outcome, got.Cluster, outcome, cluster)
			}
			if got.Outcome == topology.Subset && !known.Cluster(got.Cluster) {
				t.Errorf("plan %q, %s: narrowed to %s, which the last table did not name", local, r, got.Cluster)
			}
		}
		// jobs: a+c is new; its largest known subsets are a's and c's sets of one (a first).
		check(jobs, topology.Subset, contract.ClusterSubsetPrefix+"cp-a")
		check(fresh, topology.Unavailable, "")
		if local == "" {
			// r's set of one is known, but b was live in the last table: b first.
			check(gadgets, topology.Subset, contract.ClusterSubsetPrefix+"cp-b")
			check(widgets, topology.Subset, contract.ClusterSubsetPrefix+"cp-a+cp-b")
			check(pods, topology.Default, contract.ClusterDefault)
		} else {
			check(widgets, topology.Default, contract.ClusterLocal) // b serves it itself
		}
	}
	// The whole table is unchanged, and a table naming nothing new narrows to itself.
	if got := after.For("").Routes.Lookup(jobs).Cluster; got != contract.ClusterSubsetPrefix+"cp-a+cp-c" {
		t.Errorf("NarrowTo changed the whole table: jobs to %s", got)
	}
	if same := narrowTo(before, known); same.Front != before.Front {
		t.Error("a table naming only known sets was rebuilt")
	}
}

// TestNarrowToDangerous: narrowed to a known set of only dangerous members, a route refuses
// requests whose identity kube-mvp sets, as the plan does for such a set; the default route
// is left as it is.
func TestNarrowToDangerous(t *testing.T) {
	widgets := topology.Resource{Group: "apps", Version: "v1", Resource: "widgets"}
	pods := topology.Resource{Version: "v1", Resource: "pods"}
	topo, err := topology.New([]topology.APIServer{
		{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true},
		{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true},
	}, map[topology.Resource][]string{pods: {"id-a", "id-b", "id-c"}, widgets: {"id-a", "id-c"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := plan.ForEveryEnvoy(topo.WithDangerous(map[string]string{"id-c": "c"}))
	if err != nil {
		t.Fatal(err)
	}
	known := Names{{KindCluster, plan.SubsetClusterName(topo, topology.ServerSet{"id-c"})}: true, {KindLive, "id-c"}: true}
	n := narrowTo(e, known)
	if rt, _ := n.Front.Routes.Route(widgets); rt.Cluster != "kube-apiservers-only-cp-c" || !slices.Equal(rt.ProxyCertRefused, topology.ServerSet{"id-c"}) {
		t.Errorf("widgets narrowed to cp-c: %+v, want refused for id-c", rt)
	}
	if !slices.Equal(n.Front.Routes.Default.ProxyCertRefused, e.Front.Routes.Default.ProxyCertRefused) {
		t.Errorf("narrowing changed the default route: %+v", n.Front.Routes.Default)
	}
}

// envoysOf are the plans of servers serving served, the remembered ones known from the
// memory of departed apiservers.
func envoysOf(t *testing.T, servers []topology.APIServer, served map[topology.Resource][]string, remembered ...string) *plan.Envoys {
	t.Helper()
	topo, err := topology.New(servers, served, nil)
	if err != nil {
		t.Fatal(err)
	}
	topo.Sources = map[string]topology.Source{}
	for _, id := range remembered {
		topo.Sources[id] = topology.Source{From: topology.SourceRemembered}
	}
	e, err := plan.ForEveryEnvoy(topo)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
