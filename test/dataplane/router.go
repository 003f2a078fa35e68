package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// retryBufferLimit is how much request body the router keeps for retries (Envoy's default
// per-connection buffer limit, 1 MiB). A larger body is streamed and cannot be retried.
const retryBufferLimit = 1 << 20

type failureKind int

const (
	noFailure          failureKind = iota
	connectFailure                 // TCP or TLS failed: retry_on connect-failure
	resetBeforeRequest             // the connection failed before the request was sent
	resetAfterRequest              // the connection failed after the request was sent, before the response
	timeoutFailure                 // the route timeout expired before the response
	// HTTP/2 only (h2pool.go): the server refused the stream (REFUSED_STREAM, or above a
	// GOAWAY's last stream id): Envoy's RemoteRefusedStreamReset, retry_on refused-stream.
	refusedStream
	// HTTP/2 only: the server reset the stream (RST_STREAM): Envoy's RemoteReset.
	remoteReset
)

// router is Envoy's router filter for our route actions: it resolves the cluster (cluster,
// or cluster_header: the named header's value), picks a host, sends the request and retries
// per the route's retry policy; it streams the response back as it arrives.
func (st *stream) router(rt *route) {
	d := st.d
	if rt == nil {
		st.addFlag(flagNoRouteFound)
		st.localReply(http.StatusNotFound, "", "route_not_found")
		return
	}
	if rt.direct != nil {
		st.localReply(rt.direct.status, rt.direct.body, "direct_response", rt.responseHeadersToAdd...)
		return
	}
	// The virtual host's request_headers_to_remove (finalizeRequestHeaders, once every
	// filter has run).
	for _, h := range rt.vh.requestHeadersToRemove {
		st.hdr.del(h)
	}
	name := rt.cluster
	if rt.clusterHeader != "" {
		// cluster_header: a missing header or an unknown cluster is "cluster not found",
		// 503 with flag NC.
		name, _ = st.hdr.get(rt.clusterHeader)
	}
	// A cluster still warming (added by CDS, endpoints or first health checks pending) is
	// not in Envoy's thread-local cluster manager yet: the router's getThreadLocalCluster
	// finds nothing, the same "cluster not found" (see liveCluster.warmedLocked).
	var cc *clusterCfg
	var hosts []*liveHost
	var transport *upstreamPool
	var lb *subsetLB
	c := d.cluster(name)
	if name != "" && c != nil {
		cc, hosts, transport, lb = c.serving()
	}
	if cc == nil {
		st.addFlag(flagNoClusterFound)
		st.localReply(http.StatusServiceUnavailable, "", "cluster_not_found")
		return
	}
	cp := "cluster." + cc.stat + "."

	// Circuit breaker max_requests: requests beyond it are rejected with UO.
	if c.active.Add(1) > cc.maxRequests {
		c.active.Add(-1)
		d.stats.inc(cp + "upstream_rq_pending_overflow")
		st.addFlag(flagOverflow)
		st.localReply(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. reset reason: overflow", "upstream_reset_before_response_started{overflow}")
		return
	}
	defer c.active.Add(-1)

	// The request body, buffered for retries when small enough.
	var body []byte
	replayable := true
	var stream io.Reader
	if st.r.Body != nil && st.r.Body != http.NoBody && st.r.ContentLength != 0 {
		lr := io.LimitReader(st.r.Body, retryBufferLimit+1)
		b, err := io.ReadAll(lr)
		if err != nil {
			st.addFlag(flagDownstreamTerminate)
			return
		}
		body = b
		if len(b) > retryBufferLimit {
			replayable = false
			stream = io.MultiReader(bytes.NewReader(b), st.r.Body)
		}
	}

	ctx := st.r.Context()
	if rt.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rt.timeout)
		defer cancel()
	}

	retries := 0
	if rt.retry != nil {
		retries = rt.retry.numRetries
	}
	tried := map[*liveHost]bool{}
	// The subset load balancer's criteria, the same for every attempt.
	criteria := st.subsetCriteria(rt)
	started := false
	var lastKind failureKind
	var lastErr error
	for attempt := 0; ; attempt++ {
		maxSel := 1
		if rt.retry != nil && rt.retry.previousHosts {
			maxSel = rt.retry.hostSelectionMax
		}
		var h *liveHost
		if rt.retry != nil && rt.retry.previousHosts {
			h = c.choose(cc, hosts, lb, criteria, tried, maxSel)
		} else {
			h = c.choose(cc, hosts, lb, criteria, nil, 1)
		}
		if h == nil {
			d.stats.inc(cp + "upstream_cx_none_healthy")
			st.addFlag(flagNoHealthyUpstream)
			st.localReply(http.StatusServiceUnavailable, "no healthy upstream", "no_healthy_upstream")
			return
		}
		tried[h] = true
		if attempt > 0 {
			d.stats.inc(cp + "upstream_rq_retry")
		}
		var rd io.Reader
		switch {
		case stream != nil:
			rd = stream
		case body != nil:
			rd = bytes.NewReader(body)
		}
		resp, kind, err := st.attempt(ctx, c, cc, transport, h, rd, int64(len(body)))
		c.localOriginResult(cc, hosts, h, kind == connectFailure || kind == resetBeforeRequest || kind == timeoutFailure)
		if kind == noFailure {
			if !st.retriableResponse(rt, resp) || !replayable || !st.mayRetry(ctx, c, cc, attempt, retries) {
				// Envoy forwards the last response when it may not retry it.
				st.respond(c, h, resp)
				return
			}
			d.log.Debug("retriable upstream response", "cluster", name, "host", h.address, "status", resp.StatusCode)
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
			resp.Body.Close()
			continue
		}
		lastKind, lastErr = kind, err
		// Envoy's router: upstream_request_started_ |= first_upstream_tx_byte_sent_ of the
		// reset attempt (router.cc onUpstreamReset); once set, reset-before-request retries
		// nothing more for this request.
		// A stream the server refused or reset had been sent as well.
		started = started || kind == resetAfterRequest || kind == refusedStream || kind == remoteReset
		if kind == resetAfterRequest {
			// Envoy's connection pool counts each connection closed under an active
			// request (reportUpstreamCxDestroyActiveRequest,
			// source/common/upstream/upstream_impl.cc), retried or not.
			d.stats.inc(cp + "upstream_cx_destroy_remote_with_active_rq")
		}
		d.log.Debug("upstream attempt failed", "cluster", name, "host", h.address, "error", err)
		if kind == timeoutFailure {
			d.stats.inc(cp + "upstream_rq_timeout")
			st.addFlag(flagUpstreamReqTimeout)
			st.localReply(http.StatusGatewayTimeout, "upstream request timeout", "upstream_response_timeout")
			return
		}
		if ctx.Err() != nil {
			st.addFlag(flagDownstreamTerminate)
			return
		}
		if !st.retriable(rt, kind, started) || !replayable || !st.mayRetry(ctx, c, cc, attempt, retries) {
			break
		}
	}
	switch lastKind {
	case connectFailure:
		d.stats.inc(cp + "upstream_cx_connect_fail")
		st.addFlag(flagConnectFailure)
		st.localReply(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. "+
			"reset reason: connection failure, transport failure reason: "+errString(lastErr), "upstream_reset_before_response_started{connection_failure}")
	case refusedStream, remoteReset:
		// Envoy's Filter::streamResetReasonToResponseFlag (source/common/router/router.cc):
		// RemoteReset and RemoteRefusedStreamReset are UR; the body and details name the
		// reason as Http::Utility::resetReasonToString does.
		reason := "remote reset"
		if lastKind == refusedStream {
			reason = "remote refused stream reset"
		}
		st.addFlag(flagRemoteReset)
		st.localReply(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset "+
			"before headers. reset reason: "+reason, "upstream_reset_before_response_started{"+strings.ReplaceAll(reason, " ", "_")+"}")
	default:
		st.addFlag(flagConnTermination)
		st.localReply(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before "+
			"headers. reset reason: connection termination", "upstream_reset_before_response_started{connection_termination}")
	}
}

