package dataplane

import (
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// h2Keepalive is http2_protocol_options.connection_keepalive.
type h2Keepalive struct {
	interval, timeout time.Duration
	jitterPercent     float64 // interval_jitter, Envoy's default 15%
}

// h2Pool is the connection pool of a cluster whose explicit_http_config is
// http2_protocol_options: Envoy's multiplexed HTTP/2 pool (source/common/http/http2/
// conn_pool.cc on source/common/conn_pool/conn_pool_base.cc). Per host it keeps connections
// and hands each stream one that has room for it; a new connection is opened only when no
// connection (the one being established included: its streams wait for it) has room, so many
// concurrent requests share one connection until the server's SETTINGS_MAX_CONCURRENT_STREAMS
// is reached (Envoy: ActiveClient's concurrent stream limit is the min of
// max_concurrent_streams and the peer's setting, and ConnPoolImplBase::shouldCreateNewConnection
// counts the streams the connections can still take).
//
// Every connection is one http2.ClientConn (Transport.NewClientConn) used through
// ClientConn.RoundTrip only: unlike http2.Transport.RoundTrip it never re-sends a request on
// another connection by itself (GOAWAY, REFUSED_STREAM, unusable connection), which Envoy
// does not either; what is retried is the route's retry policy's business (router.go).
type h2Pool struct {
	c      *liveCluster
	cfg    *clusterCfg
	socket *upstreamTLS
	tr     *http2.Transport
	count  bool // count upstream_cx_total (the request pool, not the health checker)

	mu    sync.Mutex
	hosts map[string]*h2HostPool
	ctx   context.Context
	stop  context.CancelFunc
}

type h2HostPool struct {
	dial  sync.Mutex // held while a connection is established: other streams wait for it
	mu    sync.Mutex
	conns []*h2Conn
}

type h2Conn struct {
	cc       *http2.ClientConn
	conn     net.Conn
	lastRead atomic.Int64 // unix nanos of the last bytes received
}

func (c *h2Conn) Read(b []byte) (int, error) {
	n, err := c.conn.Read(b)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
	}
	return n, err
}

// readTracking is the connection the ClientConn speaks over: reads are noted for the
// keepalive (any frame received extends the PING ACK timeout).
type readTracking struct {
	net.Conn
	h *h2Conn
}

func (r readTracking) Read(b []byte) (int, error) { return r.h.Read(b) }

func newH2Pool(c *liveCluster, cc *clusterCfg, socket *upstreamTLS, count bool) *h2Pool {
	ctx, stop := context.WithCancel(c.d.ctx)
	// The windows reach x/net/http2's Transport only through a net/http Transport's HTTP2
	// config (ConfigureTransports links the two; nothing of t1 but that config, and the
	// defaults of its zero value, is used: connections come from connect, not t1).
	t1 := &http.Transport{HTTP2: cc.h2.transportConfig()}
	tr, err := http2.ConfigureTransports(t1) //nolint:staticcheck // the only way to set x/net's client windows
	if err != nil {
		panic("dataplane: " + err.Error()) // only for a t1 already configured, which t1 is not
	}
	tr.DisableCompression = true
	// Envoy's CodecClient idle timer (source/common/http/codec_client.cc): the cluster's
	// idle_timeout closes a connection that has had no active stream for that long; the
	// ClientConn's idle timer is the same rule (0: never).
	tr.IdleConnTimeout = cc.idleTimeout
	// No ReadIdleTimeout/PingTimeout: connection_keepalive is our own PING loop
	// (keepalive), as Envoy's codec runs it.
	//
	// Flow control: x/net/http2 credits a DATA frame back to the server, stream and
	// connection window alike, when the response body is read
	// (transportResponseBody.Read), and the router reads it only as fast as it writes it
	// to the downstream client, so a client that stops reading stops the credit. Envoy's
	// codec (source/common/http/http2/codec_impl.cc, ConnectionImpl::onData) credits data as
	// it arrives unless the stream is read-disabled, which the router does once the
	// downstream buffers pass their watermarks, and then keeps it as unconsumed_bytes_
	// until reads are enabled again: in both a stalled stream holds up to its stream window
	// of the connection window. What each buffers before that differs (Go: the stream
	// window in the response body's pipe; Envoy: its watermarked buffers), not what holds
	// the windows.
	return &h2Pool{c: c, cfg: cc, socket: socket, count: count, hosts: map[string]*h2HostPool{}, ctx: ctx, stop: stop, tr: tr}
}

