package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// fixtureNow is when testdata/upgrade.yaml is judged: cp-a and cp-b are live, cp-c is dead.
var fixtureNow = time.Date(2026, 11, 23, 10, 0, 10, 0, time.UTC)

// loadFixture builds the topology of a testdata fixture as FileSource does.
func loadFixture(t testing.TB, name string, now time.Time) *topology.Topology {
	t.Helper()
	objs, err := objects.LoadFixture(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	topo, errs := objects.Build(objs, objects.Options{Now: now})
	if len(errs) > 0 || topo == nil {
		t.Fatalf("fixture %s: %v", name, errs)
	}
	return topo
}

// serve starts impl on a real listener, "unix" (a socket in a fresh directory) or "tcp"
// (loopback), and returns a real gRPC client connected to it.
func serve(t testing.TB, network string, impl extprocv3.ExternalProcessorServer) extprocv3.ExternalProcessorClient {
	t.Helper()
	var lis net.Listener
	var target string
	var err error
	switch network {
	case "unix":
		// Not t.TempDir(): socket paths are limited to ~100 bytes and test names are long.
		dir, derr := os.MkdirTemp("", "extproc")
		if derr != nil {
			t.Fatal(derr)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		path := filepath.Join(dir, "s.sock")
		lis, err = net.Listen("unix", path)
		target = "unix:" + path
	case "tcp":
		lis, err = net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			target = lis.Addr().String()
		}
	default:
		t.Fatalf("network %q", network)
	}
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, impl)
	go gs.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// headers builds an ext_proc HeaderMap from name, value pairs, values in raw_value as Envoy
// sends them by default.
func headers(kv ...string) *extprocv3.HttpHeaders {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.HttpHeaders{Headers: hm, EndOfStream: true}
}

// request is the request_headers message for a request line plus extra headers.
func request(method, path string, extra ...string) *extprocv3.HttpHeaders {
	return headers(append([]string{":method", method, ":path", path, ":authority", "kube.example:6443", ":scheme", "https"}, extra...)...)
}

// exchange does, for one HTTP request, what Envoy's ext_proc filter does with our processing
// mode when it keeps the stream for the whole request (1.36's lifetime): open a stream, send
// request_headers, read the one response, and, without half-closing, see the server end the
// stream cleanly (status OK), as extproc does after its last answer.
func exchange(ctx context.Context, c extprocv3.ExternalProcessorClient, msg *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	stream, err := c.Process(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(msg); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if extra, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("after the response: %v, %v; want the server to end the stream", extra, err)
	}
	return resp, nil
}

func call(t testing.TB, c extprocv3.ExternalProcessorClient, h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	t.Helper()
	return callBeside(t, c, "", h)
}

// callBeside is call from a sidecar Envoy beside apiserver local ("": a front proxy), which
// names it in the stream's gRPC metadata as the sidecar's routes do.
func callBeside(t testing.TB, c extprocv3.ExternalProcessorClient, local string, h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	t.Helper()
	ctx := testutil.Context(t, 10*time.Second)
	if local != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, contract.MetadataLocalAPIServer, local)
	}
	resp, err := exchange(ctx, c, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// header is one header line.
type header struct{ name, value string }

// applyMutation applies a request-headers response to the request's headers as Envoy's
// ext_proc filter does (MutationUtils::applyHeaderMutations): names are lower-cased; first
// every remove_headers name is removed, then each set_headers entry either replaces every
// value of its name (append unset or false, the ext_proc default) or adds one (append true).
// Values come from raw_value.
func applyMutation(t testing.TB, req *extprocv3.HttpHeaders, resp *extprocv3.ProcessingResponse) []header {
	t.Helper()
	var hs []header
	for _, h := range req.GetHeaders().GetHeaders() {
		hs = append(hs, header{strings.ToLower(h.GetKey()), string(h.GetRawValue())})
	}
	hr := resp.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("not a request-headers response: %v", resp)
	}
	m := hr.GetResponse().GetHeaderMutation()
	del := func(name string) {
		kept := hs[:0]
		for _, h := range hs {
			if h.name != name {
				kept = append(kept, h)
			}
		}
		hs = kept
	}
	for _, name := range m.GetRemoveHeaders() {
		if !strings.HasPrefix(name, ":") {
			del(strings.ToLower(name))
		}
	}
	for _, o := range m.GetSetHeaders() {
		if o.GetHeader().GetValue() != "" {
			t.Errorf("header %s set in value, not raw_value", o.GetHeader().GetKey())
		}
		name := strings.ToLower(o.GetHeader().GetKey())
		//lint:ignore SA1019 ext_proc honours only the deprecated append flag (see setHeader)
		if !o.GetAppend().GetValue() {
			del(name)
		}
		hs = append(hs, header{name, string(o.GetHeader().GetRawValue())})
	}
	return hs
}

// values returns every value of name in hs, in order.
func values(hs []header, name string) []string {
	var vs []string
	for _, h := range hs {
		if h.name == name {
			vs = append(vs, h.value)
		}
	}
	return vs
}
