// Package extproc is kube-mvp's Envoy external processor (envoy.service.ext_proc.v3): for
// each request on a route whose group/version has mixed serving sets, Envoy sends us the
// request headers; we look the request up in the plan of that Envoy (the same plan its
// route tables were translated from: the front proxy's, or a sidecar's, named in the
// stream's gRPC metadata) and answer with a header mutation that names the cluster in
// x-kube-mvp-cluster, strips client-supplied identity and routing headers, or with an
// immediate Kubernetes Status 503 when the apiservers that serve the resource are all down.
// Client identity is not decided here: Envoy's Lua filter (internal/snapshot/identity.lua)
// maps a verified client certificate to front-proxy headers before ext_proc runs and says so
// in contract.HeaderIdentityDecision; such a request goes to the front-proxy variant of the
// cluster we name (contract.ClusterName.ProxyCert), with the identity headers the filter set.
// The routing table (a plan.Table) is swapped atomically with SetTable by whatever source
// feeds it: the table stream from xds-server (internal/tablestream.Follow, whose apply callback
// has SetTable's signature) or FileSource.
package extproc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Options configure a Server.
type Options struct {
	// Logger receives table changes and routing errors; nil discards.
	Logger *slog.Logger
	// Registry receives the metrics; nil means a new one (see Server.Registry).
	Registry *prometheus.Registry
	// Now is the clock for the table age; nil means time.Now.
	Now func() time.Time
	// MaxStreams bounds the ext_proc streams open at once, across connections: one more is
	// refused (ResourceExhausted). 0 means DefaultMaxStreams.
	MaxStreams int
	// FirstMessageTimeout ends a stream whose first message has not arrived this long after
	// it opened. 0 means DefaultFirstMessageTimeout.
	FirstMessageTimeout time.Duration
}

// Stream bounds. An open ext_proc stream costs extproc about 12 KB (BenchmarkOpenStreamMemory:
// 10–13 KB for one that sent nothing yet), so the defaults keep streams within the chart's
// 128 MiB memory limit with room: 4096 streams ≈ 48 MiB, the rest for the routing table and
// the runtime. Envoy needs far fewer: a decision takes microseconds and Envoy drops a stream
// it gave up on (message_timeout, 200 ms by default), so 4096 is 20,000 requests a second
// all timing out. Past it, a refusal (Envoy's 503 with Retry-After) beats running out of memory.
const (
	DefaultMaxStreams = 4096
	// DefaultMaxStreamsPerConnection is HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS (the
	// command's gRPC server option): Envoy opens another connection rather than exceed it,
	// and one connection cannot take all of DefaultMaxStreams.
	DefaultMaxStreamsPerConnection = 1024
	// DefaultFirstMessageTimeout: Envoy writes request_headers as it opens the stream and
	// gives up on the answer after message_timeout (xds-server --extproc-message-timeout,
	// 200 ms by default); a stream silent 25 times that long has no request waiting on it,
	// short of a node starved for seconds. A longer message_timeout needs no longer bound:
	// the first message comes with the stream.
	DefaultFirstMessageTimeout = 5 * time.Second
)

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	table atomic.Pointer[preparedTable]
	setMu sync.Mutex // serialises SetTable (metrics bookkeeping)

	log        *slog.Logger
	now        func() time.Time
	reg        *prometheus.Registry
	m          *metrics
	noTable    *extprocv3.ProcessingResponse
	noPlan     *extprocv3.ProcessingResponse
	unexpected [len(unexpectedTypes)]*extprocv3.ProcessingResponse

	errorLog logLimiter

	open         atomic.Int64 // streams in Process past the limit, at most maxStreams
	maxStreams   int64
	firstTimeout time.Duration
	refused      error // Process's answer past maxStreams
	refusedLog   logLimiter
	idleLog      logLimiter
}

// New returns a Server without a routing table: until the first SetTable every request
// is answered 503.
func New(opts Options) *Server {
	s := &Server{log: opts.Logger, now: opts.Now, reg: opts.Registry}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	s.maxStreams = int64(opts.MaxStreams)
	if s.maxStreams <= 0 {
		s.maxStreams = DefaultMaxStreams
	}
	s.firstTimeout = opts.FirstMessageTimeout
	if s.firstTimeout <= 0 {
		s.firstTimeout = DefaultFirstMessageTimeout
	}
	s.refused = status.Errorf(codes.ResourceExhausted, "extproc: %d ext_proc streams open, its limit across connections (extproc --max-streams)", s.maxStreams)
	s.m = newMetrics(s.reg, s)
	s.noTable = immediate503("kube-mvp has no routing table yet", "kube_mvp_no_routing_table")
	s.noPlan = immediate503("kube-mvp has no routing plan yet for the apiserver this proxy runs beside", "kube_mvp_no_local_plan")
	empty := &extprocv3.HeadersResponse{}
	s.unexpected = [...]*extprocv3.ProcessingResponse{
		unexpectedResponseHeaders:  {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: empty}},
		unexpectedRequestBody:      {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}},
		unexpectedResponseBody:     {Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}},
		unexpectedRequestTrailers:  {Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}},
		unexpectedResponseTrailers: {Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}},
		// A request with no (or an unknown) type has no matching response type; an empty
		// response changes nothing.
		unexpectedUnknown: {},
	}
	return s
}