// closeIdle drains the pool: every connection gets a GOAWAY and closes once its streams
// ended (Envoy drains the replaced cluster version's pools), and no new connection is
// opened for keepalives.
func (p *h2Pool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, hp := range p.hosts {
		hp.mu.Lock()
		for _, c := range hp.conns {
			go func() { _ = c.cc.Shutdown(context.Background()) }()
		}
		hp.conns = nil
		hp.mu.Unlock()
	}
}

func (p *h2Pool) host(addr string) *h2HostPool {
	p.mu.Lock()
	defer p.mu.Unlock()
	hp := p.hosts[addr]
	if hp == nil {
		hp = &h2HostPool{}
		p.hosts[addr] = hp
	}
	return hp
}

// reserve returns a connection with room for one more stream, reserved for it, or nil.
// Connections that closed or received a GOAWAY leave the pool (Envoy's pool moves a
// connection that got a GOAWAY to draining: it takes no new stream). A connection has room
// below both the server's SETTINGS_MAX_CONCURRENT_STREAMS (ReserveNewRequest) and the
// cluster's max_concurrent_streams, limit: Envoy's ActiveClient takes the lower of the two
// as its concurrent stream limit (source/common/http/http2/conn_pool.cc,
// ActiveClient::calculateInitialStreamsLimit), and past it the pool opens another
// connection (ConnPoolImplBase::shouldCreateNewConnection). Streams count until they end
// (response read or reset), as Envoy's do until the stream is destroyed.
func (hp *h2HostPool) reserve(limit uint32) *h2Conn {
	hp.mu.Lock()
	defer hp.mu.Unlock()
	live := hp.conns[:0]
	var got *h2Conn
	for _, c := range hp.conns {
		st := c.cc.State()
		if st.Closed || st.Closing {
			continue
		}
		live = append(live, c)
		if got == nil && st.StreamsActive+st.StreamsReserved+st.StreamsPending < int(limit) && c.cc.ReserveNewRequest() {
			got = c
		}
	}
	clear(hp.conns[len(live):])
	hp.conns = live
	return got
}

// get returns a connection to addr with a stream reserved on it, establishing one if none
// has room. A failure to establish it is a *connectError.
func (p *h2Pool) get(ctx context.Context, addr string) (*h2Conn, error) {
	hp := p.host(addr)
	for {
		if c := hp.reserve(p.cfg.h2.maxStreams); c != nil {
			return c, nil
		}
		hp.dial.Lock()
		if c := hp.reserve(p.cfg.h2.maxStreams); c != nil {
			hp.dial.Unlock()
			return c, nil
		}
		c, err := p.connect(ctx, addr)
		if err != nil {
			hp.dial.Unlock()
			return nil, err
		}
		hp.mu.Lock()
		hp.conns = append(hp.conns, c)
		hp.mu.Unlock()
		hp.dial.Unlock()
	}
}

// connect establishes one connection: TCP within connect_timeout, TLS with the cluster's
// ALPN, the HTTP/2 connection preface. The HTTP/2 codec is used whatever ALPN negotiated:
// with explicit_http_config.http2_protocol_options Envoy's pool creates an HTTP/2
// CodecClient (Http2::ActiveClient, CodecType::HTTP2) without looking at the negotiated
// protocol (only auto_config's mixed pool reads ALPN). A server that accepts none of the
// offered protocols fails the TLS handshake (no_application_protocol alert): a connect
// failure, UF.
func (p *h2Pool) connect(ctx context.Context, addr string) (*h2Conn, error) {
	cc := p.cfg
	if p.count {
		p.c.d.stats.inc(p.c.statPrefix() + "upstream_cx_total")
	}
	nd := cc.dialer()
	conn, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &connectError{err}
	}
	if p.socket != nil {
		tc, err := p.c.d.upstreamTLSConfig(p.socket)
		if err != nil {
			conn.Close()
			return nil, &connectError{err}
		}
		tconn := tls.Client(conn, tc)
		hctx, cancel := context.WithTimeout(ctx, cc.connectTimeout)
		err = tconn.HandshakeContext(hctx)
		cancel()
		if err != nil {
			conn.Close()
			return nil, &connectError{err}
		}
		conn = tconn
	}
	h := &h2Conn{conn: conn}
	h.lastRead.Store(time.Now().UnixNano())
	ccn, err := p.tr.NewClientConn(readTracking{conn, h})
	if err != nil {
		conn.Close()
		return nil, &connectError{err}
	}
	h.cc = ccn
	if cc.h2Keepalive != nil {
		go p.keepalive(h, cc.h2Keepalive)
	}
	return h, nil
}

