package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kube-mvp/kube-mvp/internal/extproc"
	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// ---- certificates -------------------------------------------------------------------------

type testCA struct{ *testutil.CA }

type keyPair struct{ testutil.Leaf }

func (k keyPair) tls(t testing.TB) tls.Certificate {
	c, err := tls.X509KeyPair(k.CertPEM, k.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newTestCA(t testing.TB, cn string) testCA {
	ca, err := testutil.NewCA(cn)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{ca}
}

func (ca testCA) issue(t testing.TB, subject pkix.Name, server bool, dns []string, ips []net.IP, uris ...string) keyPair {
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if server {
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	tmpl := &x509.Certificate{Subject: subject, ExtKeyUsage: usage, DNSNames: dns, IPAddresses: ips}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	leaf, err := ca.Issue(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{leaf}
}

type pki struct {
	servingCA, clientCA, peerCA, proxyCA testCA
	serving, proxyClient, apiserver      keyPair
}

func newPKI(t testing.TB) *pki {
	p := &pki{servingCA: newTestCA(t, "serving-ca"), clientCA: newTestCA(t, "client-ca"), peerCA: newTestCA(t, "peer-ca"), proxyCA: newTestCA(t, "front-proxy-ca")}
	p.serving = p.servingCA.issue(t, pkix.Name{CommonName: "kube-mvp"}, true, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, "spiffe://kube-mvp/proxy")
	p.proxyClient = p.proxyCA.issue(t, pkix.Name{CommonName: "front-proxy-client"}, false, nil, nil)
	p.apiserver = p.peerCA.issue(t, pkix.Name{CommonName: "kube-apiserver"}, true, []string{"kubernetes.default.svc"}, nil)
	return p
}

// files writes the PKI in the chart's layout (one directory per mounted Secret) and returns
// the paths xds-server hands to Envoy.
func (p *pki) files(t testing.TB) snapshot.SecretFiles {
	t.Helper()
	dir := t.TempDir()
	write := func(sub, name string, b []byte) string {
		path := filepath.Join(dir, sub, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return snapshot.SecretFiles{
		ServingCert: write("serving", "tls.crt", p.serving.CertPEM), ServingKey: write("serving", "tls.key", p.serving.KeyPEM),
		ClientCA:        write("client-ca", "ca.crt", p.clientCA.CertPEM),
		ProxyClientCert: write("proxy-client", "tls.crt", p.proxyClient.CertPEM), ProxyClientKey: write("proxy-client", "tls.key", p.proxyClient.KeyPEM),
		PeerCA: write("peer-ca", "ca.crt", p.peerCA.CertPEM),
	}
}

// ---- fake apiservers -----------------------------------------------------------------------

type seenRequest struct {
	Server string `json:"server"`
	Method string `json:"method"`
	Path   string `json:"path"`
	// Target is the request-target exactly as received (escapes, "//", dot-segments).
	Target string      `json:"target"`
	Host   string      `json:"host"`
	Header http.Header `json:"header"`
	// ClientCert is the client certificate the request's TLS connection presented:
	// "CN=<common name>", or "" for none.
	ClientCert string `json:"clientCert"`
	// Proto is the request's protocol as the apiserver received it (HTTP/1.1, HTTP/2.0).
	Proto string `json:"proto"`
}

// proxyClientCert is seenRequest.ClientCert of the data plane's proxy client certificate.
const proxyClientCert = "CN=front-proxy-client"

// clientCert is seenRequest.ClientCert of r's connection.
func clientCert(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	return "CN=" + r.TLS.PeerCertificates[0].Subject.CommonName
}

type fakeAPIServer struct {
	name string
	srv  *httptest.Server
	mu   sync.Mutex
	seen []seenRequest
	// checks are the /readyz requests (the data plane's health checks).
	checks []seenRequest
	// refusal, when set, answers every request but /readyz with this status (and Retry-After
	// when retryAfter), as an apiserver that does not process it.
	refusal *refusal
	// served are the client addresses of connections that carried a request other than
	// /readyz; closed those of every connection closed (either side).
	served, closed map[string]bool
	// stall, when set and true for a request, leaves it unanswered until the client goes
	// away, as a frozen (SIGSTOPped) apiserver.
	stall func(*http.Request) bool
	// hangup, when set and true for a request, closes the request's connection without an
	// answer once the request has been read, as an apiserver closing a kept-alive
	// connection just as the next request arrives.
	hangup func(*http.Request) bool
	// conns are the connections by remote address (an HTTP/2 hangup closes one).
	conns map[string]net.Conn
	// serve, when set, may answer a request (other than /readyz) itself: it reports
	// whether it did.
	serve func(http.ResponseWriter, *http.Request) bool
}

type refusal struct {
	status     int
	retryAfter bool
}

// refuse makes f answer like a stopping apiserver (503 "apiserver is shutting down" with
// Retry-After: 1) or, without retryAfter, like one that failed the request; nil serves again.
func (f *fakeAPIServer) refuse(r *refusal) {
	f.mu.Lock()
	f.refusal = r
	f.mu.Unlock()
}

func (f *fakeAPIServer) addr() string { return f.srv.Listener.Addr().String() }

func (f *fakeAPIServer) requests() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.seen...)
}

// servedConns is the connections (their remote addresses) f served requests on.
func (f *fakeAPIServer) servedConns() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var conns []string
	for a := range f.served {
		conns = append(conns, a)
	}
	return conns
}

// waitClosed waits until the connection from addr to f closed; what names it.
func (f *fakeAPIServer) waitClosed(t *testing.T, addr, what string) {
	t.Helper()
	testutil.WaitFor(t, t.Context(), 10*time.Second, what+" closed", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !f.closed[addr] {
			return fmt.Errorf("connection from %s still open", addr)
		}
		return nil
	})
}

// readyzChecks returns the /readyz requests f has seen.
func (f *fakeAPIServer) readyzChecks() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.checks...)
}