// mayRetry is asked once a failure or response is retriable: it enforces num_retries (URX when
// exhausted) and the circuit breaker max_retries, then waits Envoy's default back-off: a random
// wait up to (2^n - 1) × 25 ms, capped at 250 ms.
func (st *stream) mayRetry(ctx context.Context, c *liveCluster, cc *clusterCfg, attempt, retries int) bool {
	d := st.d
	cp := c.statPrefix()
	if attempt >= retries {
		d.stats.inc(cp + "upstream_rq_retry_limit_exceeded")
		st.addFlag(flagRetryLimitExceeded)
		return false
	}
	if c.retries.Add(1) > cc.maxRetries {
		c.retries.Add(-1)
		d.stats.inc(cp + "upstream_rq_retry_overflow")
		return false
	}
	defer c.retries.Add(-1)
	wait := time.Duration(rand.Int64N(int64(min(time.Duration((1<<(attempt+1))-1)*25*time.Millisecond, 250*time.Millisecond)) + 1))
	select {
	case <-time.After(wait):
		return true
	case <-ctx.Done():
		return false
	}
}

// retriableResponse decides whether an upstream response is retried, as Envoy's
// RetryStateImpl::wouldRetryFromHeaders (source/common/router/retry_state_impl.cc) does for
// the conditions implemented here: a response carrying x-envoy-ratelimited is never retried
// (envoy-ratelimited, which would, is not implemented); retry_on retriable-status-codes
// retries a response whose status is one of retriable_status_codes (425 Too Early, which
// Envoy treats apart, is refused by the allowlist); retry_on retriable-headers a response
// carrying any header that one of retriable_headers matches (":status" included). Envoy also
// adds the request's x-envoy-retriable-status-codes to the list (and x-envoy-retry-on to
// retry_on) unless its connection manager removed them from an external request: not
// modelled; a request carrying them could be retried by Envoy where it is not here.
func (st *stream) retriableResponse(rt *route, resp *http.Response) bool {
	if rt.retry == nil {
		return false
	}
	if _, ok := resp.Header[http.CanonicalHeaderKey("x-envoy-ratelimited")]; ok {
		return false
	}
	if rt.retry.on["retriable-status-codes"] && slices.Contains(rt.retry.retriableStatusCodes, uint32(resp.StatusCode)) {
		return true
	}
	if !rt.retry.on["retriable-headers"] {
		return false
	}
	get := func(name string) (string, bool) {
		if name == ":status" {
			return strconv.Itoa(resp.StatusCode), true
		}
		vs, ok := resp.Header[http.CanonicalHeaderKey(name)]
		return strings.Join(vs, ","), ok
	}
	for _, m := range rt.retry.retriableHeaders {
		if m.matches(get) {
			return true
		}
	}
	return false
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// retriable applies retry_on to failures: connect-failure, refused-stream (HTTP/2
// REFUSED_STREAM), reset-before-request (no attempt of this request that was reset had been
// sent: started, Envoy's RetryStateImpl::wouldRetryFromReset), reset (any reset before a
// response). Responses: retriableResponse.
func (st *stream) retriable(rt *route, kind failureKind, started bool) bool {
	if rt.retry == nil {
		return false
	}
	on := rt.retry.on
	switch kind {
	case connectFailure:
		return on["connect-failure"] || on["reset"]
	case resetBeforeRequest:
		return on["reset-before-request"] && !started || on["reset"]
	case resetAfterRequest, remoteReset:
		return on["reset"]
	case refusedStream:
		// RetryStateImpl::wouldRetryFromReset: refused-stream retries
		// RemoteRefusedStreamReset only; reset any reset.
		return on["refused-stream"] || on["reset"]
	}
	return false
}

// attempt sends the request to one host. Upstream request headers are the (mutated) request
// headers, the host and path unchanged (no rewrites configured); the router adds no
// x-envoy-* headers with suppress_envoy_headers.
func (st *stream) attempt(ctx context.Context, c *liveCluster, cc *clusterCfg, pool *upstreamPool, h *liveHost, body io.Reader, n int64) (*http.Response, failureKind, error) {
	if strings.HasPrefix(h.address, "unix:") {
		return nil, connectFailure, &connectError{errors.New("unix socket hosts are not implemented for HTTP routing")}
	}
	if pool.h2 != nil {
		return st.attemptH2(ctx, c, cc, pool.h2, h, body, n)
	}
	tr := pool.h1
	// Go's http.Transport re-sends a request by itself, on another connection, when a reused
	// keep-alive connection fails after the request was written to it (net/http
	// transport.go: roundTrip's loop, persistConn.shouldRetryRequest: errServerClosedIdle,
	// transportReadFromServerError, nothingWrittenError, for bodiless or rewindable
	// idempotent requests). Envoy has no such hidden retry: once the connection pool handed
	// the request a connection and its headers were encoded, the request counts as started
	// (source/common/router/upstream_codec_filter.cc, decodeHeaders: encodeHeaders, then
	// upstreamTiming().onFirstUpstreamTxByteSent), and a reset then is a connection
	// termination that only the route's retry policy may retry (reset-before-request does
	// not: RetryStateImpl::wouldRetryFromReset). So a second GetConn after the headers were
	// written is Go starting a hidden retry: the attempt is cancelled instead and fails as a
	// reset after the request. A second GetConn before anything was written (Go found the
	// idle connection dead before using it) is let through: Envoy's pool never hands out a
	// connection it has seen closed, and that request goes on a new connection in Envoy too.
	actx, cancelAttempt := context.WithCancelCause(ctx)
	var wrote writtenFlag
	var conns int
	trace := &httptrace.ClientTrace{
		GetConn: func(string) {
			wrote.mu.Lock()
			defer wrote.mu.Unlock()
			conns++
			if conns > 1 && wrote.wrote {
				cancelAttempt(errHiddenRetry)
			}
		},
		WroteHeaders: wrote.set,
	}
	req, err := st.upstreamRequest(httptrace.WithClientTrace(actx, trace), cc, h, body, n)
	if err != nil {
		return nil, connectFailure, err
	}
	done := st.startAttempt(c, h)
	resp, err := tr.RoundTrip(req)
	done()
	if err == nil {
		// actx is not cancelled here: the response body is read under it. It ends with
		// the downstream request's context.
		return resp, noFailure, nil
	}
	hidden := context.Cause(actx) == errHiddenRetry
	cancelAttempt(nil)
	if kind, ok := attemptFailed(ctx, h, err); ok {
		return nil, kind, err
	}
	switch {
	case hidden:
		return nil, resetAfterRequest, errHiddenRetry
	case !wrote.get():
		return nil, resetBeforeRequest, err
	default:
		return nil, resetAfterRequest, err
	}
}

// attemptFailed counts a failed attempt on h and classifies what both upstream protocols
// share: a connection that never came up (UF) and the route timeout (UT). ok false: the
// caller tells the rest apart (what was written, resets, refusals).
func attemptFailed(ctx context.Context, h *liveHost, err error) (kind failureKind, ok bool) {
	h.mu.Lock()
	h.rqErrs++
	h.mu.Unlock()
	var ce *connectError
	switch {
	case errors.As(err, &ce):
		return connectFailure, true
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return timeoutFailure, true
	}
	return noFailure, false
}

// upstreamRequest is the request to send to host h: the (mutated) request headers, the
// :path as received.
func (st *stream) upstreamRequest(ctx context.Context, cc *clusterCfg, h *liveHost, body io.Reader, n int64) (*http.Request, error) {
	scheme := "http"
	if cc.tls != nil {
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, st.method, scheme+"://"+h.address+"/", body)
	if err != nil {
		return nil, err
	}
	setRequestTarget(req.URL, st.path)
	req.Host = st.host
	req.ContentLength = n
	if body == nil {
		req.ContentLength = 0
	} else if n > retryBufferLimit {
		req.ContentLength = -1
	}
	if st.r.ContentLength < 0 && body != nil && n <= retryBufferLimit {
		req.ContentLength = n
	}
	for _, e := range st.hdr {
		req.Header[http.CanonicalHeaderKey(e.name)] = append(req.Header[http.CanonicalHeaderKey(e.name)], e.value)
	}
	req.Header.Del("Content-Length")
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = nil // Go's transport would add its own
	}
	return req, nil
}

