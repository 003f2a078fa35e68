package extproc

import (
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// want is what a request should turn into.
type want struct {
	cluster   string // x-kube-mvp-cluster; empty means an immediate 503
	subset    bool   // x-kubernetes-peer-proxied: true is set
	set       string // the serving set named in the load balancer's dynamic metadata
	message   string // the 503 Status message
	proxyCert bool   // the Lua filter set the identity: its headers are kept
}

// withProxyCert is w for a request whose identity Envoy's Lua filter set: the front-proxy variant.
func withProxyCert(w want) want {
	c := contract.ParseClusterName(w.cluster)
	c.ProxyCert = true
	w.cluster = c.String()
	w.proxyCert = true
	return w
}

func routed(cluster string) want { return want{cluster: cluster} }
func subset(set string) want {
	return want{cluster: contract.ClusterServingSets, subset: true, set: set}
}

// servingSet is the serving set resp names in the load balancer's dynamic metadata ("" for
// none).
func servingSet(resp *extprocv3.ProcessingResponse) string {
	return resp.GetDynamicMetadata().GetFields()[contract.MetadataNamespaceLB].GetStructValue().GetFields()[contract.LBSetKey].GetStringValue()
}

// destination is where resp sends the request: the serving set if it names one, else the
// cluster.
func destination(resp *extprocv3.ProcessingResponse) string {
	if set := servingSet(resp); set != "" {
		return set
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == contract.HeaderRoutingCluster {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}
func unavailable(gvr string) want {
	return want{message: "no apiserver that serves " + gvr + " is available"}
}

func pending(gvr string) want {
	return want{message: gvr + " is a new CustomResourceDefinition's that no apiserver serves yet; retry in a moment"}
}

// checkResponse asserts that resp is w's answer to req.
func checkResponse(t *testing.T, req *extprocv3.HttpHeaders, resp *extprocv3.ProcessingResponse, w want) {
	t.Helper()
	if w.cluster == "" {
		checkStatus503(t, resp, w.message)
		return
	}
	cr := resp.GetRequestHeaders().GetResponse()
	if cr == nil {
		t.Fatalf("want a request-headers response, got %v", resp)
	}
	if cr.GetStatus() != extprocv3.CommonResponse_CONTINUE || !cr.GetClearRouteCache() {
		t.Errorf("status %v, clear_route_cache %v; want CONTINUE and true", cr.GetStatus(), cr.GetClearRouteCache())
	}
	// Only headers the listener should have stripped are removed (which Envoy's mutation
	// rules then refuse: the request fails); nothing else is.
	for _, name := range cr.GetHeaderMutation().GetRemoveHeaders() {
		if !slices.ContainsFunc(req.GetHeaders().GetHeaders(), func(h *corev3.HeaderValue) bool { return strings.EqualFold(h.GetKey(), name) }) {
			t.Errorf("%s is removed, but the request did not carry it", name)
		}
	}
	hs := applyMutation(t, req, resp)
	if got := values(hs, contract.HeaderRoutingCluster); !slices.Equal(got, []string{w.cluster}) {
		t.Errorf("%s = %q, want %q", contract.HeaderRoutingCluster, got, w.cluster)
	}
	var wantProxied []string
	if w.subset {
		wantProxied = []string{"true"}
	}
	if got := values(hs, contract.HeaderPeerProxied); !slices.Equal(got, wantProxied) {
		t.Errorf("%s = %q, want %q", contract.HeaderPeerProxied, got, wantProxied)
	}
	if got := servingSet(resp); got != w.set {
		t.Errorf("serving set %q, want %q", got, w.set)
	}
	if w.set == "" && resp.GetDynamicMetadata() != nil {
		t.Errorf("dynamic metadata %v, want none", resp.GetDynamicMetadata())
	}
	for ns := range resp.GetDynamicMetadata().GetFields() {
		if ns != contract.MetadataNamespaceLB {
			t.Errorf("dynamic metadata in namespace %q: Envoy accepts only %q", ns, contract.MetadataNamespaceLB)
		}
	}
}

func checkStatus503(t *testing.T, resp *extprocv3.ProcessingResponse, message string) {
	t.Helper()
	checkStatus(t, resp, typev3.StatusCode_ServiceUnavailable, "ServiceUnavailable", message)
	var retryAfter []string
	for _, o := range resp.GetImmediateResponse().GetHeaders().GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), "retry-after") {
			retryAfter = append(retryAfter, string(o.GetHeader().GetRawValue()))
		}
	}
	if !slices.Equal(retryAfter, []string{"1"}) {
		t.Errorf("retry-after %q, want 1 (client-go retries a 503 with Retry-After itself)", retryAfter)
	}
}