// fakeOptions vary a fake apiserver's HTTP.
type fakeOptions struct {
	// http1Only: the fake speaks HTTP/1.1 only (httptest's default); without, ALPN offers h2
	// before http/1.1, as a real apiserver does.
	http1Only bool
	// maxStreams, if set, is the SETTINGS_MAX_CONCURRENT_STREAMS it advertises.
	maxStreams uint32
	// watchStep, if set, paces watches instead of the tick: one event per receive.
	watchStep chan struct{}
}

// newFakeAPIServerOpts is an HTTPS server on ip that asks for (but does not require) a client
// certificate and verifies one of the front-proxy CA, like an apiserver with
// --requestheader-client-ca-file (the data plane's proxy client certificate), and records
// which one each request's connection presented. It serves /readyz as an apiserver with
// anonymous requests off: 200 only to a request that presents the proxy client certificate
// (the health checks' identity header comes with it), else 401. It serves a streaming
// /watch, upgrades (echo) and everything else as a JSON echo of the request; fo varies its
// HTTP.
func newFakeAPIServerOpts(t testing.TB, p *pki, name, ip string, tick time.Duration, ticks int, fo fakeOptions) *fakeAPIServer {
	f := &fakeAPIServer{name: name, served: map[string]bool{}, closed: map[string]bool{}, conns: map[string]net.Conn{}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen := seenRequest{Server: name, Method: r.Method, Path: r.URL.RequestURI(), Target: r.RequestURI, Host: r.Host, Header: r.Header.Clone(), ClientCert: clientCert(r), Proto: r.Proto}
		if r.URL.Path == "/readyz" {
			f.mu.Lock()
			f.checks = append(f.checks, seen)
			f.mu.Unlock()
			if seen.ClientCert != proxyClientCert {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}`)
				return
			}
			_, _ = io.WriteString(w, "ok")
			return
		}
		f.mu.Lock()
		f.seen = append(f.seen, seen)
		f.served[r.RemoteAddr] = true
		ref, stall, hangup, serve := f.refusal, f.stall, f.hangup, f.serve
		f.mu.Unlock()
		w.Header().Set("Server", "fake-apiserver")
		switch {
		case serve != nil && serve(w, r):
		case stall != nil && stall(r):
			<-r.Context().Done()
		case hangup != nil && hangup(r):
			if r.ProtoMajor == 2 {
				// No hijacking an HTTP/2 stream: close the connection under it.
				f.mu.Lock()
				conn := f.conns[r.RemoteAddr]
				f.mu.Unlock()
				if conn != nil {
					conn.Close()
				}
				<-r.Context().Done()
				return
			}
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		case ref != nil:
			if ref.retryAfter {
				w.Header().Set("Retry-After", "1")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(ref.status)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"refused by %s","code":%d}`, name, ref.status)
		case r.Header.Get("Upgrade") != "":
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\nX-Served-By: %s\r\n\r\n", r.Header.Get("Upgrade"), name)
			_ = brw.Flush()
			// Echo lines until the client closes.
			for {
				line, err := brw.ReadString('\n')
				if err != nil {
					return
				}
				_, _ = brw.WriteString(name + ":" + line)
				_ = brw.Flush()
			}
		case isWatch(r):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			rc := http.NewResponseController(w)
			_ = rc.Flush()
			next := fo.watchStep
			if next == nil {
				tk := time.NewTicker(tick)
				defer tk.Stop()
				next = make(chan struct{})
				go func() {
					for {
						select {
						case <-r.Context().Done():
							return
						case <-tk.C:
							select {
							case next <- struct{}{}:
							case <-r.Context().Done():
								return
							}
						}
					}
				}()
			}
			for i := 0; i < ticks; i++ {
				select {
				case <-r.Context().Done():
					return
				case <-next:
				}
				fmt.Fprintf(w, "{\"type\":\"ADDED\",\"n\":%d,\"at\":%d}\n", i, time.Now().UnixNano())
				_ = rc.Flush()
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(seen)
		}
	})
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	proxyPool := x509.NewCertPool()
	proxyPool.AddCert(p.proxyCA.Cert)
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.mu.Lock()
			f.conns[c.RemoteAddr().String()] = c
			f.mu.Unlock()
		}
		if s == http.StateClosed || s == http.StateHijacked {
			f.mu.Lock()
			f.closed[c.RemoteAddr().String()] = true
			f.mu.Unlock()
		}
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{p.apiserver.tls(t)}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: proxyPool}
	if !fo.http1Only {
		srv.EnableHTTP2 = true
		srv.TLS.NextProtos = []string{"h2", "http/1.1"}
		srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: int(fo.maxStreams)}
	}
	srv.StartTLS()
	f.srv = srv
	t.Cleanup(srv.Close)
	return f
}

