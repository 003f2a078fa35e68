package dataplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// TLS session resumption and client certificates. Envoy does not verify the certificate of a
// resumed session again (BoringSSL skips the verification callback), so identity.lua sees it
// presented but not validated and the request takes the client-certificate-undecided route:
// a 503. The product turns resumption off on the client listener; resumptionOn puts Envoy's
// defaults back, which shows the data plane models the bug the product avoids.

// resumptionOn turns both kinds of session resumption back on (Envoy's defaults, the
// listener before the product turned them off).
func resumptionOn(res *snapshot.Resources) error {
	var err error
	if e := editDownstreamTLS(res, func(c *tlsv3.DownstreamTlsContext) {
		if !c.GetDisableStatelessSessionResumption() || !c.GetDisableStatefulSessionResumption() {
			err = errors.New("the product's listener no longer disables session resumption")
		}
		c.SessionTicketKeysType = nil
		c.DisableStatefulSessionResumption = false
	}); e != nil {
		return e
	}
	return err
}

// resumingGet sends one GET over a new TLS connection (a fresh http.Transport) that presents
// cert and offers to resume a session from cache (Go's client: tickets only, TLS 1.2 and 1.3).
func (e *env) resumingGet(t *testing.T, cert *tls.Certificate, cache tls.ClientSessionCache, version uint16) (reply, tls.ConnectionState) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.servingCA.Cert)
	tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{*cert},
		ClientSessionCache: cache, MinVersion: version, MaxVersion: version,
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get(e.base + "/api/v1/namespaces")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: b}
	if resp.Header.Get("Server") == "fake-apiserver" {
		_ = json.Unmarshal(b, &r.seen)
	}
	if resp.TLS == nil {
		t.Fatal("no TLS connection state")
	}
	return r, *resp.TLS
}

// checkServedAs checks r reached an apiserver as the certificate user alice.
func checkServedAs(t *testing.T, what string, r reply) {
	t.Helper()
	if r.status != 200 || r.seen.ClientCert != proxyClientCert || r.seen.Header.Get("X-Remote-User") != "alice" {
		t.Errorf("%s: status %d, the apiserver saw client certificate %q and user %q, want 200 for alice over %q: %s",
			what, r.status, r.seen.ClientCert, r.seen.Header.Get("X-Remote-User"), proxyClientCert, r.body)
	}
}

// checkUndecided checks r is the client-certificate-undecided route's 503.
func checkUndecided(t *testing.T, what string, r reply) {
	t.Helper()
	if r.status != 503 || !bytes.Contains(r.body, []byte("could not be mapped to a user")) {
		t.Errorf("%s: status %d, want the undecided-identity 503: %s", what, r.status, r.body)
	}
}

// TestSessionResumption: a client with a certificate opens a second connection that offers
// to resume the first one's session. With resumption on, it resumes and the request is the
// undecided-identity 503, as on Envoy; with the product's listener, it is a full handshake
// and the request is served as the certificate's user. Go's client resumes by ticket only
// (TLS 1.2 and 1.3: stateless resumption); openssl s_client by ticket and, with -no_ticket,
// by TLS 1.2 session ID (stateful resumption, which the data plane cannot model).
func TestSessionResumption(t *testing.T) {
	for _, cfg := range []struct {
		name    string
		edit    func(*snapshot.Resources) error
		resumes bool
	}{
		{"resumption on", resumptionOn, true},
		{"product", nil, false},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			e := newEnv(t, envOptions{editResources: cfg.edit})
			alice := e.subjectCert(pkix.Name{CommonName: "alice", Organization: []string{"team-a"}})
			for _, v := range []struct {
				name    string
				version uint16
			}{{"Go TLS 1.2", tls.VersionTLS12}, {"Go TLS 1.3", tls.VersionTLS13}} {
				t.Run(v.name, func(t *testing.T) {
					cache := tls.NewLRUClientSessionCache(4)
					r, cs := e.resumingGet(t, alice, cache, v.version)
					if cs.DidResume {
						t.Fatal("first connection resumed")
					}
					checkServedAs(t, "first connection", r)
					r, cs = e.resumingGet(t, alice, cache, v.version)
					if cs.DidResume != cfg.resumes {
						t.Fatalf("second connection: resumed %v, want %v", cs.DidResume, cfg.resumes)
					}
					if cfg.resumes {
						checkUndecided(t, "second connection (resumed)", r)
					} else {
						checkServedAs(t, "second connection", r)
					}
				})
			}
			// openssl's client resumes by session ID too (-no_ticket: stateful resumption,
			// TLS 1.2 only: BoringSSL resumes TLS 1.3 by ticket only).
			for _, c := range []struct {
				name string
				args []string
				// reused: what the data plane does with resumption on. Envoy would also resume
				// the session ID; the data plane cannot (listener.go, downstreamTLSConfig).
				reused bool
			}{
				{"openssl TLS 1.2 session ID", []string{"-tls1_2", "-no_ticket"}, false},
				{"openssl TLS 1.2 ticket", []string{"-tls1_2"}, true},
				{"openssl TLS 1.3 ticket", []string{"-tls1_3"}, true},
			} {
				t.Run(c.name, func(t *testing.T) {
					e.opensslResumption(t, c.args, cfg.resumes && c.reused)
				})
			}
		})
	}
}

