package extproc

import (
	"slices"
	"strings"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestSpoofedHeaders: whatever identity or routing headers a client sends, none reaches an
// apiserver; identity headers go on only when Envoy's Lua filter says it set them (the
// listener strips the decision header, like every identity header, from clients, before any
// filter runs), and then to the front-proxy variant of the cluster.
func TestSpoofedHeaders(t *testing.T) {
	srv := New(Options{})
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	client := serve(t, "unix", srv)

	spoofed := []string{
		"x-remote-user", "system:admin",
		"x-remote-group", "system:masters",
		"x-remote-group", "system:nodes",
		"x-remote-extra-foo", "bar",
		"x-remote-extra-authentication.kubernetes.io%2fcredential-id", "X509SHA256=forged",
		"x-remote-uid", "0",
		"x-kubernetes-peer-proxied", "true",
		"x-kube-mvp-cluster", "kube-apiservers-only-cp-c",
	}
	mixedCase := []string{
		"X-Remote-User", "system:admin",
		"X-REMOTE-GROUP", "system:masters",
		"X-Remote-Extra-Scopes", "everything",
		"X-Remote-Uid", "0",
		"X-Kubernetes-Peer-Proxied", "true",
		"X-Kube-Mvp-Cluster", "kube-apiservers-only-cp-c",
	}
	credentialID := "X509SHA256=" + strings.Repeat("0f", 32)
	// What the Lua filter sets for alice's certificate.
	alice := []string{
		contract.HeaderIdentityDecision, contract.IdentityProxyCert,
		contract.HeaderRemoteUser, "alice",
		contract.HeaderRemoteGroup, "team-a",
		contract.HeaderRemoteGroup, "team-b",
		contract.HeaderRemoteExtraPrefix + contract.CredentialIDExtraKey, credentialID,
		contract.HeaderXFCC, `Hash=0f;Subject="CN=alice,O=team-b,O=team-a";URI=`,
	}
	ownCredentials := []string{contract.HeaderIdentityDecision, contract.IdentityOwnCredentials, contract.HeaderXFCC, `Hash=0f;Subject="CN=alice";URI=`}
	innocent := []string{"user-agent", "kubectl/v1.37.1", "x-request-id", "r-1", "impersonate-user", "bob"}

	type identityWant struct {
		user   string
		groups []string
		extra  string
	}
	cases := []struct {
		name    string
		path    string
		extra   []string
		want    want
		ident   *identityWant // nil: no identity headers at all
		removed []string      // names that must be gone (beyond the fixed list)
	}{
		{"spoofed, no certificate", "/api/v1/namespaces/default/pods", spoofed, routed("kube-apiservers"), nil, []string{"x-remote-extra-foo"}},
		{"spoofed, no certificate, subset route", "/apis/batch/v1/jobs", spoofed, subset("kube-apiservers-only-cp-a"), nil, nil},
		{"spoofed in mixed case", "/apis/batch/v1/jobs", mixedCase, subset("kube-apiservers-only-cp-a"), nil, []string{"x-remote-extra-scopes"}},
		{"spoofed, non-resource", "/healthz", spoofed, routed("kube-apiservers"), nil, nil},
		{"identity set by the Lua filter", "/api/v1/pods", alice, withProxyCert(routed("kube-apiservers")), &identityWant{"alice", []string{"team-a", "team-b"}, credentialID}, nil},
		{"identity set by the Lua filter, subset route", "/apis/batch/v1/namespaces/x/cronjobs", alice,
			withProxyCert(subset("kube-apiservers-only-cp-a")), &identityWant{"alice", []string{"team-a", "team-b"},
				credentialID}, nil},
		{"certificate refused, own credentials", "/apis/batch/v1/jobs", append(slices.Clone(ownCredentials), spoofed...), subset("kube-apiservers-only-cp-a"), nil, []string{"x-remote-extra-foo"}},
		{"identity set, but no live server: 503 all the same", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations", alice,
			unavailable("storagemigration.k8s.io/v1alpha1/storageversionmigrations"), nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := request("GET", c.path, append(slices.Clone(innocent), c.extra...)...)
			resp := call(t, client, req)
			checkResponse(t, req, resp, c.want)
			if c.want.cluster == "" {
				return
			}
			hs := applyMutation(t, req, resp)
			var gotUser, gotUID, gotExtra []string
			for _, h := range hs {
				switch {
				case h.name == contract.HeaderRemoteUser:
					gotUser = append(gotUser, h.value)
				case h.name == contract.HeaderRemoteUID:
					gotUID = append(gotUID, h.value)
				case strings.HasPrefix(h.name, contract.HeaderRemoteExtraPrefix):
					gotExtra = append(gotExtra, h.name+": "+h.value)
				}
			}
			gotGroups := values(hs, contract.HeaderRemoteGroup)
			if c.ident == nil {
				if gotUser != nil || gotGroups != nil || gotUID != nil || gotExtra != nil {
					t.Errorf("identity headers reach the apiserver: user %q groups %q uid %q extra %q", gotUser, gotGroups, gotUID, gotExtra)
				}
			} else {
				if !slices.Equal(gotUser, []string{c.ident.user}) || !slices.Equal(gotGroups, c.ident.groups) || gotUID != nil {
					t.Errorf("user %q groups %q uid %q; want %q %q none", gotUser, gotGroups, gotUID, c.ident.user, c.ident.groups)
				}
				if want := []string{contract.HeaderRemoteExtraPrefix + contract.CredentialIDExtraKey + ": " + c.ident.extra}; !slices.Equal(gotExtra, want) {
					t.Errorf("extra %q, want %q", gotExtra, want)
				}
			}
			for _, name := range c.removed {
				if !slices.Contains(resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders(), name) {
					t.Errorf("%s not in remove_headers", name)
				}
			}
			// Everything else the client sent arrives untouched.
			for i := 0; i < len(innocent); i += 2 {
				if got := values(hs, innocent[i]); !slices.Equal(got, []string{innocent[i+1]}) {
					t.Errorf("%s = %q, want %q", innocent[i], got, innocent[i+1])
				}
			}
		})
	}
}

