package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// headersMsg is the request_headers message of a request line.
func headersMsg(method, path string, extra ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: request(method, path, extra...)}}
}

// waitOpen waits until n streams are open in srv.
func waitOpen(t *testing.T, srv *Server, n int) {
	t.Helper()
	testutil.WaitFor(t, t.Context(), 10*time.Second, fmt.Sprintf("%d open streams", n), func() error {
		if got, _ := metricValue(t, srv, "kube_mvp_extproc_streams_open", nil); got != float64(n) {
			return fmt.Errorf("%v open", got)
		}
		return nil
	})
}

// tryStream opens a stream, sends a request and returns the answer, or the status the
// stream ended with.
func tryStream(ctx context.Context, client extprocv3.ExternalProcessorClient) (*extprocv3.ProcessingResponse, error) {
	stream, err := client.Process(ctx)
	if err != nil {
		return nil, err
	}
	_ = stream.Send(headersMsg("GET", "/apis/batch/v1/jobs")) // io.EOF if a refusal came first
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if extra, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("after the response: %v, %v; want the server to end the stream", extra, err)
	}
	return resp, nil
}

// refusedStream is tryStream on a stream extproc must refuse: the status it ended with.
func refusedStream(ctx context.Context, client extprocv3.ExternalProcessorClient) error {
	resp, err := tryStream(ctx, client)
	if err == nil {
		return fmt.Errorf("answered: %v", resp)
	}
	return err
}

// TestMaxStreams: past MaxStreams open streams across connections, one more is refused
// (ResourceExhausted, naming the limit), counted and logged; the open ones are served, and a
// stream that ends, served or not, frees its place.
func TestMaxStreams(t *testing.T) {
	const limit = 3
	var logs testutil.SyncBuffer
	now := time.Now() // fixed: the log's rate limit lets one line through
	srv := New(Options{MaxStreams: limit, FirstMessageTimeout: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Now: func() time.Time { return now }})
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	clients := []extprocv3.ExternalProcessorClient{serve(t, "unix", srv), serve(t, "tcp", srv)}
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_streams_limit", nil); got != limit {
		t.Errorf("streams_limit %v, want %d", got, limit)
	}

	// Idle streams over two connections, as a client that opens streams and sends nothing.
	ctx := testutil.Context(t, 30*time.Second)
	idle := make([]extprocv3.ExternalProcessor_ProcessClient, limit)
	cancels := make([]context.CancelFunc, limit)
	for i := range idle {
		sctx, cancel := context.WithCancel(ctx)
		stream, err := clients[i%2].Process(sctx)
		if err != nil {
			t.Fatal(err)
		}
		idle[i], cancels[i] = stream, cancel
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	waitOpen(t, srv, limit)

	for i, c := range clients {
		err := refusedStream(ctx, c)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "3 ext_proc streams open") || !strings.Contains(err.Error(), "--max-streams") {
			t.Fatalf("stream %d past the limit, on connection %d: %v; want ResourceExhausted naming the limit, 3, and --max-streams", limit+1, i, err)
		}
	}
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_streams_refused_total", map[string]string{"limit": "max-streams"}); got != 2 {
		t.Errorf(`streams_refused_total{limit="max-streams"} = %v, want 2`, got)
	}
	if n := strings.Count(logs.String(), "ext_proc stream refused"); n != 1 {
		t.Errorf("%d refusals logged, want 1 (rate-limited):\n%s", n, logs.String())
	}

	// An open stream is served as usual, and ends, which frees its place.
	if err := idle[0].Send(headersMsg("GET", "/apis/batch/v1/jobs")); err != nil {
		t.Fatal(err)
	}
	resp, err := idle[0].Recv()
	if err != nil || resp.GetRequestHeaders() == nil {
		t.Fatalf("open stream: %v, %v; want a decision", resp, err)
	}
	if _, err := idle[0].Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("served stream not ended: %v", err)
	}
	waitOpen(t, srv, limit-1)
	call(t, clients[1], request("GET", "/api/v1/pods"))

	// So does one its client gives up on before sending anything.
	cancels[1]()
	waitOpen(t, srv, limit-2) // and the decision above gave its place back
	call(t, clients[0], request("GET", "/api/v1/pods"))
	call(t, clients[1], request("GET", "/api/v1/pods"))
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_streams_refused_total", map[string]string{"limit": "max-streams"}); got != 2 {
		t.Errorf(`streams_refused_total{limit="max-streams"} = %v after places freed, want still 2`, got)
	}
	cancels[2]()
	waitOpen(t, srv, 0)
}

