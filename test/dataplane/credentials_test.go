package dataplane

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Which client certificate the apiservers see, and which identity headers, for each kind of
// client certificate request, through the data plane with the snapshot and extproc kube-mvp
// really serve.

// subjectCert is a client certificate of the client CA with subject name.
func (e *env) subjectCert(name pkix.Name) *tls.Certificate {
	kp := e.pki.clientCA.issue(e.t, name, false, nil, nil)
	c := kp.tls(e.t)
	return &c
}

// oidUID is the attribute Kubernetes reads a client certificate user's UID from
// (k8s.io/apimachinery asn1.X509UID); BoringSSL, and so the data plane's XFCC, prints it as
// the hex of its DER.
var oidUID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}

// identityHeaders returns the request's X-Remote-* headers and X-Forwarded-Client-Cert.
func identityHeaders(h http.Header) map[string][]string {
	out := map[string][]string{}
	for k, v := range h {
		if strings.HasPrefix(strings.ToLower(k), "x-remote-") || strings.EqualFold(k, "x-forwarded-client-cert") {
			out[k] = v
		}
	}
	return out
}

func (e *env) seenCount() int {
	n := 0
	for _, f := range e.apiservers {
		n += len(f.requests())
	}
	return n
}

// TestClientCertificateOutcomes: what each kind of client certificate request becomes, with
// the real extproc: the apiserver sees the proxy client certificate and identity headers only
// for a certificate user (over the front-proxy variant cluster); a certificate the apiserver
// would reject is answered 401 unless a bearer token (Authorization, or a WebSocket
// upgrade's Sec-WebSocket-Protocol) decides, which then reaches the apiserver without
// certificate and identity headers, as it would directly; a certificate without CommonName is
// the same (the apiserver's front-proxy authenticator fails on it).
func TestClientCertificateOutcomes(t *testing.T) {
	e := newEnv(t, envOptions{})
	alice := e.subjectCert(pkix.Name{CommonName: "alice", Organization: []string{"team-a"}})
	// Two UID attributes: Kubernetes' x509 authenticator fails such a certificate.
	refused := e.subjectCert(pkix.Name{CommonName: "bob", ExtraNames: []pkix.AttributeTypeAndValue{{Type: oidUID, Value: "u-1"}, {Type: oidUID, Value: "u-2"}}})
	noCN := e.subjectCert(pkix.Name{Organization: []string{"team-a"}})

	type outcome struct {
		cluster string // the cluster whose upstream_rq_total the request adds to
		user    string // X-Remote-User the apiserver sees; "" no identity headers at all
		auth    string // Authorization the apiserver sees
	}
	forwarded := func(cluster, user, auth string) *outcome { return &outcome{cluster, user, auth} }
	cases := []struct {
		name string
		cert *tls.Certificate
		path string
		hdr  map[string]string
		want *outcome // nil: a 401 Status from kube-mvp, nothing upstream
	}{
		{"certificate user", alice, "/api/v1/namespaces", nil, forwarded("kube-apiservers/front-proxy", "alice", "")},
		{"certificate user, subset", alice, "/apis/batch/v1/jobs", nil, forwarded("kube-apiservers-serving/front-proxy", "alice", "")},
		// The apiserver authenticates the certificate before a token.
		{"certificate user and bearer token", alice, "/api/v1/namespaces", map[string]string{"Authorization": "Bearer x"}, forwarded("kube-apiservers/front-proxy", "alice", "Bearer x")},
		{"refused certificate", refused, "/api/v1/namespaces", nil, nil},
		{"refused certificate, bearer token", refused, "/api/v1/namespaces", map[string]string{"Authorization": "Bearer x"}, forwarded("kube-apiservers", "", "Bearer x")},
		{"refused certificate, lower-case bearer token", refused, "/apis/batch/v1/jobs", map[string]string{"Authorization": "bearer x"}, forwarded("kube-apiservers-serving", "", "bearer x")},
		{"refused certificate, Basic", refused, "/api/v1/namespaces", map[string]string{"Authorization": "Basic Ym9iOnB3"}, nil},
		{"refused certificate, empty bearer token", refused, "/api/v1/namespaces", map[string]string{"Authorization": "Bearer"}, nil},
		// Not a WebSocket upgrade: the apiserver reads no token from Sec-WebSocket-Protocol.
		{"refused certificate, WebSocket protocol without upgrade", refused, "/api/v1/namespaces", map[string]string{"Sec-WebSocket-Protocol": "base64url.bearer.authorization.k8s.io.eA"}, nil},
		{"certificate without CommonName", noCN, "/api/v1/namespaces", nil, nil},
		{"certificate without CommonName, bearer token", noCN, "/api/v1/namespaces", map[string]string{"Authorization": "Bearer x"}, forwarded("kube-apiservers", "", "Bearer x")},
	}
	for _, tc := range cases {
		clusters := []string{"kube-apiservers", "kube-apiservers/front-proxy", "kube-apiservers-serving", "kube-apiservers-serving/front-proxy"}
		before := map[string]uint64{}
		for _, c := range clusters {
			before[c] = e.stat("cluster." + c + ".upstream_rq_total")
		}
		seen := e.seenCount()
		r := e.do(e.noTokenClient(tc.cert), "GET", tc.path, tc.hdr)
		grew := map[string]uint64{}
		for _, c := range clusters {
			if d := e.stat("cluster."+c+".upstream_rq_total") - before[c]; d != 0 {
				grew[c] = d
			}
		}
		if tc.want == nil {
			checkUnauthorized(t, tc.name, r)
			if len(grew) != 0 || e.seenCount() != seen {
				t.Errorf("%s: refused, yet requests went upstream: %v", tc.name, grew)
			}
			continue
		}
		if r.status != 200 {
			t.Errorf("%s: status %d: %s", tc.name, r.status, r.body)
			continue
		}
		if len(grew) != 1 || grew[tc.want.cluster] != 1 {
			t.Errorf("%s: requests per cluster %v, want one to %s", tc.name, grew, tc.want.cluster)
		}
		h := r.seen.Header
		ids := identityHeaders(h)
		if tc.want.user == "" {
			if r.seen.ClientCert != "" || len(ids) != 0 {
				t.Errorf("%s: the apiserver saw client certificate %q and identity headers %v, want none", tc.name, r.seen.ClientCert, ids)
			}
		} else {
			if r.seen.ClientCert != proxyClientCert || h.Get("X-Remote-User") != tc.want.user || strings.Join(h.Values("X-Remote-Group"), ",") != "team-a" {
				t.Errorf("%s: the apiserver saw client certificate %q and identity headers %v, want %q, user %s of team-a", tc.name, r.seen.ClientCert, ids, proxyClientCert, tc.want.user)
			}
			if h.Get("X-Forwarded-Client-Cert") != "" {
				t.Errorf("%s: XFCC reached the apiserver", tc.name)
			}
		}
		if got := h.Get("Authorization"); got != tc.want.auth {
			t.Errorf("%s: Authorization %q reached the apiserver, want %q", tc.name, got, tc.want.auth)
		}
	}
}

