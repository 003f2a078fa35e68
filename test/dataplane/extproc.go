package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

type extProcClient struct {
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
}

// extProcClient returns the gRPC client of the ext_proc cluster (envoy_grpc.cluster_name):
// its first host, a unix socket (pipe) or host:port, dialled within the cluster's
// connect_timeout, HTTP/2 (gRPC) in plaintext.
func (d *DataPlane) extProcClient(cfg *config, cluster string) (*extProcClient, error) {
	cc := cfg.clusters[cluster]
	if cc == nil {
		return nil, fmt.Errorf("ext_proc cluster %q not found", cluster)
	}
	hosts := cc.staticHosts
	if cc.edsName != "" {
		hosts, _ = compileHosts(cfg.endpoints[cc.edsName])
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("ext_proc cluster %q has no hosts", cluster)
	}
	addr := hosts[0].address
	key := cluster + "|" + addr
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.extproc[key]; c != nil {
		return c, nil
	}
	if d.closed {
		return nil, errors.New("closed")
	}
	timeout := cc.connectTimeout
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		var nd net.Dialer
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if p, ok := strings.CutPrefix(addr, "unix:"); ok {
			return nd.DialContext(ctx, "unix", p)
		}
		return nd.DialContext(ctx, "tcp", addr)
	}
	conn, err := grpc.NewClient("passthrough:///"+strings.ReplaceAll(addr, "/", "_"),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
	if err != nil {
		return nil, err
	}
	c := &extProcClient{conn: conn, client: extprocv3.NewExternalProcessorClient(conn)}
	d.extproc[key] = c
	return c, nil
}

// extProcStream is a request's ext_proc gRPC stream, kept open after the request-headers
// step while the response headers are still to be sent on it (Envoy keeps one stream per
// request for every message of the request and its response).
type extProcStream struct {
	ep     *extProcCfg
	sp     string // stats prefix
	s      extprocv3.ExternalProcessor_ProcessClient
	ctx    context.Context
	cancel context.CancelFunc
}

type extProcResult struct {
	s    extprocv3.ExternalProcessor_ProcessClient
	resp *extprocv3.ProcessingResponse
	err  error
}

// exchange sends req on s and waits for the answer. The processor ending the stream cleanly
// (status OK) before answering is io.EOF; a failed Send's real error is on Recv.
func exchange(s extprocv3.ExternalProcessor_ProcessClient, req *extprocv3.ProcessingRequest, sent func()) extProcResult {
	if err := s.Send(req); err != nil {
		_, rerr := s.Recv()
		if rerr == io.EOF {
			return extProcResult{s: s, err: io.EOF}
		}
		return extProcResult{s: s, err: errors.Join(err, rerr)}
	}
	sent()
	resp, err := s.Recv()
	return extProcResult{s: s, resp: resp, err: err}
}

func (st *stream) extProcPrefix(ep *extProcCfg) string {
	return fmt.Sprintf("%sext_proc.%s.", st.prefix(), ep.statPrefix)
}

// extProcFail handles a failed ext_proc exchange: failure_mode_allow lets the request (or
// response) continue unprocessed and returns true; otherwise Envoy answers with
// status_on_error and it returns false.
func (st *stream) extProcFail(ep *extProcCfg, sp, details string) bool {
	return st.extProcFailWith(ep, sp, ep.statusOnError, details)
}

// extProcFailWith is extProcFail answering with code instead of status_on_error.
func (st *stream) extProcFailWith(ep *extProcCfg, sp string, code int, details string) bool {
	d := st.d
	d.stats.inc(sp + "streams_failed")
	if st.extProcFailsOpen(ep) {
		d.stats.inc(sp + "failure_mode_allowed")
		return true
	}
	st.localReply(code, "", details)
	return false
}

// extProcFailsOpen is failure_mode_allow: the filter's, or the route's ExtProcOverrides'.
func (st *stream) extProcFailsOpen(ep *extProcCfg) bool {
	if st.extProcFailOpen != nil {
		return *st.extProcFailOpen
	}
	return ep.failureModeAllow
}