// ---- environment ---------------------------------------------------------------------------

type env struct {
	t          testing.TB
	pki        *pki
	secrets    snapshot.SecretFiles      // the files Envoy reads
	apiservers map[string]*fakeAPIServer // by hostname
	topo       *topology.Topology
	xds        *xds.Server
	ext        *extproc.Server
	extGRPC    *grpc.Server
	dp         *DataPlane
	base       string
}

type envOptions struct {
	fixture   string // testdata fixture name, default batch-off
	local     string // sidecar: local apiserver
	tick      time.Duration
	ticks     int
	noExtProc bool
	// extProc, if set, is served on the ext_proc socket instead of internal/extproc.
	extProc extprocv3.ExternalProcessorServer
	// editExtProc, if set, changes the ext_proc filter configuration of the snapshot.
	editExtProc func(*extprocfilterv3.ExternalProcessor)
	// requestHeaders, if set, are the identity headers the apiservers read.
	requestHeaders topology.RequestHeaders
	// hostSuffix, if set, is appended to every apiserver's hostname (FQDNs: cp-a.example.com).
	hostSuffix string
	// editResources, if set, changes the snapshot's resources before the data plane gets them.
	editResources func(*snapshot.Resources) error
	// upstreamRequestTimeout, if set, is snapshot.Config.UpstreamRequestTimeout.
	upstreamRequestTimeout time.Duration
	// fake varies the fake apiservers' HTTP (h2_test.go).
	fake fakeOptions
	// front, if set, is the address the data plane gets for each apiserver instead of its
	// own (a proxy in front of it, or another server).
	front func(p *pki, name, addr string) string
	// drain, if set, is the data plane's --drain-time-s and --drain-strategy (drain_test.go).
	drain *DrainOptions
	// envoyVersion is the Envoy release the data plane models ("": the newest).
	envoyVersion string
}