// checkStatus asserts that resp is an immediate Kubernetes Status with code, reason and message.
func checkStatus(t *testing.T, resp *extprocv3.ProcessingResponse, code typev3.StatusCode, reason, message string) {
	t.Helper()
	ir := resp.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want an immediate response, got %v", resp)
	}
	if ir.GetStatus().GetCode() != code {
		t.Errorf("status %v, want %v", ir.GetStatus().GetCode(), code)
	}
	var ct []string
	for _, o := range ir.GetHeaders().GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), "content-type") {
			ct = append(ct, string(o.GetHeader().GetRawValue()))
		}
	}
	if !slices.Equal(ct, []string{"application/json"}) {
		t.Errorf("content-type %q, want application/json", ct)
	}
	var body map[string]any
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
		t.Fatalf("body %q: %v", ir.GetBody(), err)
	}
	wantBody := map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{}, "status": "Failure",
		"message": message, "reason": reason, "code": float64(code),
	}
	if code == typev3.StatusCode_ServiceUnavailable {
		wantBody["details"] = map[string]any{"retryAfterSeconds": float64(1)}
	}
	if len(body) != len(wantBody) {
		t.Errorf("body %s has fields other than %v", ir.GetBody(), wantBody)
	}
	for k, v := range wantBody {
		if gotJSON, wantJSON := mustJSON(body[k]), mustJSON(v); gotJSON != wantJSON {
			t.Errorf("body field %s = %s, want %s (body %s)", k, gotJSON, wantJSON, ir.GetBody())
		}
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestDecisions covers every outcome of the plan, subresources and sidecar mode (the
// sidecar's stream names its apiserver in gRPC metadata), over real gRPC streams on a unix
// socket and on loopback TCP.
func TestDecisions(t *testing.T) {
	fx := loadFixture(t, "upgrade.yaml", fixtureNow)
	allLive := loadFixture(t, "upgrade.yaml", time.Time{})
	sidecarB := fx.WithLocal("apiserver-imkgstwjs6opnbwk2ixluu6fiq")
	sidecarA := fx.WithLocal("apiserver-tqsyvnc7rs47fayzipsuqpfg4m")

	// The same rows on a topology built directly: three servers, one dead, one resource each
	// way, and a served-everywhere group.
	direct, err := topology.New(
		[]topology.APIServer{
			{ID: "id-1", Hostname: "node-1", Address: "192.0.2.1:6443", Alive: true, Verified: true},
			{ID: "id-2", Hostname: "node-2", Address: "192.0.2.2:6443", Alive: true, Verified: true},
			{ID: "id-3", Hostname: "node-3", Address: "192.0.2.3:6443", Alive: true, Verified: true},
			{ID: "id-4", Hostname: "node-4", Address: "192.0.2.4:6443", Alive: false},
		},
		map[topology.Resource][]string{
			{Version: "v1", Resource: "services"}:                                 {"id-1", "id-2", "id-3", "id-4"},
			{Group: "apps", Version: "v1", Resource: "widgets"}:                   {"id-3", "id-1"},
			{Group: "apps", Version: "v1", Resource: "widgets", Subresource: "x"}: {"id-3"},
			{Group: "old.io", Version: "v1beta1", Resource: "relics"}:             {"id-4"},
			{Group: "gone.io", Version: "v1", Resource: "ghosts"}:                 {"apiserver-stale"},
			{Group: "crd.example.io", Version: "v1", Resource: "foos"}:            {"id-1"},
			{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"}: {"id-2"},
		},
		[]topology.GroupVersion{{Group: "crd.example.io", Version: "v1"}})
	if err != nil {
		t.Fatal(err)
	}
	newGV := topology.GroupVersion{Group: "new.example.io", Version: "v1"}
	direct.SetPending([]topology.Resource{{Group: "crd.example.io", Version: "v1", Resource: "bars"}, {Group: newGV.Group, Version: newGV.Version, Resource: "gizmos"}})

	cases := []struct {
		name         string
		topo         *topology.Topology
		method, path string
		want         want
	}{
		// Non-resource requests: any live apiserver.
		{"non-resource /healthz", fx, "GET", "/healthz", routed("kube-apiservers")},
		{"non-resource /version", fx, "GET", "/version?timeout=32s", routed("kube-apiservers")},
		{"non-resource /openapi/v3", fx, "GET", "/openapi/v3/apis/batch/v1", routed("kube-apiservers")},
		{"discovery /api", fx, "GET", "/api", routed("kube-apiservers")},
		{"discovery /apis", fx, "GET", "/apis", routed("kube-apiservers")},
		{"discovery /apis/batch", fx, "GET", "/apis/batch", routed("kube-apiservers")},
		{"group/version document /apis/batch/v1 goes to who serves batch/v1", fx, "GET", "/apis/batch/v1", subset("kube-apiservers-only-cp-a")},
		{"group/version document with an escaped slash", fx, "GET", "/apis/batch%2Fv1?timeout=32s", subset("kube-apiservers-only-cp-a")},
		{"escaped slash: list jobs", fx, "GET", "/apis/batch%2Fv1/namespaces/default/jobs", subset("kube-apiservers-only-cp-a")},
		{"core document /api/v1, served by all", fx, "GET", "/api/v1", routed("kube-apiservers")},

		// Resources every live apiserver serves: the default set.
		{"served by all: list pods", fx, "GET", "/api/v1/namespaces/default/pods", routed("kube-apiservers")},
		{"served by all: watch with a query", fx, "GET", "/api/v1/pods?watch=true&resourceVersion=10&allowWatchBookmarks=true", routed("kube-apiservers")},
		{"served by all: create configmap", fx, "POST", "/api/v1/namespaces/kube-system/configmaps", routed("kube-apiservers")},
		{"served by all: delete deployment", fx, "DELETE", "/apis/apps/v1/namespaces/default/deployments/web", routed("kube-apiservers")},
		{"served by all live (a dead server too)", direct, "GET", "/api/v1/services", routed("kube-apiservers")},

		// Nobody publishes the GVR (CRDs, aggregated APIs): the default set, whose chain serves it.
		{"CRD group", fx, "GET", "/apis/stable.example.com/v1/namespaces/default/crontabs", routed("kube-apiservers")},
		{"aggregated API", fx, "GET", "/apis/metrics.k8s.io/v1beta1/nodes", routed("kube-apiservers")},
		{"unknown group", fx, "GET", "/apis/unknown.example.org/v1/things", routed("kube-apiservers")},
		{"unknown resource in a known group/version", fx, "GET", "/apis/apps/v1/namespaces/default/frobs", routed("kube-apiservers")},
		// A CRD's or APIService's claim that every apiserver serves a group/version never
		// overrides the apiservers' own discovery: a resource only node-1 lists goes to node-1.
		{"a served-everywhere claim does not override who lists it", direct, "GET", "/apis/crd.example.io/v1/foos", subset("kube-apiservers-only-node-1")},

		// A new CRD no apiserver lists yet: a 503 with Retry-After (client-go retries), not an
		// apiserver that may answer 404; its subresources and, when nothing of its
		// group/version is listed, the document too.
		{"new CRD pending", direct, "GET", "/apis/crd.example.io/v1/namespaces/x/bars", pending("crd.example.io/v1/bars")},
		{"new CRD pending: subresource", direct, "PUT", "/apis/crd.example.io/v1/namespaces/x/bars/b/status", pending("crd.example.io/v1/bars")},
		{"new CRD pending: create", direct, "POST", "/apis/new.example.io/v1/gizmos", pending("new.example.io/v1/gizmos")},
		{"new CRD pending: its new group/version's document", direct, "GET", "/apis/new.example.io/v1", pending(newGV.Document().String())},

		// A strict subset serves it: only that subset, and no second proxying.
		{"strict subset: list jobs", fx, "GET", "/apis/batch/v1/namespaces/default/jobs", subset("kube-apiservers-only-cp-a")},
		{"strict subset: watch path", fx, "GET", "/apis/batch/v1/watch/namespaces/default/jobs/j", subset("kube-apiservers-only-cp-a")},
		{"strict subset: create cronjob", fx, "POST", "/apis/batch/v1/namespaces/default/cronjobs", subset("kube-apiservers-only-cp-a")},
		{"strict subset of two, sorted names", direct, "GET", "/apis/apps/v1/widgets", subset("kube-apiservers-only-node-1+node-3")},
		{"strict subset of one", direct, "GET", "/apis/resource.k8s.io/v1/namespaces/x/resourceclaims/c", subset("kube-apiservers-only-node-2")},

		// Subresources.
		{"subresource new on an old resource", fx, "PATCH", "/api/v1/namespaces/default/pods/p/resize", subset("kube-apiservers-only-cp-a")},
		{"subresource served by all", fx, "GET", "/api/v1/namespaces/default/pods/p/log?follow=true", routed("kube-apiservers")},
		{"subresource exec (upgrade) served by all", fx, "POST", "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true", routed("kube-apiservers")},
		{"subresource of a subset resource", fx, "PUT", "/apis/apps/v1/namespaces/default/deployments/web/scale", routed("kube-apiservers")},
		{"unpublished subresource falls back to its resource", fx, "PUT", "/apis/batch/v1/namespaces/default/jobs/j/status", subset("kube-apiservers-only-cp-a")},
		{"subresource narrower than its resource", direct, "GET", "/apis/apps/v1/widgets/w/x", subset("kube-apiservers-only-node-3")},

		// Published but nobody live is known to serve it: default set, whose chain says 404.
		{"published, only stale IDs", fx, "GET", "/apis/policy/v1beta1/podsecuritypolicies", routed("kube-apiservers")},
		{"published, only stale IDs (direct)", direct, "GET", "/apis/gone.io/v1/ghosts", routed("kube-apiservers")},

		// The apiservers that serve it are known but dead: 503 Status.
		{"capable servers dead", fx, "GET", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations", unavailable("storagemigration.k8s.io/v1alpha1/storageversionmigrations")},
		{"capable servers dead: subresource", fx, "PATCH",
			"/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations/m/status",
			unavailable("storagemigration.k8s.io/v1alpha1/storageversionmigrations/status")},
		{"capable servers dead (direct)", direct, "GET", "/apis/old.io/v1beta1/relics", unavailable("old.io/v1beta1/relics")},
		{"same fixture, every Lease live: the subset", allLive, "GET", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations", subset("kube-apiservers-only-cp-c")},
		{"same fixture, every Lease live: pods everywhere", allLive, "GET", "/api/v1/pods", routed("kube-apiservers")},

		// Sidecar mode: the local apiserver whenever it can.
		{"sidecar: non-resource stays local", sidecarB, "GET", "/readyz", routed("kube-apiserver-local")},
		{"sidecar: local serves it", sidecarB, "GET", "/api/v1/namespaces/default/pods", routed("kube-apiserver-local")},
		{"sidecar: CRD stays local", sidecarB, "GET", "/apis/stable.example.com/v1/crontabs", routed("kube-apiserver-local")},
		{"sidecar: local lacks it", sidecarB, "GET", "/apis/batch/v1/jobs", subset("kube-apiservers-only-cp-a")},
		{"sidecar: local lacks the subresource", sidecarB, "PATCH", "/api/v1/namespaces/default/pods/p/resize", subset("kube-apiservers-only-cp-a")},
		{"sidecar: local is the only one", sidecarA, "GET", "/apis/batch/v1/jobs", routed("kube-apiserver-local")},
		{"sidecar: stale IDs only, local 404s", sidecarA, "GET", "/apis/policy/v1beta1/podsecuritypolicies", routed("kube-apiserver-local")},
		{"sidecar: capable servers dead", sidecarA, "GET", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations", unavailable("storagemigration.k8s.io/v1alpha1/storageversionmigrations")},
	}
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			srv := New(Options{})
			client := serve(t, network, srv)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					srv.SetTopology(c.topo, "test")
					req := request(c.method, c.path)
					checkResponse(t, req, callBeside(t, client, c.topo.LocalID, req), c.want)
				})
			}
		})
	}
}