// closeExtProc ends the request's ext_proc stream if it is still open (CloseSend, then the
// stream's context is cancelled): Envoy closes it when the request ends, however it ends
// (Filter::onDestroy).
func (st *stream) closeExtProc() {
	for _, x := range []*extProcStream{st.ext, st.extHeld} {
		if x != nil {
			_ = x.s.CloseSend()
			x.cancel()
		}
	}
	st.ext, st.extHeld = nil, nil
}

// holdExtProc keeps a stream whose last response arrived until the request ends, as Envoy
// before 1.37 does, and watches it: the processor ending it cleanly is done with
// (Filter::onGrpcClose); a failure while the request goes on resets the request
// (Filter::onGrpcError: with failure_mode_allow false, the response already under way).
func (st *stream) holdExtProc(x *extProcStream) {
	st.extHeld = x
	d, failOpen, path := st.d, st.extProcFailsOpen(x.ep), st.path
	go func() {
		_, err := x.s.Recv()
		switch {
		case x.ctx.Err() != nil: // the request ended and closed it
		case err == io.EOF:
			d.stats.inc(x.sp + "streams_closed")
		case err == nil:
			d.stats.inc(x.sp + "spurious_msgs_received")
		default:
			d.stats.inc(x.sp + "streams_failed")
			if failOpen {
				d.stats.inc(x.sp + "failure_mode_allowed")
				return
			}
			d.log.Warn("ext_proc stream held for the request failed: the request is reset", "path", path, "error", err)
			st.reset(fmt.Errorf("ext_proc stream failed: %w", err))
		}
	}()
}

// runExtProc runs the ext_proc filter's request-headers step: one bidirectional stream per
// request, one request_headers message (headers as raw_value, end_of_stream when the request
// has no body), one response awaited for at most message_timeout. It returns whether the
// route cache must be cleared and false when the request was answered (immediate response
// or failure). When the response headers are to be processed too (processing_mode, or the
// processor's mode_override), the stream stays open on st.ext; otherwise it is closed.
func (st *stream) runExtProc(ep *extProcCfg, md []kv) (clearRoute bool, ok bool) {
	d := st.d
	sp := st.extProcPrefix(ep)
	fail := func(details string) (bool, bool) {
		return false, st.extProcFail(ep, sp, details)
	}
	client, err := d.extProcClient(st.cfg, ep.cluster)
	if err != nil {
		d.log.Warn("ext_proc unavailable", "error", err)
		return fail("ext_proc_error_gRPC_error_14")
	}
	ctx, cancel := context.WithCancel(st.r.Context())
	// s is set once the exchange below has finished (it is not safe to close a stream while
	// it may still be sending); kept when the stream stays open for the response.
	var s extprocv3.ExternalProcessor_ProcessClient
	kept := false
	defer func() {
		if kept {
			return
		}
		if s != nil {
			_ = s.CloseSend()
		}
		cancel()
	}()
	for _, m := range md { // the route's overrides.grpc_initial_metadata
		ctx = metadata.AppendToOutgoingContext(ctx, m.name, m.value)
	}

	all := append(headerList{{":authority", st.host}, {":path", st.path}, {":method", st.method}, {":scheme", st.scheme}}, st.hdr...)
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers:     &corev3.HeaderMap{Headers: forwardHeaders(ep, all)},
		EndOfStream: st.r.Body == nil || st.r.Body == http.NoBody || st.r.ContentLength == 0,
	}}}
	ch := make(chan extProcResult, 1)
	d.stats.inc(sp + "streams_started")
	go func() {
		s, err := client.client.Process(ctx)
		if err != nil {
			ch <- extProcResult{err: err}
			return
		}
		ch <- exchange(s, req, func() { d.stats.inc(sp + "stream_msgs_sent") })
	}()
	var hr *extprocv3.HeadersResponse
	var sendResp bool
	if s, hr, sendResp, ok = st.awaitHeadersReply(ep, sp, ch, true, nil); hr == nil {
		return false, ok
	}
	cr := hr.GetResponse()
	if m := cr.GetHeaderMutation(); m != nil {
		if err := st.applyMutation(ep.rules, m, sp); err != nil {
			d.log.Warn("ext_proc header mutation rejected", "error", err)
			return fail("ext_proc_error_header_mutation_rejected")
		}
	}
	clearRoute, stat := routeCacheDecision(ep.routeCache, cr)
	if stat != "" {
		d.stats.inc(sp + stat)
	}
	switch {
	case sendResp:
		kept = true
		st.ext = &extProcStream{ep: ep, sp: sp, s: s, ctx: ctx, cancel: cancel}
	case d.version.extProcStreamForRequestLife():
		kept = true
		st.holdExtProc(&extProcStream{ep: ep, sp: sp, s: s, ctx: ctx, cancel: cancel})
	}
	return clearRoute, true
}

