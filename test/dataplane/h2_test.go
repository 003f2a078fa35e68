package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

const httpOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// h2Config is how a test varies the product's HTTP/2 apiserver clusters (connection_keepalive,
// idle timeout, other HTTP/2 options, the health checks' ALPN, the upgrade routes).
type h2Config struct {
	keepalive   *corev3.KeepaliveSettings // nil: the product's
	noKeepalive bool                      // no connection_keepalive at all
	idle        time.Duration             // 0: the product's idle_timeout
	// mutate, if set, changes the http2_protocol_options further.
	mutate func(*corev3.Http2ProtocolOptions)
	// plainHealthChecks takes away what the product does for its HTTP/2 clusters' health
	// checks (tls_options.alpn_protocols [http/1.1] and a health-check socket with ALPN
	// http/1.1): their connections then offer the cluster's ALPN (h2) while the HTTP health
	// checker speaks HTTP/1.1 (TestH2HealthCheckALPN).
	plainHealthChecks bool
	// noUpgradeRoutes removes the routes' upgrade variants, so that an upgrade reaches an
	// HTTP/2 cluster (TestH2Upgrade).
	noUpgradeRoutes bool
}

// edit applies c to every EDS cluster with explicit HTTP/2 options (the product's apiserver
// clusters; their HTTP/1.1 variants stay as they are) and, with noUpgradeRoutes, to the routes.
func (c h2Config) edit(res *snapshot.Resources) error {
	if c.noUpgradeRoutes {
		rc := proto.Clone(res.Routes[0].(*routev3.RouteConfiguration)).(*routev3.RouteConfiguration)
		vh := rc.GetVirtualHosts()[0]
		vh.Routes = slices.DeleteFunc(vh.Routes, func(r *routev3.Route) bool {
			return strings.Contains(r.GetName(), snapshot.RouteSuffixUpgrade)
		})
		res.Routes[0] = rc
	}
	for i, r := range res.Clusters {
		cl := r.(*clusterv3.Cluster)
		a := cl.GetTypedExtensionProtocolOptions()[httpOptionsKey]
		if cl.GetType() != clusterv3.Cluster_EDS || a == nil {
			continue
		}
		o := &httpv3.HttpProtocolOptions{}
		if err := a.UnmarshalTo(o); err != nil {
			return err
		}
		h2 := o.GetExplicitHttpConfig().GetHttp2ProtocolOptions()
		if h2 == nil {
			continue
		}
		if c.keepalive != nil {
			h2.ConnectionKeepalive = proto.Clone(c.keepalive).(*corev3.KeepaliveSettings)
		}
		if c.noKeepalive {
			h2.ConnectionKeepalive = nil
		}
		if c.mutate != nil {
			c.mutate(h2)
		}
		if c.idle > 0 {
			o.CommonHttpProtocolOptions.IdleTimeout = durationpb.New(c.idle)
		}
		packed, err := anypb.New(o)
		if err != nil {
			return err
		}
		// Copies: the clusters share the product's messages.
		cl = proto.Clone(cl).(*clusterv3.Cluster)
		cl.TypedExtensionProtocolOptions = map[string]*anypb.Any{httpOptionsKey: packed}
		if c.plainHealthChecks {
			cl.TransportSocketMatches = nil
			for _, hc := range cl.GetHealthChecks() {
				hc.TlsOptions, hc.TransportSocketMatchCriteria = nil, nil
			}
		}
		res.Clusters[i] = cl
	}
	return nil
}

func keepalive(interval, timeout time.Duration) *corev3.KeepaliveSettings {
	return &corev3.KeepaliveSettings{Interval: durationpb.New(interval), Timeout: durationpb.New(timeout)}
}

// connsOf is the connections that carried requests (other than /readyz) to f.
func connsOf(f *fakeAPIServer) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.served)
}