// Registry is where the Server's metrics are registered.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// SetTable makes p the routing table; requests already being decided finish on the
// previous one. version names it in metrics and logs (the table stream's content hash, or
// FileSource's). A nil p is ignored.
func (s *Server) SetTable(p *plan.Table, version string) {
	if p == nil {
		return
	}
	s.setMu.Lock()
	defer s.setMu.Unlock()
	old := s.table.Load()
	tb := newPreparedTable(p, version, s.now(), s.m)
	if d := p.Discovery; d != nil {
		if old != nil && old.plans.Discovery != nil && old.plans.Discovery.ETag == d.ETag {
			tb.discoveryGzip = old.discoveryGzip // the same document: compressed once
		} else {
			tb.discoveryGzip = gzipDiscovery(d.JSON)
		}
	}
	s.table.Store(tb)
	if front := p.Routes[""]; front != nil {
		s.m.forgetKeys(func(r topology.Resource) bool { _, ok := front.Route(r); return ok })
	}
	oldVersion := ""
	if old != nil {
		oldVersion = old.version
	}
	s.m.setVersion(oldVersion, version)
	if old == nil || oldVersion != version {
		s.log.Info("routing table in use", "version", version, "apiservers", len(p.APIServers), "live", p.Live(), "resources", p.Routes[""].Len())
	}
}

// Ready reports whether a routing table is loaded.
func (s *Server) Ready() bool { return s.table.Load() != nil }

// Version is the version of the routing table in use, empty before the first.
func (s *Server) Version() string {
	if t := s.table.Load(); t != nil {
		return t.version
	}
	return ""
}

// Process serves one ext_proc stream. Envoy opens one per HTTP request and, with our
// processing mode (request headers SEND, everything else SKIP/NONE), sends a single
// request_headers message and expects exactly one response to it; for a merged-discovery
// request, whose answer asked for them (mode_override), the response headers follow on the
// same stream. Process ends the stream after its last answer. The stream's gRPC metadata
// may say, from a sidecar Envoy, which apiserver it runs beside: its requests are decided
// by that sidecar's plan.
//
// A stream beyond MaxStreams is refused (ResourceExhausted), and one whose first message
// does not come within FirstMessageTimeout is ended (DeadlineExceeded): Envoy fails either
// request with status_on_error, a 503 with Retry-After.
func (s *Server) Process(stream grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) error {
	if !s.acquireStream() {
		s.m.streamsRefused.Inc()
		if n, ok := s.refusedLog.allow(s.now()); ok {
			s.log.Warn("ext_proc stream refused: too many open (extproc --max-streams)", "limit", s.maxStreams, "similar_suppressed", n)
		}
		return s.refused
	}
	defer s.open.Add(-1)
	md, _ := metadata.FromIncomingContext(stream.Context())
	var local string
	if l := md.Get(contract.MetadataLocalAPIServer); len(l) == 1 {
		local = l[0]
	}
	var disc discoveryState
	req, err := s.recvFirst(stream)
	for {
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		start := time.Now()
		resp := s.respond(req, local, &disc)
		if err := stream.Send(resp); err != nil {
			return err
		}
		if req.GetRequestHeaders() != nil {
			s.m.decisionSeconds.Observe(time.Since(start).Seconds())
		}
		if resp.GetModeOverride().GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SEND {
			// The last answer: end the stream (status OK) rather than wait for Envoy to. Envoy
			// takes a clean close as "processing complete" (ext_proc.cc Filter::onGrpcClose),
			// while one that keeps the stream for the request's life (1.36; 1.37+ with
			// ext_proc_stream_close_optimization off) would otherwise hold it through a whole
			// watch and reset the watch when extproc restarts.
			return nil
		}
		req, err = stream.Recv()
	}
}