// routeCacheDecision is whether a request-headers response cr clears the route cache, and
// the counter it increments ("" for none), as Envoy's DecodingProcessorState::clearRouteCache
// (source/extensions/filters/http/ext_proc/processor_state.cc) for a downstream filter:
// without a header_mutation nothing is cleared, whatever route_cache_action and
// clear_route_cache say (clear_route_cache set counts clear_route_cache_ignored); with one,
// CLEAR clears, DEFAULT clears when clear_route_cache is set, RETAIN never clears
// (clear_route_cache set counts clear_route_cache_disabled). It runs after the mutation was
// applied (a rejected mutation fails the request before).
func routeCacheDecision(action extprocfilterv3.ExternalProcessor_RouteCacheAction, cr *extprocv3.CommonResponse) (clear bool, stat string) {
	if cr.GetHeaderMutation() == nil {
		if cr.GetClearRouteCache() {
			return false, "clear_route_cache_ignored"
		}
		return false, ""
	}
	switch action {
	case extprocfilterv3.ExternalProcessor_CLEAR:
		return true, ""
	case extprocfilterv3.ExternalProcessor_RETAIN:
		if cr.GetClearRouteCache() {
			return false, "clear_route_cache_disabled"
		}
		return false, ""
	default: // DEFAULT
		return cr.GetClearRouteCache(), ""
	}
}

