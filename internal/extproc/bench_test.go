package extproc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// emptyServer is the baseline: an ExternalProcessor that answers request_headers with an
// empty HeadersResponse and, like extproc, ends the stream after its answer.
type emptyServer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (emptyServer) Process(stream grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) error {
	if _, err := stream.Recv(); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	return stream.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
}

// benchRequests is a mix of what reaches extproc: requests on group/versions with mixed
// serving sets (the only ones routed through ext_proc) and a few others, with the headers
// kubectl and Envoy put on them (authorization and cookies are not forwarded to extproc:
// the snapshot's forward_rules keep credentials inside Envoy).
func benchRequests(withCert bool) []*extprocv3.ProcessingRequest {
	common := []string{
		"user-agent", "kubectl/v1.37.1 (linux/amd64) kubernetes/abcdef0",
		"accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
		"x-forwarded-proto", "https",
		"x-request-id", "9f1c1f9e-7a4e-4c8e-9d1e-2b6f2f0d8c11",
		"x-envoy-expected-rq-timeout-ms", "0",
	}
	if withCert {
		// What Envoy's Lua filter set for a kubelet's certificate.
		common = append(common, contract.HeaderXFCC, "Hash="+strings.Repeat("5a", 32)+`;Subject="CN=system:node:worker-1,O=system:nodes";URI=`,
			contract.HeaderIdentityDecision, contract.IdentityProxyCert,
			contract.HeaderRemoteUser, "system:node:worker-1", contract.HeaderRemoteGroup, "system:nodes",
			contract.HeaderRemoteExtraPrefix+contract.CredentialIDExtraKey, "X509SHA256="+strings.Repeat("5a", 32))
	}
	var reqs []*extprocv3.ProcessingRequest
	for _, rl := range [][2]string{
		{"GET", "/apis/batch/v1/namespaces/default/jobs?limit=500"},
		{"POST", "/apis/batch/v1/namespaces/default/cronjobs"},
		{"PATCH", "/api/v1/namespaces/default/pods/web-0/resize"},
		{"GET", "/api/v1/namespaces/default/pods/web-0/log?follow=true"},
		{"GET", "/apis/batch/v1/watch/namespaces/default/jobs?resourceVersion=1234"},
		{"GET", "/apis/stable.example.com/v1/namespaces/default/crontabs"},
		{"GET", "/apis/apps/v1/namespaces/default/deployments/web"},
		{"GET", "/version"},
	} {
		reqs = append(reqs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: request(rl[0], rl[1], common...),
		}})
	}
	return reqs
}

// benchOverGRPC measures one HTTP request's worth of ext_proc exchange (open stream, send
// request_headers, receive, half-close, see the end), serially and from parallel clients.
func benchOverGRPC(b *testing.B, impl extprocv3.ExternalProcessorServer) {
	client := serve(b, "tcp", impl)
	for _, withCert := range []bool{false, true} {
		name := "bearer"
		if withCert {
			name = "client-cert"
		}
		reqs := benchRequests(withCert)
		b.Run(name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				if _, err := exchange(ctx, client, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := exchange(ctx, client, reqs[int(n.Add(1))%len(reqs)]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}

func benchServer(b *testing.B) *Server {
	srv := New(Options{})
	srv.SetTopology(loadFixture(b, "upgrade.yaml", fixtureNow), "bench")
	return srv
}

func BenchmarkDecisionOverGRPC(b *testing.B) { benchOverGRPC(b, benchServer(b)) }

func BenchmarkEmptyServerOverGRPC(b *testing.B) { benchOverGRPC(b, emptyServer{}) }

// BenchmarkDecideInProcess is the pure part: from request headers to the response message.
func BenchmarkDecideInProcess(b *testing.B) {
	srv := benchServer(b)
	for _, withCert := range []bool{false, true} {
		name := "bearer"
		if withCert {
			name = "client-cert"
		}
		reqs := benchRequests(withCert)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var disc discoveryState
			for i := 0; b.Loop(); i++ {
				if srv.respond(reqs[i%len(reqs)], "", &disc) == nil {
					b.Fatal("no response")
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
	// Parse and the plan's lookup alone, for comparison.
	routes := srv.table.Load().plans.Routes[""]
	b.Run("parse+decide", func(b *testing.B) {
		b.ReportAllocs()
		reqs := benchRequests(false)
		paths := make([][2]string, len(reqs))
		for i, r := range reqs {
			hs := r.GetRequestHeaders().GetHeaders().GetHeaders()
			paths[i] = [2]string{string(hs[0].GetRawValue()), string(hs[1].GetRawValue())}
		}
		for i := 0; b.Loop(); i++ {
			p := paths[i%len(paths)]
			_ = routes.Decide(topology.ParsePathHeader(p[0], p[1]))
		}
	})
}

// BenchmarkOpenStreamMemory measures what an open ext_proc stream that has sent nothing yet
// costs extproc: the heap and stacks in use per stream, the gRPC transport's share
// included. The client writes raw HTTP/2 frames and keeps nothing per stream, so the growth
// is the server's. Run it with -benchtime=1x; the budget behind DefaultMaxStreams uses it.
func BenchmarkOpenStreamMemory(b *testing.B) {
	const n = 2000
	srv := New(Options{MaxStreams: n, FirstMessageTimeout: time.Hour})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go gs.Serve(lis) //nolint:errcheck // ends with Stop
	b.Cleanup(gs.Stop)
	inUse := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse + m.StackInuse
	}
	waitOpen := func(want int64) {
		for srv.open.Load() != want {
			time.Sleep(10 * time.Millisecond)
		}
	}
	var perStream float64
	for b.Loop() {
		before := inUse()
		conn, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		go io.Copy(io.Discard, conn) //nolint:errcheck // the server's frames do not matter
		if err := openIdleStreams(conn, lis.Addr().String(), n); err != nil {
			b.Fatal(err)
		}
		waitOpen(n)
		perStream = float64(inUse()-before) / n
		conn.Close()
		waitOpen(0)
	}
	b.ReportMetric(perStream, "B/stream")
}

// openIdleStreams writes the HTTP/2 preface and the headers of n ext_proc streams on conn,
// and nothing else.
func openIdleStreams(conn net.Conn, authority string, n int) error {
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return err
	}
	fr := http2.NewFramer(conn, nil)
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for i := range n {
		block.Reset()
		for _, f := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":authority", authority},
			{":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"},
			{"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
				return err
			}
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			return err
		}
	}
	return nil
}