// TestOtherRequestHeaderNames: with apiservers that read other identity headers
// (--requestheader-username-headers=X-User and so on, carried in the routing table), extproc
// asks to remove them, and every extra header under their prefix, when a client's reach it
// (which Envoy's mutation rules refuse, failing the request: the listener should have
// stripped them), as it does the defaults, and keeps them when the Lua filter set them.
func TestOtherRequestHeaderNames(t *testing.T) {
	topo := loadFixture(t, "upgrade.yaml", fixtureNow)
	topo.RequestHeaders = topology.RequestHeaders{User: []string{"X-User", "x-login"}, UID: []string{"x-uid"}, Group: []string{"x-groups"}, ExtraPrefix: []string{"x-extra-"}}
	srv := New(Options{})
	srv.SetTopology(topo, "v1")
	client := serve(t, "unix", srv)

	spoofed := []string{"x-user", "system:admin", "X-Login", "root", "x-groups", "system:masters", "x-uid", "0", "X-Extra-Scopes", "all"}
	req := request("GET", "/api/v1/pods", spoofed...)
	resp := call(t, client, req)
	removed := resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()
	for _, name := range []string{"x-user", "x-login", "x-uid", "x-groups", "x-extra-scopes"} {
		if !slices.Contains(removed, name) {
			t.Errorf("%s is not removed: %v", name, removed)
		}
	}
	hs := applyMutation(t, req, resp)
	for _, name := range []string{"x-user", "x-login", "x-uid", "x-groups", "x-extra-scopes"} {
		if got := values(hs, name); got != nil {
			t.Errorf("%s %q reaches the apiserver", name, got)
		}
	}

	set := []string{contract.HeaderIdentityDecision, contract.IdentityProxyCert, "x-user", "alice", "x-groups", "team-a", "x-extra-" + contract.CredentialIDExtraKey, "X509SHA256=00"}
	req = request("GET", "/api/v1/pods", set...)
	hs = applyMutation(t, req, call(t, client, req))
	if got := values(hs, "x-user"); !slices.Equal(got, []string{"alice"}) {
		t.Errorf("x-user %q, want alice", got)
	}
	if got := values(hs, "x-groups"); !slices.Equal(got, []string{"team-a"}) {
		t.Errorf("x-groups %q, want team-a", got)
	}
	if got := values(hs, contract.HeaderRoutingCluster); !slices.Equal(got, []string{contract.ClusterName{Base: "kube-apiservers", ProxyCert: true}.String()}) {
		t.Errorf("routing header %q, want the front-proxy variant", got)
	}
}

// TestUpgradeNamesHTTP1Cluster: a request that asks for a protocol upgrade (SPDY or
// WebSocket: exec, attach, port-forward, a WebSocket watch) is routed to the HTTP/1.1 variant of
// the cluster decided on (Envoy cannot forward an upgrade over HTTP/2), the front-proxy one
// for an identity the Lua filter set, with the same serving set and removals as without the
// upgrade; every other request to the cluster itself.
func TestUpgradeNamesHTTP1Cluster(t *testing.T) {
	srv := New(Options{})
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	client := serve(t, "unix", srv)
	alice := []string{contract.HeaderIdentityDecision, contract.IdentityProxyCert, contract.HeaderRemoteUser, "alice"}
	for _, c := range []struct {
		name, path string
		extra      []string
		want       want
	}{
		{"SPDY exec, serving set", "/apis/batch/v1/namespaces/x/jobs/j", []string{"upgrade", "SPDY/3.1", "connection", "Upgrade"},
			want{cluster: contract.ClusterName{Base: contract.ClusterServingSets, HTTP1: true}.String(), subset: true, set: "kube-apiservers-only-cp-a"}},
		{"WebSocket watch, default cluster", "/api/v1/namespaces/x/pods?watch=true", []string{"Upgrade", "websocket"},
			want{cluster: contract.ClusterName{Base: contract.ClusterDefault, HTTP1: true}.String()}},
		{"WebSocket, client-certificate identity", "/apis/batch/v1/jobs", append([]string{"upgrade", "websocket"}, alice...),
			want{cluster: contract.ClusterName{Base: contract.ClusterServingSets, ProxyCert: true, HTTP1: true}.String(), subset: true, set: "kube-apiservers-only-cp-a", proxyCert: true}},
		{"WebSocket, client-supplied extra to strip", "/apis/batch/v1/jobs", []string{"upgrade", "websocket", "x-remote-extra-foo", "bar"},
			want{cluster: contract.ClusterName{Base: contract.ClusterServingSets, HTTP1: true}.String(), subset: true, set: "kube-apiservers-only-cp-a"}},
		{"no upgrade", "/apis/batch/v1/jobs", nil, subset("kube-apiservers-only-cp-a")},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := request("GET", c.path, c.extra...)
			resp := call(t, client, req)
			checkResponse(t, req, resp, c.want)
			if slices.Contains(c.extra, "x-remote-extra-foo") && !slices.Contains(resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders(), "x-remote-extra-foo") {
				t.Errorf("client-supplied x-remote-extra-foo not removed")
			}
		})
	}
}