// TestH2Multiplexed: an HTTP/2 cluster sends its requests over TLS with ALPN h2 as HTTP/2,
// many concurrent ones (short GETs and long-held watch-like streams alike) on one
// connection per apiserver; only when a connection's streams reach the server's
// SETTINGS_MAX_CONCURRENT_STREAMS, or the cluster's max_concurrent_streams, does the pool
// open another. The HTTP/1.1 pool would need a
// connection per concurrent request.
func TestH2Multiplexed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxStreams uint32 // the apiservers' SETTINGS_MAX_CONCURRENT_STREAMS (0: Go's)
		// clusterStreams, if set, is the clusters' max_concurrent_streams (else the
		// product's, above the held streams).
		clusterStreams uint32
	}{{"default", 0, 0}, {"max-streams-2", 2, 0}, {"cluster-max-streams-2", 0, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			h2 := h2Config{keepalive: keepalive(10*time.Second, 5*time.Second)}
			limit := tc.maxStreams
			if tc.clusterStreams > 0 {
				h2.mutate = func(o *corev3.Http2ProtocolOptions) { o.MaxConcurrentStreams = wrapperspb.UInt32(tc.clusterStreams) }
				limit = tc.clusterStreams
			}
			e := newEnv(t, envOptions{fake: fakeOptions{maxStreams: tc.maxStreams}, editResources: h2.edit})
			c := e.client(nil)
			const path = "/api/v1/namespaces/default/configmaps"
			// Every apiserver gets its connection (and its SETTINGS) first.
			if servers, _ := e.spread(c, path, 30); len(servers) != len(e.apiservers) {
				t.Fatalf("warm-up reached %v, want every apiserver", servers)
			}
			for name, f := range e.apiservers {
				if n := connsOf(f); n != 1 {
					t.Fatalf("%s: %d connections after sequential requests, want 1", name, n)
				}
			}
			// Held streams: the apiservers answer nothing until released.
			release := make(chan struct{})
			held := map[string]int{}
			var hmu sync.Mutex
			for _, f := range e.apiservers {
				f.mu.Lock()
				f.stall = func(r *http.Request) bool {
					if r.URL.Query().Get("fieldSelector") != "hold" {
						return false
					}
					hmu.Lock()
					held[f.name]++
					hmu.Unlock()
					<-release
					return false
				}
				f.mu.Unlock()
			}
			const nHeld, nShort = 12, 30
			var wg sync.WaitGroup
			errs := make(chan error, nHeld+nShort)
			for range nHeld {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r := e.do(c, "GET", path+"?fieldSelector=hold&watch=true", nil); r.status != 200 {
						errs <- fmt.Errorf("held: status %d: %s", r.status, r.body)
					}
				}()
			}
			testutil.WaitFor(t, t.Context(), 10*time.Second, "every held stream reached an apiserver", func() error {
				hmu.Lock()
				defer hmu.Unlock()
				n := 0
				for _, v := range held {
					n += v
				}
				if n != nHeld {
					return fmt.Errorf("%d held", n)
				}
				return nil
			})
			// The short requests are answered while every held stream is still open. At most
			// three at a time: a new connection's first streams leave before the server's
			// SETTINGS arrive (in Envoy too: its pool starts a connection at the cluster's
			// limit), so a larger burst onto one could be refused (REFUSED_STREAM) on every
			// host it is retried on when the machine is busy; three in flight are absorbed
			// by the route's refused-stream retries on the other hosts.
			var short sync.WaitGroup
			inFlight := make(chan struct{}, 3)
			for range nShort {
				inFlight <- struct{}{}
				short.Go(func() {
					defer func() { <-inFlight }()
					if r := e.do(c, "GET", path, nil); r.status != 200 || r.seen.Proto != "HTTP/2.0" {
						errs <- fmt.Errorf("short: status %d, proto %q: %s", r.status, r.seen.Proto, r.body)
					}
				})
			}
			short.Wait()
			close(release)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			total := 0
			for name, f := range e.apiservers {
				n := connsOf(f)
				total += n
				hmu.Lock()
				h := held[name]
				hmu.Unlock()
				for _, r := range f.requests() {
					if r.Proto != "HTTP/2.0" {
						t.Errorf("%s got %s %s over %s, want HTTP/2.0", name, r.Method, r.Path, r.Proto)
					}
				}
				switch {
				case limit == 0 && n != 1:
					t.Errorf("%s: %d connections for %d held streams and short requests, want 1", name, n, h)
				case limit > 0 && n < (h+int(limit)-1)/int(limit):
					t.Errorf("%s: %d connections for %d held streams at %d streams per connection", name, n, h, limit)
				}
			}
			// With a stream limit, a connection opened for a waiting stream may end up
			// unused when a stream on another one ended first; without, every connection
			// carries requests.
			if got := e.stat("cluster.kube-apiservers.upstream_cx_total"); got < uint64(total) || limit == 0 && got != uint64(total) {
				t.Errorf("upstream_cx_total %d, the apiservers saw %d connections", got, total)
			}
		})
	}
}

