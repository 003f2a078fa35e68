package proxycert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// fakeAPIServer authenticates as kube-apiserver's authenticator union does (front proxy
// first, then client certificates, each failure an error that only a later success
// overrides, anonymous last when nothing failed) and answers a SelfSubjectReview. The
// end-to-end test TestProxyCertificateCheck holds the same cases against real apiservers.
type fakeAPIServer struct {
	requestHeaderCA *x509.CertPool // --requestheader-client-ca-file
	allowedNames    []string       // --requestheader-allowed-names
	userHeaders     []string       // --requestheader-username-headers
	clientCA        *x509.CertPool // --client-ca-file; nil: none
	anonymous       bool
	forbid          bool // authorization refuses the review
	answer          int  // answer this status instead (after authentication)
	reviews         int
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, failed := f.authenticate(r)
	switch {
	case user == "" && (failed || !f.anonymous):
		writeStatus(w, 401, "Unauthorized")
		return
	case user == "":
		user = "system:anonymous"
	}
	if r.Method != http.MethodPost || r.URL.Path != ReviewPath {
		writeStatus(w, 404, "the server could not find the requested resource")
		return
	}
	var in struct{ Kind, APIVersion string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Kind != "SelfSubjectReview" || in.APIVersion != "authentication.k8s.io/v1" {
		writeStatus(w, 400, fmt.Sprintf("not a SelfSubjectReview: %v %+v", err, in))
		return
	}
	f.reviews++
	switch {
	case f.answer != 0:
		writeStatus(w, f.answer, "something went wrong")
	case f.forbid:
		writeStatus(w, 403,
			fmt.Sprintf(`selfsubjectreviews.authentication.k8s.io is forbidden: User %q cannot create resource "selfsubjectreviews" in API group "authentication.k8s.io" at the cluster scope`, user))
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"kind":"SelfSubjectReview","apiVersion":"authentication.k8s.io/v1","metadata":{},"status":{"userInfo":{"username":%q,"groups":["system:authenticated"]}}}`, user)
	}
}

func (f *fakeAPIServer) authenticate(r *http.Request) (user string, failed bool) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "", false
	}
	cert := r.TLS.PeerCertificates[0]
	verify := func(pool *x509.CertPool) bool {
		_, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err == nil
	}
	switch {
	case !verify(f.requestHeaderCA):
		failed = true
	case len(f.allowedNames) > 0 && !slices.Contains(f.allowedNames, cert.Subject.CommonName):
		failed = true
	default:
		for _, h := range f.userHeaders {
			if v := r.Header.Get(h); v != "" {
				return v, false
			}
		}
	}
	if f.clientCA != nil {
		if verify(f.clientCA) {
			return cert.Subject.CommonName, false
		}
		failed = true
	}
	return "", failed
}

func writeStatus(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"code":%d}`, msg, code)
}

