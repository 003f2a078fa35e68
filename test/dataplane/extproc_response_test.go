package dataplane

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// respHeadersProc is a test ext_proc server. A request with an x-test-case header is
// answered (request_headers, CONTINUE) with mode_override{response_header_mode: SEND}; the
// response_headers message that may follow is recorded and answered as the case says:
//
//	immediate:  immediate_response 200 with its own body, content-type and etag
//	mutate:     CONTINUE, adding the allowed header x-test-added
//	disallowed: CONTINUE, setting cache-control, which mutation_rules do not allow
//	silent:     no answer at all
//	close:      the stream ends cleanly (status OK) without an answer
//
// close-request ends the stream cleanly without answering the request headers. Other
// requests get a plain CONTINUE.
type respHeadersProc struct {
	extprocv3.UnimplementedExternalProcessorServer
	mu   sync.Mutex
	seen map[string][]*extprocv3.HttpHeaders // case -> response_headers messages received
}

func newRespHeadersProc() *respHeadersProc {
	return &respHeadersProc{seen: map[string][]*extprocv3.HttpHeaders{}}
}

func (p *respHeadersProc) received(tc string) []*extprocv3.HttpHeaders {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*extprocv3.HttpHeaders(nil), p.seen[tc]...)
}

func headerOf(h *extprocv3.HttpHeaders, name string) (string, bool) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == name {
			return string(hv.GetRawValue()), true
		}
	}
	return "", false
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}

const discoveryBody = `{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[]}`

func (p *respHeadersProc) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := s.Recv()
	if err != nil {
		return nil
	}
	tc, _ := headerOf(req.GetRequestHeaders(), "x-test-case")
	if tc == "close-request" {
		return nil
	}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	if tc != "" {
		resp.ModeOverride = &extprocfilterv3.ProcessingMode{ResponseHeaderMode: extprocfilterv3.ProcessingMode_SEND}
	}
	if err := s.Send(resp); err != nil {
		return nil
	}
	req, err = s.Recv()
	if err != nil {
		return nil // the data plane closed the stream: no response headers
	}
	p.mu.Lock()
	p.seen[tc] = append(p.seen[tc], req.GetResponseHeaders())
	p.mu.Unlock()
	headers := func(m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: m}}}}
	}
	switch tc {
	case "immediate":
		resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK},
			Body:   []byte(discoveryBody),
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type",
				"application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"), setHeader("etag",
				`"discovery-1"`)}},
			Details: "kube_mvp_discovery",
		}}}
	case "mutate":
		resp = headers(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-test-added", "yes")}})
	case "disallowed":
		resp = headers(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("cache-control", "no-store")}})
	case "close":
		return nil
	default: // silent
		<-s.Context().Done()
		return nil
	}
	if err := s.Send(resp); err != nil {
		return nil
	}
	_, _ = s.Recv() // until the data plane ends the stream
	return nil
}

// allowModeOverride is the snapshot's ext_proc filter with allow_mode_override, x-test-*
// headers allowed by mutation_rules, and the response header "server" not forwarded.
func allowModeOverride(ep *extprocfilterv3.ExternalProcessor) {
	ep.AllowModeOverride = true
	// Inside the product's ^(...)$: appended after it, the RE2 program is over Envoy's 100.
	re := ep.MutationRules.AllowExpression.Regex
	ep.MutationRules.AllowExpression.Regex = strings.TrimSuffix(re, ")$") + "|x-test-.+)$"
	ep.ForwardRules.DisallowedHeaders.Patterns = append(ep.ForwardRules.DisallowedHeaders.Patterns,
		&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "server"}})
}

// statDelta runs f and returns how much each ext_proc counter grew.
func (e *env) statDelta(f func()) map[string]uint64 {
	names := []string{"stream_msgs_sent", "stream_msgs_received", "message_timeouts", "streams_failed", "streams_closed", "rejected_header_mutations"}
	before := map[string]uint64{}
	for _, n := range names {
		before[n] = e.stat("http.kube_apiserver.ext_proc.kube_mvp." + n)
	}
	f()
	out := map[string]uint64{}
	for _, n := range names {
		out[n] = e.stat("http.kube_apiserver.ext_proc.kube_mvp."+n) - before[n]
	}
	return out
}

