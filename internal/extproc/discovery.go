package extproc

import (
	"bytes"
	"compress/gzip"
	"mime"
	"strconv"
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
// A client that accepts gzip gets the document gzip-compressed (compressed once per table).

// discoveryState is what a stream remembers between the request and the response headers.
type discoveryState struct {
	doc         *topology.Discovery // nil: not a merged-discovery request
	ifNoneMatch string
	// gzipped is doc.JSON gzip-compressed, when the client accepts gzip (nil otherwise).
	gzipped []byte
}

// gzipDiscovery compresses a merged document, once per document (preparedTable): the
// apiserver sends its own discovery gzip-compressed to clients that accept it, and so does
// extproc (at 2,000 CRDs, 566 KB of JSON is 15 KB gzipped, in 2.4 ms).
func gzipDiscovery(doc []byte) []byte {
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.DefaultCompression)
	if err == nil {
		_, err = zw.Write(doc)
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return nil // never with a bytes.Buffer; served uncompressed then
	}
	return b.Bytes()
}

// acceptsGzip reads Accept-Encoding (RFC 9110 12.5.3): gzip (or x-gzip) listed with a weight
// above zero, or not listed and "*" is.
func acceptsGzip(acceptEncoding string) bool {
	gzipQ, anyQ := -1.0, -1.0 // -1: not listed
	for elem := range strings.SplitSeq(acceptEncoding, ",") {
		coding, params, _ := strings.Cut(elem, ";")
		q := 1.0
		for p := range strings.SplitSeq(params, ";") {
			if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(strings.TrimSpace(k), "q") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					q = f
				} else {
					q = 0
				}
			}
		}
		switch strings.ToLower(strings.TrimSpace(coding)) {
		case "gzip", "x-gzip":
			gzipQ = max(gzipQ, q)
		case "*":
			anyQ = max(anyQ, q)
		}
	}
	if gzipQ >= 0 {
		return gzipQ > 0
	}
	return anyQ > 0
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
		setHeader("vary", "Accept, Accept-Encoding", false),
	}}
	if st.ifNoneMatch == st.doc.ETag {
		s.m.discovery[discoveryNotModified].Inc()
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_NotModified}, Headers: headers, Details: "kube_mvp_merged_discovery_not_modified",
		}}}
	}
	s.m.discovery[discoveryServed].Inc()
	body := st.doc.JSON
	if st.gzipped != nil {
		body = st.gzipped
		headers.SetHeaders = append(headers.SetHeaders, setHeader("content-encoding", "gzip", false))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK}, Headers: headers, Body: body, Details: "kube_mvp_merged_discovery",
	}}}
}

var continueResponseHeaders = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
