package dataplane

import (
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Graceful drain, Envoy v1.36 semantics (DRAIN.md): the server's drain manager, the HTTP
// connection manager's drain on each response, and the listeners' stop.

// DrainStrategy is Envoy's --drain-strategy (Server::DrainStrategy).
type DrainStrategy int

const (
	// DrainGradual: once draining, a connection is drain-closed with a probability that
	// grows with the time elapsed over the drain time (Envoy's default).
	DrainGradual DrainStrategy = iota
	// DrainImmediate: once draining, every connection is drain-closed.
	DrainImmediate
)

func (s DrainStrategy) String() string {
	if s == DrainImmediate {
		return "immediate"
	}
	return "gradual"
}

// DrainOptions are Envoy's --drain-time-s and --drain-strategy.
type DrainOptions struct {
	Time     time.Duration // --drain-time-s (Envoy: whole seconds; default 600 s)
	Strategy DrainStrategy // --drain-strategy (default gradual)
}

// defaultDrainTime is --drain-time-s's default (source/server/options_impl.cc: OptionsImpl).
const defaultDrainTime = 600 * time.Second

// drainManager is Envoy's server-wide DrainManagerImpl (source/server/drain_manager_impl.cc)
// as v1.36 uses it: every connection manager polls drainClose() when it encodes response
// headers; nothing is pushed to connections (see downConn).
type drainManager struct {
	drainTime time.Duration
	strategy  DrainStrategy
	now       func() time.Time
	random    func() uint64

	mu       sync.Mutex
	draining bool
	deadline time.Time
	timer    *time.Timer
	pending  []func() // completion callbacks not yet run
}

func newDrainManager(o DrainOptions) *drainManager {
	return &drainManager{drainTime: o.Time, strategy: o.Strategy, now: time.Now, random: rand.Uint64}
}

// isDraining is DrainManagerImpl::draining.
func (m *drainManager) isDraining() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.draining
}

// drainClose is DrainManagerImpl::drainClose (drain_manager_impl.cc): false unless draining
// (the health-check-failed case, /healthcheck/fail, is not modelled: the stand-in has no
// such endpoint); immediate strategy: true; gradual: true once the deadline passed or with a
// drain time of 0, else true when the whole seconds elapsed exceed random % drain seconds,
// so with probability elapsed/drain time. Envoy computes the remaining time truncated to
// seconds and the elapsed time as the drain time minus that; so does this.
func (m *drainManager) drainClose() bool {
	m.mu.Lock()
	draining, deadline := m.draining, m.deadline
	m.mu.Unlock()
	if !draining {
		return false
	}
	if m.strategy == DrainImmediate {
		return true
	}
	now := m.now()
	if !now.Before(deadline) {
		return true
	}
	drainSecs := int64(m.drainTime / time.Second)
	if drainSecs == 0 {
		return true
	}
	remaining := int64(deadline.Sub(now) / time.Second)
	elapsed := drainSecs - remaining
	return uint64(elapsed) > m.random()%uint64(drainSecs)
}

// startDrainSequence is DrainManagerImpl::startDrainSequence: draining from now on, with the
// deadline now + drain time, when done runs (on a timer). Called again while draining, done
// joins the callbacks of the running sequence (at once if its timer already fired), as
// addDrainCompleteCallback does.
func (m *drainManager) startDrainSequence(done func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.draining {
		if m.timer == nil {
			go done()
			return
		}
		m.pending = append(m.pending, done)
		return
	}
	m.draining = true
	m.deadline = m.now().Add(m.drainTime)
	m.pending = append(m.pending, done)
	m.timer = time.AfterFunc(m.drainTime, func() {
		m.mu.Lock()
		cbs := m.pending
		m.pending, m.timer = nil, nil
		m.mu.Unlock()
		for _, cb := range cbs {
			cb()
		}
	})
}

// stop cancels a pending completion (the data plane is closing).
func (m *drainManager) stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.timer != nil {
		m.timer.Stop()
		m.timer = nil
	}
	m.pending = nil
}