func wantDelta(t *testing.T, what string, got map[string]uint64, want map[string]uint64) {
	t.Helper()
	for k, v := range got {
		if v != want[k] {
			t.Errorf("%s: %s grew by %d, want %d (all: %v)", what, k, v, want[k], got)
		}
	}
}

// TestExtProcResponseHeaders: with allow_mode_override, a processor's mode_override
// {response_header_mode: SEND} makes the data plane send it the upstream response headers
// on the same stream, and its answer is applied: an immediate_response replaces the
// upstream response, a header mutation (under mutation_rules) changes it, and no answer
// within message_timeout fails the request (504 as Envoy 1.35+, mapped to a 503 Status).
func TestExtProcResponseHeaders(t *testing.T) {
	p := newRespHeadersProc()
	e := newEnv(t, envOptions{extProc: p, editExtProc: allowModeOverride})
	if n := e.dp.NACKs(); len(n) > 0 {
		t.Fatalf("NACKs: %q", n)
	}
	c := e.client(nil) // GET /apis takes the discovery route, through ext_proc

	t.Run("immediate", func(t *testing.T) {
		var r reply
		d := e.statDelta(func() { r = e.do(c, "GET", "/apis", map[string]string{"X-Test-Case": "immediate"}) })
		wantDelta(t, "immediate", d, map[string]uint64{"stream_msgs_sent": 2, "stream_msgs_received": 2})
		if r.status != 200 || string(r.body) != discoveryBody {
			t.Fatalf("status %d body %q, want 200 and the processor's body", r.status, r.body)
		}
		if got := r.header.Get("Content-Type"); got != "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList" {
			t.Errorf("Content-Type %q", got)
		}
		if got := r.header.Get("Etag"); got != `"discovery-1"` {
			t.Errorf("Etag %q", got)
		}
		if r.header.Get("Server") == "fake-apiserver" {
			t.Errorf("the upstream's headers reached the client: %v", r.header)
		}
		// The upstream was asked; the processor saw its response headers: :status first,
		// forward_rules applied (server is disallowed), end_of_stream false (a body follows).
		upstream := 0
		for _, f := range e.apiservers {
			for _, rq := range f.requests() {
				if rq.Path == "/apis" && rq.Header.Get("X-Test-Case") == "immediate" {
					upstream++
				}
			}
		}
		if upstream != 1 {
			t.Errorf("the upstream saw %d requests, want 1", upstream)
		}
		msgs := p.received("immediate")
		if len(msgs) != 1 {
			t.Fatalf("%d response_headers messages, want 1", len(msgs))
		}
		m := msgs[0]
		if hs := m.GetHeaders().GetHeaders(); len(hs) == 0 || hs[0].GetKey() != ":status" || string(hs[0].GetRawValue()) != "200" {
			t.Errorf("response headers do not start with :status 200: %v", hs)
		}
		if v, _ := headerOf(m, "content-type"); v != "application/json" {
			t.Errorf("content-type %q sent to the processor", v)
		}
		if _, ok := headerOf(m, "server"); ok {
			t.Errorf("server sent to the processor despite forward_rules")
		}
		if m.GetEndOfStream() {
			t.Errorf("end_of_stream true for a response with a body")
		}
	})

	t.Run("mutate", func(t *testing.T) {
		for _, method := range []string{"GET", "HEAD"} {
			var r reply
			d := e.statDelta(func() { r = e.do(c, method, "/apis", map[string]string{"X-Test-Case": "mutate"}) })
			wantDelta(t, method, d, map[string]uint64{"stream_msgs_sent": 2, "stream_msgs_received": 2})
			if r.status != 200 || r.header.Get("Server") != "fake-apiserver" {
				t.Fatalf("%s: status %d, server %q: %s", method, r.status, r.header.Get("Server"), r.body)
			}
			if method == "GET" && r.seen.Path != "/apis" {
				t.Errorf("GET: the upstream body did not arrive: %q", r.body)
			}
			if got := r.header.Get("X-Test-Added"); got != "yes" {
				t.Errorf("%s: X-Test-Added %q, want the processor's mutation", method, got)
			}
		}
		msgs := p.received("mutate")
		if len(msgs) != 2 || msgs[0].GetEndOfStream() || !msgs[1].GetEndOfStream() {
			t.Errorf("end_of_stream of GET and HEAD: %v", msgs)
		}
	})

	// The discovery route overrides failure_mode_allow (merged discovery may fall back to
	// one apiserver's own): a failed response-headers step lets the upstream response go on
	// unprocessed.
	t.Run("disallowed mutation", func(t *testing.T) {
		var r reply
		d := e.statDelta(func() { r = e.do(c, "GET", "/apis", map[string]string{"X-Test-Case": "disallowed"}) })
		wantDelta(t, "disallowed", d, map[string]uint64{"stream_msgs_sent": 2, "stream_msgs_received": 2, "streams_failed": 1, "rejected_header_mutations": 1})
		wantFailedOpen(t, r)
	})

	t.Run("message timeout", func(t *testing.T) {
		var r reply
		d := e.statDelta(func() { r = e.do(c, "GET", "/apis", map[string]string{"X-Test-Case": "silent"}) })
		wantDelta(t, "silent", d, map[string]uint64{"stream_msgs_sent": 2, "stream_msgs_received": 1, "message_timeouts": 1, "streams_failed": 1})
		wantFailedOpen(t, r)
		if n := len(p.received("silent")); n != 1 {
			t.Errorf("%d response_headers messages, want 1", n)
		}
	})

	// A processor that closes the stream cleanly lets the request or the response proceed
	// without it (ExternalProcessor service documentation), even with failure_mode_allow
	// false.
	t.Run("clean close", func(t *testing.T) {
		for tc, sent := range map[string]uint64{"close": 2, "close-request": 1} {
			var r reply
			d := e.statDelta(func() { r = e.do(c, "GET", "/apis", map[string]string{"X-Test-Case": tc}) })
			wantDelta(t, tc, d, map[string]uint64{"stream_msgs_sent": sent, "stream_msgs_received": sent - 1, "streams_closed": 1})
			if r.status != 200 || r.seen.Path != "/apis" {
				t.Errorf("%s: status %d: %s", tc, r.status, r.body)
			}
		}
	})

	t.Run("no override", func(t *testing.T) {
		var r reply
		d := e.statDelta(func() { r = e.do(c, "GET", "/apis", nil) })
		wantDelta(t, "no override", d, map[string]uint64{"stream_msgs_sent": 1, "stream_msgs_received": 1})
		if r.status != 200 || r.seen.Path != "/apis" {
			t.Errorf("status %d: %s", r.status, r.body)
		}
	})
}