// testExtProcMessageTimeout is the ext_proc message_timeout of every test's data plane
// (harness.TestExtProcMessageTimeout's value: harness imports this package).
const testExtProcMessageTimeout = 2 * time.Second

var fixtureAddresses = map[string]string{"cp-a": "127.0.0.1", "cp-b": "127.0.0.2", "cp-c": "127.0.0.3"}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	if o.fixture == "" {
		o.fixture = "batch-off"
	}
	if o.tick == 0 {
		o.tick, o.ticks = 100*time.Millisecond, 5
	}
	e := &env{t: t, pki: newPKI(t), apiservers: map[string]*fakeAPIServer{}}
	raw, err := os.ReadFile(fixtures.Path(o.fixture))
	if err != nil {
		t.Fatal(err)
	}
	fixture := string(raw)
	if o.hostSuffix != "" {
		for host := range fixtureAddresses {
			fixture = strings.ReplaceAll(fixture, "kubernetes.io/hostname: "+host+"}", "kubernetes.io/hostname: "+host+o.hostSuffix+"}")
			// The apiserver IDs follow their hostnames.
			fixture = strings.ReplaceAll(fixture, objects.APIServerIDFor(host), objects.APIServerIDFor(host+o.hostSuffix))
		}
	}
	for host, ip := range fixtureAddresses {
		f := newFakeAPIServerOpts(t, e.pki, host, ip, o.tick, o.ticks, o.fake)
		e.apiservers[host] = f
		addr := f.addr()
		if o.front != nil {
			addr = o.front(e.pki, host, addr)
		}
		fixture = strings.ReplaceAll(fixture, ip+":6443", addr)
	}
	objs, err := objects.DecodeFixture(strings.NewReader(fixture))
	if err != nil {
		t.Fatal(err)
	}
	topo, warnings := objects.Build(objs, objects.Options{})
	if topo == nil {
		t.Fatalf("no topology: %v", warnings)
	}
	topo.RequestHeaders = o.requestHeaders
	e.topo = topo

	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "extproc.sock")
	if !o.noExtProc {
		e.startExtProc(sock, o.extProc)
	}
	e.secrets = e.pki.files(t)
	cfg := snapshot.Config{
		ListenAddress: "127.0.0.1", ListenPort: 6443, ExtProcAddress: "unix:" + sock,
		Secrets: e.secrets, UpstreamRequestTimeout: o.upstreamRequestTimeout,
		// Not the product's 200 ms: each test's first decision pays for extproc's lazy gRPC
		// dial, which under -race on a busy machine can take longer (e2e uses 2 s too).
		ExtProcMessageTimeout: testExtProcMessageTimeout,
	}
	e.xds = xds.New(xds.Options{Log: testLogger(t), Translate: func(p *plan.Plan) (*cachev3.Snapshot, error) {
		res, err := snapshot.Build(p, cfg)
		if res == nil {
			return nil, err
		}
		if o.editExtProc != nil {
			if err := editExtProc(res, o.editExtProc); err != nil {
				return nil, err
			}
		}
		if o.editResources != nil {
			if err := o.editResources(res); err != nil {
				return nil, err
			}
		}
		return res.Snapshot()
	}})
	plans, err := plan.ForEveryEnvoy(topo)
	if err != nil {
		t.Fatal(err)
	}
	e.xds.Update(plans)
	g := grpc.NewServer()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e.xds.Register(ctx, g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)

	dp, err := Start(ctx, Options{XDSAddress: ln.Addr().String(), NodeID: t.Name(), LocalAPIServer: o.local, EnvoyVersion: o.envoyVersion,
		ListenerAddress: map[string]string{"kube-apiserver": "127.0.0.1:0"}, Logger: testLogger(t), Drain: o.drain})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := dp.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	e.dp = dp
	e.base = "https://" + dp.ListenerAddr("kube-apiserver")
	return e
}

