package plan_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestProxyCertDangerous: an apiserver that takes the proxy certificate for an ordinary
// client's is left out of every front-proxy variant (ProxyCertExcluded); a route whose cluster
// or serving set has no other member refuses front-proxy requests (ProxyCertRefused), the
// others do not; the plan without dangerous apiservers is unchanged.
func TestProxyCertDangerous(t *testing.T) {
	base := upgrade(t)
	r := func(g, v, res, sub string) topology.Resource {
		return topology.Resource{Group: g, Version: v, Resource: res, Subresource: sub}
	}
	route := func(p *plan.Plan, res topology.Resource) plan.Route {
		t.Helper()
		rt, ok := p.Routes.Route(res)
		if !ok {
			t.Fatalf("no route for %s", res)
		}
		return rt
	}
	cluster := func(p *plan.Plan, name string) plan.Cluster {
		t.Helper()
		for _, c := range p.Clusters {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no cluster %s in %v", name, p.Clusters)
		return plan.Cluster{}
	}

	clean := mustBuild(t, base)
	if clean.ProxyCertExcluded != nil || clean.Routes.Default.ProxyCertRefused != nil {
		t.Errorf("no dangerous apiserver: excluded %v, default refused %v", clean.ProxyCertExcluded, clean.Routes.Default.ProxyCertRefused)
	}
	for _, rt := range clean.Routes.All() {
		if rt.ProxyCertRefused != nil {
			t.Errorf("no dangerous apiserver: %s refuses front-proxy requests", rt.Resource)
		}
	}

	// cp-c dangerous: batch/v1 jobs (cp-a, cp-c) still has cp-a; jobs/status (cp-c alone)
	// refuses; the default cluster has cp-a and cp-b.
	p := mustBuild(t, base.WithDangerous(map[string]string{"id-c": "takes it for a client's"}))
	if !slices.Equal(p.ProxyCertExcluded, topology.ServerSet{"id-c"}) {
		t.Errorf("ProxyCertExcluded %v, want [id-c]", p.ProxyCertExcluded)
	}
	if rt := route(p, r("batch", "v1", "jobs", "")); rt.ProxyCertRefused != nil || rt.Cluster != route(clean, r("batch", "v1", "jobs", "")).Cluster {
		t.Errorf("jobs: %+v, want the same set as without danger, not refused", rt)
	}
	if rt := route(p, r("batch", "v1", "jobs", "status")); !slices.Equal(rt.ProxyCertRefused, topology.ServerSet{"id-c"}) || rt.Outcome != topology.Subset {
		t.Errorf("jobs/status: %+v, want a subset refusing front-proxy requests for id-c", rt)
	}
	if c := cluster(p, "kube-apiservers-only-cp-c"); !slices.Equal(c.ProxyCertRefused, topology.ServerSet{"id-c"}) {
		t.Errorf("serving set of cp-c: %+v, want front-proxy refused", c)
	}
	if c := cluster(p, contract.ClusterDefault); c.ProxyCertRefused != nil {
		t.Errorf("default cluster %+v refuses, want not", c)
	}
	// Everything else routes exactly as without danger.
	for i, rt := range p.Routes.All() {
		c := clean.Routes.All()[i]
		if rt.Resource != c.Resource || rt.Outcome != c.Outcome || rt.Cluster != c.Cluster {
			t.Errorf("route %s: %+v, without danger %+v", rt.Resource, rt, c)
		}
	}

	// Every live apiserver dangerous: every forwarding route refuses, the default one too.
	all := mustBuild(t, base.WithDangerous(map[string]string{"id-a": "a", "id-b": "b", "id-c": "c"}))
	if want := (topology.ServerSet{"id-a", "id-b", "id-c"}); !slices.Equal(all.Routes.Default.ProxyCertRefused, want) || !slices.Equal(cluster(all, contract.ClusterDefault).ProxyCertRefused, want) {
		t.Errorf("default route %+v, cluster %+v: want refused for %v", all.Routes.Default, cluster(all, contract.ClusterDefault), want)
	}
	for _, rt := range all.Routes.All() {
		if forwards := rt.Outcome != topology.Unavailable; forwards != (rt.ProxyCertRefused != nil) {
			t.Errorf("all dangerous: %s %s refused %v", rt.Resource, rt.Outcome, rt.ProxyCertRefused)
		}
	}

	// A sidecar beside a dangerous apiserver refuses what its local cluster serves; its
	// serving sets elsewhere are unaffected.
	side := mustBuild(t, base.WithLocal("id-b").WithDangerous(map[string]string{"id-b": "b"}))
	if !slices.Equal(side.Routes.Default.ProxyCertRefused, topology.ServerSet{"id-b"}) {
		t.Errorf("sidecar beside a dangerous apiserver: default route %+v", side.Routes.Default)
	}
	if rt := route(side, r("batch", "v1", "jobs", "")); rt.ProxyCertRefused != nil {
		t.Errorf("sidecar: jobs %+v refuses, want not (cp-a and cp-c serve it)", rt)
	}

	// The view names them by hostname.
	v := p.View()
	if !slices.Equal(v.ProxyCertExcluded, []string{"cp-c"}) {
		t.Errorf("view: frontProxyExcluded %v", v.ProxyCertExcluded)
	}
}

func mustBuild(t *testing.T, tp *topology.Topology) *plan.Plan {
	t.Helper()
	p, err := plan.Build(tp)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProxyCertRefusal: the message names each apiserver by hostname and ID with its
// reason, at most three, and stays short whatever the reasons.
func TestProxyCertRefusal(t *testing.T) {
	servers := []topology.APIServer{
		{ID: "id-a", Hostname: "cp-a", Dangerous: "authenticates the proxy certificate as the client x: add its CN"},
		{ID: "id-b", Dangerous: strings.Repeat("é", 5000)},
		{ID: "id-c", Hostname: "cp-c", Dangerous: "c"},
		{ID: "id-d", Hostname: "cp-d", Dangerous: "d"},
		{ID: "id-e", Hostname: "cp-e", Dangerous: "e"},
	}
	one := plan.ProxyCertRefusal(servers, topology.ServerSet{"id-a"})
	for _, want := range []string{"kube-mvp: ", "would run as the certificate's user", "cp-a (id-a): authenticates the proxy certificate as the client x: add its CN"} {
		if !strings.Contains(one, want) {
			t.Errorf("message lacks %q: %s", want, one)
		}
	}
	many := plan.ProxyCertRefusal(servers, topology.ServerSet{"id-a", "id-b", "id-c", "id-d", "id-e"})
	if !strings.Contains(many, "id-b (id-b): éé") || !strings.Contains(many, "cp-c (id-c): c; and 2 more") || strings.Contains(many, "cp-d") {
		t.Errorf("five apiservers: %s", many)
	}
	if len(many) > 2000 || !strings.Contains(many, "…") {
		t.Errorf("five apiservers, one with a long reason: %d bytes, want it cut", len(many))
	}
}
