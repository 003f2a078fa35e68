package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestDrainManagerGradual: DrainManagerImpl::drainClose's gradual strategy with an injected
// clock and random source: false before the drain; true when the whole seconds elapsed
// exceed random % drain seconds; true once the deadline passed; true with a drain time of
// 0; the immediate strategy always true once draining.
func TestDrainManagerGradual(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	var rnd uint64
	m := newDrainManager(DrainOptions{Time: 10 * time.Second, Strategy: DrainGradual})
	m.now = func() time.Time { return now }
	m.random = func() uint64 { return rnd }
	if m.drainClose() || m.isDraining() {
		t.Fatal("drainClose before the drain")
	}
	done := make(chan struct{})
	m.startDrainSequence(func() { close(done) })
	defer m.stop()
	for _, c := range []struct {
		at   time.Duration
		rnd  uint64
		want bool
	}{
		{0, 0, false},                     // elapsed 0 > 0: false
		{500 * time.Millisecond, 0, true}, // remaining 9.5 s truncates to 9: elapsed 1 > 0
		{time.Second, 0, true},            // elapsed 1 > 0
		{time.Second, 1, false},           // elapsed 1 > 1: false
		{3 * time.Second, 12, true},       // 12 % 10 = 2 < 3
		{3 * time.Second, 13, false},      // 13 % 10 = 3
		{9 * time.Second, 9, false},       // elapsed 9 > 9: false
		{10 * time.Second, 9, true},       // the deadline
		{time.Hour, 9, true},
	} {
		now, rnd = start.Add(c.at), c.rnd
		if got := m.drainClose(); got != c.want {
			t.Errorf("at %v, random %d: drainClose %v, want %v", c.at, c.rnd, got, c.want)
		}
	}
	// The completion runs on the real timer after the drain time; not waited for here.

	zero := newDrainManager(DrainOptions{Time: 0, Strategy: DrainGradual})
	zero.random = func() uint64 { return 5 }
	ran := make(chan struct{})
	zero.startDrainSequence(func() { close(ran) })
	if !zero.drainClose() {
		t.Error("drain time 0: drainClose false")
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Error("drain time 0: completion did not run")
	}
	// A second sequence after the first completed: its callback runs at once.
	again := make(chan struct{})
	zero.startDrainSequence(func() { close(again) })
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Error("completion callback of a finished sequence did not run")
	}

	imm := newDrainManager(DrainOptions{Time: time.Hour, Strategy: DrainImmediate})
	if imm.drainClose() {
		t.Error("immediate: drainClose before the drain")
	}
	imm.startDrainSequence(func() {})
	defer imm.stop()
	if !imm.drainClose() {
		t.Error("immediate: drainClose false while draining")
	}
}

// h1Conn is a raw HTTP/1.1 (ALPN http/1.1) keep-alive connection to the listener.
type h1Conn struct {
	t  *testing.T
	c  *tls.Conn
	br *bufio.Reader
}

func (e *env) tlsConfig(protos ...string) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.servingCA.Cert)
	return &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: protos}
}

func dialH1(t *testing.T, e *env) (*h1Conn, error) {
	c, err := tls.Dial("tcp", e.dp.ListenerAddr("kube-apiserver"), e.tlsConfig("http/1.1"))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return &h1Conn{t: t, c: c, br: bufio.NewReader(c)}, nil
}

// get sends a GET of path and reads the whole response.
func (h *h1Conn) get(path string) (*http.Response, error) {
	fmt.Fprintf(h.c, "GET %s HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\n\r\n", path, testToken)
	res, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res, err
}

// closedByPeer: the connection reads EOF (or a reset) within the bound.
func (h *h1Conn) closedByPeer() error {
	_ = h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := h.br.ReadByte()
	if err == nil {
		return errors.New("read a byte, want the connection closed")
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errors.New("the connection is still open")
	}
	return nil
}

// silent: nothing arrives on the connection for a while (it is neither written to nor
// closed). A bounded negative check.
func (h *h1Conn) silent(d time.Duration) error {
	_ = h.c.SetReadDeadline(time.Now().Add(d))
	defer h.c.SetReadDeadline(time.Time{})
	_, err := h.br.Peek(1)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	return fmt.Errorf("the connection got something: %v", err)
}