// attemptH2 is attempt over an HTTP/2 cluster's pool (h2pool.go). A stream's failure maps
// onto Envoy's reset reasons: no connection (TCP/TLS) is ConnectionFailure (UF); the
// connection closing under the stream is ConnectionTermination (UC), before or after the
// request's headers went out (reset-before-request covers only the former); a stream the
// server refused is RemoteRefusedStreamReset and one it reset RemoteReset (both UR).
//
// An upgrade (websocket, SPDY) goes out as Envoy's HTTP/2 client codec sends it:
// ClientStreamImpl::encodeHeaders (source/common/http/http2/codec_impl.cc) turns every
// HTTP/1 upgrade into an RFC 8441 extended CONNECT (Utility::transformUpgradeRequestFromH1toH2:
// method CONNECT, :protocol the upgrade token, no upgrade/connection headers), whether or not
// the server takes it (allow_connect is the accepting side's setting). A server without
// extended CONNECT resets the stream (UR, 503 to the client); a non-2xx answer is forwarded
// as is. Deviation: a 2xx answer (Envoy turns it into a 101 and tunnels over the stream) is
// not tunnelled here; the downstream stream is reset instead.
func (st *stream) attemptH2(ctx context.Context, c *liveCluster, cc *clusterCfg, p *h2Pool, h *liveHost, body io.Reader, n int64) (*http.Response, failureKind, error) {
	d := st.d
	var wrote writtenFlag
	trace := &httptrace.ClientTrace{WroteHeaders: wrote.set}
	req, err := st.upstreamRequest(httptrace.WithClientTrace(ctx, trace), cc, h, body, n)
	if err != nil {
		return nil, connectFailure, err
	}
	if st.upgrade != "" {
		req.Method = http.MethodConnect
		req.Header[":protocol"] = []string{req.Header.Get("Upgrade")}
		req.Header.Del("Upgrade")
		req.Header.Del("Connection")
		if req.Body == nil {
			// An extended CONNECT stream stays open for the tunnel's bytes.
			pr, pw := io.Pipe()
			defer pw.Close()
			req.Body = pr
			req.ContentLength = -1
		}
	}
	done := st.startAttempt(c, h)
	var resp *http.Response
	for {
		var conn *h2Conn
		conn, err = p.get(ctx, h.address)
		if err != nil {
			break
		}
		resp, err = conn.cc.RoundTrip(req)
		// A connection that could not take the stream (it closed or got a GOAWAY after
		// the pool reserved it) sent nothing: Envoy's pool would not have handed it out;
		// another connection takes the stream. Not a retry.
		if err != nil && strings.Contains(err.Error(), h2Unusable) && !wrote.get() {
			continue
		}
		break
	}
	done()
	if err == nil {
		if st.upgrade != "" && resp.StatusCode/100 == 2 {
			resp.Body.Close()
			d.log.Warn("extended CONNECT answered 2xx: tunnelling over HTTP/2 is not implemented (documented deviation)", "cluster", cc.name)
			panic(http.ErrAbortHandler)
		}
		return resp, noFailure, nil
	}
	if kind, ok := attemptFailed(ctx, h, err); ok {
		return nil, kind, err
	}
	switch {
	case ctx.Err() != nil:
		return nil, resetBeforeRequest, err
	case h2Refused(err):
		return nil, refusedStream, err
	case h2RemoteReset(err):
		return nil, remoteReset, err
	case !wrote.get():
		return nil, resetBeforeRequest, err
	default:
		return nil, resetAfterRequest, err
	}
}