// awaitHeadersReply waits at most message_timeout for the processor's answer (on ch) to a
// headers message of the request phase or of the response phase, and settles every outcome
// but a headers response of that phase as Envoy does in both: no answer in time (abandon,
// when set, gives up the stream first), a failed stream, an answer this data plane does not
// implement or a spurious one (extProcFail), a clean end of the stream (the
// request or response proceeds unprocessed), an immediate_response (the client's answer).
// hr is nil then and ok tells whether the request or response goes on. Otherwise hr is the
// headers response and sendResp whether the response headers are to be sent too, after the
// processor's mode_override (from ep's processing_mode in the request phase). s is the
// stream once the exchange has finished.
func (st *stream) awaitHeadersReply(ep *extProcCfg, sp string, ch <-chan extProcResult, requestPhase bool, abandon func()) (
	s extprocv3.ExternalProcessor_ProcessClient, hr *extprocv3.HeadersResponse, sendResp, ok bool) {
	d := st.d
	timer := time.NewTimer(ep.messageTimeout)
	defer timer.Stop()
	var res extProcResult
	select {
	case res = <-ch:
	case <-timer.C:
		// message_timeout: no answer in time is a failure; without failure_mode_allow it
		// is answered with 504 Gateway Timeout, not status_on_error (Envoy 1.35+,
		// envoyproxy/envoy#39217, which made it unconditional). The exchange may still be
		// running, so a kept stream is abandoned (its context cancelled) rather than closed.
		d.stats.inc(sp + "message_timeouts")
		if abandon != nil {
			abandon()
		}
		return nil, nil, false, st.extProcFailWith(ep, sp, http.StatusGatewayTimeout, "ext_proc_error_per-message_timeout_exceeded")
	}
	fail := func(details string) (extprocv3.ExternalProcessor_ProcessClient, *extprocv3.HeadersResponse, bool, bool) {
		return res.s, nil, false, st.extProcFail(ep, sp, details)
	}
	if res.err == io.EOF {
		// The processor closed the stream cleanly without answering: the request (or the
		// response) proceeds without it (ExternalProcessor service, "if the server closes
		// the gRPC stream cleanly, then the data plane proceeds without consulting the
		// server"; Filter::onGrpcClose).
		d.stats.inc(sp + "streams_closed")
		return res.s, nil, false, true
	}
	if res.err != nil {
		d.log.Warn("ext_proc stream failed", "error", res.err)
		return fail(fmt.Sprintf("ext_proc_error_gRPC_error_%d", int(status.Code(res.err))))
	}
	d.stats.inc(sp + "stream_msgs_received")
	d.log.Debug("ext_proc response", "path", st.path, "response", res.resp)
	headers := false // a headers response of this phase
	switch r := res.resp.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		st.extProcDynamicMetadata(ep, res.resp)
		hr, headers = r.RequestHeaders, requestPhase
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		st.extProcDynamicMetadata(ep, res.resp)
		hr, headers = r.ResponseHeaders, !requestPhase
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		st.extProcDynamicMetadata(ep, res.resp)
		st.immediateResponse(ep, sp, r.ImmediateResponse)
		return res.s, nil, false, false
	}
	if !headers {
		d.stats.inc(sp + "spurious_msgs_received")
		return fail("ext_proc_error_spurious_message")
	}
	if hr == nil {
		hr = &extprocv3.HeadersResponse{} // as unset: CONTINUE, nothing changed
	}
	cr := hr.GetResponse()
	if cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE || cr.GetBodyMutation() != nil || cr.GetTrailers() != nil {
		d.stats.inc(sp + "spurious_msgs_received")
		return fail("ext_proc_error_unimplemented_response")
	}
	sendResp, err := modeOverride(ep, res.resp.GetModeOverride(), ep.sendRespHeaders, requestPhase)
	if err != nil {
		d.log.Warn("ext_proc mode_override not implemented", "error", err)
		d.stats.inc(sp + "spurious_msgs_received")
		return fail("ext_proc_error_unimplemented_mode_override")
	}
	return res.s, hr, sendResp, true
}

// extProcDynamicMetadata is Envoy's ext_proc Filter::setDynamicMetadata
// (source/extensions/filters/http/ext_proc/ext_proc.cc), which onReceiveMessage runs for a
// headers response or an immediate_response before handling it: each top-level field of the
// response's dynamic_metadata names a namespace; one listed in
// metadata_options.receiving_namespaces.untyped is merged into the request's dynamic
// metadata (StreamInfo::setDynamicMetadata: the Struct's fields replace those of the same
// name), as a Struct (a value that is not one merges nothing); any other is dropped. Without
// receiving namespaces nothing is accepted.
func (st *stream) extProcDynamicMetadata(ep *extProcCfg, resp *extprocv3.ProcessingResponse) {
	if len(ep.receivingNamespaces) == 0 || resp.GetDynamicMetadata() == nil {
		return
	}
	for ns, v := range resp.GetDynamicMetadata().GetFields() {
		if !slices.Contains(ep.receivingNamespaces, ns) {
			st.d.log.Debug("ext_proc dynamic metadata namespace not received", "namespace", ns)
			continue
		}
		if st.dynamicMetadata == nil {
			st.dynamicMetadata = map[string]*structpb.Struct{}
		}
		cur := st.dynamicMetadata[ns]
		merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		for k, x := range cur.GetFields() {
			merged.Fields[k] = x
		}
		for k, x := range v.GetStructValue().GetFields() {
			merged.Fields[k] = x
		}
		st.dynamicMetadata[ns] = merged
	}
}