// editExtProc applies edit to the ext_proc filter of every listener of res.
func editExtProc(res *snapshot.Resources, edit func(*extprocfilterv3.ExternalProcessor)) error {
	for _, r := range res.Listeners {
		l := r.(*listenerv3.Listener)
		f := l.GetFilterChains()[0].GetFilters()[0]
		h := &hcmv3.HttpConnectionManager{}
		if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
			return err
		}
		for _, hf := range h.GetHttpFilters() {
			ep := &extprocfilterv3.ExternalProcessor{}
			if hf.GetTypedConfig().MessageIs(ep) {
				if err := hf.GetTypedConfig().UnmarshalTo(ep); err != nil {
					return err
				}
				edit(ep)
				a, err := anypb.New(ep)
				if err != nil {
					return err
				}
				hf.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}
			}
		}
		a, err := anypb.New(h)
		if err != nil {
			return err
		}
		f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
	}
	return nil
}

// editDownstreamTLS applies edit to the DownstreamTlsContext of every listener of res.
func editDownstreamTLS(res *snapshot.Resources, edit func(*tlsv3.DownstreamTlsContext)) error {
	for _, r := range res.Listeners {
		for _, fc := range r.(*listenerv3.Listener).GetFilterChains() {
			ts := fc.GetTransportSocket()
			if ts == nil {
				continue
			}
			ctx := &tlsv3.DownstreamTlsContext{}
			if err := ts.GetTypedConfig().UnmarshalTo(ctx); err != nil {
				return err
			}
			edit(ctx)
			a, err := anypb.New(ctx)
			if err != nil {
				return err
			}
			ts.ConfigType = &corev3.TransportSocket_TypedConfig{TypedConfig: a}
		}
	}
	return nil
}

// setExtProcTable gives srv the routing table of the env's topology, as xds-server's stream
// would.
func (e *env) setExtProcTable(srv *extproc.Server) {
	e.t.Helper()
	tb, err := plan.TableOf(e.topo)
	if err != nil {
		e.t.Fatal(err)
	}
	srv.SetTable(tb, "test")
}

// startExtProc serves srv, or internal/extproc when srv is nil, on the unix socket sock. A
// sidecar's local apiserver reaches extproc in the ext_proc streams' metadata, as from Envoy.
func (e *env) startExtProc(sock string, srv extprocv3.ExternalProcessorServer) {
	if srv == nil {
		log := testLogger(e.t)
		e.ext = extproc.New(extproc.Options{Logger: log})
		e.setExtProcTable(e.ext)
		srv = e.ext
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		e.t.Fatal(err)
	}
	e.extGRPC = grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(e.extGRPC, srv)
	go func() { _ = e.extGRPC.Serve(ln) }()
	e.t.Cleanup(e.extGRPC.Stop)
}

// testToken is the bearer token of client(nil): the fake apiservers accept anything. A
// request with a bearer token, like one without any credentials (noTokenClient(nil)), takes
// the line-rate routes (ext_proc only where its group/version needs a decision) and reaches
// the apiservers as it came, over connections that present no client certificate.
const testToken = "test-token"