// checkUnauthorized checks r is the apiserver's own answer to a request it cannot
// authenticate: 401 with a Status.
func checkUnauthorized(t *testing.T, what string, r reply) {
	t.Helper()
	if r.status != http.StatusUnauthorized || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("%s: status %d, content type %q, want 401 application/json: %s", what, r.status, r.header.Get("Content-Type"), r.body)
		return
	}
	var st map[string]any
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Errorf("%s: %v: %s", what, err, r.body)
		return
	}
	if st["kind"] != "Status" || st["code"] != float64(401) || st["reason"] != "Unauthorized" || st["status"] != "Failure" {
		t.Errorf("%s: body %s, want a Status with code 401, reason Unauthorized", what, r.body)
	}
}

// TestRefusedCertificateWebSocket: a WebSocket upgrade with a certificate the apiserver would
// reject goes on (without certificate and identity headers) when its Sec-WebSocket-Protocol
// carries a bearer token, which the apiserver then authenticates; without the token it is
// answered 401.
func TestRefusedCertificateWebSocket(t *testing.T) {
	e := newEnv(t, envOptions{})
	refused := e.subjectCert(pkix.Name{CommonName: "bob", ExtraNames: []pkix.AttributeTypeAndValue{{Type: oidUID, Value: "u-1"}, {Type: oidUID, Value: "u-2"}}})
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.servingCA.Cert)
	upgrade := func(protocols string) (*http.Response, *bufio.Reader, *tls.Conn) {
		conn, err := tls.Dial("tcp", e.dp.ListenerAddr("kube-apiserver"), &tls.Config{RootCAs: pool, ServerName: "localhost",
			NextProtos: []string{"http/1.1"}, Certificates: []tls.Certificate{*refused}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn, "GET /api/v1/namespaces/default/pods/p/exec?command=sh HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Protocol: %s\r\n\r\n", protocols)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp, br, conn
	}

	const protocols = "base64url.bearer.authorization.k8s.io.eA, channel.k8s.io"
	resp, br, conn := upgrade(protocols)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("with a token: status %d, want 101", resp.StatusCode)
	}
	server := resp.Header.Get("X-Served-By")
	_, _ = io.WriteString(conn, "hello\n")
	if got := readLine(br); got != server+":hello\n" {
		t.Errorf("echo %q", got)
	}
	var seen []seenRequest
	for _, f := range e.apiservers {
		seen = append(seen, f.requests()...)
	}
	if len(seen) != 1 {
		t.Fatalf("the apiservers saw %d requests, want 1", len(seen))
	}
	if ids := identityHeaders(seen[0].Header); seen[0].ClientCert != "" || len(ids) != 0 {
		t.Errorf("the apiserver saw client certificate %q and identity headers %v, want none", seen[0].ClientCert, ids)
	}
	if got := seen[0].Header.Get("Sec-WebSocket-Protocol"); got != protocols {
		t.Errorf("Sec-WebSocket-Protocol %q reached the apiserver, want %q", got, protocols)
	}
	if got := e.stat("cluster.kube-apiservers/http1.upstream_rq_total"); got != 1 {
		t.Errorf("caller cluster's HTTP/1.1 variant (upgrades) upstream_rq_total %d, want 1", got)
	}

	// The apiserver reads a token only from an entry that starts with the prefix (after
	// trimming); anywhere else it is no token, and the refused certificate stays refused.
	for _, p := range []string{"channel.k8s.io", "x.base64url.bearer.authorization.k8s.io.eA, channel.k8s.io"} {
		resp, _, _ = upgrade(p)
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		checkUnauthorized(t, "protocols "+p, reply{status: resp.StatusCode, header: resp.Header, body: body})
		if n := e.seenCount(); n != 1 {
			t.Errorf("protocols %s: the apiservers saw %d requests, want still 1", p, n)
		}
	}
	// A token entry after others counts.
	resp, _, _ = upgrade("channel.k8s.io,  base64url.bearer.authorization.k8s.io.eA")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Errorf("token as the second entry: status %d, want 101", resp.StatusCode)
	}
}

