package drain

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

func newWaiter(t *testing.T, maxWait time.Duration) (*Waiter, *httptest.Server, *testutil.SyncBuffer) {
	var logs testutil.SyncBuffer
	w := &Waiter{File: filepath.Join(t.TempDir(), "envoy-drained"), MaxWait: maxWait, Logger: slog.New(slog.NewTextHandler(&logs, nil)), check: 10 * time.Millisecond}
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	return w, srv, &logs
}

func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestWaiterWaitsForTheFile: /drained answers only once drain-envoy's file exists, and logs
// what it says.
func TestWaiterWaitsForTheFile(t *testing.T) {
	w, srv, logs := newWaiter(t, time.Minute)
	type answer struct {
		code int
		body string
		err  error
		at   time.Time
	}
	got := make(chan answer, 1)
	go func() {
		code, body, err := get(t.Context(), srv.URL+"/drained")
		got <- answer{code, body, err, time.Now()}
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case a := <-got:
		t.Fatalf("answered %+v before the file exists", a)
	default:
	}
	written := time.Now()
	if err := writeDone(w.File, []byte("level=INFO msg=\"Envoy is drained\"\n")); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil || a.code != 200 || a.body != "drained\n" || a.at.Before(written) {
		t.Errorf("answer %+v", a)
	}
	if !strings.Contains(logs.String(), "Envoy is drained") {
		t.Errorf("log lacks drain-envoy's summary:\n%s", logs.String())
	}
	// Once written, at once.
	if code, body, err := get(t.Context(), srv.URL); code != 200 || body != "drained\n" || err != nil {
		t.Errorf("second request: %d %q %v", code, body, err)
	}
}

// TestWaiterMaxWait: without the file, the wait ends after MaxWait, 200 and logged.
func TestWaiterMaxWait(t *testing.T) {
	_, srv, logs := newWaiter(t, 200*time.Millisecond)
	start := time.Now()
	code, body, err := get(t.Context(), srv.URL)
	if took := time.Since(start); err != nil || code != 200 || !strings.Contains(body, "not drained after 200ms") || took < 200*time.Millisecond || took > 5*time.Second {
		t.Errorf("%d %q %v after %s", code, body, err, took)
	}
	if !strings.Contains(logs.String(), "no word of Envoy's drain") {
		t.Errorf("log:\n%s", logs.String())
	}
}

// TestWaiterLimit: MaxWaiters wait at once; one more gets 503 at once; a waiter whose client
// leaves frees its place.
func TestWaiterLimit(t *testing.T) {
	w, srv, _ := newWaiter(t, time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range MaxWaiters {
		wg.Add(1)
		go func() { defer wg.Done(); get(ctx, srv.URL) }() //nolint:errcheck // cancelled below
	}
	testutil.WaitFor(t, t.Context(), 10*time.Second, "the waiters", testutil.Cond(func() bool { return w.waiting.Load() == MaxWaiters }))
	if code, _, err := get(t.Context(), srv.URL); code != http.StatusServiceUnavailable || err != nil {
		t.Errorf("one waiter too many: %d %v", code, err)
	}
	cancel()
	wg.Wait()
	testutil.WaitFor(t, t.Context(), 10*time.Second, "the waiters to leave", testutil.Cond(func() bool { return w.waiting.Load() == 0 }))
	if err := os.WriteFile(w.File, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, err := get(t.Context(), srv.URL); code != 200 || err != nil {
		t.Errorf("after the waiters left: %d %v", code, err)
	}
}

// TestWaiterDisabledAndMethods: MaxWait 0 is no endpoint; only GET and HEAD wait.
func TestWaiterDisabledAndMethods(t *testing.T) {
	_, srv, _ := newWaiter(t, 0)
	if code, _, err := get(t.Context(), srv.URL); code != http.StatusNotFound || err != nil {
		t.Errorf("disabled: %d %v", code, err)
	}
	_, srv, _ = newWaiter(t, time.Minute)
	resp, err := http.Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}
}

// TestWaiterStop: extproc stopping ends the waits.
func TestWaiterStop(t *testing.T) {
	w, srv, _ := newWaiter(t, time.Minute)
	stop := make(chan struct{})
	w.Stop = stop
	time.AfterFunc(50*time.Millisecond, func() { close(stop) })
	if code, body, err := get(t.Context(), srv.URL); code != 200 || body != "extproc is stopping\n" || err != nil {
		t.Errorf("%d %q %v", code, body, err)
	}
}