// downConn is a downstream connection's connection-manager state: whether it is draining
// (Envoy's ConnectionManagerImpl::drain_state_ left NotDraining). One per accepted
// connection (http.Server.ConnContext), HTTP/1.1 and HTTP/2 alike (serveH2 passes the
// connection's context on to x/net/http2).
//
// Deliberately pessimistic, as v1.36: a connection learns of a drain only when it encodes
// response headers (ConnectionManagerImpl::ActiveStream::encodeHeaders polls
// drainClose()). A connection that sends no response during the drain — an idle
// keep-alive connection, or an HTTP/2 connection whose only stream is a watch whose headers
// went out before the drain — gets no GOAWAY and no close: it stays open until the process
// exits. The push notification to every connection (ListenerManagerImpl::onServerDrainStart)
// exists only in Envoy's newest main, not in v1.36, and is not modelled.
type downConn struct {
	draining atomic.Bool
}

type downConnKey struct{}

func downConnOf(ctx context.Context) *downConn {
	dc, _ := ctx.Value(downConnKey{}).(*downConn)
	return dc
}

// connContext is an http.Server's ConnContext: a fresh downConn per connection.
func connContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, downConnKey{}, &downConn{})
}

// drainWriter applies ConnectionManagerImpl::ActiveStream::encodeHeaders' drain step
// (source/common/http/conn_manager_impl.cc) to a response's headers, just before they are
// written: a connection starts draining when the drain manager's drainClose() is true, and
// every response on a draining connection carries "Connection: close" (over HTTP/2, x/net's
// graceful shutdown: one GOAWAY). Upgrade responses (101) are written by hijacking the
// connection (stream.tunnel), not through here: they take no drain decision (Envoy's does,
// counting downstream_cx_drain_close, with no effect on the tunnel).
// Envoy's steps and where Go differs: test/dataplane/DRAIN.md#connection-manager-on-each-response.
type drainWriter struct {
	http.ResponseWriter
	d       *DataPlane
	dc      *downConn
	prefix  string
	r       *http.Request
	written bool
}

func (w *drainWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *drainWriter) beforeHeaders(status int) {
	if w.written || status < 200 {
		return
	}
	w.written = true
	if !w.dc.draining.Load() && w.d.drain.drainClose() && w.dc.draining.CompareAndSwap(false, true) {
		w.d.stats.inc(w.prefix + "downstream_cx_drain_close")
		w.d.log.Debug("drain closing connection", "remote", w.r.RemoteAddr, "proto", w.r.Proto)
	}
	if !w.dc.draining.Load() {
		return
	}
	if w.r.ProtoMajor == 1 && (status == http.StatusSwitchingProtocols || w.r.Method == http.MethodConnect) {
		return
	}
	w.ResponseWriter.Header().Set("Connection", "close")
}

func (w *drainWriter) WriteHeader(status int) {
	w.beforeHeaders(status)
	w.ResponseWriter.WriteHeader(status)
}

func (w *drainWriter) Write(b []byte) (int, error) {
	w.beforeHeaders(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// FlushError flushes, writing the headers (200) first if none were written, as Go's
// ResponseWriter does.
func (w *drainWriter) FlushError() error {
	w.beforeHeaders(http.StatusOK)
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// stopListeners is ListenerManagerImpl::stopListeners
// (source/common/listener_manager/listener_manager_impl.cc) for StopListenersType::All: each
// listener stops accepting and its listening socket is closed ("so that clients fast fail
// instead of waiting in the accept queue": a new connection is refused), counted in
// listener_manager.listener_stopped; connections already accepted stay open and are served
// on. The static health listener is one of them; the admin is not (Envoy's admin listener is
// not the listener manager's). A listener added or rebound by a later LDS update is not
// bound (Envoy does not add listeners once they are stopped).
func (d *DataPlane) stopListeners() {
	d.mu.Lock()
	if d.listenersStopped || d.closed {
		d.mu.Unlock()
		return
	}
	d.listenersStopped = true
	var lns []net.Listener
	for _, l := range d.listeners {
		lns = append(lns, l.ln)
	}
	if d.healthLn != nil {
		lns = append(lns, d.healthLn)
	}
	d.mu.Unlock()
	for _, ln := range lns {
		_ = ln.Close()
		d.stats.inc("listener_manager.listener_stopped")
	}
	d.log.Info("listeners stopped")
}