// opensslResumption runs openssl s_client twice with alice's certificate, saving the session
// of the first connection (-sess_out) and offering it on the second (-sess_in), and checks
// the second is "Reused" (and answered the undecided-identity 503) or "New" (and served).
func (e *env) opensslResumption(t *testing.T, args []string, reused bool) {
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl not installed (Debian: apt-get install openssl): session-ID resumption not tested")
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kp := e.pki.clientCA.issue(t, pkix.Name{CommonName: "alice", Organization: []string{"team-a"}}, false, nil, nil)
	ca, cert, key := write("ca.pem", e.pki.servingCA.CertPEM), write("cert.pem", kp.CertPEM), write("key.pem", kp.KeyPEM)
	sess := filepath.Join(dir, "session.pem")
	run := func(sessArg string) string {
		t.Helper()
		// Bounded: s_client waits for the server to close (Connection: close), which a
		// broken data plane might never do.
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"s_client", "-connect", e.dp.ListenerAddr("kube-apiserver"),
			"-servername", "localhost", "-CAfile", ca, "-verify_return_error", "-cert", cert, "-key", key,
			"-alpn", "http/1.1", "-ign_eof", sessArg, sess}, args...)...)
		// The response comes after the TLS 1.3 tickets, so -sess_out saves a resumable session.
		cmd.Stdin = strings.NewReader("GET /api/v1/namespaces HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("openssl %v: %v\n%s", cmd.Args, err, out)
		}
		return string(out)
	}
	status := func(out string) string {
		if i := strings.Index(out, "HTTP/1.1 "); i >= 0 && len(out) >= i+12 {
			return out[i+9 : i+12]
		}
		return ""
	}
	first := run("-sess_out")
	if !strings.Contains(first, "\nNew, ") || status(first) != "200" {
		t.Fatalf("first connection: want New and 200:\n%s", first)
	}
	if _, err := os.Stat(sess); os.IsNotExist(err) {
		// s_client saves only a resumable session: the server sent neither a session ID
		// nor a ticket, so nothing can be resumed. Envoy's answer too without tickets and
		// session cache: BoringSSL assigns a session ID only to a session it will cache
		// (handshake_server.cc, do_select_parameters).
		if reused {
			t.Errorf("first connection: no resumable session (no session ID, no ticket):\n%s", first)
		}
		return
	}
	second := run("-sess_in")
	switch {
	case reused && (!strings.Contains(second, "\nReused, ") || status(second) != "503"):
		t.Errorf("second connection: want Reused and the undecided-identity 503:\n%s", second)
	case !reused && (!strings.Contains(second, "\nNew, ") || status(second) != "200"):
		t.Errorf("second connection: want New and 200:\n%s", second)
	}
}
