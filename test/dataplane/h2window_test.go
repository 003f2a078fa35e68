package dataplane

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestH2SlowReaders: clients that start a large response (a big list, a busy watch) and then
// stop reading hold, each, up to its stream window of the upstream connection's window:
// neither Envoy nor the stand-in credits the apiserver for data its client did not take
// (codec_impl.cc ConnectionImpl::onData; h2pool.go newH2Pool). With Envoy 1.36's defaults
// (16 MiB stream window, 24 MiB connection window, 1024 streams) two of them exhaust the
// connection window, and a short request on the same connection gets its headers but never
// its body until they go away; with the product's windows (100 streams × 1 MiB ≤ 100 MiB)
// four of them leave the connection free. The sidecar fixture sends every non-resource
// request to the local apiserver, so all of them share its one HTTP/2 connection.
func TestH2SlowReaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(*corev3.Http2ProtocolOptions) // nil: the product's
		readers int
		stall   bool
	}{
		{"product", nil, 4, false},
		{"envoy-defaults", func(o *corev3.Http2ProtocolOptions) {
			o.MaxConcurrentStreams, o.InitialStreamWindowSize, o.InitialConnectionWindowSize = nil, nil, nil
		}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{fixture: "sidecar", local: "cp-a", editResources: h2Config{mutate: tc.mutate}.edit})
			f := e.apiservers["cp-a"]
			// Each slow reader's response: far more than every window and buffer on the way.
			const size = 256 << 20
			blockedSince := make([]atomic.Int64, tc.readers) // unix nanos a Write began, 0: not in one
			written := make([]atomic.Int64, tc.readers)
			f.mu.Lock()
			f.serve = func(w http.ResponseWriter, r *http.Request) bool {
				rest, ok := strings.CutPrefix(r.URL.Path, "/big/")
				if !ok {
					return false
				}
				i, err := strconv.Atoi(rest)
				if err != nil || i >= tc.readers {
					return false
				}
				w.Header().Set("Content-Type", "application/octet-stream")
				w.WriteHeader(http.StatusOK)
				chunk := make([]byte, 32<<10)
				for n := 0; n < size; n += len(chunk) {
					blockedSince[i].Store(time.Now().UnixNano())
					_, err := w.Write(chunk)
					blockedSince[i].Store(0)
					if err != nil {
						return true
					}
					written[i].Add(int64(len(chunk)))
				}
				return true
			}
			f.mu.Unlock()

			// The upstream connection first (and its SETTINGS), by a short request.
			if r := e.do(e.client(nil), "GET", "/healthz", nil); r.status != 200 || r.seen.Server != "cp-a" {
				t.Fatalf("warm-up: status %d from %q: %s", r.status, r.seen.Server, r.body)
			}
			// The slow readers, each over a client connection of its own: they read the
			// headers and a little of the body, then nothing.
			readers := make([]io.Closer, tc.readers)
			for i := range tc.readers {
				ctx, cancel := context.WithCancel(t.Context())
				req, _ := http.NewRequestWithContext(ctx, "GET", e.base+"/big/"+strconv.Itoa(i), nil)
				resp, err := e.client(nil).Do(req)
				if err != nil {
					cancel()
					t.Fatal(err)
				}
				if resp.StatusCode != 200 {
					cancel()
					t.Fatalf("slow reader %d: status %d", i, resp.StatusCode)
				}
				if _, err := io.ReadFull(resp.Body, make([]byte, 1024)); err != nil {
					cancel()
					t.Fatal(err)
				}
				readers[i] = closer(func() error { cancel(); return resp.Body.Close() })
			}
			release := func() {
				for _, r := range readers {
					_ = r.Close()
				}
			}
			t.Cleanup(release)
			// Every slow reader's upstream writes block: flow control, all windows and
			// buffers between the apiserver and the client full.
			const blocked = 300 * time.Millisecond
			testutil.WaitFor(t, t.Context(), 30*time.Second, "every slow reader's upstream writes blocked", func() error {
				for i := range tc.readers {
					s := blockedSince[i].Load()
					if s == 0 || time.Since(time.Unix(0, s)) < blocked {
						return fmt.Errorf("reader %d: writing (%d bytes written)", i, written[i].Load())
					}
				}
				return nil
			})
			var total int64
			for i := range tc.readers {
				total += written[i].Load()
			}
			t.Logf("%d slow readers blocked after %d MiB written upstream", tc.readers, total>>20)

			// A short request on the same upstream connection.
			done := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(t.Context(), "GET", e.base+"/healthz", nil)
				resp, err := e.client(nil).Do(req)
				if err != nil {
					done <- err
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err == nil && (resp.StatusCode != 200 || !strings.Contains(string(b), `"cp-a"`)) {
					err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
				}
				done <- err
			}()
			// Stalled: not answered within bound (it never would be before the readers
			// leave). Not stalled: answered, however slowly the machine runs (-race, load).
			bound := 3 * time.Second
			if !tc.stall {
				bound = 30 * time.Second
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("short request: %v", err)
				}
				if tc.stall {
					t.Fatalf("short request completed beside %d stalled readers, want it stalled by the connection window", tc.readers)
				}
			case <-time.After(bound):
				if !tc.stall {
					t.Fatalf("short request not completed within %v beside %d stalled readers", bound, tc.readers)
				}
				// The readers go away: their unread data is credited back (the stand-in's
				// response body Close; Envoy's onStreamClose), and the short request
				// completes, so it was the window that held it.
				release()
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("short request after the readers left: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("short request still not completed after the slow readers left")
				}
			}
			if n := connsOf(f); n != 1 {
				t.Errorf("cp-a saw %d connections, want the slow readers and the short request on one", n)
			}
		})
	}
}

type closer func() error

func (c closer) Close() error { return c() }