func TestNoTableYet(t *testing.T) {
	srv := New(Options{})
	client := serve(t, "unix", srv)
	if srv.Ready() {
		t.Error("ready without a table")
	}
	checkStatus503(t, call(t, client, request("GET", "/api/v1/pods")), "kube-mvp has no routing table yet")
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	if !srv.Ready() || srv.Version() != "v1" {
		t.Errorf("ready %v, version %q after SetTopology", srv.Ready(), srv.Version())
	}
	req := request("GET", "/api/v1/pods")
	checkResponse(t, req, call(t, client, req), routed("kube-apiservers"))
}

func TestMalformedRequests(t *testing.T) {
	srv := New(Options{})
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	client := serve(t, "tcp", srv)
	for name, req := range map[string]*extprocv3.HttpHeaders{
		"no :path":             headers(":method", "GET", ":authority", "x"),
		"no headers at all":    {},
		"no :method":           headers(":path", "/apis/batch/v1/jobs"),
		"path without slash":   request("GET", "apis/batch/v1/jobs"),
		"only a query":         request("GET", "?x=/apis/batch/v1/jobs"),
		"dot segments":         request("GET", "/apis/batch/v1/../../api/v1/pods"),
		"percent-encoded":      request("GET", "/apis/batch/v1/namespaces/%2F/jobs"),
		"very long path":       request("GET", "/api/v1/"+strings.Repeat("x/", 5000)),
		"empty value for path": headers(":method", "GET", ":path", ""),
	} {
		t.Run(name, func(t *testing.T) {
			resp := call(t, client, req)
			if resp.GetRequestHeaders() == nil && resp.GetImmediateResponse() == nil {
				t.Fatalf("no answer: %v", resp)
			}
			if resp.GetRequestHeaders() != nil && len(values(applyMutation(t, req, resp), contract.HeaderRoutingCluster)) != 1 {
				t.Errorf("no cluster chosen: %v", resp)
			}
		})
	}
	// Without :path a request is non-resource: the default cluster.
	req := headers(":method", "GET")
	checkResponse(t, req, call(t, client, req), routed("kube-apiservers"))
	// Values may arrive in value instead of raw_value (older Envoy, or the runtime flag off).
	req = request("GET", "/")
	req.Headers.Headers[1].RawValue, req.Headers.Headers[1].Value = nil, "/apis/batch/v1/jobs"
	resp := call(t, client, req)
	if got := destination(resp); got != "kube-apiservers-only-cp-a" {
		t.Errorf(":path in value: cluster %q", got)
	}
}