// acquireStream counts a stream in, unless maxStreams are open already.
func (s *Server) acquireStream() bool {
	for {
		n := s.open.Load()
		if n >= s.maxStreams {
			return false
		}
		if s.open.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// recvFirst is the stream's first Recv, bounded by firstTimeout. Recv has no deadline of
// its own and only returning from Process ends the stream, so it runs aside; returning
// cancels the stream, which ends that Recv.
func (s *Server) recvFirst(stream grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) (*extprocv3.ProcessingRequest, error) {
	type received struct {
		req *extprocv3.ProcessingRequest
		err error
	}
	got := make(chan received, 1)
	go func() {
		req, err := stream.Recv()
		got <- received{req, err}
	}()
	timer := time.NewTimer(s.firstTimeout)
	defer timer.Stop()
	select {
	case r := <-got:
		return r.req, r.err
	case <-timer.C:
		s.m.firstMessageTimeouts.Inc()
		if n, ok := s.idleLog.allow(s.now()); ok {
			s.log.Warn("ext_proc stream ended: no message since it opened (extproc --first-message-timeout)", "timeout", s.firstTimeout, "similar_suppressed", n)
		}
		return nil, status.Errorf(codes.DeadlineExceeded, "extproc: no message within %v of the stream's start (extproc --first-message-timeout)", s.firstTimeout)
	}
}

// respond answers one message. Messages other than request_headers cannot arrive with our
// processing mode; each is counted and answered with an empty response of its own type
// (which lets the request continue unchanged) rather than failing the stream, which with
// failure_mode_allow: false would fail the client's request.
func (s *Server) respond(req *extprocv3.ProcessingRequest, local string, disc *discoveryState) *extprocv3.ProcessingResponse {
	var u int
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return s.requestHeaders(r.RequestHeaders, local, disc)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if disc.doc != nil { // we asked for these (mode_override)
			return s.mergedDiscoveryResponse(r.ResponseHeaders, disc)
		}
		u = unexpectedResponseHeaders
	case *extprocv3.ProcessingRequest_RequestBody:
		u = unexpectedRequestBody
	case *extprocv3.ProcessingRequest_ResponseBody:
		u = unexpectedResponseBody
	case *extprocv3.ProcessingRequest_RequestTrailers:
		u = unexpectedRequestTrailers
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		u = unexpectedResponseTrailers
	default:
		u = unexpectedUnknown
	}
	s.m.unexpected[u].Inc()
	return s.unexpected[u]
}

// requestHeaders is the whole per-request work: scan the headers, decide, answer. local: the
// sidecar Envoy's apiserver ("" for a front proxy); disc is filled in for a merged-discovery
// request.
func (s *Server) requestHeaders(h *extprocv3.HttpHeaders, local string, disc *discoveryState) *extprocv3.ProcessingResponse {
	var (
		method, path        string
		accept, ifNoneMatch string
		acceptEncoding      string
		decision            string
		upgrade             bool
		identity, owned     []string // identity headers; kube-mvp's own (lower-case names)
		stripped            int
	)
	tb := s.table.Load()
	if tb == nil {
		s.m.noTable.Inc()
		return s.noTable
	}
	names := &tb.plans.RequestHeaders
	for _, hv := range h.GetHeaders().GetHeaders() {
		k := hv.GetKey()
		if len(k) < 5 {
			continue
		}
		if k[0] == ':' { // pseudo-headers are lower case by definition (RFC 9113 8.3)
			switch k {
			case ":method":
				method = methodValue(hv)
			case ":path":
				path = headerValue(hv)
			}
			continue
		}
		switch {
		case (k[0] == 'a' || k[0] == 'A') && equalFold(k, "accept"):
			accept = headerValue(hv)
		case (k[0] == 'i' || k[0] == 'I') && equalFold(k, "if-none-match"):
			ifNoneMatch = headerValue(hv)
		case (k[0] == 'a' || k[0] == 'A') && equalFold(k, "accept-encoding"):
			acceptEncoding = headerValue(hv)
		case equalFold(k, contract.HeaderIdentityDecision):
			decision = headerValue(hv)
		case (k[0] == 'u' || k[0] == 'U') && equalFold(k, "upgrade"):
			// Envoy's routes send it to an HTTP/1.1 cluster (snapshot: the ":upgrade" variants).
			upgrade = true
		case anyEqualFold(names.User, k):
			stripped |= strippedUser
			identity = append(identity, toLower(k))
		case anyEqualFold(names.Group, k):
			stripped |= strippedGroup
			identity = append(identity, toLower(k))
		case anyEqualFold(names.UID, k):
			stripped |= strippedUID
			identity = append(identity, toLower(k))
		case equalFold(k, contract.HeaderPeerProxied):
			stripped |= strippedPeerProxied
			owned = append(owned, toLower(k))
		case equalFold(k, contract.HeaderRoutingCluster):
			stripped |= strippedRouteCluster
			owned = append(owned, toLower(k))
		case anyPrefixFold(names.ExtraPrefix, k):
			stripped |= strippedExtra
			identity = append(identity, toLower(k))
		}
	}
	// Identity headers are the Lua filter's when it says it set them (the listener strips
	// clients' own before any filter runs); otherwise any that arrived are the client's,
	// which the listener should have stripped (route.response says what happens to them).
	proxyCert := decision == contract.IdentityProxyCert
	if proxyCert {
		stripped &^= strippedUser | strippedGroup | strippedUID | strippedExtra
		identity = nil
	}
	if stripped != 0 {
		s.m.countStripped(stripped)
	}

	v := tb.view(local)
	if v == nil {
		// A sidecar whose apiserver this table has no plan for: its Envoy got a newer
		// configuration than this table (or a forged stream names no apiserver). Any
		// cluster named here could be missing from that Envoy, so nothing is.
		s.m.noPlan.Inc()
		return s.noPlan
	}
	rt, err := decide(v, method, path)
	if err != nil {
		// The parser or Decide failed on this input: send it to the default set, whose
		// handler chain answers it as it would without kube-mvp.
		if n, ok := s.errorLog.allow(s.now()); ok {
			s.log.Error("routing decision failed; using the default cluster", "method", method, "path", path, "error", err, "similar_suppressed", n)
		}
		s.m.internalError.Inc()
		rt = v.def
	} else {
		rt.count()
	}
	kind := plan.RequestKind{ProxyCert: proxyCert, Upgrade: upgrade}.Index()
	resp := rt.resp[kind]
	if rt.set[kind] == nil {
		return resp // kube-mvp's own 503: Unavailable, or the proxy certificate refused
	}
	if len(identity) != 0 || len(owned) != 0 {
		resp = rt.response(append(identity, owned...), kind)
	}
	if tb.plans.Discovery != nil && wantsMergedDiscovery(method, path, accept) {
		*disc = discoveryState{doc: tb.plans.Discovery, ifNoneMatch: ifNoneMatch}
		if acceptsGzip(acceptEncoding) {
			disc.gzipped = tb.discoveryGzip
		}
		return withResponseHeaders(resp)
	}
	return resp
}

// decide parses the request line and looks it up in v. A request without :path (malformed;
// Envoy's codecs reject those before filters run) is treated as non-resource. A panic in
// the parser or the lookup is turned into an error rather than taking the process down.
func decide(v *view, method, path string) (rt *route, err error) {
	defer func() {
		if p := recover(); p != nil {
			rt, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	if path == "" {
		return v.def, nil
	}
	return v.route(v.routes.DecideKey(topology.ParsePathHeader(method, path))), nil
}

// headerValue returns a header's value: Envoy sends it in raw_value (runtime flag
// envoy.reloadable_features.send_header_raw_value, on by default) or, older or with the flag
// off, in value.
func headerValue(hv *corev3.HeaderValue) string {
	if hv.GetValue() != "" {
		return hv.GetValue()
	}
	return string(hv.GetRawValue())
}

// methodValue is headerValue for :method, without allocating for the usual methods.
func methodValue(hv *corev3.HeaderValue) string {
	if hv.GetValue() != "" {
		return hv.GetValue()
	}
	switch b := hv.GetRawValue(); string(b) {
	case "GET":
		return "GET"
	case "POST":
		return "POST"
	case "PUT":
		return "PUT"
	case "PATCH":
		return "PATCH"
	case "DELETE":
		return "DELETE"
	case "HEAD":
		return "HEAD"
	case "OPTIONS":
		return "OPTIONS"
	default:
		return string(b)
	}
}

// equalFold reports whether s equals the lower-case ASCII lower, ignoring ASCII case.
func equalFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// anyEqualFold reports whether s equals one of the lower-case names, ignoring ASCII case.
func anyEqualFold(lowers []string, s string) bool {
	for _, l := range lowers {
		if equalFold(s, l) {
			return true
		}
	}
	return false
}

// anyPrefixFold reports whether s is longer than one of the lower-case prefixes and starts
// with it, ignoring ASCII case.
func anyPrefixFold(prefixes []string, s string) bool {
	for _, p := range prefixes {
		if len(s) > len(p) && equalFold(s[:len(p)], p) {
			return true
		}
	}
	return false
}

func toLower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// logLimiter lets one log line through per second and counts the rest, so a flood of bad
// requests cannot flood the log.
type logLimiter struct {
	next       atomic.Int64 // unix nanos before which lines are suppressed
	suppressed atomic.Int64
}

func (l *logLimiter) allow(now time.Time) (suppressed int64, ok bool) {
	n := l.next.Load()
	if now.UnixNano() < n || !l.next.CompareAndSwap(n, now.Add(time.Second).UnixNano()) {
		l.suppressed.Add(1)
		return 0, false
	}
	return l.suppressed.Swap(0), true
}