// pki is what the checks need: a serving CA and certificate, a front-proxy CA with the proxy
// certificate, a client CA.
type pki struct {
	servingCA, frontProxyCA, clientCA, otherCA *testutil.CA
	serving, wrongName                         tls.Certificate
	proxy                                      tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{}
	for _, ca := range []struct {
		to **testutil.CA
		cn string
	}{{&p.servingCA, "serving-ca"}, {&p.frontProxyCA, "front-proxy-ca"}, {&p.clientCA, "client-ca"}, {&p.otherCA, "other-ca"}} {
		var err error
		if *ca.to, err = testutil.NewCA(ca.cn); err != nil {
			t.Fatal(err)
		}
	}
	pair := func(ca *testutil.CA, tmpl *x509.Certificate) tls.Certificate {
		leaf, err := ca.Issue(tmpl)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	server := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	p.serving = pair(p.servingCA, &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"}, ExtKeyUsage: server, DNSNames: []string{"kubernetes", DefaultServerName}})
	p.wrongName = pair(p.servingCA, &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: server, DNSNames: []string{"kubernetes"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	p.proxy = pair(p.frontProxyCA, &x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return p
}

func pool(cas ...*testutil.CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

// serve starts f over TLS with cert and returns its address.
func serve(t *testing.T, f http.Handler, cert tls.Certificate) string {
	t.Helper()
	s := httptest.NewUnstartedServer(f)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert}
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	s.StartTLS()
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

func TestDefaultServerNameIsEnvoys(t *testing.T) {
	if DefaultServerName != snapshot.DefaultUpstreamServerName {
		t.Errorf("DefaultServerName %q, xds-server's --upstream-server-name default %q: the check must verify apiservers as Envoy does", DefaultServerName, snapshot.DefaultUpstreamServerName)
	}
}

// TestCheck: each way an apiserver can be configured, and what Check makes of it.
func TestCheck(t *testing.T) {
	p := newPKI(t)
	checker, err := NewChecker(p.proxy, pool(p.servingCA), "")
	if err != nil {
		t.Fatal(err)
	}
	fix := `add its CN "front-proxy-client" to --requestheader-allowed-names and its issuer's CA (CN=front-proxy-ca) to --requestheader-client-ca-file`
	good := func() *fakeAPIServer {
		return &fakeAPIServer{requestHeaderCA: pool(p.frontProxyCA), allowedNames: []string{"front-proxy-client"},
			userHeaders: []string{"X-Remote-User"}, clientCA: pool(p.clientCA), anonymous: true}
	}
	for _, c := range []struct {
		name    string
		edit    func(*fakeAPIServer)
		headers []string
		want    Result
		// reason holds these (in order).
		reason []string
	}{
		{name: "accepted", want: Result{Verdict: Accepted, Status: 201, User: contract.HealthCheckUser}},
		{name: "any name allowed", edit: func(f *fakeAPIServer) { f.allowedNames = nil },
			want: Result{Verdict: Accepted, Status: 201, User: contract.HealthCheckUser}},
		{name: "forbidden but authenticated", edit: func(f *fakeAPIServer) { f.forbid = true },
			want: Result{Verdict: Accepted, Status: 403, User: contract.HealthCheckUser}},
		{name: "the apiserver's own header name", edit: func(f *fakeAPIServer) { f.userHeaders = []string{"X-User"} }, headers: []string{"x-user"},
			want: Result{Verdict: Accepted, Status: 201, User: contract.HealthCheckUser}},
		// A name the apiserver does not read before the one it does (prepended in the
		// published ConfigMap): it takes its own, as from Envoy's health checks.
		{name: "a foreign name first", headers: []string{"x-attacker-user", "x-remote-user"},
			want: Result{Verdict: Accepted, Status: 201, User: contract.HealthCheckUser}},
		{name: "CN not allowed", edit: func(f *fakeAPIServer) { f.allowedNames = []string{"someone-else"} },
			want:   Result{Verdict: Refused, Status: 401},
			reason: []string{"does not accept the proxy certificate as a front proxy: " + fix, "--requestheader-username-headers must include X-Remote-User"}},
		{name: "other front-proxy CA", edit: func(f *fakeAPIServer) { f.requestHeaderCA = pool(p.otherCA) },
			want: Result{Verdict: Refused, Status: 401}, reason: []string{"does not accept the proxy certificate as a front proxy: " + fix}},
		{name: "CN not allowed, anonymous off", edit: func(f *fakeAPIServer) { f.allowedNames = []string{"someone-else"}; f.anonymous = false },
			want: Result{Verdict: Refused, Status: 401}, reason: []string{"does not accept the proxy certificate as a front proxy: " + fix}},
		{name: "taken as a client certificate", edit: func(f *fakeAPIServer) {
			f.allowedNames = []string{"someone-else"}
			f.clientCA = pool(p.clientCA, p.frontProxyCA)
		}, want: Result{Verdict: Refused, Status: 201, User: "front-proxy-client", Dangerous: true},
			reason: []string{"authenticates the proxy certificate as the client front-proxy-client, not as a front proxy: " + fix, "DANGEROUS", "would run as front-proxy-client"}},
		{name: "taken as a client certificate, forbidden", edit: func(f *fakeAPIServer) {
			f.requestHeaderCA = pool(p.otherCA)
			f.clientCA = pool(p.clientCA, p.frontProxyCA)
			f.forbid = true
		}, want: Result{Verdict: Refused, Status: 403, User: "front-proxy-client", Dangerous: true},
			reason: []string{"as the client front-proxy-client", "DANGEROUS"}},
		{name: "user header ignored", edit: func(f *fakeAPIServer) { f.userHeaders = []string{"X-User"} },
			want:   Result{Verdict: Refused, Status: 401},
			reason: []string{"does not accept the proxy certificate as a front proxy: " + fix, "--requestheader-username-headers must include X-Remote-User"}},
		{name: "user header ignored, no client CA: anonymous", edit: func(f *fakeAPIServer) { f.userHeaders = []string{"X-User"}; f.clientCA = nil },
			want:   Result{Verdict: Refused, Status: 201, User: "system:anonymous", Dangerous: true},
			reason: []string{"authenticates the proxy certificate as system:anonymous, not as a front proxy: " + fix, "--requestheader-username-headers must include X-Remote-User", "DANGEROUS"}},
		{name: "server error", edit: func(f *fakeAPIServer) { f.answer = 500 },
			want: Result{Verdict: Inconclusive, Status: 500}, reason: []string{"inconclusive: answered 500: something went wrong"}},
		{name: "not found", edit: func(f *fakeAPIServer) { f.answer = 404 },
			want: Result{Verdict: Inconclusive, Status: 404}, reason: []string{"inconclusive: answered 404"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := good()
			if c.edit != nil {
				c.edit(f)
			}
			headers := c.headers
			if headers == nil {
				headers = []string{"x-remote-user"}
			}
			got := checker.Check(t.Context(), serve(t, f, p.serving), headers)
			reason := got.Reason
			got.Reason = ""
			if got != c.want {
				t.Errorf("result %+v, want %+v (reason %q)", got, c.want, reason)
			}
			if c.want.Verdict != Accepted && reason == "" {
				t.Error("no reason")
			}
			if c.want.Verdict == Accepted && reason != "" {
				t.Errorf("reason %q for an accepted certificate", reason)
			}
			rest := reason
			for _, want := range c.reason {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Errorf("reason lacks %q (in order):\n%s", want, reason)
					break
				}
				rest = rest[i+len(want):]
			}
		})
	}
}

// TestCheckVerifiesTheAPIServer: the proxy certificate goes only to an apiserver whose
// serving certificate the peer CA signed for the server name; otherwise it is unreachable
// (not refused), and the apiserver never sees a request.
func TestCheckVerifiesTheAPIServer(t *testing.T) {
	p := newPKI(t)
	f := &fakeAPIServer{requestHeaderCA: pool(p.frontProxyCA), userHeaders: []string{"X-Remote-User"}}
	for _, c := range []struct {
		name       string
		serving    tls.Certificate
		peerCA     *x509.CertPool
		serverName string
		want       string
	}{
		{"other peer CA", p.serving, pool(p.otherCA), "", "certificate signed by unknown authority"},
		{"no SAN for the server name", p.wrongName, pool(p.servingCA), "", "not kubernetes.default.svc"},
		{"other server name", p.serving, pool(p.servingCA), "apiserver.example.com", "not apiserver.example.com"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checker, err := NewChecker(p.proxy, c.peerCA, c.serverName)
			if err != nil {
				t.Fatal(err)
			}
			got := checker.Check(t.Context(), serve(t, f, c.serving), []string{"x-remote-user"})
			if got.Verdict != Inconclusive || got.Status != 0 || !strings.HasPrefix(got.Reason, "unreachable: ") || !strings.Contains(got.Reason, c.want) {
				t.Errorf("%+v, want unreachable: …%s…", got, c.want)
			}
		})
	}
	if f.reviews != 0 {
		t.Errorf("%d reviews reached an unverified apiserver", f.reviews)
	}
	// The proxy certificate reaches a verified one; the name it was verified for is SNI.
	var sni string
	s := httptest.NewUnstartedServer(f)
	s.TLS = &tls.Config{ClientAuth: tls.RequestClientCert, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		sni = h.ServerName
		return &p.serving, nil
	}}
	s.StartTLS()
	defer s.Close()
	checker, err := NewChecker(p.proxy, pool(p.servingCA), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := checker.Check(t.Context(), s.Listener.Addr().String(), []string{"x-remote-user"}); got.Verdict != Accepted || sni != DefaultServerName {
		t.Errorf("%+v with SNI %q, want accepted with SNI %s", got, sni, DefaultServerName)
	}
}

// TestCheckNoRedirect: a redirect is inconclusive, naming its Location, and the check (the
// user header with it) is not repeated there.
func TestCheckNoRedirect(t *testing.T) {
	p := newPKI(t)
	checker, err := NewChecker(p.proxy, pool(p.servingCA), "")
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("redirect followed: %s %s", r.Method, r.URL)
	}))
	defer elsewhere.Close()
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect} {
		addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+r.URL.Path, code)
		}), p.serving)
		got := checker.Check(t.Context(), addr, []string{"x-remote-user"})
		want := fmt.Sprintf("inconclusive: answered %d redirecting to %q, which is not followed", code, elsewhere.URL+ReviewPath)
		if got.Verdict != Inconclusive || got.Status != code || got.Reason != want {
			t.Errorf("%d: %+v, want inconclusive: %s", code, got, want)
		}
	}
}