// modeOverride applies a processor's mode_override (ProcessingResponse.mode_override, sent
// with a headers response) to whether the response headers are sent, for this request only.
// Envoy ignores mode_override unless allow_mode_override is set. In an override, a header
// or trailer mode DEFAULT means no change from the filter's processing_mode (documented for
// ProcessingMode.HeaderSendMode DEFAULT), and request_header_mode is ignored (the request
// headers are already processed). Sending bodies or trailers is not implemented by this
// data plane: an override asking for it (in the request phase, for either direction; in the
// response phase, for the response) is an error. sendResp is the mode before the override.
func modeOverride(ep *extProcCfg, mo *extprocfilterv3.ProcessingMode, sendResp, requestPhase bool) (bool, error) {
	if mo == nil || !ep.allowModeOverride {
		return sendResp, nil
	}
	if mo.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_NONE || mo.GetResponseTrailerMode() == extprocfilterv3.ProcessingMode_SEND ||
		requestPhase && (mo.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_NONE || mo.GetRequestTrailerMode() == extprocfilterv3.ProcessingMode_SEND) {
		return sendResp, fmt.Errorf("mode_override {%v} is not implemented", mo)
	}
	switch mo.GetResponseHeaderMode() {
	case extprocfilterv3.ProcessingMode_SEND:
		return true, nil
	case extprocfilterv3.ProcessingMode_SKIP:
		return false, nil
	}
	return sendResp, nil
}

// immediateResponse answers the request with a processor's immediate_response, as Envoy's
// sendImmediateResponse does: a local reply (local_reply_config applies) with its status
// (200 when unset), body, details and headers.
func (st *stream) immediateResponse(ep *extProcCfg, sp string, ir *extprocv3.ImmediateResponse) {
	code := int(ir.GetStatus().GetCode())
	if code == 0 {
		code = http.StatusOK
	}
	// Immediate response headers are checked with the filter's mutation_rules, like any
	// other header mutation (Envoy since 1.32: envoyproxy/envoy#27925, its runtime guard
	// removed in #35381). A refused header is dropped and counted; the reply still goes out
	// (sendImmediateResponse logs the failed mutation, envoyproxy/envoy#27547).
	var extra []kv
	for _, o := range ir.GetHeaders().GetSetHeaders() {
		k := strings.ToLower(o.GetHeader().GetKey())
		v := o.GetHeader().GetValue()
		if len(o.GetHeader().GetRawValue()) > 0 {
			v = string(o.GetHeader().GetRawValue())
		}
		if !validHeader(k, v) || strings.HasPrefix(k, ":") || k == "host" || checkMutation(ep.rules, k) != nil {
			st.d.stats.inc(sp + "rejected_header_mutations")
			continue
		}
		extra = append(extra, kv{k, v})
	}
	st.localReply(code, string(ir.GetBody()), ir.GetDetails(), extra...)
}

// extProcResponseHeaders is the ext_proc filter's response-headers step (encodeHeaders) for
// a request whose stream was kept open for it: one response_headers message on the same
// stream (":status", then every response header, values in raw_value, forward_rules applied
// as for requests; end_of_stream when the response has no body), one answer awaited for at
// most message_timeout. A headers response (CONTINUE) may mutate hdr under mutation_rules;
// an immediate_response replaces the upstream response with a local reply (Envoy accepts
// one at any phase before the response headers went downstream); errors, a clean end of the
// stream and message_timeout are handled as in the request phase. It returns false when the
// client was answered with a local reply: the caller discards the upstream response.
func (st *stream) extProcResponseHeaders(code int, hdr *headerList, endOfStream bool) bool {
	d, x := st.d, st.ext
	ep, sp := x.ep, x.sp
	fail := func(details string) bool { return st.extProcFail(ep, sp, details) }
	all := append(headerList{{":status", strconv.Itoa(code)}}, *hdr...)
	req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers:     &corev3.HeaderMap{Headers: forwardHeaders(ep, all)},
		EndOfStream: endOfStream,
	}}}
	ch := make(chan extProcResult, 1)
	go func() { ch <- exchange(x.s, req, func() { d.stats.inc(sp + "stream_msgs_sent") }) }()
	abandon := func() { st.ext = nil; x.cancel() }
	_, hr, _, ok := st.awaitHeadersReply(ep, sp, ch, false, abandon)
	if hr == nil {
		return ok
	}
	// clear_route_cache is ignored when processing response messages
	// (CommonResponse.clear_route_cache).
	if m := hr.GetResponse().GetHeaderMutation(); m != nil {
		// The mutation is applied to a copy: a failed one leaves the response as the
		// upstream sent it (for failure_mode_allow).
		mutated := slices.Clone(*hdr)
		if err := d.applyHeaderMutation(ep.rules, m, sp, responseTarget(&mutated)); err != nil {
			d.log.Warn("ext_proc response header mutation rejected", "error", err)
			if errors.Is(err, errUnimplemented) {
				return fail("ext_proc_error_unimplemented_response")
			}
			return fail("ext_proc_error_header_mutation_rejected")
		}
		*hdr = mutated
	}
	return true
}

