package extproc

import (
	"errors"
	"io"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestMergedDiscovery drives one stream per request over real gRPC as Envoy does with
// mode_override: request headers, then (if asked for) the response headers. The merged
// document replaces only an apiserver's 200 aggregated answer.
func TestMergedDiscovery(t *testing.T) {
	topo := loadFixture(t, "upgrade.yaml", fixtureNow)
	topo.Discovery = topology.NewDiscovery([]byte(`{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[]}`))
	srv := New(Options{})
	srv.SetTopology(topo, "v1")
	client := serve(t, "unix", srv)

	const v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
	const kubectlAccept = v2 + ",application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
	cases := []struct {
		name       string
		method     string
		path       string
		request    []string // extra request headers
		response   []string // response headers, nil: extproc must not ask for them
		wantStatus int      // of the immediate response; 0: the apiserver's answer goes on
	}{
		{"kubectl", "GET", "/apis", []string{"accept", kubectlAccept}, []string{":status", "200", "content-type", v2}, 200},
		{"protobuf answer", "GET", "/apis?timeout=32s", []string{"accept", kubectlAccept}, []string{":status", "200", "content-type", "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}, 200},
		{"client has it", "GET", "/apis", []string{"accept", v2, "if-none-match", topo.Discovery.ETag}, []string{":status", "200", "content-type", v2}, 304},
		{"client has an older one", "GET", "/apis", []string{"accept", v2, "if-none-match", `"0"`}, []string{":status", "200", "content-type", v2}, 200},
		{"refused by the apiserver", "GET", "/apis", []string{"accept", v2}, []string{":status", "403", "content-type", "application/json"}, 0},
		{"legacy discovery answer", "GET", "/apis", []string{"accept", v2}, []string{":status", "200", "content-type", "application/json"}, 0},
		{"nopeer: one apiserver's view", "GET", "/apis", []string{"accept", v2 + ";profile=nopeer"}, nil, 0},
		{"legacy discovery request", "GET", "/apis", []string{"accept", "application/json"}, nil, 0},
		{"not /apis", "GET", "/apis/apps", []string{"accept", v2}, nil, 0},
		{"not GET", "POST", "/apis", []string{"accept", v2}, nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testutil.Context(t, 10*time.Second)
			stream, err := client.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			send := func(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				t.Helper()
				if err := stream.Send(m); err != nil {
					t.Fatal(err)
				}
				resp, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			resp := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: request(c.method, c.path, c.request...)}})
			if resp.GetRequestHeaders() == nil {
				t.Fatalf("request headers answered with %v", resp)
			}
			asked := resp.GetModeOverride().GetResponseHeaderMode() == extprocfilterv3.ProcessingMode_SEND
			if asked != (c.response != nil) {
				t.Fatalf("response headers asked for: %v, want %v", asked, c.response != nil)
			}
			if asked {
				resp = send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers(c.response...)}})
				ir := resp.GetImmediateResponse()
				switch {
				case c.wantStatus == 0 && resp.GetResponseHeaders() == nil:
					t.Errorf("want the apiserver's answer to go on, got %v", resp)
				case c.wantStatus != 0 && int(ir.GetStatus().GetCode()) != c.wantStatus:
					t.Errorf("immediate response %v, want %d", ir, c.wantStatus)
				case c.wantStatus != 0:
					got := map[string]string{}
					for _, h := range ir.GetHeaders().GetSetHeaders() {
						got[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
					}
					if got["etag"] != topo.Discovery.ETag || got["content-type"] != v2 {
						t.Errorf("headers %v", got)
					}
					if wantBody := map[int]string{200: string(topo.Discovery.JSON), 304: ""}[c.wantStatus]; string(ir.GetBody()) != wantBody {
						t.Errorf("body %q, want %q", ir.GetBody(), wantBody)
					}
				}
			}
			// extproc ends the stream after its last answer, not before (the response headers
			// it asked for were answered on it).
			if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
				t.Errorf("extproc did not end the stream after its last answer: %v", err)
			}
		})
	}
}