const configmaps = "/api/v1/namespaces/default/configmaps"

// TestDrainHTTP1: after POST /drain_listeners?graceful with the immediate strategy, a
// keep-alive HTTP/1.1 connection's next response carries "Connection: close" and the
// connection closes after it (downstream_cx_drain_close); a connection idle through the drain
// gets nothing: not closed, still served, after the listeners stopped; the data plane's
// close (SIGTERM) cuts it.
func TestDrainHTTP1(t *testing.T) {
	e := newEnv(t, envOptions{drain: &DrainOptions{Time: time.Second, Strategy: DrainImmediate}})
	busy, err := dialH1(t, e)
	must(t, err)
	idle, err := dialH1(t, e)
	must(t, err)
	last, err := dialH1(t, e)
	must(t, err)
	for _, h := range []*h1Conn{busy, idle, last} {
		res, err := h.get(configmaps)
		if err != nil || res.StatusCode != 200 || res.Close {
			t.Fatalf("before the drain: %v %v", res, err)
		}
	}
	if code, body := adminDo(t, e, "POST", "/drain_listeners?graceful"); code != 200 || body != "OK\n" {
		t.Fatalf("drain: %d %q", code, body)
	}
	res, err := busy.get(configmaps)
	if err != nil || res.StatusCode != 200 || !res.Close {
		t.Fatalf("first response in the drain: %v %v", res, err)
	}
	if err := busy.closedByPeer(); err != nil {
		t.Error(err)
	}
	if n := e.stat(hcmPrefix + "downstream_cx_drain_close"); n != 1 {
		t.Errorf("downstream_cx_drain_close %d, want 1", n)
	}
	// Already draining: OK and nothing else.
	if code, body := adminDo(t, e, "POST", "/drain_listeners?graceful"); code != 200 || body != "OK\n" {
		t.Errorf("second drain: %d %q", code, body)
	}

	// The idle connection: no notification (v1.36), through the drain time and the stop.
	testutil.WaitFor(t, t.Context(), 20*time.Second, "the listeners stopped", func() error {
		if e.stat("listener_manager.listener_stopped") == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	if err := idle.silent(300 * time.Millisecond); err != nil {
		t.Errorf("idle connection: %v", err)
	}
	res, err = idle.get(configmaps)
	if err != nil || res.StatusCode != 200 || !res.Close {
		t.Errorf("idle connection's request after the stop: %v %v", res, err)
	}
	if err := idle.closedByPeer(); err != nil {
		t.Error(err)
	}

	// SIGTERM (the stand-in closes the data plane, as Envoy's RunHelper signal handler
	// shuts the server down at once): an open connection is cut.
	must(t, e.dp.Close())
	if err := last.closedByPeer(); err != nil {
		t.Errorf("after the close: %v", err)
	}
}

// TestDrainStopListeners: during the drain time the listener keeps accepting (a connection
// made then is served after the stop); after it, a new connection is refused; the admin
// still answers. With skip_exit the listener keeps accepting after the drain time. Without
// graceful, the listeners stop at once and no connection is drained (v1.36); skip_exit
// needs graceful.
func TestDrainStopListeners(t *testing.T) {
	t.Run("graceful", func(t *testing.T) {
		e := newEnv(t, envOptions{drain: &DrainOptions{Time: 2 * time.Second, Strategy: DrainImmediate}})
		if code, _ := adminDo(t, e, "POST", "/drain_listeners?graceful"); code != 200 {
			t.Fatalf("drain: %d", code)
		}
		during, err := dialH1(t, e)
		if err != nil {
			t.Fatalf("a connection during the drain time: %v", err)
		}
		if e.stat("listener_manager.listener_stopped") != 0 {
			t.Fatal("the listeners stopped before the connection was made: the drain time is too short for this machine")
		}
		refused(t, e)
		res, err := during.get(configmaps)
		if err != nil || res.StatusCode != 200 {
			t.Errorf("connection accepted in the drain time, after the stop: %v %v", res, err)
		}
		if code, _ := adminDo(t, e, "GET", "/ready"); code != 200 {
			t.Errorf("admin /ready after the stop: %d", code)
		}
	})
	t.Run("skip_exit", func(t *testing.T) {
		e := newEnv(t, envOptions{drain: &DrainOptions{Time: 0, Strategy: DrainImmediate}})
		if code, _ := adminDo(t, e, "POST", "/drain_listeners?graceful&skip_exit"); code != 200 {
			t.Fatalf("drain: %d", code)
		}
		testutil.WaitFor(t, t.Context(), 10*time.Second, "the drain sequence completed", func() error {
			e.dp.drain.mu.Lock()
			defer e.dp.drain.mu.Unlock()
			if e.dp.drain.timer != nil {
				return errors.New("drain timer pending")
			}
			return nil
		})
		h, err := dialH1(t, e)
		if err != nil {
			t.Fatalf("skip_exit: a new connection after the drain time: %v", err)
		}
		if res, err := h.get(configmaps); err != nil || res.StatusCode != 200 || !res.Close {
			t.Errorf("skip_exit: %v %v", res, err)
		}
		if n := e.stat("listener_manager.listener_stopped"); n != 0 {
			t.Errorf("listener_stopped %d with skip_exit", n)
		}
	})
	t.Run("not graceful", func(t *testing.T) {
		e := newEnv(t, envOptions{drain: &DrainOptions{Time: time.Hour, Strategy: DrainImmediate}})
		h, err := dialH1(t, e)
		must(t, err)
		if code, body := adminDo(t, e, "POST", "/drain_listeners?skip_exit"); code != 400 || body != "skip_exit requires graceful\n" {
			t.Errorf("skip_exit without graceful: %d %q", code, body)
		}
		if code, body := adminDo(t, e, "POST", "/drain_listeners?graceful&inboundonly"); code != 400 || !strings.Contains(body, "inboundonly") {
			t.Errorf("inboundonly: %d %q", code, body)
		}
		if code, body := adminDo(t, e, "POST", "/drain_listeners"); code != 200 || body != "OK\n" {
			t.Fatalf("drain: %d %q", code, body)
		}
		refusedNow(t, e)
		res, err := h.get(configmaps)
		if err != nil || res.StatusCode != 200 || res.Close {
			t.Errorf("accepted connection after a non-graceful stop: %v %v (want served, not drained)", res, err)
		}
		if e.dp.drain.isDraining() {
			t.Error("a non-graceful drain started the drain sequence")
		}
	})
}

// refused waits (bounded) until the listeners stopped, then checks that a new connection to
// the listener is refused.
func refused(t *testing.T, e *env) {
	t.Helper()
	testutil.WaitFor(t, t.Context(), 20*time.Second, "the listeners stopped", func() error {
		if e.stat("listener_manager.listener_stopped") == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	refusedNow(t, e)
}

func refusedNow(t *testing.T, e *env) {
	t.Helper()
	c, err := net.DialTimeout("tcp", e.dp.ListenerAddr("kube-apiserver"), 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("a new connection was accepted after the stop")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial: %v, want connection refused", err)
	}
}

// TestDrainHTTP2: an HTTP/2 connection carrying a watch (headers out before the drain) gets
// a GOAWAY with its next response; the watch runs to its end on it; later requests go on a
// new connection; every drained connection closes once its streams ended. The request gauge
// follows the watch. An idle HTTP/2 connection gets no GOAWAY.
func TestDrainHTTP2(t *testing.T) {
	const events = 3
	step := make(chan struct{})
	e := newEnv(t, envOptions{tick: time.Second, ticks: events, fake: fakeOptions{watchStep: step},
		drain: &DrainOptions{Time: time.Hour, Strategy: DrainImmediate}})
	var dials atomic.Int32
	tr := &http2.Transport{TLSClientConfig: e.tlsConfig("h2"), DialTLSContext: func(ctx context.Context, network, addr string, cfg *tls.Config) (net.Conn, error) {
		dials.Add(1)
		return (&tls.Dialer{Config: cfg}).DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: bearer{tr}}

	// An idle HTTP/2 connection, used once before the drain.
	idleRaw, err := tls.Dial("tcp", e.dp.ListenerAddr("kube-apiserver"), e.tlsConfig("h2"))
	must(t, err)
	t.Cleanup(func() { idleRaw.Close() })
	idle, err := (&http2.Transport{}).NewClientConn(idleRaw)
	must(t, err)
	req, _ := http.NewRequest("GET", e.base+configmaps, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	if res, err := idle.RoundTrip(req); err != nil || res.StatusCode != 200 {
		t.Fatalf("idle connection's request: %v %v", res, err)
	} else {
		res.Body.Close()
	}

	watch, err := c.Get(e.base + "/api/v1/pods?watch=true")
	if err != nil || watch.StatusCode != 200 {
		t.Fatalf("watch: %v %v", watch, err)
	}
	defer watch.Body.Close()
	testutil.WaitFor(t, t.Context(), 10*time.Second, "the watch counted active", func() error {
		if n := e.dp.Gauge(hcmPrefix + "downstream_rq_active"); n != 1 {
			return fmt.Errorf("downstream_rq_active %d", n)
		}
		return nil
	})

	if code, _ := adminDo(t, e, "POST", "/drain_listeners?graceful"); code != 200 {
		t.Fatalf("drain: %d", code)
	}
	// The next response on the watch's connection: served, and a GOAWAY after it.
	res, err := c.Get(e.base + configmaps)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("request in the drain: %v %v", res, err)
	}
	res.Body.Close()
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections before the GOAWAY, want 1", n)
	}
	testutil.WaitFor(t, t.Context(), 10*time.Second, "a request on a new connection", func() error {
		res, err := c.Get(e.base + configmaps)
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		if dials.Load() < 2 {
			return errors.New("still on the first connection")
		}
		return nil
	})
	if n := e.stat(hcmPrefix + "downstream_cx_drain_close"); n < 2 {
		t.Errorf("downstream_cx_drain_close %d, want at least 2 (both connections)", n)
	}

	// The watch, on the draining connection, runs to its end.
	br := bufio.NewReader(watch.Body)
	for i := range events {
		select {
		case step <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d: the fake apiserver's watch went away", i)
		}
		line, err := br.ReadString('\n')
		if err != nil || !strings.Contains(line, fmt.Sprintf(`"n":%d`, i)) {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Errorf("the watch did not end cleanly: %v", err)
	}
	testutil.WaitFor(t, t.Context(), 10*time.Second, "no request active", func() error {
		if n := e.dp.Gauge(hcmPrefix + "downstream_rq_active"); n != 0 {
			return fmt.Errorf("downstream_rq_active %d", n)
		}
		return nil
	})
	// Every drained connection closes once its streams ended; the idle one stays.
	testutil.WaitFor(t, t.Context(), 20*time.Second, "the drained connections closed", func() error {
		if n := e.dp.Gauge(hcmPrefix + "downstream_cx_active"); n != 1 {
			return fmt.Errorf("downstream_cx_active %d, want 1 (the idle connection)", n)
		}
		return nil
	})
	if st := idle.State(); st.Closing || st.Closed {
		t.Errorf("the idle connection got a GOAWAY or closed: %+v", st)
	}
	// Its next request is its first response in the drain: served, and then the GOAWAY.
	req, _ = http.NewRequest("GET", e.base+configmaps, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	if res, err := idle.RoundTrip(req); err != nil || res.StatusCode != 200 {
		t.Fatalf("idle connection's request in the drain: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	testutil.WaitFor(t, t.Context(), 10*time.Second, "the GOAWAY on the idle connection", func() error {
		if !idle.State().Closing {
			return errors.New("no GOAWAY yet")
		}
		return nil
	})
}

// TestDrainAdminGET: GET /drain_listeners is refused as Envoy's admin refuses a GET of a
// mutating handler, and starts nothing.
func TestDrainAdminGET(t *testing.T) {
	e := newEnv(t, envOptions{})
	if code, body := adminDo(t, e, "GET", "/drain_listeners?graceful"); code != http.StatusMethodNotAllowed || body != "Method GET not allowed, POST required." {
		t.Errorf("GET /drain_listeners: %d %q", code, body)
	}
	if e.dp.drain.isDraining() {
		t.Error("GET /drain_listeners started a drain")
	}
}