// forwardHeaders are the headers sent to the processor (the pseudo-headers first, then
// every header), each value in raw_value, minus those forward_rules exclude
// (allowed_headers, when set, is the list of the only ones sent; disallowed_headers are
// never sent). The rules apply to request and response headers alike.
func forwardHeaders(ep *extProcCfg, all headerList) []*corev3.HeaderValue {
	var out []*corev3.HeaderValue
	for _, h := range all {
		if ep.allowedHeaders != nil && !anyMatch(ep.allowedHeaders, h.name) {
			continue
		}
		if anyMatch(ep.disallowed, h.name) {
			continue
		}
		out = append(out, &corev3.HeaderValue{Key: h.name, RawValue: []byte(h.value)})
	}
	return out
}

func anyMatch(ms []*stringMatcher, s string) bool {
	for _, m := range ms {
		if m.match(s) {
			return true
		}
	}
	return false
}

func validHeader(k, v string) bool {
	if k == "" || strings.ContainsAny(k, " \t\r\n:") && !strings.HasPrefix(k, ":") {
		return false
	}
	return !strings.ContainsAny(v, "\r\n\x00")
}

var errDisallowed = errors.New("disallowed")

// checkMutation is Envoy's HeaderMutationRules check (mutation_rules Checker::isAllowed) for
// one header name, in its order: disallow_expression refuses; allow_expression allows;
// disallow_all refuses; the routing headers (host, :authority, :method, :scheme) need
// allow_all_routing; ":"-prefixed headers are refused with disallow_system; x-envoy-* need
// allow_envoy; anything else is allowed. Without mutation_rules the defaults (all false) apply.
func checkMutation(r *mutationRules, name string) error {
	if r == nil {
		r = &mutationRules{}
	}
	if r.disallow != nil && r.disallow.MatchString(name) {
		return errDisallowed
	}
	if r.allow != nil && r.allow.MatchString(name) {
		return nil
	}
	if r.disallowAll {
		return errDisallowed
	}
	switch name {
	case "host", ":authority", ":method", ":scheme":
		if !r.allowAllRouting {
			return errDisallowed
		}
	}
	if r.disallowSystem && strings.HasPrefix(name, ":") {
		return errDisallowed
	}
	if !r.allowEnvoy && strings.HasPrefix(name, "x-envoy-") {
		return errDisallowed
	}
	return nil
}

// mutationTarget is the header map an ext_proc header mutation applies to: a request's or
// a response's.
type mutationTarget struct {
	hdr *headerList
	// fixed reports the names a mutation may not remove (pseudo-headers; host on requests).
	fixed func(name string) bool
	// special sets the names that are not in hdr (pseudo-headers; host on requests):
	// handled is false for an ordinary header. errDisallowed refuses the change like
	// mutation_rules; any other error fails the mutation.
	special func(name, value string) (handled bool, err error)
}