// startAttempt counts an attempt on c's host h as started and in flight until done, which
// also times the wait for the response's headers.
func (st *stream) startAttempt(c *liveCluster, h *liveHost) (done func()) {
	st.d.stats.inc(c.statPrefix() + "upstream_rq_total")
	h.active.Add(1)
	h.mu.Lock()
	h.rqTotal++
	h.mu.Unlock()
	start := time.Now()
	return func() {
		st.d.stats.timing("dataplane.timing.upstream_rq_headers", start)
		h.active.Add(-1)
	}
}

// writtenFlag says whether an attempt's request headers went out (httptrace's WroteHeaders),
// which decides between Envoy's reset-before-request and a reset after it.
type writtenFlag struct {
	mu    sync.Mutex
	wrote bool
}

func (f *writtenFlag) set() { f.mu.Lock(); f.wrote = true; f.mu.Unlock() }

func (f *writtenFlag) get() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wrote
}

// setRequestTarget makes u's request-target (what Go's client writes in the request line,
// URL.RequestURI) exactly target, the downstream :path. Envoy forwards the :path as received
// when it neither rewrites nor normalizes it (normalize_path and merge_slashes false,
// path_with_escaped_slashes_action KEEP_UNCHANGED; the router's upstream request headers are
// the downstream ones, source/common/router/router.cc): no %-escape is decoded or re-encoded,
// "//" stays (url.URL.Parse would read "//apis/x" as host "apis") and no dot-segment is
// resolved (URL.ResolveReference would turn "/apis/x/../y" into "/apis/y").
func setRequestTarget(u *url.URL, target string) {
	path, query, hasQuery := strings.Cut(target, "?")
	u.RawQuery, u.ForceQuery = query, hasQuery && query == ""
	u.Path, u.RawPath, u.Opaque = "", "", ""
	if !strings.HasPrefix(path, "//") {
		// An opaque URL is written as is (RequestURI returns Opaque).
		u.Opaque = path
		return
	}
	// RequestURI would prefix an opaque "//..." with the scheme; Path with RawPath is
	// written as RawPath when that is a valid encoding of Path, which a path Go's server
	// accepted is.
	if p, err := url.PathUnescape(path); err == nil {
		u.Path, u.RawPath = p, path
	} else {
		u.Path = path
	}
}

