package e2e

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestCustomRequestHeaderNames: an apiserver that reads identity from other headers than
// X-Remote-* (--requestheader-username-headers=X-Login and so on) publishes them in
// kube-system/extension-apiserver-authentication; kube-mvp reads them there, forwards a
// certificate user's name, groups and UID in them, and strips them (and the defaults) from
// every client, so whoever calls — certificate, token, nobody — gets the identity the
// apiserver gives directly, spoofed headers in either naming notwithstanding.
func TestCustomRequestHeaderNames(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1", Args: []string{
		"--requestheader-username-headers=X-Login",
		"--requestheader-group-headers=X-Teams",
		"--requestheader-extra-headers-prefix=X-Attr-",
		// The apiserver insists on the standard UID header among its UID headers.
		"--requestheader-uid-headers=X-Id,X-Remote-Uid",
	}})
	k := e.startKubeMVP(ctx, "front", "")

	// alice with Kubernetes' UID attribute (1.3.6.1.4.1.57683.2).
	alice, err := e.cp.PKI.ClientCA.Issue(pkix.Name{CommonName: "alice", Organization: []string{"team-a", "team-b"},
		ExtraNames: []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}, Value: "alice-uid"}}},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	carolToken := serviceAccountToken(t, ctx, e.adminClient(e.cp.Server("cp-a")), "carol")

	spoof := http.Header{
		"X-Login": {"system:admin"}, "X-Teams": {"system:masters"}, "X-Id": {"0"}, "X-Attr-Scopes": {"everything"},
		"X-Remote-User": {"system:admin"}, "X-Remote-Group": {"system:masters"},
	}
	direct := "https://" + e.cp.Server("cp-a").Address()
	for _, c := range []struct {
		name     string
		cert     *controlplane.KeyPair
		token    string
		wantUser string
	}{
		{"client certificate with UID", &alice, "", `"username":"alice","uid":"alice-uid","groups":["team-a","team-b","system:authenticated"]`},
		{"bearer token", nil, carolToken, `"username":"system:serviceaccount:default:carol"`},
		{"no credentials", nil, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			hc := e.rawClient(c.cert)
			want := selfSubjectReview(t, ctx, hc, direct, c.token, spoof)
			if strings.Contains(want, "system:admin") || strings.Contains(want, "system:masters") || !strings.Contains(want, c.wantUser) {
				t.Fatalf("directly, the apiserver answered %s; want it to contain %s", want, c.wantUser)
			}
			for i := range 3 {
				if got := selfSubjectReview(t, ctx, hc, k.Endpoint(), c.token, spoof); got != want {
					t.Fatalf("request %d through kube-mvp: %s\nwant what the apiserver answers directly: %s", i, got, want)
				}
			}
		})
	}
}