// TestH2ALPNMismatch: an HTTP/2 cluster offers only h2; an apiserver that speaks only
// HTTP/1.1 refuses the TLS handshake (no_application_protocol alert): a connect failure, UF,
// and after the retries (connect-failure, previous_hosts; all apiservers alike) the 503 of
// UF. The health checks (ALPN http/1.1) pass; nothing reaches an apiserver but them. (Go's
// transport would have fallen back to HTTP/1.1 and served the request.)
func TestH2ALPNMismatch(t *testing.T) {
	e := newEnv(t, envOptions{fake: fakeOptions{http1Only: true}})
	c := e.client(nil)
	r := e.do(c, "GET", "/api/v1/namespaces/default/configmaps", nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "connection_failure") {
		t.Fatalf("status %d, want the 503 of UF: %s", r.status, r.body)
	}
	if n := e.stat("cluster.kube-apiservers.upstream_cx_connect_fail"); n == 0 {
		t.Errorf("no upstream_cx_connect_fail")
	}
	for name, f := range e.apiservers {
		if n := len(f.requests()); n != 0 {
			t.Errorf("%s got %d requests", name, n)
		}
	}
}

// TestH2IdleTimeout: the cluster's idle_timeout closes an HTTP/2 connection that had no
// stream for that long (Envoy's CodecClient idle timer), and the next request opens a new one.
func TestH2IdleTimeout(t *testing.T) {
	e := newEnv(t, envOptions{
		editResources: h2Config{idle: 300 * time.Millisecond}.edit})
	c := e.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	r := e.do(c, "GET", path, nil)
	if r.status != 200 || r.seen.Proto != "HTTP/2.0" {
		t.Fatalf("status %d over %q: %s", r.status, r.seen.Proto, r.body)
	}
	f := e.apiservers[r.seen.Server]
	conns := f.servedConns()
	if len(conns) != 1 {
		t.Fatalf("%d connections, want 1", len(conns))
	}
	f.waitClosed(t, conns[0], "the idle HTTP/2 connection")
	before := e.stat("cluster.kube-apiservers.upstream_cx_total")
	if r := e.do(c, "GET", path, nil); r.status != 200 {
		t.Fatalf("after the idle close: status %d: %s", r.status, r.body)
	}
	if e.stat("cluster.kube-apiservers.upstream_cx_total") == before {
		t.Errorf("no new connection after the idle one closed")
	}
}

// upgrade sends an HTTP/1.1 upgrade of type typ to the data plane and returns the response
// and the connection.
func upgrade(t *testing.T, e *env, typ string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.servingCA.Cert)
	conn, err := tls.Dial("tcp", e.dp.ListenerAddr("kube-apiserver"), &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET /api/v1/namespaces/default/pods/p/exec?command=sh HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: %s\r\nAuthorization: Bearer %s\r\n\r\n", typ, testToken)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, conn, br
}