// rawSubjectClient is a client presenting a certificate of the client CA whose subject is
// rdns exactly (GetClientCertificate: Go's client would drop a certificate it cannot parse).
func (e *env) rawSubjectClient(rdns [][]rawATV) *http.Client {
	cert, err := e.pki.clientCA.IssueRawSubject(rawName(e.t, rdns))
	if err != nil {
		e.t.Fatal(err)
	}
	c := e.noTokenClient(nil)
	tc := c.Transport.(*http.Transport).TLSClientConfig
	tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return c
}

// TestClientCertificateStringTypes: certificates whose subject BoringSSL and Go read
// differently. What Go reads as the apiserver does is forwarded with that identity; what Go
// cannot parse fails this data plane's handshake (Go's TLS parses the certificate; Envoy
// would run the Lua filter, which answers 401: TestLuaIdentityMatchesKubernetes); what
// BoringSSL cannot parse fails the handshake as in Envoy.
func TestClientCertificateStringTypes(t *testing.T) {
	e := newEnv(t, envOptions{})
	cases := []struct {
		name   string
		rdns   [][]rawATV
		user   string // "": the handshake fails
		groups string
	}{
		{"T61String O with é", [][]rawATV{{atv(oidO, val(tagT61, []byte("\xe9quipe")))}, {utf8v(oidCN, "t61")}}, "t61", "équipe"},
		{"description", [][]rawATV{{utf8v(oidDescription, "a person")}, {utf8v(oidO, "team-a")}, {utf8v(oidCN, "dora")}}, "dora", "team-a"},
		{"UTF8String CN café", [][]rawATV{{utf8v(oidCN, "café")}}, "café", ""},
		{"PrintableString CN with é (Go)", [][]rawATV{{atv(oidCN, val(tagPrintable, []byte("caf\xe9")))}}, "", ""},
		{"VisibleString description (Go)", [][]rawATV{{atv(oidDescription, val(tagVisible, []byte("x")))}, {utf8v(oidCN, "dora")}}, "", ""},
		{"UTF8String CN with U+FFFE (BoringSSL)", [][]rawATV{{utf8v(oidCN, "a\uFFFEb")}}, "", ""},
	}
	for _, tc := range cases {
		seen := e.seenCount()
		res, err := e.rawSubjectClient(tc.rdns).Get(e.base + "/api/v1/namespaces")
		if tc.user == "" {
			if err == nil {
				res.Body.Close()
				t.Errorf("%s: status %d, want a failed handshake", tc.name, res.StatusCode)
			} else if e.seenCount() != seen {
				t.Errorf("%s: a request went upstream", tc.name)
			}
			t.Logf("%s: %v", tc.name, err)
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var s seenRequest
		if res.StatusCode != 200 || json.Unmarshal(b, &s) != nil {
			t.Errorf("%s: %d %s", tc.name, res.StatusCode, b)
			continue
		}
		h := s.Header
		if s.ClientCert != proxyClientCert || h.Get("X-Remote-User") != tc.user || strings.Join(h.Values("X-Remote-Group"), ",") != tc.groups {
			t.Errorf("%s: the apiserver saw %q and %v, want user %q, groups %q", tc.name, s.ClientCert, identityHeaders(h), tc.user, tc.groups)
		}
	}
}