// keepalive is http2_protocol_options.connection_keepalive as Envoy's HTTP/2 codec runs it
// (source/common/http/http2/codec_impl.cc): the constructor schedules the first PING via
// onKeepaliveResponse, interval plus a random jitter of up to interval_jitter percent of it
// (default 15); sendKeepalive sends a PING and arms the timeout; onKeepaliveResponse (the
// PING ACK) disarms it and schedules the next PING the same way; any other frame received
// while the ACK is awaited re-arms the timeout for another timeout period
// (onBeforeFrameReceived); onKeepaliveResponseTimeout counts http2.keepalive_timeout and
// closes the connection without flushing. Its streams are then reset with
// ConnectionTermination (the router's UC; a response already streaming is cut off).
func (p *h2Pool) keepalive(h *h2Conn, ka *h2Keepalive) {
	for {
		wait := ka.interval
		if j := time.Duration(ka.jitterPercent * float64(ka.interval) / 100); j > 0 {
			wait += time.Duration(rand.Int64N(int64(j)))
		}
		t := time.NewTimer(wait)
		select {
		case <-p.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if h.cc.State().Closed {
			return
		}
		sent := time.Now()
		ack := make(chan error, 1)
		pctx, cancel := context.WithCancel(p.ctx)
		go func() { ack <- h.cc.Ping(pctx) }()
		timeout := time.NewTimer(ka.timeout)
	wait:
		select {
		case err := <-ack:
			timeout.Stop()
			cancel()
			if err != nil {
				return // the connection closed (or the pool stopped)
			}
			continue
		case <-timeout.C:
			// Bytes received since the PING extend the wait (onBeforeFrameReceived).
			// (Approximation: bytes rather than frames; the PING ACK itself is not
			// excluded, but it ends the wait above.)
			if last := time.Unix(0, h.lastRead.Load()); last.After(sent) {
				if left := ka.timeout - time.Since(last); left > 0 {
					timeout.Reset(left)
					goto wait
				}
			}
			p.c.d.stats.inc(p.c.statPrefix() + "http2.keepalive_timeout")
			h.conn.Close()
			cancel()
			return
		case <-p.ctx.Done():
			timeout.Stop()
			cancel()
			return
		}
	}
}

// h2Errors classifies a ClientConn.RoundTrip error the way Envoy's HTTP/2 codec reports the
// stream's end. x/net/http2 keeps these errors unexported; they are matched by text.
var (
	// The stream was above a GOAWAY's last stream id: x/net aborts it with
	// errClientConnGotGoAway (or, for stream 1 under an error GOAWAY, its own message).
	h2GoAwayMessages = []string{"http2: Transport received Server's graceful shutdown GOAWAY", "http2: Transport received GOAWAY from server"}
	// The connection could not take the stream (closed or draining) before anything was
	// sent on it.
	h2Unusable = "http2: client conn not usable"
	// The peer did not advertise SETTINGS_ENABLE_CONNECT_PROTOCOL.
	h2NoExtendedConnect = "net/http: extended connect not supported by peer"
)

// h2Refused reports a stream the server refused: REFUSED_STREAM, or above a GOAWAY's
// last-stream-id. Envoy: the codec library closes the streams above last_accepted_stream_id
// with REFUSED_STREAM on a GOAWAY (oghttp2 OgHttp2Session::OnGoAway; nghttp2 likewise), and
// ConnectionImpl::onStreamClose (source/common/http/http2/codec_impl.cc) turns
// REFUSED_STREAM into StreamResetReason::RemoteRefusedStreamReset.
func h2Refused(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) && se.Code == http2.ErrCodeRefusedStream {
		return true
	}
	for _, m := range h2GoAwayMessages {
		if strings.Contains(err.Error(), m) {
			return true
		}
	}
	return false
}

// h2RemoteReset reports another RST_STREAM from the server (RemoteReset), or an extended
// CONNECT the server cannot take: Envoy sends it regardless and a server without RFC 8441
// support rejects the :protocol pseudo-header as malformed with a stream error (RFC 9113
// 8.1.1), which arrives as a remote reset.
func h2RemoteReset(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) {
		return true
	}
	return strings.Contains(err.Error(), h2NoExtendedConnect)
}