// TestH2Upgrade: an upgrade routed to an HTTP/2 cluster goes out as Envoy's HTTP/2 codec
// sends it, an extended CONNECT; an apiserver without RFC 8441 (Go's default) cannot take it
// and the client gets Envoy's 503 for a remote reset (UR), the apiserver seeing no upgrade.
// Over an HTTP/1.1 cluster with ALPN http/1.1 the same apiservers (which also offer h2)
// upgrade as before.
func TestH2Upgrade(t *testing.T) {
	t.Run("http2-cluster", func(t *testing.T) {
		e := newEnv(t, envOptions{editResources: h2Config{noUpgradeRoutes: true}.edit})
		for _, typ := range []string{"SPDY/3.1", "websocket"} {
			resp, _, _ := upgrade(t, e, typ)
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "remote_reset") {
				t.Errorf("%s: status %d, want the 503 of a remote reset: %s", typ, resp.StatusCode, body)
			}
		}
		for name, f := range e.apiservers {
			if n := len(f.requests()); n != 0 {
				t.Errorf("%s saw %d requests", name, n)
			}
		}
	})
	t.Run("http1-cluster", func(t *testing.T) {
		e := newEnv(t, envOptions{}) // the product's: upgrade variants to the HTTP/1.1 clusters
		for _, typ := range []string{"SPDY/3.1", "websocket"} {
			resp, conn, br := upgrade(t, e, typ)
			if resp.StatusCode != 101 {
				t.Fatalf("%s: status %d", typ, resp.StatusCode)
			}
			server := resp.Header.Get("X-Served-By")
			_, _ = io.WriteString(conn, "hello\n")
			if got := readLine(br); got != server+":hello\n" {
				t.Errorf("%s: echo %q", typ, got)
			}
		}
		for name, f := range e.apiservers {
			for _, r := range f.requests() {
				if r.Proto != "HTTP/1.1" {
					t.Errorf("%s got %s over %s", name, r.Path, r.Proto)
				}
			}
		}
	})
}

// freezeProxy is a TCP proxy in front of an apiserver whose freeze stops the connections it
// carries at that moment in both directions, keeping them open, as a SIGSTOPped apiserver
// (or a dead path) does; connections made afterwards pass.
type freezeProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []*proxiedConn
}

type proxiedConn struct {
	frozen chan struct{} // closed when frozen
	once   sync.Once
	a, b   net.Conn
}

func newFreezeProxy(t testing.TB, target string) *freezeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.a.Close()
			c.b.Close()
		}
	})
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			c := &proxiedConn{frozen: make(chan struct{}), a: a, b: b}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			go c.pipe(a, b)
			go c.pipe(b, a)
		}
	}()
	return p
}

func (c *proxiedConn) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-c.frozen:
			select {} // frozen: nothing more moves (the connections stay open until cleanup)
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *freezeProxy) addr() string { return p.ln.Addr().String() }

// freeze stops every connection the proxy carries now.
func (p *freezeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.once.Do(func() { close(c.frozen) })
	}
}

