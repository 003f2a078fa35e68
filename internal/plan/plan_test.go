package plan_test

import (
	"slices"
	"testing"

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
			{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true},
			{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
			{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true},
			{ID: "id-d", Hostname: "cp-d", Address: "10.0.0.4:6443", Alive: false},
			{ID: "id-e", Hostname: "cp-e", Alive: true, Verified: true}, // alive but no address: not routable
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
		[]topology.GroupVersion{{Group: "example.com", Version: "v1"}})
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
		{"unknown subresource falls back to its resource", tp, "GET", "/apis/batch/v1/namespaces/x/jobs/j/frob",
			topology.Subset, []string{"id-a", "id-c"}, "kube-apiservers-only-cp-a+cp-c", "batch/v1/jobs"},
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
