package extproc

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
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
		wantGzip   bool     // the body gzip-compressed
	}{
		{"kubectl", "GET", "/apis", []string{"accept", kubectlAccept}, []string{":status", "200", "content-type", v2}, 200, false},
		{"protobuf answer", "GET", "/apis?timeout=32s", []string{"accept", kubectlAccept}, []string{":status",
			"200", "content-type",
			"application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}, 200, false},
		{"client has it", "GET", "/apis", []string{"accept", v2, "if-none-match", topo.Discovery.ETag}, []string{":status", "200", "content-type", v2}, 304, false},
		{"client accepts gzip", "GET", "/apis", []string{"accept", kubectlAccept, "accept-encoding", "gzip"}, []string{":status", "200", "content-type", v2}, 200, true},
		{"client accepts gzip, has it", "GET", "/apis", []string{"accept", v2, "accept-encoding", "br, gzip;q=0.5",
			"if-none-match", topo.Discovery.ETag}, []string{":status", "200", "content-type", v2}, 304, false},
		{"client refuses gzip", "GET", "/apis", []string{"accept", v2, "Accept-Encoding", "gzip;q=0, identity"}, []string{":status", "200", "content-type", v2}, 200, false},
		{"client has an older one", "GET", "/apis", []string{"accept", v2, "if-none-match", `"0"`}, []string{":status", "200", "content-type", v2}, 200, false},
		{"refused by the apiserver", "GET", "/apis", []string{"accept", v2}, []string{":status", "403", "content-type", "application/json"}, 0, false},
		{"legacy discovery answer", "GET", "/apis", []string{"accept", v2}, []string{":status", "200", "content-type", "application/json"}, 0, false},
		{"nopeer: one apiserver's view", "GET", "/apis", []string{"accept", v2 + ";profile=nopeer"}, nil, 0, false},
		{"legacy discovery request", "GET", "/apis", []string{"accept", "application/json"}, nil, 0, false},
		{"not /apis", "GET", "/apis/apps", []string{"accept", v2}, nil, 0, false},
		{"not GET", "POST", "/apis", []string{"accept", v2}, nil, 0, false},
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
					if got["etag"] != topo.Discovery.ETag || got["content-type"] != v2 || got["vary"] != "Accept, Accept-Encoding" {
						t.Errorf("headers %v", got)
					}
					body := ir.GetBody()
					if gzipped := got["content-encoding"] == "gzip"; gzipped != c.wantGzip {
						t.Errorf("content-encoding %q; want gzip: %v", got["content-encoding"], c.wantGzip)
					} else if gzipped {
						zr, err := gzip.NewReader(bytes.NewReader(body))
						if err != nil {
							t.Fatal(err)
						}
						if body, err = io.ReadAll(zr); err != nil {
							t.Fatal(err)
						}
					}
					if wantBody := map[int]string{200: string(topo.Discovery.JSON), 304: ""}[c.wantStatus]; string(body) != wantBody {
						t.Errorf("body %q, want %q", body, wantBody)
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

// TestAcceptsGzip reads Accept-Encoding as RFC 9110 12.5.3 says: a coding with weight zero is
// not acceptable, "*" stands for any coding not listed.
func TestAcceptsGzip(t *testing.T) {
	for value, want := range map[string]bool{
		"":                     false,
		"gzip":                 true,
		"GZIP":                 true,
		"x-gzip":               true,
		"gzip, deflate, br":    true,
		"br;q=1.0, gzip;q=0.8": true,
		"*":                    true,
		"gzip;q=0":             false,
		"gzip; q=0.000":        false,
		"gzip;q=bogus":         false,
		"identity":             false,
		"deflate, br":          false,
		"gzipped":              false,
		"gzip;q=0, *":          false,
		"*;q=0":                false,
		"br, *;q=0.1":          true,
	} {
		if got := acceptsGzip(value); got != want {
			t.Errorf("Accept-Encoding %q: gzip accepted %v, want %v", value, got, want)
		}
	}
}

// TestDiscoveryGzipFollowsTheTable: the compressed document is the current table's, and a
// table with the same document does not compress it again.
func TestDiscoveryGzipFollowsTheTable(t *testing.T) {
	srv := New(Options{})
	topo := loadFixture(t, "upgrade.yaml", fixtureNow)
	gunzip := func() string {
		t.Helper()
		zr, err := gzip.NewReader(bytes.NewReader(srv.table.Load().discoveryGzip))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i, doc := range []string{`{"items":[]}`, `{"items":[{"metadata":{"name":"a.example.com"}}]}`} {
		topo.Discovery = topology.NewDiscovery([]byte(doc))
		srv.SetTopology(topo, fmt.Sprint("v", i))
		if got := gunzip(); got != doc {
			t.Errorf("table v%d: compressed document %q, want %q", i, got, doc)
		}
	}
	before := srv.table.Load().discoveryGzip
	topo.Discovery = topology.NewDiscovery(topo.Discovery.JSON) // another table, the same document
	srv.SetTopology(topo, "v2")
	if srv.Version() != "v2" || &srv.table.Load().discoveryGzip[0] != &before[0] {
		t.Error("a table with the same document compressed it again")
	}
}