// client is an HTTPS client trusting the serving CA, with a client certificate if given,
// else with the bearer token testToken; HTTP/2 when the server agrees.
func (e *env) client(cert *tls.Certificate) *http.Client {
	c := e.noTokenClient(cert)
	if cert == nil {
		c.Transport = bearer{c.Transport}
	}
	return c
}

type bearer struct{ http.RoundTripper }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+testToken)
	return b.RoundTripper.RoundTrip(r)
}

// noTokenClient is client without the bearer token: with cert nil, a client without any
// credentials.
func (e *env) noTokenClient(cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.servingCA.Cert)
	tc := &tls.Config{RootCAs: pool, ServerName: "localhost"}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func (e *env) userCert(cn string, groups ...string) *tls.Certificate {
	kp := e.pki.clientCA.issue(e.t, pkix.Name{CommonName: cn, Organization: groups}, false, nil, nil)
	c := kp.tls(e.t)
	return &c
}

type reply struct {
	status int
	header http.Header
	body   []byte
	seen   seenRequest
}

func (e *env) do(c *http.Client, method, path string, hdr map[string]string) reply {
	e.t.Helper()
	req, err := http.NewRequest(method, e.base+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: b}
	if resp.Header.Get("Server") == "fake-apiserver" {
		_ = json.Unmarshal(b, &r.seen)
	}
	return r
}

// spread sends n GETs of path, each of which must succeed, and counts the apiservers that
// answered them and the routing header (X-Kube-Mvp-Cluster, "" when absent) they came with.
func (e *env) spread(c *http.Client, path string, n int) (servers, clusters map[string]int) {
	e.t.Helper()
	return e.spreadWith(c, path, n, nil)
}

// spreadWith is spread with request headers.
func (e *env) spreadWith(c *http.Client, path string, n int, hdr map[string]string) (servers, clusters map[string]int) {
	e.t.Helper()
	servers, clusters = map[string]int{}, map[string]int{}
	for range n {
		r := e.do(c, "GET", path, hdr)
		if r.status != 200 {
			e.t.Fatalf("GET %s: status %d: %s", path, r.status, r.body)
		}
		servers[r.seen.Server]++
		clusters[r.seen.Header.Get("X-Kube-Mvp-Cluster")]++
	}
	return servers, clusters
}

// reachEvery sends GETs of path, each of which must succeed, until want apiservers have each
// answered one, and at most max: a warm-up that leaves a kept-alive connection to each,
// whichever hosts the balancer picks (least request: at random while none is busy). It
// returns the count of each apiserver's answers.
func (e *env) reachEvery(c *http.Client, path string, want, max int) map[string]int {
	e.t.Helper()
	servers := map[string]int{}
	for range max {
		r := e.do(c, "GET", path, nil)
		if r.status != 200 {
			e.t.Fatalf("GET %s: status %d: %s", path, r.status, r.body)
		}
		servers[r.seen.Server]++
		if len(servers) >= want {
			return servers
		}
	}
	e.t.Fatalf("%d GETs of %s reached %v, want %d apiservers", max, path, servers, want)
	return nil
}

func (e *env) stat(name string) uint64 { return e.dp.stats.get(name) }

func readLine(br *bufio.Reader) string {
	s, _ := br.ReadString('\n')
	return s
}

// isWatch: the apiserver would serve r as a watch: a /watch/ path, or a watch query parameter
// whose first value is not "0" or "false" (k8s.io/apimachinery runtime
// Convert_Slice_string_To_bool).
func isWatch(r *http.Request) bool {
	if strings.Contains(r.URL.Path, "/watch/") {
		return true
	}
	v, ok := r.URL.Query()["watch"]
	return ok && len(v) > 0 && v[0] != "0" && !strings.EqualFold(v[0], "false")
}

// extProcStreamsStat counts the ext_proc streams opened (Envoy's
// http.<stat_prefix>.ext_proc.<filter stat_prefix>.streams_started).
const extProcStreamsStat = "http.kube_apiserver.ext_proc.kube_mvp.streams_started"