// TestCheckUnreachable: nobody listening, or no answer in time, is unreachable.
func TestCheckUnreachable(t *testing.T) {
	p := newPKI(t)
	checker, err := NewChecker(p.proxy, pool(p.servingCA), "")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	if got := checker.Check(t.Context(), closed, []string{"x-remote-user"}); got.Verdict != Inconclusive || !strings.Contains(got.Reason, "unreachable: ") {
		t.Errorf("closed port: %+v", got)
	}
	stuck := make(chan struct{})
	defer close(stuck)
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-stuck }), p.serving)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if got := checker.Check(ctx, addr, []string{"x-remote-user"}); got.Verdict != Inconclusive || !strings.Contains(got.Reason, "unreachable: ") {
		t.Errorf("no answer: %+v", got)
	}
}

// TestFilesLoad: Files.Load reads what the flags name, each problem naming its file.
func TestFilesLoad(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	leaf, err := p.frontProxyCA.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		path := dir + "/" + name
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cert, key, ca := write("proxy.crt", leaf.CertPEM), write("proxy.key", leaf.KeyPEM), write("peer-ca.crt", p.servingCA.CertPEM)
	c, err := Files{Cert: cert, Key: key, PeerCA: ca}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.Proxy.Subject.CommonName != "front-proxy-client" {
		t.Errorf("proxy certificate %s", c.Proxy.Subject)
	}
	f := &fakeAPIServer{requestHeaderCA: pool(p.frontProxyCA), userHeaders: []string{"X-Remote-User"}}
	if got := c.Check(t.Context(), serve(t, f, p.serving), []string{"x-remote-user"}); got.Verdict != Accepted {
		t.Errorf("%+v", got)
	}
	for _, bad := range []struct {
		f    Files
		want string
	}{
		{Files{Cert: cert, Key: ca, PeerCA: ca}, "proxy client certificate " + cert + " and key " + ca},
		{Files{Cert: cert, Key: key, PeerCA: dir + "/nope"}, "peer CA: open " + dir + "/nope"},
		{Files{Cert: cert, Key: key, PeerCA: key}, "peer CA " + key + ": no PEM certificate"},
	} {
		if _, err := bad.f.Load(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad.f, err, bad.want)
		}
	}
}