// TestH2KeepaliveFrozenUpstream: connection_keepalive detects apiservers that stopped
// answering with their connections open (SIGSTOP). Within interval (+ jitter) + timeout of
// the freeze the data plane closes each frozen connection (http2.keepalive_timeout): a watch
// streaming on it is cut off (the client sees a broken stream, Envoy resets the downstream
// stream), a GET waiting on it is reset (UC) and retried by its route (retry_on reset, the
// read variant) on a new connection, a POST waiting on it is not retried (no reset in its
// retry_on): 503 UC. While the apiservers answer, PINGs are ACKed and nothing closes.
// Without the keepalive all three would wait for the apiserver indefinitely.
func TestH2KeepaliveFrozenUpstream(t *testing.T) {
	// A timeout long enough that the GET and POST sent just after the freeze are on the
	// frozen connection before it closes, and that a PING ACK delayed by a busy machine
	// closes nothing while the apiservers answer.
	const interval, timeout = 300 * time.Millisecond, 2 * time.Second
	// Only cp-a, behind a proxy that can freeze it, is a host: with several hosts all frozen
	// at once, their keepalive timeouts fire together and a GET's three attempts can each
	// meet a frozen connection just before it closes (a 503 real Envoy would give too).
	// With one host the GET's retry can only go to a new connection.
	var frozen *freezeProxy
	onlyFrozen := func(res *snapshot.Resources) error {
		if err := (h2Config{keepalive: keepalive(interval, timeout)}).edit(res); err != nil {
			return err
		}
		return onlyEndpoint(res, frozen.addr())
	}
	e := newEnv(t, envOptions{tick: 50 * time.Millisecond, ticks: 100000,
		front: func(_ *pki, name, addr string) string {
			if name != "cp-a" {
				return addr
			}
			frozen = newFreezeProxy(t, addr)
			return frozen.addr()
		},
		editResources: onlyFrozen})
	c := e.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	const ka = "cluster.kube-apiservers.http2.keepalive_timeout"
	if servers, _ := e.spread(c, path, 10); len(servers) != 1 || servers["cp-a"] == 0 {
		t.Fatalf("warm-up reached %v, want cp-a only", servers)
	}
	// A watch, streaming.
	req, _ := http.NewRequest("GET", e.base+path+"?watch=true", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("watch: %v", err)
	}
	// Answering apiservers: several keepalive rounds, nothing closes.
	time.Sleep(4 * interval)
	if n := e.stat(ka); n != 0 {
		t.Fatalf("keepalive_timeout %d while the apiservers answer", n)
	}
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("watch after keepalive rounds: %v", err)
	}
	retriesBefore := e.stat("cluster.kube-apiservers.upstream_rq_retry")
	frozen.freeze()
	frozeAt := time.Now()
	type result struct {
		r       reply
		elapsed time.Duration
	}
	get, post := make(chan result, 1), make(chan result, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	send := func(method string, out chan result) {
		req, _ := http.NewRequestWithContext(ctx, method, e.base+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			out <- result{r: reply{status: -1, body: []byte(err.Error())}, elapsed: time.Since(frozeAt)}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- result{r: reply{status: resp.StatusCode, body: b}, elapsed: time.Since(frozeAt)}
	}
	go send("GET", get)
	go send("POST", post)
	// The watch ends with an error, not EOF.
	watchEnd := make(chan error, 1)
	go func() {
		for {
			if _, err := br.ReadString('\n'); err != nil {
				watchEnd <- err
				return
			}
		}
	}()
	limit := interval*115/100 + timeout + 2*time.Second // slack for a busy machine
	select {
	case err := <-watchEnd:
		if err == io.EOF {
			t.Errorf("watch ended cleanly, want a broken stream")
		}
		if d := time.Since(frozeAt); d > limit {
			t.Errorf("watch cut after %v, want within %v", d, limit)
		}
	case <-ctx.Done():
		t.Fatal("the watch on the frozen connection never ended")
	}
	g, p := <-get, <-post
	if g.r.status != 200 || g.elapsed > limit {
		t.Errorf("GET: status %d after %v, want 200 (retried) within %v: %s", g.r.status, g.elapsed, limit, g.r.body)
	}
	if p.r.status != http.StatusServiceUnavailable || !strings.Contains(string(p.r.body), "connection_termination") || p.elapsed > limit {
		t.Errorf("POST: status %d after %v, want the 503 of a UC within %v: %s", p.r.status, p.elapsed, limit, p.r.body)
	}
	if n := e.stat(ka); n == 0 {
		t.Errorf("no http2.keepalive_timeout counted")
	}
	// The GET's retry only: the POST got its 503 above, which a retry would have replaced.
	if n := e.stat("cluster.kube-apiservers.upstream_rq_retry") - retriesBefore; n != 1 {
		t.Errorf("upstream_rq_retry +%d, want 1 (the GET's)", n)
	}
}

// TestH2ConfigNACK: the HTTP/2 clusters the product will generate are accepted; anything of
// http2_protocol_options beyond connection_keepalive's interval, timeout and
// interval_jitter, max_concurrent_streams and the two windows is rejected, connection_idle_interval included, and a keepalive without
// its required timeout too.
func TestH2ConfigNACK(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*corev3.Http2ProtocolOptions)
		want   string // "" accepted
	}{
		{"product", nil, ""},
		{"interval_jitter", func(o *corev3.Http2ProtocolOptions) {
			o.ConnectionKeepalive.IntervalJitter = &typev3.Percent{Value: 5}
		}, ""},
		{"connection_idle_interval", func(o *corev3.Http2ProtocolOptions) {
			o.ConnectionKeepalive.ConnectionIdleInterval = durationpb.New(time.Minute)
		}, "field explicit_http_config.http2_protocol_options.connection_keepalive.connection_idle_interval is not implemented"},
		{"max_concurrent_streams and windows", func(o *corev3.Http2ProtocolOptions) {
			o.MaxConcurrentStreams = wrapperspb.UInt32(10)
			o.InitialStreamWindowSize = wrapperspb.UInt32(65535)
			o.InitialConnectionWindowSize = wrapperspb.UInt32(10 * 65535)
		}, ""},
		{"hpack_table_size", func(o *corev3.Http2ProtocolOptions) {
			o.HpackTableSize = wrapperspb.UInt32(0)
		}, "field explicit_http_config.http2_protocol_options.hpack_table_size is not implemented"},
		{"allow_connect", func(o *corev3.Http2ProtocolOptions) {
			o.AllowConnect = true
		}, "field explicit_http_config.http2_protocol_options.allow_connect is not implemented"},
		{"keepalive without timeout", func(o *corev3.Http2ProtocolOptions) {
			o.ConnectionKeepalive.Timeout = nil
		}, "KeepaliveSettings.Timeout: value is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := buildResources(t, "batch-off")
			if err := (h2Config{keepalive: keepalive(10*time.Second, 5*time.Second), mutate: tc.mutate}).edit(res); err != nil {
				t.Fatal(err)
			}
			js, err := res.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			nacks := startConfig(t, js).NACKs()
			switch {
			case tc.want == "" && len(nacks) != 0:
				t.Fatalf("NACKs %q, want none", nacks)
			case tc.want != "" && (len(nacks) != 1 || !strings.Contains(nacks[0], tc.want)):
				t.Fatalf("NACKs %q, want one containing %q", nacks, tc.want)
			}
		})
	}
}