// TestMaxStreamsUnderLoad: parallel clients over a small limit each get an answer or a
// refusal, refusals are counted one for one, and every place is given back (go test -race).
func TestMaxStreamsUnderLoad(t *testing.T) {
	srv := New(Options{MaxStreams: 4})
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	client := serve(t, "tcp", srv)
	ctx := testutil.Context(t, 60*time.Second)
	var (
		mu               sync.Mutex
		served, refused  int
		wg               sync.WaitGroup
		unexpectedErrors []error
	)
	for range 16 {
		wg.Go(func() {
			for range 50 {
				_, err := tryStream(ctx, client)
				mu.Lock()
				switch status.Code(err) {
				case codes.OK:
					served++
				case codes.ResourceExhausted:
					refused++
				default:
					unexpectedErrors = append(unexpectedErrors, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(unexpectedErrors) != 0 {
		t.Fatalf("%d streams failed otherwise, e.g. %v", len(unexpectedErrors), unexpectedErrors[0])
	}
	t.Logf("%d served, %d refused", served, refused)
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_streams_refused_total", map[string]string{"limit": "max-streams"}); got != float64(refused) {
		t.Errorf("streams_refused_total %v, want %d", got, refused)
	}
	if served == 0 {
		t.Error("nothing served")
	}
	waitOpen(t, srv, 0)
}

// TestFirstMessageTimeout: a stream that sends nothing is ended (DeadlineExceeded, naming the
// flag), counted and logged, and its place freed; the bound is on the first message only.
func TestFirstMessageTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	var logs testutil.SyncBuffer
	topo := loadFixture(t, "upgrade.yaml", fixtureNow)
	topo.Discovery = topology.NewDiscovery([]byte(`{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[]}`))
	srv := New(Options{MaxStreams: 1, FirstMessageTimeout: timeout, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	srv.SetTopology(topo, "v1")
	client := serve(t, "unix", srv)
	ctx := testutil.Context(t, 30*time.Second)

	stream, err := client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Recv returns when extproc ends the stream; ctx bounds the wait should it never.
	_, err = stream.Recv()
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "--first-message-timeout") || !strings.Contains(err.Error(), timeout.String()) {
		t.Fatalf("idle stream: %v; want DeadlineExceeded naming --first-message-timeout and %v", err, timeout)
	}
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_streams_first_message_timeouts_total", nil); got != 1 {
		t.Errorf("first_message_timeouts_total %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "no message since it opened") {
		t.Errorf("not logged:\n%s", logs.String())
	}
	// Its place (the only one) is free again.
	waitOpen(t, srv, 0)
	call(t, client, request("GET", "/api/v1/pods"))

	// A merged-discovery stream waits for the response headers as long as the apiserver
	// takes: past the timeout, they are still answered.
	stream, err = client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
	if err := stream.Send(headersMsg("GET", "/apis", "accept", v2)); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || resp.GetModeOverride().GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SEND {
		t.Fatalf("discovery request: %v, %v; want the response headers asked for", resp, err)
	}
	time.Sleep(4 * timeout) // a wrong bound would end the stream by now; a late timer only hides it
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers(":status", "200", "content-type", v2)}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || resp.GetImmediateResponse().GetStatus().GetCode() != 200 {
		t.Fatalf("response headers after the first-message timeout: %v, %v; want the merged document", resp, err)
	}
	if got, _ := metricValue(t, srv, "kube_mvp_extproc_streams_first_message_timeouts_total", nil); got != 1 {
		t.Errorf("first_message_timeouts_total %v, want still 1", got)
	}
}
