package extproc

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestSpoofedHeaders: whatever identity or routing headers a client sends, none reaches an
// apiserver; the only identity forwarded is the one of the verified client certificate that
// our listener put in XFCC.
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
	hash := strings.Repeat("0f", 32)
	xfcc := `Hash=` + hash + `;Subject="CN=alice,O=team-b,O=team-a";URI=`
	innocent := []string{"authorization", "Bearer abc", "user-agent", "kubectl/v1.37.1", "x-request-id", "r-1", "impersonate-user", "bob"}

	type identityWant struct {
		user   string
		groups []string
		extra  string // the credential ID, or empty
	}
	alice := &identityWant{"alice", []string{"team-a", "team-b"}, "X509SHA256=" + hash}
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
		{"certificate only", "/api/v1/pods", []string{contract.HeaderXFCC, xfcc}, asFrontProxy(routed("kube-apiservers")), alice, nil},
		{"certificate and spoofed", "/api/v1/pods", append([]string{contract.HeaderXFCC, xfcc}, spoofed...), asFrontProxy(routed("kube-apiservers")), alice, nil},
		{"certificate and spoofed, subset route", "/apis/batch/v1/namespaces/x/cronjobs", append(slices.Clone(spoofed), contract.HeaderXFCC, xfcc), asFrontProxy(subset("kube-apiservers-only-cp-a")), alice, nil},
		{"certificate in a mixed-case header", "/api/v1/pods", append([]string{"X-Forwarded-Client-Cert", xfcc}, mixedCase...), asFrontProxy(routed("kube-apiservers")), alice, nil},
		// An empty CN: the apiserver refuses it (its front-proxy authenticator fails on the
		// certificate) unless a bearer token authenticates the request.
		{"certificate without CN", "/api/v1/pods", append([]string{contract.HeaderXFCC, `Hash=` + hash + `;Subject="O=system:masters";URI=`}, spoofed...), refused, nil, nil},
		{"two XFCC headers", "/api/v1/pods", append([]string{contract.HeaderXFCC, xfcc, contract.HeaderXFCC, `Subject="CN=system:admin"`}, spoofed...), refused, nil, nil},
		{"XFCC with two elements", "/api/v1/pods", append([]string{contract.HeaderXFCC, `Subject="CN=mallory",` + xfcc}, spoofed...), refused, nil, nil},
		{"certificate, but no live server: 503 all the same", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations", append([]string{contract.HeaderXFCC, xfcc}, spoofed...),
			unavailable("storagemigration.k8s.io/v1alpha1/storageversionmigrations"), nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := request("GET", c.path, append(slices.Clone(innocent), c.extra...)...)
			resp := call(t, client, req)
			checkResponse(t, req, resp, c.want)
			if c.want.cluster == "" || c.want.unauthorized {
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
				case h.name == contract.HeaderXFCC:
					t.Errorf("XFCC reaches the apiserver: %q", h.value)
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
				if want := []string{contract.HeaderRemoteExtraPrefix + credentialIDKey + ": " + c.ident.extra}; !slices.Equal(gotExtra, want) {
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

// TestCertificateOutcomes: what the apiserver's authenticators would make of a client
// certificate, and of a bearer token beside it, decides where a request goes. Its user goes
// as that user to the front-proxy twin, token or not (x509 comes before tokens); a
// certificate the apiserver would reject (two UIDs) is refused with 401 unless Envoy's route
// says a bearer token is there, which the apiserver then authenticates on a cluster without
// the proxy certificate; a certificate without CN is the same (the x509 authenticator passes
// over it, the front-proxy authenticator every apiserver behind kube-mvp has fails on it);
// an identity that cannot be forwarded unchanged is refused even with a token (the apiserver
// would have taken the certificate's user, not the token's). The 401 comes before a 503, as
// the apiserver authenticates before anything else.
func TestCertificateOutcomes(t *testing.T) {
	srv := New(Options{})
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	client := serve(t, "tcp", srv)
	hash := strings.Repeat("0f", 32)
	cert := func(subject string) []string {
		return []string{contract.HeaderXFCC, `Hash=` + hash + `;Subject="` + subject + `";URI=`}
	}
	alice := cert("CN=alice,O=team-a")
	// Kubernetes' UID attribute, "u1" and "u2" as PrintableStrings, as BoringSSL prints them.
	twoUIDs := cert("1.3.6.1.4.1.57683.2=#13027531,1.3.6.1.4.1.57683.2=#13027532,CN=alice")
	controlChar := cert(`CN=alice\0A`)
	noCN := cert("O=system:masters")
	token := []string{contract.MetadataCaller, contract.CallerCertificateAndToken}
	spoofed := []string{"x-remote-user", "system:admin", "x-remote-group", "system:masters"}

	cases := []struct {
		name     string
		metadata []string
		headers  []string
		path     string
		want     want
		user     []string
		groups   []string
	}{
		{"user", nil, alice, "/api/v1/pods", asFrontProxy(routed("kube-apiservers")), []string{"alice"}, []string{"team-a"}},
		{"user and token", token, alice, "/apis/batch/v1/jobs", asFrontProxy(subset("kube-apiservers-only-cp-a")), []string{"alice"}, []string{"team-a"}},
		{"rejected by the apiserver, no token", nil, twoUIDs, "/api/v1/pods", refused, nil, nil},
		{"rejected by the apiserver, other metadata", []string{contract.MetadataCaller, "someone"}, twoUIDs, "/api/v1/pods", refused, nil, nil},
		{"rejected by the apiserver, token", token, append(slices.Clone(twoUIDs), spoofed...), "/apis/batch/v1/jobs", subset("kube-apiservers-only-cp-a"), nil, nil},
		{"rejected by the apiserver, resource unavailable", nil, twoUIDs, "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations", refused, nil, nil},
		{"cannot be forwarded, token", token, controlChar, "/api/v1/pods", refused, nil, nil},
		{"no CN", nil, append(slices.Clone(noCN), spoofed...), "/readyz", refused, nil, nil},
		{"no CN, token", token, noCN, "/apis/batch/v1/jobs", subset("kube-apiservers-only-cp-a"), nil, nil},
		{"no certificate", nil, spoofed, "/apis/batch/v1/jobs", subset("kube-apiservers-only-cp-a"), nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if c.metadata != nil {
				ctx = metadata.AppendToOutgoingContext(ctx, c.metadata...)
			}
			req := request("GET", c.path, c.headers...)
			resp, err := exchange(ctx, client, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: req}})
			if err != nil {
				t.Fatal(err)
			}
			checkResponse(t, req, resp, c.want)
			if c.want.unauthorized {
				return
			}
			hs := applyMutation(t, req, resp)
			if got := values(hs, contract.HeaderRemoteUser); !slices.Equal(got, c.user) {
				t.Errorf("X-Remote-User %q, want %q", got, c.user)
			}
			if got := values(hs, contract.HeaderRemoteGroup); !slices.Equal(got, c.groups) {
				t.Errorf("X-Remote-Group %q, want %q", got, c.groups)
			}
		})
	}
}