// TestUnexpectedMessages: messages our processing mode never sends get an empty response of
// their own type and are counted.
func TestUnexpectedMessages(t *testing.T) {
	srv := New(Options{})
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	client := serve(t, "unix", srv)
	hh := &extprocv3.HttpHeaders{}
	cases := []struct {
		typ   string
		req   *extprocv3.ProcessingRequest
		check func(*extprocv3.ProcessingResponse) bool
	}{
		{"response_headers", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseHeaders() != nil }},
		{"request_body", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}")}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestBody() != nil }},
		{"response_body", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseBody() != nil }},
		{"request_trailers", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestTrailers() != nil }},
		{"response_trailers", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseTrailers() != nil }},
		{"unknown", &extprocv3.ProcessingRequest{}, func(r *extprocv3.ProcessingResponse) bool { return r.GetResponse() == nil }},
	}
	for _, c := range cases {
		t.Run(c.typ, func(t *testing.T) {
			ctx := testutil.Context(t, 10*time.Second)
			resp, err := exchange(ctx, client, c.req)
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(resp) {
				t.Errorf("response %v", resp)
			}
		})
	}
	for _, typ := range unexpectedTypes {
		if got, _ := metricValue(t, srv, "kube_mvp_extproc_unexpected_messages_total", map[string]string{"type": typ}); got != 1 {
			t.Errorf("unexpected_messages_total{type=%q} = %v, want 1", typ, got)
		}
	}

	// After its answer to the request headers, extproc ends the stream: an unexpected message
	// that follows is never read.
	ctx := testutil.Context(t, 10*time.Second)
	stream, err := client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: request("GET", "/api/v1/pods")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}})
	if extra, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the answer to the request headers: %v, %v; want the stream ended (status OK)", extra, err)
	}
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_unexpected_messages_total", map[string]string{"type": "response_headers"}); got != 1 {
		t.Errorf("the message after the stream ended was read: unexpected_messages_total{type=response_headers} = %v, want 1", got)
	}
}