// requestTarget is the request's header map: :path, :method, :scheme and :authority (host)
// can be set, and none of them removed.
func (st *stream) requestTarget() mutationTarget {
	return mutationTarget{
		hdr:   &st.hdr,
		fixed: func(k string) bool { return strings.HasPrefix(k, ":") || k == "host" },
		special: func(k, v string) (bool, error) {
			switch k {
			case ":path":
				st.path = v
			case ":method":
				st.method = v
			case ":authority", "host":
				st.host = v
			case ":scheme":
				st.scheme = v
			default:
				return false, nil
			}
			return true, nil
		},
	}
}

var errUnimplemented = errors.New("not implemented by the test data plane")

// responseTarget is a response's header map. The only response pseudo-header is :status;
// changing it is not implemented here, and no pseudo-header can be removed or added.
func responseTarget(h *headerList) mutationTarget {
	return mutationTarget{
		hdr:   h,
		fixed: func(k string) bool { return strings.HasPrefix(k, ":") },
		special: func(k, _ string) (bool, error) {
			switch {
			case k == ":status":
				return true, fmt.Errorf("mutation of :status: %w", errUnimplemented)
			case strings.HasPrefix(k, ":"):
				return true, errDisallowed
			}
			return false, nil
		},
	}
}

// applyMutation applies an ext_proc header mutation to the request headers.
func (st *stream) applyMutation(r *mutationRules, m *extprocv3.HeaderMutation, sp string) error {
	return st.d.applyHeaderMutation(r, m, sp, st.requestTarget())
}

// applyHeaderMutation applies an ext_proc header mutation to a request's or a response's
// headers, with the same mutation_rules checks in both directions. A disallowed change is
// an error with disallow_is_error, else it is skipped (and counted). Setting both value and
// raw_value, or an invalid header, is always an error. append (the deprecated BoolValue, the
// only one ext_proc honours) adds a value; otherwise the header is replaced. Pseudo-headers
// (and host on requests) cannot be removed. Like Envoy's ext_proc (MutationUtils::
// applyHeaderMutations), removals are applied before the sets.
func (d *DataPlane) applyHeaderMutation(r *mutationRules, m *extprocv3.HeaderMutation, sp string, t mutationTarget) error {
	isErr := r != nil && r.disallowIsError
	reject := func(what string) error {
		d.stats.inc(sp + "rejected_header_mutations")
		if isErr {
			return fmt.Errorf("mutation of %q is not allowed", what)
		}
		return nil
	}
	for _, k := range m.GetRemoveHeaders() {
		k = strings.ToLower(k)
		if t.fixed(k) {
			if err := reject(k); err != nil {
				return err
			}
			continue
		}
		if checkMutation(r, k) != nil {
			if err := reject(k); err != nil {
				return err
			}
			continue
		}
		t.hdr.del(k)
	}
	for _, o := range m.GetSetHeaders() {
		h := o.GetHeader()
		k := strings.ToLower(h.GetKey())
		if h.GetValue() != "" && len(h.GetRawValue()) > 0 {
			d.stats.inc(sp + "rejected_header_mutations")
			return fmt.Errorf("header %q sets both value and raw_value", k)
		}
		v := h.GetValue()
		if len(h.GetRawValue()) > 0 {
			v = string(h.GetRawValue())
		}
		if !validHeader(k, v) {
			d.stats.inc(sp + "rejected_header_mutations")
			return fmt.Errorf("invalid header %q", k)
		}
		if checkMutation(r, k) != nil {
			if err := reject(k); err != nil {
				return err
			}
			continue
		}
		if handled, err := t.special(k, v); handled {
			if errors.Is(err, errDisallowed) {
				if err := reject(k); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			continue
		}
		// append_action, when not the default, decides (newer Envoy); else the deprecated
		// append flag: true adds a value, false (the default) replaces every value.
		_, exists := t.hdr.get(k)
		switch o.GetAppendAction() {
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				t.hdr.add(k, v)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			t.hdr.set(k, v)
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				t.hdr.set(k, v)
			}
		default:
			if o.GetAppend().GetValue() {
				t.hdr.add(k, v)
			} else {
				t.hdr.set(k, v)
			}
		}
	}
	return nil
}
