package extproc

import (
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestProxyCertRefused: a request whose identity the Lua filter set gets a 503 naming the
// dangerous apiservers (with Retry-After) where every apiserver of its cluster or serving set
// is dangerous, and its front-proxy variant otherwise; a request with the caller's own
// credentials is routed as without danger.
func TestProxyCertRefused(t *testing.T) {
	base, err := topology.New(
		[]topology.APIServer{
			{ID: "id-1", Hostname: "node-1", Address: "192.0.2.1:6443", Alive: true, Verified: true},
			{ID: "id-2", Hostname: "node-2", Address: "192.0.2.2:6443", Alive: true, Verified: true},
			{ID: "id-3", Hostname: "node-3", Address: "192.0.2.3:6443", Alive: true, Verified: true},
		},
		map[topology.Resource][]string{
			{Version: "v1", Resource: "services"}:                                 {"id-1", "id-2", "id-3"},
			{Group: "apps", Version: "v1", Resource: "widgets"}:                   {"id-3", "id-1"},
			{Group: "apps", Version: "v1", Resource: "widgets", Subresource: "x"}: {"id-3"},
		}, nil)
	if err != nil {
		t.Fatal(err)
	}
	one := base.WithDangerous(map[string]string{"id-3": "takes the proxy certificate as the client front-proxy-client"})
	all := base.WithDangerous(map[string]string{"id-1": "one", "id-2": "two", "id-3": "three"})
	refused := func(tp *topology.Topology, ids ...string) want {
		return want{message: plan.ProxyCertRefusal(tp.APIServers, ids)}
	}
	fp := []string{contract.HeaderIdentityDecision, contract.IdentityProxyCert, "x-remote-user", "alice"}
	cases := []struct {
		name         string
		topo         *topology.Topology
		method, path string
		proxyCert    bool
		want         want
	}{
		{"another capable apiserver: the variant of the set", one, "GET", "/apis/apps/v1/widgets", true, withProxyCert(subset("kube-apiservers-only-node-1+node-3"))},
		{"only the dangerous one serves it", one, "GET", "/apis/apps/v1/widgets/w/x", true, refused(one, "id-3")},
		{"only the dangerous one, own credentials", one, "GET", "/apis/apps/v1/widgets/w/x", false, subset("kube-apiservers-only-node-3")},
		{"served by all", one, "GET", "/api/v1/services", true, withProxyCert(routed("kube-apiservers"))},
		{"every apiserver dangerous: non-resource", all, "GET", "/healthz", true, refused(all, "id-1", "id-2", "id-3")},
		{"every apiserver dangerous: a subset", all, "GET", "/apis/apps/v1/widgets", true, refused(all, "id-1", "id-3")},
		{"every apiserver dangerous, own credentials", all, "GET", "/healthz", false, routed("kube-apiservers")},
	}
	srv := New(Options{})
	client := serve(t, "unix", srv)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv.SetTopology(c.topo, "test")
			var extra []string
			if c.proxyCert {
				extra = fp
			}
			req := request(c.method, c.path, extra...)
			checkResponse(t, req, call(t, client, req), c.want)
		})
	}
}