func TestMetrics(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	srv := New(Options{Now: func() time.Time { return now }})
	client := serve(t, "unix", srv)
	call(t, client, request("GET", "/healthz"))
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	now = now.Add(90 * time.Second)
	for range 3 {
		call(t, client, request("GET", "/apis/batch/v1/jobs"))
	}
	call(t, client, request("GET", "/healthz"))
	call(t, client, request("PATCH", "/api/v1/namespaces/x/pods/p/resize"))
	call(t, client, request("GET", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations"))
	call(t, client, request("GET", "/apis/policy/v1beta1/podsecuritypolicies", "x-remote-user", "system:admin", "X-Remote-Extra-Scopes", "all"))
	srv.SetTopology(loadFixture(t, "upgrade.yaml", time.Time{}), "v2")

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kube_mvp_extproc_decisions_total", map[string]string{"outcome": "no_table", "group": "", "version": "", "resource": ""}, 1},
		// /healthz, and policy/v1beta1, which only a StorageVersion naming an ID no Lease
		// knows lists: not published, so the default set answers it.
		{"kube_mvp_extproc_decisions_total", map[string]string{"outcome": "default", "group": "", "version": "", "resource": ""}, 2},
		{"kube_mvp_extproc_decisions_total", map[string]string{"outcome": "internal_error", "group": "", "version": "", "resource": ""}, 0},
		{"kube_mvp_extproc_decisions_total", map[string]string{"outcome": "subset", "group": "batch", "version": "v1", "resource": "jobs"}, 3},
		{"kube_mvp_extproc_decisions_total", map[string]string{"outcome": "subset", "group": "", "version": "v1", "resource": "pods/resize"}, 1},
		{"kube_mvp_extproc_decisions_total", map[string]string{"outcome": "unavailable", "group": "storagemigration.k8s.io", "version": "v1alpha1", "resource": "storageversionmigrations"}, 1},
		{"kube_mvp_extproc_table_version_info", map[string]string{"version": "v2"}, 1},
		{"kube_mvp_extproc_table_age_seconds", nil, 0},
		{"kube_mvp_extproc_stripped_headers_total", map[string]string{"header": "x-remote-user"}, 1},
		{"kube_mvp_extproc_stripped_headers_total", map[string]string{"header": "x-remote-extra-*"}, 1},
		{"kube_mvp_extproc_stripped_headers_total", map[string]string{"header": "x-remote-group"}, 0},
		// the request before the first table is answered 503 before its identity is settled
		{"kube_mvp_extproc_unexpected_messages_total", map[string]string{"type": "request_body"}, 0},
	} {
		if got, ok := metricValue(t, srv, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if n := metricCount(t, srv, "kube_mvp_extproc_decisions_total"); n != 7 {
		t.Errorf("%d decision series, want 7 (no series per request path)", n)
	}
	if n := metricCount(t, srv, "kube_mvp_extproc_table_version_info"); n != 1 {
		t.Errorf("%d version series, want 1", n)
	}
	now = now.Add(42 * time.Second)
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_table_age_seconds", nil); got != 42 {
		t.Errorf("table age %v, want 42", got)
	}
}

// metricValue finds the sample of name whose labels are exactly labels.
func metricValue(t *testing.T, srv *Server, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; !ok || v != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func metricCount(t *testing.T, srv *Server, name string) int {
	t.Helper()
	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// TestSetTopologyIsAtomic swaps tables while requests run (go test -race).
func TestSetTopologyIsAtomic(t *testing.T) {
	srv := New(Options{})
	a := loadFixture(t, "upgrade.yaml", fixtureNow)
	b := loadFixture(t, "upgrade.yaml", time.Time{})
	srv.SetTopology(a, "a")
	client := serve(t, "tcp", srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			if i%2 == 0 {
				srv.SetTopology(b, "b")
			} else {
				srv.SetTopology(a, "a")
			}
		}
	}()
	path := "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations"
	for range 50 {
		resp := call(t, client, request("GET", path))
		// Either table's answer, never a mixture.
		if resp.GetImmediateResponse() == nil {
			req := request("GET", path)
			checkResponse(t, req, resp, subset("kube-apiservers-only-cp-c"))
		}
	}
	<-done
}

// TestDecisionSeriesFollowTheTable: the decision series of a key go when a table without the
// key arrives (a deleted CRD, say), so churn does not grow the series without end; series
// of no key (the default route) stay.
func TestDecisionSeriesFollowTheTable(t *testing.T) {
	topo := func(jobs bool) *topology.Topology {
		served := map[topology.Resource][]string{{Version: "v1", Resource: "pods"}: {"apiserver-a"}}
		if jobs {
			served[topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}] = []string{"apiserver-a"}
		}
		tp, err := topology.New([]topology.APIServer{
			{ID: "apiserver-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
			{ID: "apiserver-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true},
		}, served, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	srv := New(Options{})
	client := serve(t, "unix", srv)
	jobs := map[string]string{"outcome": "subset", "group": "batch", "version": "v1", "resource": "jobs"}
	pods := map[string]string{"outcome": "subset", "group": "", "version": "v1", "resource": "pods"}
	def := map[string]string{"outcome": "default", "group": "", "version": "", "resource": ""}
	srv.SetTopology(topo(true), "with-jobs")
	for _, path := range []string{"/apis/batch/v1/jobs", "/apis/batch/v1/jobs", "/api/v1/pods", "/healthz"} {
		call(t, client, request("GET", path))
	}
	if got, ok := metricValue(t, srv, "kube_mvp_extproc_decisions_total", jobs); !ok || got != 2 {
		t.Fatalf("jobs' decisions %v (found %v), want 2", got, ok)
	}
	srv.SetTopology(topo(false), "without-jobs")
	if got, ok := metricValue(t, srv, "kube_mvp_extproc_decisions_total", jobs); ok {
		t.Errorf("jobs' decisions still listed (%v) by a table without jobs", got)
	}
	for _, labels := range []map[string]string{pods, def} {
		if got, ok := metricValue(t, srv, "kube_mvp_extproc_decisions_total", labels); !ok || got != 1 {
			t.Errorf("decisions%v %v (found %v), want 1: kept", labels, got, ok)
		}
	}
	srv.SetTopology(topo(true), "with-jobs-again")
	call(t, client, request("GET", "/apis/batch/v1/jobs"))
	if got, ok := metricValue(t, srv, "kube_mvp_extproc_decisions_total", jobs); !ok || got != 1 {
		t.Errorf("jobs' decisions %v (found %v) after it came back, want 1", got, ok)
	}
}