// TestH2HealthCheckALPN: Envoy's HTTP health checker speaks HTTP/1.1 (codec_client_type's
// default) over a connection of the cluster's transport socket, which offers the cluster's
// ALPN unless health_checks.tls_options.alpn_protocols overrides it. With ALPN h2 and no
// override, an apiserver offering h2 (every real one) negotiates h2 and fails the HTTP/1.1
// check: every apiserver is unhealthy and every request gets 503 UH. With the override
// [http/1.1] the checks pass and requests go over HTTP/2.
func TestH2HealthCheckALPN(t *testing.T) {
	for _, plain := range []bool{true, false} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			e := newEnv(t, envOptions{editResources: h2Config{plainHealthChecks: plain}.edit})
			c := e.client(nil)
			if plain {
				testutil.WaitFor(t, t.Context(), 10*time.Second, "health checks failed", func() error {
					if n := e.stat("cluster.kube-apiservers.health_check.network_failure"); n < uint64(len(e.apiservers)) {
						return fmt.Errorf("%d network failures", n)
					}
					return nil
				})
			}
			r := e.do(c, "GET", "/api/v1/namespaces/default/configmaps", nil)
			switch {
			case plain && (r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "no_healthy_upstream")):
				t.Errorf("status %d, want the 503 of UH: %s", r.status, r.body)
			case !plain && (r.status != 200 || r.seen.Proto != "HTTP/2.0"):
				t.Errorf("status %d over %q, want 200 over HTTP/2: %s", r.status, r.seen.Proto, r.body)
			}
		})
	}
}

// onlyEndpoint leaves addr the one host of every cluster (the others' endpoints are dropped).
func onlyEndpoint(res *snapshot.Resources, addr string) error {
	found := false
	for i, r := range res.Endpoints {
		cla := proto.Clone(r.(*endpointv3.ClusterLoadAssignment)).(*endpointv3.ClusterLoadAssignment)
		for _, l := range cla.GetEndpoints() {
			l.LbEndpoints = slices.DeleteFunc(l.LbEndpoints, func(ep *endpointv3.LbEndpoint) bool {
				sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
				keep := net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue())) == addr
				found = found || keep
				return !keep
			})
		}
		res.Endpoints[i] = cla
	}
	if !found {
		return fmt.Errorf("no endpoint has address %s", addr)
	}
	return nil
}