// errHiddenRetry cancels an attempt that Go's transport was about to re-send by itself.
var errHiddenRetry = errors.New("upstream connection closed after the request was sent (not retried: Envoy does not)")

// responseHopByHop are the connection-specific response headers Envoy drops.
var responseHopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade"}

// respond streams the upstream response to the client: headers at once, then the body as it
// arrives, each read flushed (Envoy does not buffer response bodies). A 101 to an accepted
// upgrade turns the connection into a raw bidirectional stream. When the request's ext_proc
// stream was kept open for the response headers, the ext_proc filter processes them first
// (encoder filters run before the headers go downstream) and may mutate them or replace the
// whole response with a local reply.
//
// Deviation: only upstream responses reach the ext_proc response-headers step here. In
// Envoy a local reply sent after the request-headers step (by the router: no healthy
// upstream, timeouts, ...) also passes through the ext_proc filter's encodeHeaders.
func (st *stream) respond(c *liveCluster, h *liveHost, resp *http.Response) {
	d := st.d
	cp := c.statPrefix()
	d.stats.inc(cp + "upstream_rq_" + strconv.Itoa(resp.StatusCode))
	d.stats.inc(fmt.Sprintf("%supstream_rq_%dxx", cp, resp.StatusCode/100))
	h.mu.Lock()
	h.rqSuccess++
	h.mu.Unlock()
	h.active.Add(1)
	defer h.active.Add(-1)
	upgrade := resp.StatusCode == http.StatusSwitchingProtocols && st.upgrade != ""
	hdr := responseHeaderList(resp.Header)
	if !upgrade {
		for _, k := range responseHopByHop {
			hdr.del(strings.ToLower(k))
		}
	}
	if st.ext != nil && !st.extProcResponseHeaders(resp.StatusCode, &hdr, responseHasNoBody(st.method, resp)) {
		// Answered with a local reply: the upstream response is discarded.
		resp.Body.Close()
		return
	}
	st.done = true
	d.stats.inc(fmt.Sprintf("%sdownstream_rq_%dxx", st.prefix(), resp.StatusCode/100))
	if upgrade {
		st.tunnel(resp, hdr)
		return
	}
	defer resp.Body.Close()
	out := st.w.Header()
	for _, e := range hdr {
		k := http.CanonicalHeaderKey(e.name)
		out[k] = append(out[k], e.value)
	}
	if !st.hcm.passThroughServer {
		out.Set("Server", "envoy")
	}
	if resp.ContentLength >= 0 && resp.Header.Get("Content-Length") == "" && st.method != http.MethodHead && resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified {
		out.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	for k := range resp.Trailer {
		out.Add("Trailer", k)
	}
	st.w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(st.w)
	_ = rc.Flush()
	buf := make([]byte, 32*1024)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := st.w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			// The upstream reset after the response started: Envoy resets the downstream
			// stream too.
			d.stats.inc(cp + "upstream_rq_rx_reset")
			panic(http.ErrAbortHandler)
		}
	}
	for k, v := range resp.Trailer {
		out[http.TrailerPrefix+k] = v
	}
}