// TestExtProcModeOverrideIgnored: with allow_mode_override false, Envoy ignores a
// processor's mode_override: no response_headers message is sent and the client gets the
// upstream's response.
func TestExtProcModeOverrideIgnored(t *testing.T) {
	p := newRespHeadersProc()
	e := newEnv(t, envOptions{extProc: p, editExtProc: func(ep *extprocfilterv3.ExternalProcessor) { ep.AllowModeOverride = false }})
	c := e.client(nil) // the discovery route, through ext_proc
	for _, tc := range []string{"immediate", "silent"} {
		var r reply
		d := e.statDelta(func() { r = e.do(c, "GET", "/apis", map[string]string{"X-Test-Case": tc}) })
		wantDelta(t, tc, d, map[string]uint64{"stream_msgs_sent": 1, "stream_msgs_received": 1})
		if r.status != 200 || r.header.Get("Server") != "fake-apiserver" || r.seen.Path != "/apis" {
			t.Errorf("%s: status %d, server %q: %s", tc, r.status, r.header.Get("Server"), r.body)
		}
		if n := len(p.received(tc)); n != 0 {
			t.Errorf("%s: %d response_headers messages sent, want none", tc, n)
		}
	}
}

// TestModeOverride: which mode_override fields change whether the response headers are
// sent, which are ignored, and which ask for what this data plane does not implement.
func TestModeOverride(t *testing.T) {
	on, off := &extProcCfg{allowModeOverride: true}, &extProcCfg{}
	type pm = extprocfilterv3.ProcessingMode
	const (
		send, skip = extprocfilterv3.ProcessingMode_SEND, extprocfilterv3.ProcessingMode_SKIP
	)
	cases := []struct {
		name          string
		ep            *extProcCfg
		mo            *pm
		before, inReq bool
		want, wantErr bool
	}{
		{"none", on, nil, false, true, false, false},
		{"send", on, &pm{ResponseHeaderMode: send}, false, true, true, false},
		{"skip", on, &pm{ResponseHeaderMode: skip}, true, true, false, false},
		{"default keeps the configured mode", on, &pm{}, true, true, true, false},
		{"request_header_mode is ignored", on, &pm{RequestHeaderMode: skip}, false, true, false, false},
		{"not allowed", off, &pm{ResponseHeaderMode: send}, false, true, false, false},
		{"not allowed, unimplemented ignored too", off, &pm{ResponseBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}, false, true, false, false},
		{"request body", on, &pm{ResponseHeaderMode: send, RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}, false, true, false, true},
		{"response body", on, &pm{ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED}, false, true, false, true},
		{"response trailers", on, &pm{ResponseTrailerMode: send}, false, false, false, true},
		{"request trailers", on, &pm{RequestTrailerMode: send}, false, true, false, true},
		{"request trailers after the request", on, &pm{RequestTrailerMode: send, ResponseTrailerMode: skip}, true, false, true, false},
	}
	for _, tc := range cases {
		got, err := modeOverride(tc.ep, tc.mo, tc.before, tc.inReq)
		if (err != nil) != tc.wantErr || err == nil && got != tc.want {
			t.Errorf("%s: got %v, %v; want %v, error %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestResponseMutation: a header mutation of response headers follows mutation_rules like
// one of request headers; pseudo-headers cannot be removed or added, and changing :status
// is not implemented.
func TestResponseMutation(t *testing.T) {
	d := &DataPlane{stats: newStats()}
	rules := &mutationRules{disallowIsError: true}
	hdr := headerList{{":status", "200"}, {"content-type", "application/json"}, {"etag", `"1"`}, {"vary", "Accept"}}
	m := &extprocv3.HeaderMutation{RemoveHeaders: []string{"ETag"}, SetHeaders: []*corev3.HeaderValueOption{
		setHeader("x-a", "1"), setHeader("content-type", "text/plain"),
		{Header: &corev3.HeaderValue{Key: "vary", RawValue: []byte("Accept-Encoding")}, Append: wrapperspb.Bool(true)}}}
	if err := d.applyHeaderMutation(rules, m, "p.", responseTarget(&hdr)); err != nil {
		t.Fatal(err)
	}
	want := headerList{{":status", "200"}, {"vary", "Accept"}, {"x-a", "1"}, {"content-type", "text/plain"}, {"vary", "Accept-Encoding"}}
	if !slices.Equal(hdr, want) {
		t.Errorf("got %v, want %v", hdr, want)
	}
	for _, m := range []*extprocv3.HeaderMutation{
		{RemoveHeaders: []string{":status"}},
		{SetHeaders: []*corev3.HeaderValueOption{setHeader(":path", "/x")}},
		{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-envoy-x", "1")}},
	} {
		if err := d.applyHeaderMutation(rules, m, "p.", responseTarget(&hdr)); err == nil || errors.Is(err, errUnimplemented) {
			t.Errorf("%v: error %v, want a rejection", m, err)
		}
	}
	err := d.applyHeaderMutation(rules, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":status", "304")}}, "p.", responseTarget(&hdr))
	if !errors.Is(err, errUnimplemented) {
		t.Errorf(":status: error %v, want not implemented", err)
	}
	// Without disallow_is_error a disallowed change is skipped and counted.
	before := d.stats.get("p.rejected_header_mutations")
	if err := d.applyHeaderMutation(nil, &extprocv3.HeaderMutation{RemoveHeaders: []string{":status"}}, "p.", responseTarget(&hdr)); err != nil {
		t.Fatal(err)
	}
	if d.stats.get("p.rejected_header_mutations") != before+1 || !slices.Equal(hdr, want) {
		t.Errorf("skipped rejection: %v", hdr)
	}
}

// recordingProc records the request headers of every stream and lets the request go on.
type recordingProc struct {
	extprocv3.UnimplementedExternalProcessorServer
	mu   sync.Mutex
	seen []*extprocv3.HttpHeaders
}

func (p *recordingProc) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := s.Recv()
	if err != nil {
		return nil
	}
	p.mu.Lock()
	p.seen = append(p.seen, req.GetRequestHeaders())
	p.mu.Unlock()
	_ = s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	return nil
}

// TestCredentialsNotForwardedToExtProc: extproc decides on the path, the method and the
// client certificate, so the snapshot's forward_rules keep every credential a request may
// carry (Authorization, Cookie, Proxy-Authorization, and Sec-WebSocket-Protocol, where
// WebSocket clients put their bearer token) away from it; the apiserver still gets them.
func TestCredentialsNotForwardedToExtProc(t *testing.T) {
	p := &recordingProc{}
	e := newEnv(t, envOptions{extProc: p})
	c := e.client(e.userCert("alice"))
	creds := map[string]string{"Authorization": "Bearer secret-token", "Cookie": "session=secret", "Proxy-Authorization": "Basic c2VjcmV0",
		"Sec-WebSocket-Protocol": "base64url.bearer.authorization.k8s.io.c2VjcmV0, v4.channel.k8s.io"}
	r := e.do(c, "GET", "/apis/batch/v1/namespaces/default/jobs", creds) // batch/v1 takes ext_proc
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	p.mu.Lock()
	seen := p.seen
	p.mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("%d ext_proc streams, want 1", len(seen))
	}
	for _, name := range []string{"authorization", "cookie", "proxy-authorization", "sec-websocket-protocol"} {
		if v, ok := headerOf(seen[0], name); ok {
			t.Errorf("extproc received %s: %q", name, v)
		}
	}
	if _, ok := headerOf(seen[0], ":path"); !ok {
		t.Errorf("extproc did not receive :path: %v", seen[0])
	}
	for k, v := range creds {
		if got := r.seen.Header.Get(k); got != v {
			t.Errorf("the apiserver got %s %q, want %q", k, got, v)
		}
	}
}