// TestOtherRequestHeaderNames: with apiservers that read other identity headers
// (--requestheader-username-headers=X-User and so on, carried in the routing table), extproc
// forwards a certificate's identity in those names, and removes them, and every extra header
// under their prefix, from what clients send, as it does the defaults.
func TestOtherRequestHeaderNames(t *testing.T) {
	topo := loadFixture(t, "upgrade.yaml", fixtureNow)
	topo.RequestHeaders = topology.RequestHeaders{User: []string{"X-User", "x-login"}, UID: []string{"x-uid"}, Group: []string{"x-groups"}, ExtraPrefix: []string{"x-extra-"}}
	srv := New(Options{})
	srv.SetTopology(topo, "v1")
	client := serve(t, "unix", srv)

	hash := strings.Repeat("0f", 32)
	req := request("GET", "/api/v1/pods",
		contract.HeaderXFCC, `Hash=`+hash+`;Subject="CN=alice,O=team-a";URI=`,
		"x-user", "system:admin", "X-Login", "root", "x-groups", "system:masters", "x-uid", "0", "X-Extra-Scopes", "all")
	resp := call(t, client, req)
	removed := resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()
	for _, name := range []string{"x-user", "x-login", "x-uid", "x-groups", "x-extra-scopes", contract.HeaderXFCC} {
		if !slices.Contains(removed, name) {
			t.Errorf("%s is not removed: %v", name, removed)
		}
	}
	hs := applyMutation(t, req, resp)
	if got := values(hs, "x-user"); !slices.Equal(got, []string{"alice"}) {
		t.Errorf("x-user %q, want alice", got)
	}
	if got := values(hs, "x-groups"); !slices.Equal(got, []string{"team-a"}) {
		t.Errorf("x-groups %q, want team-a", got)
	}
	for _, name := range []string{"x-login", "x-uid", "x-extra-scopes", contract.HeaderRemoteUser, contract.HeaderRemoteGroup} {
		if got := values(hs, name); got != nil {
			t.Errorf("%s %q reaches the apiserver", name, got)
		}
	}
	if got := values(hs, "x-extra-"+credentialIDKey); !slices.Equal(got, []string{"X509SHA256=" + hash}) {
		t.Errorf("credential ID %q", got)
	}
}
