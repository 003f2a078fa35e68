package e2e

import (
	"context"
	"crypto/tls"
	"encoding/asn1"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// attr is one attribute of a subject; its value's string type is the tag.
type attr struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

// rdnSET is one RDN (the "SET" suffix: SET OF).
type rdnSET []attr

func str(oid asn1.ObjectIdentifier, tag int, v string) rdnSET {
	return rdnSET{{oid, asn1.RawValue{Class: asn1.ClassUniversal, Tag: tag, Bytes: []byte(v)}}}
}

var (
	oidCN          = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidO           = asn1.ObjectIdentifier{2, 5, 4, 10}
	oidDescription = asn1.ObjectIdentifier{2, 5, 4, 13}
)

// String types (universal tags).
const (
	tagUTF8      = 12
	tagPrintable = 19
	tagT61       = 20
	tagVisible   = 26
)

// TestCertificateSubjectsAsTheApiserver: client certificates of the client CA whose subjects
// BoringSSL (Envoy's printed subject) and Go (the apiserver) read differently — a Latin-1 CN
// as a PrintableString, which Go refuses and BoringSSL prints as "café"; a T61String O, which
// both read as Latin-1; a description attribute, which BoringSSL names and Kubernetes ignores —
// get through kube-mvp what they get from the apiserver directly: the same SelfSubjectReview
// user, or no answer at all (Go's TLS handshake refuses a certificate it cannot parse; the
// test data plane's handshake is Go's too, Envoy's Lua filter answers 401 instead:
// test/dataplane TestLuaIdentityMatchesKubernetes). With a bearer token beside the
// certificate too: the apiserver still refuses the handshake.
func TestCertificateSubjectsAsTheApiserver(t *testing.T) {
	ctx := testutil.Context(t, 8*time.Minute)
	e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"})
	k := e.startKubeMVP(ctx, "front", "")
	token := serviceAccountToken(t, ctx, e.adminClient(e.cp.Server("cp-a")), "carol")
	ca := testutil.CA{Cert: e.cp.PKI.ClientCA.Cert, Key: e.cp.PKI.ClientCA.Key}

	cases := []struct {
		name     string
		subject  []rdnSET
		accepted bool // the apiserver takes the certificate's user
	}{
		{"PrintableString CN with é", []rdnSET{str(oidO, tagUTF8, "team-a"), str(oidCN, tagPrintable, "caf\xe9")}, false},
		{"T61String O with é", []rdnSET{str(oidO, tagT61, "\xe9quipe"), str(oidCN, tagUTF8, "t61")}, true},
		{"description attribute", []rdnSET{str(oidDescription, tagUTF8, "a person"), str(oidO, tagUTF8, "team-a"), str(oidCN, tagUTF8, "dora")}, true},
		{"description attribute, VisibleString", []rdnSET{str(oidDescription, tagVisible, "a person"), str(oidCN, tagUTF8, "dora")}, false},
		{"UTF8String CN café", []rdnSET{str(oidCN, tagUTF8, "café")}, true},
	}
	direct := e.cp.Server("cp-a").URL()
	for _, c := range cases {
		raw, err := asn1.Marshal(c.subject)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := ca.IssueRawSubject(raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range []string{"", token} {
			name := c.name
			if tok != "" {
				name += ", bearer token"
			}
			want := e.subjectReview(ctx, direct, cert, tok)
			got := e.subjectReview(ctx, k.Endpoint(), cert, tok)
			t.Logf("%s: directly %s; through kube-mvp %s", name, want, got)
			switch {
			case c.accepted && (want.code != http.StatusCreated || strings.Contains(want.user, "serviceaccount")):
				t.Fatalf("%s: directly %s, want the certificate's user", name, want)
			case !c.accepted && want.refused == "":
				t.Fatalf("%s: directly %s, want the handshake refused", name, want)
			}
			if got.code != want.code || got.user != want.user || (got.refused == "") != (want.refused == "") {
				t.Errorf("%s:\n  through kube-mvp: %s\n  directly:         %s", name, got, want)
			}
		}
	}
}

// reviewed is what a SelfSubjectReview came to: the status and the user it names, or why
// there was no answer.
type reviewed struct {
	code    int
	user    string // status.userInfo as JSON
	refused string // the transport's error: no HTTP answer
}

func (r reviewed) String() string {
	if r.refused != "" {
		return "no answer (" + r.refused + ")"
	}
	return fmt.Sprintf("%d %s", r.code, r.user)
}

// subjectReview posts a SelfSubjectReview to base presenting cert, never parsed on this side
// (GetClientCertificate), and the bearer token if any, on a new connection.
func (e *env) subjectReview(ctx context.Context, base string, cert tls.Certificate, token string) reviewed {
	tc := e.tlsConfig(nil)
	tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return reviewed{refused: err.Error()}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	r := reviewed{code: res.StatusCode}
	if res.StatusCode == http.StatusCreated {
		var v struct {
			Status struct {
				UserInfo json.RawMessage `json:"userInfo"`
			} `json:"status"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			e.t.Fatalf("%s: %v: %s", base, err, b)
		}
		r.user = string(v.Status.UserInfo)
	}
	return r
}