// responseHeaderList is an upstream response's headers as Envoy's header map holds them:
// names lower-case (in name order here), each value in order.
func responseHeaderList(h http.Header) headerList {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	sort.Strings(names)
	var out headerList
	for _, k := range names {
		for _, v := range h[k] {
			out.add(strings.ToLower(k), v)
		}
	}
	return out
}

// responseHasNoBody is end_stream on the response headers: the response to a HEAD, a 204 or
// 304, or an empty body. A 101 is followed by the upgraded stream.
func responseHasNoBody(method string, resp *http.Response) bool {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return false
	}
	return method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified ||
		resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0
}

// tunnel completes an upgrade: the 101 (with headers hdr) goes to the client, then bytes
// flow both ways until either side closes.
func (st *stream) tunnel(resp *http.Response, hdrs headerList) {
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		panic(http.ErrAbortHandler)
	}
	defer up.Close()
	conn, brw, err := http.NewResponseController(st.w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	hdr := http.Header{}
	for _, e := range hdrs {
		k := http.CanonicalHeaderKey(e.name)
		hdr[k] = append(hdr[k], e.value)
	}
	if !st.hcm.passThroughServer {
		hdr.Set("Server", "envoy")
	}
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\n")
	_ = hdr.Write(brw)
	fmt.Fprintf(brw, "\r\n")
	if err := brw.Flush(); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// Bytes the client sent after its request (already buffered) go first.
		_, _ = io.Copy(up, readerOf(brw.Reader, conn))
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(conn, up)
		done <- struct{}{}
	}()
	<-done
}

func readerOf(br *bufio.Reader, conn io.Reader) io.Reader {
	if br.Buffered() > 0 {
		b, _ := br.Peek(br.Buffered())
		return io.MultiReader(bytes.NewReader(append([]byte(nil), b...)), conn)
	}
	return conn
}
