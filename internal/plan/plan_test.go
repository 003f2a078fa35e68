package plan_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// A three-apiserver upgrade in progress: a and c are new (batch/v1, jobs/status, the new
// "widgets" resource in apps/v1), b is old; d is an old server that died; "gone" is an ID a
// StorageVersion still names although its Lease was garbage collected.
func upgrade(t *testing.T) *topology.Topology {
	t.Helper()
	r := func(g, v, res, sub string) topology.Resource {
		return topology.Resource{Group: g, Version: v, Resource: res, Subresource: sub}
	}
	tp, err := topology.New(
		[]topology.APIServer{
			{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true},
			{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true},
			{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true},
			{ID: "id-d", Hostname: "cp-d", Address: "10.0.0.4:6443", Alive: false},
			{ID: "id-e", Hostname: "cp-e", Alive: true}, // alive but no address: not routable
		},
		map[topology.Resource][]string{
			r("", "v1", "pods", ""):                   {"id-a", "id-b", "id-c"},
			r("", "v1", "pods", "log"):                {"id-a", "id-b", "id-c"},
			r("apps", "v1", "deployments", ""):        {"id-c", "id-b", "id-a", "id-a"},
			r("apps", "v1", "widgets", ""):            {"id-a", "id-c"},
			r("batch", "v1", "jobs", ""):              {"id-a", "id-c"},
			r("batch", "v1", "jobs", "status"):        {"id-c"},
			r("legacy.io", "v1", "things", ""):        {"id-d"},
			r("gone.io", "v1", "ghosts", ""):          {"gone"},
			r("mixed.io", "v1", "halfdead", ""):       {"id-d", "gone"},
			r("unroutable.io", "v1", "noaddress", ""): {"id-e"},
		},
		[]string{"example.com"})
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// TestDecide checks the rule (topology.DecideResource) and the plan made from it (the route each
// request gets, with its cluster) on the same requests.
func TestDecide(t *testing.T) {
	tp := upgrade(t)
	sidecarB := tp.WithLocal("id-b")
	sidecarA := tp.WithLocal("id-a")
	cases := []struct {
		name     string
		topo     *topology.Topology
		method   string
		path     string
		outcome  topology.Outcome
		servers  []string
		cluster  string
		resource string
	}{
		{"non-resource", tp, "GET", "/healthz", topology.Default, nil, "kube-apiservers", ""},
		{"group/version document: whoever serves any of it", tp, "GET", "/apis/batch/v1", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/"},
		{"escaped group/version document", tp, "GET", "/apis/batch%2Fv1?timeout=32s", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/"},
		{"escaped slash in a resource path", tp, "GET", "/apis/batch%2Fv1/namespaces/x/jobs", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/jobs"},
		{"core document served by all", tp, "GET", "/api/v1", topology.Default, nil, "kube-apiservers", "core/v1/"},
		{"group document is non-resource", tp, "GET", "/apis/batch", topology.Default, nil, "kube-apiservers", ""},
		{"sidecar: document the local apiserver lacks", sidecarB, "GET", "/apis/batch/v1/", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/"},
		{"served by every live server", tp, "GET", "/api/v1/namespaces/x/pods", topology.Default, nil, "kube-apiservers", "core/v1/pods"},
		{"duplicates in input do not matter", tp, "GET", "/apis/apps/v1/deployments", topology.Default, nil, "kube-apiservers", "apps/v1/deployments"},
		{"strict subset", tp, "GET", "/apis/batch/v1/namespaces/x/jobs", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/jobs"},
		{"watch of a subset resource", tp, "GET", "/apis/batch/v1/watch/jobs", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/jobs"},
		{"new resource in an old group/version", tp, "POST", "/apis/apps/v1/namespaces/x/widgets", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "apps/v1/widgets"},
		{"subresource known to fewer servers", tp, "PUT", "/apis/batch/v1/namespaces/x/jobs/j/status", topology.Subset, []string{"id-c"}, "kube-apiservers-only-cp-c", "batch/v1/jobs/status"},
		{"unknown subresource falls back to its resource", tp, "GET", "/apis/batch/v1/namespaces/x/jobs/j/frob", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/jobs"},
		{"unpublished group (CRD, aggregated)", tp, "GET", "/apis/stable.example.io/v1/crontabs", topology.Default, nil, "kube-apiservers", ""},
		{"served-everywhere group", tp, "GET", "/apis/example.com/v1/things", topology.Default, nil, "kube-apiservers", ""},
		{"published, only known server dead -> 503", tp, "GET", "/apis/legacy.io/v1/things", topology.Unavailable, []string{"id-d"}, "", "legacy.io/v1/things"},
		{"published, only stale IDs -> own chain 404", tp, "GET", "/apis/gone.io/v1/ghosts", topology.NotServed, nil, "kube-apiservers", "gone.io/v1/ghosts"},
		{"dead and stale -> 503", tp, "GET", "/apis/mixed.io/v1/halfdead", topology.Unavailable, []string{"id-d"}, "", "mixed.io/v1/halfdead"},
		{"alive without address counts as unavailable", tp, "GET", "/apis/unroutable.io/v1/noaddress", topology.Unavailable, []string{"id-e"}, "", "unroutable.io/v1/noaddress"},
		{"sidecar: non-resource stays local", sidecarB, "GET", "/version", topology.Default, nil, "kube-apiserver-local", ""},
		{"sidecar: local serves it", sidecarB, "GET", "/api/v1/pods", topology.Default, nil, "kube-apiserver-local", "core/v1/pods"},
		{"sidecar: local lacks it", sidecarB, "GET", "/apis/batch/v1/jobs", topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/jobs"},
		{"sidecar: local has it though others too", sidecarA, "GET", "/apis/batch/v1/jobs", topology.Default, nil, "kube-apiserver-local", "batch/v1/jobs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := topology.ParsePathHeader(c.method, c.path)
			var d topology.Decision // the rule itself, for a request
			switch {
			case req.IsResourceRequest:
				d = c.topo.DecideResource(topology.Resource{Group: req.APIGroup, Version: req.APIVersion, Resource: req.Resource, Subresource: req.Subresource})
			case req.GroupVersionDocument:
				d = c.topo.DecideResource(topology.GroupVersion{Group: req.APIGroup, Version: req.APIVersion}.Document())
			}
			if d.Outcome != c.outcome || !slices.Equal([]string(d.Servers), c.servers) {
				t.Errorf("%s %s: %v %v, want %v %v", c.method, c.path, d.Outcome, d.Servers, c.outcome, c.servers)
			}
			p, err := plan.Build(c.topo)
			if err != nil {
				t.Fatal(err)
			}
			route := p.Routes.Decide(topology.ParsePathHeader(c.method, c.path))
			if route.Cluster != c.cluster || route.Outcome != d.Outcome || !slices.Equal(route.Servers, d.Servers) {
				t.Errorf("plan: %v %v to cluster %q, want %v %v to %q", route.Outcome, route.Servers, route.Cluster, d.Outcome, d.Servers, c.cluster)
			}
			if d.Resource != (topology.Resource{}) && route.Resource != d.Resource {
				t.Errorf("plan decided on %q, topology on %q", route.Resource, d.Resource)
			}
			if got := d.Resource; (c.resource == "" && got != topology.Resource{}) || (c.resource != "" && got.String() != c.resource) {
				t.Errorf("decided on %q, want %q", got, c.resource)
			}
		})
	}
}

func TestGroupVersionsAndPrefixes(t *testing.T) {
	var got []string
	p, err := plan.Build(upgrade(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, gv := range p.GroupVersions {
		got = append(got, gv.GroupVersion.PathPrefix())
	}
	want := []string{"/api/v1/", "/apis/apps/v1/", "/apis/batch/v1/", "/apis/gone.io/v1/", "/apis/legacy.io/v1/", "/apis/mixed.io/v1/", "/apis/unroutable.io/v1/"}
	if !slices.Equal(got, want) {
		t.Errorf("prefixes %v, want %v", got, want)
	}
}

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
	build := func(servers []topology.APIServer, served map[topology.Resource][]string, remembered ...string) map[string]bool {
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
		afterEnvoys = e
		return e.Names()
	}
	a := topology.APIServer{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true}
	b := topology.APIServer{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true}
	c := topology.APIServer{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true}
	departedA := a
	departedA.Alive = false

	// a restarts: departed (remembered at its address), then back with a new API.
	before := build([]topology.APIServer{departedA, b}, map[topology.Resource][]string{pods: {"id-a", "id-b"}}, "id-a")
	after := build([]topology.APIServer{a, b}, map[topology.Resource][]string{pods: {"id-a", "id-b"}, policies: {"id-a"}})
	for name := range after {
		if !before[name] && name != "live id-a" {
			t.Errorf("a came back: %q is new to the last table", name)
		}
	}
	if got := afterEnvoys.NarrowTo(before).For("").Routes.Lookup(policies).Cluster; got != contract.ClusterSubsetPrefix+"cp-a" {
		t.Errorf("a came back: the narrowed table routes its new API to %q", got)
	}
	if !after["cluster "+contract.ClusterSubsetPrefix+"cp-a"] {
		t.Errorf("names %v lack a's serving set", slices.Sorted(maps.Keys(after)))
	}
	// Forgotten (not a host any more), it is new again.
	forgotten := build([]topology.APIServer{b}, map[topology.Resource][]string{pods: {"id-b"}})
	if forgotten["apiserver id-a"] || !after["apiserver id-a"] {
		t.Errorf("a forgotten: names %v", slices.Sorted(maps.Keys(forgotten)))
	}
	// A new serving set of two known apiservers is a new name; so is a new apiserver.
	three := build([]topology.APIServer{a, b, c}, map[topology.Resource][]string{pods: {"id-a", "id-b", "id-c"}})
	two := build([]topology.APIServer{a, b, c}, map[topology.Resource][]string{pods: {"id-a", "id-b", "id-c"}, policies: {"id-a", "id-c"}})
	if n := contract.ClusterSubsetPrefix + "cp-a+cp-c"; three["cluster "+n] || !two["cluster "+n] {
		t.Errorf("serving set %s: known before it is named", n)
	}
	if after["apiserver id-c"] || !three["apiserver id-c"] {
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
	a := topology.APIServer{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true}
	b := topology.APIServer{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true}
	c := topology.APIServer{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true}
	d := topology.APIServer{ID: "id-d", Hostname: "cp-d", Address: "10.0.0.4:6443", Alive: true}
	gadgets := topology.Resource{Group: "apps", Version: "v1", Resource: "gadgets"}
	// r departed (remembered at its address, so a host of the serving-sets cluster) and
	// comes back; its ID sorts first.
	r := topology.APIServer{ID: "id-0", Hostname: "cp-r", Address: "10.0.0.9:6443", Alive: true}
	departedR := r
	departedR.Alive = false
	envoys := func(servers []topology.APIServer, served map[topology.Resource][]string) *plan.Envoys {
		t.Helper()
		topo, err := topology.New(servers, served, nil)
		if err != nil {
			t.Fatal(err)
		}
		topo.Sources = map[string]topology.Source{"id-0": {From: topology.SourceRemembered}}
		e, err := plan.ForEveryEnvoy(topo)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// Known: a, b and c as live hosts, r as a departed one; jobs on c alone, widgets on a and b.
	before := envoys([]topology.APIServer{a, b, c, departedR}, map[topology.Resource][]string{
		pods: {"id-a", "id-b", "id-c"}, jobs: {"id-c"}, widgets: {"id-a", "id-b"},
	})
	known := before.Names()
	// Now: d is new; jobs on a and c (a new set), widgets unchanged, fresh only on d.
	after := envoys([]topology.APIServer{a, b, c, d, r}, map[topology.Resource][]string{
		pods: {"id-a", "id-b", "id-c", "id-d", "id-0"}, jobs: {"id-a", "id-c"}, widgets: {"id-a", "id-b"}, fresh: {"id-d"},
		gadgets: {"id-0", "id-b"},
	})
	narrowed := after.NarrowTo(known)
	for _, local := range []string{"", "id-b"} {
		rs := narrowed.For(local).Routes
		check := func(r topology.Resource, outcome topology.Outcome, cluster string) {
			t.Helper()
			got := rs.Lookup(r)
			if got.Outcome != outcome || got.Cluster != cluster {
				t.Errorf("plan %q, %s: %s %q, want %s %q", local, r, got.Outcome, got.Cluster, outcome, cluster)
			}
			if got.Outcome == topology.Subset && !known["cluster "+got.Cluster] {
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
	if same := before.NarrowTo(known); same.Front != before.Front {
		t.Error("a table naming only known sets was rebuilt")
	}
}
