package extproc

import (
	"mime"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Merged discovery: GET /apis asking for aggregated discovery (without profile=nopeer) is
// answered with the union of every live apiserver's APIs (topology.Discovery, built by
// xds-server), so kubectl knows every resource whichever apiserver it reaches. The request
// still goes to an apiserver, which authenticates and authorizes it: only when that
// apiserver answers 200 with aggregated discovery does extproc replace the answer. It asks
// Envoy for the response headers with mode_override (the filter has allow_mode_override),
// and answers them with an immediate response, so Envoy never buffers the apiserver's body.

// discoveryState is what a stream remembers between the request and the response headers.
type discoveryState struct {
	doc         *topology.Discovery // nil: not a merged-discovery request
	ifNoneMatch string
}

// wantsMergedDiscovery: GET /apis (or /apis/), with an Accept that lists aggregated v2 JSON
// and does not ask for profile=nopeer anywhere (that client wants one apiserver's view).
func wantsMergedDiscovery(method, path, accept string) bool {
	if method != "GET" {
		return false
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if path != "/apis" && path != "/apis/" {
		return false
	}
	listed := false
	for elem := range strings.SplitSeq(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(elem))
		if err != nil {
			continue
		}
		if params["profile"] != "" {
			return false
		}
		if mt == "application/json" && params["g"] == "apidiscovery.k8s.io" && params["v"] == "v2" && params["as"] == "APIGroupDiscoveryList" {
			listed = true
		}
	}
	return listed
}

// withResponseHeaders returns resp asking Envoy for this request's response headers too.
func withResponseHeaders(resp *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	c := proto.Clone(resp).(*extprocv3.ProcessingResponse)
	c.ModeOverride = &extprocfilterv3.ProcessingMode{ResponseHeaderMode: extprocfilterv3.ProcessingMode_SEND}
	return c
}

// mergedDiscoveryResponse answers the response headers of a merged-discovery request: the
// merged document (or 304 when the client has it) if the apiserver answered 200 with
// aggregated discovery; otherwise the apiserver's answer goes on unchanged.
func (s *Server) mergedDiscoveryResponse(h *extprocv3.HttpHeaders, st *discoveryState) *extprocv3.ProcessingResponse {
	var status, contentType string
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch strings.ToLower(hv.GetKey()) {
		case ":status":
			status = headerValue(hv)
		case "content-type":
			contentType = headerValue(hv)
		}
	}
	mt, params, _ := mime.ParseMediaType(contentType)
	if status != "200" || params["g"] != "apidiscovery.k8s.io" || params["v"] != "v2" || params["as"] != "APIGroupDiscoveryList" ||
		(mt != "application/json" && mt != "application/vnd.kubernetes.protobuf") {
		s.m.discovery[discoveryPassed].Inc()
		return continueResponseHeaders
	}
	headers := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		setHeader("content-type", contract.MediaTypeAggregatedDiscovery, false),
		setHeader("etag", st.doc.ETag, false),
		setHeader("vary", "Accept", false),
	}}
	if st.ifNoneMatch == st.doc.ETag {
		s.m.discovery[discoveryNotModified].Inc()
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_NotModified}, Headers: headers, Details: "kube_mvp_merged_discovery_not_modified",
		}}}
	}
	s.m.discovery[discoveryServed].Inc()
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK}, Headers: headers, Body: st.doc.JSON, Details: "kube_mvp_merged_discovery",
	}}}
}

var continueResponseHeaders = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