// TestDiscoveryRoute: GET /apis and /apis/ are the same document to an apiserver, so both
// take the discovery route (ext_proc on, for the merged discovery); a longer path does not.
func TestDiscoveryRoute(t *testing.T) {
	p := &recordingProc{}
	e := newEnv(t, envOptions{extProc: p})
	c := e.client(nil) // a bearer token: only the discovery route engages ext_proc here
	for _, path := range []string{"/apis", "/apis/", "/apisx", "/apis//", "/apis/?timeout=32s"} {
		p.mu.Lock()
		p.seen = nil
		p.mu.Unlock()
		e.do(c, "GET", path, nil)
		p.mu.Lock()
		n := len(p.seen)
		p.mu.Unlock()
		want := 1
		if path == "/apisx" || path == "/apis//" {
			want = 0
		}
		if n != want {
			t.Errorf("GET %s: %d ext_proc streams, want %d", path, n, want)
		}
	}
}

// wantFailedOpen asserts that r is the apiserver's own answer to GET /apis, which a failed
// ext_proc exchange let through (failure_mode_allow).
func wantFailedOpen(t *testing.T, r reply) {
	t.Helper()
	if r.status != 200 || r.seen.Path != "/apis" {
		t.Errorf("status %d: %s; want the apiserver's own 200", r.status, r.body)
	}
}
