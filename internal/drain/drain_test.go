package drain

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
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

// fakeEnvoy imitates Envoy's admin: POST /drain_listeners?graceful, then
// GET /stats?format=json&filter=downstream_rq_active answered by stats (called with the
// number of stats requests so far).
type fakeEnvoy struct {
	srv   *httptest.Server
	stats func(n int) (status int, body string)

	mu         sync.Mutex
	drainedAt  time.Time
	drainQuery string
	statsCalls int
	drainCode  int
}

func newFakeEnvoy(t *testing.T, stats func(n int) (int, string)) *fakeEnvoy {
	f := &fakeEnvoy{stats: stats, drainCode: http.StatusOK}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch {
		case r.URL.Path == "/drain_listeners" && r.Method == http.MethodPost:
			f.drainedAt, f.drainQuery = time.Now(), r.URL.RawQuery
			w.WriteHeader(f.drainCode)
			fmt.Fprintln(w, "OK")
		case r.URL.Path == "/stats" && r.Method == http.MethodGet && r.URL.Query().Get("format") == "json" && r.URL.Query().Get("filter") == "downstream_rq_active":
			if f.drainedAt.IsZero() {
				t.Errorf("stats read before drain_listeners")
			}
			f.statsCalls++
			code, body := f.stats(f.statsCalls)
			w.WriteHeader(code)
			fmt.Fprint(w, body)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEnvoy) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// statsJSON is Envoy's answer with active requests on the apiserver listener, a histogram,
// the admin's own request and a listener stat that is not an HCM's.
func statsJSON(active int) string {
	return fmt.Sprintf(`{"stats":[{"name":"http.admin.downstream_rq_active","value":1},{"name":"http.envoy-health.downstream_rq_active","value":0},`+
		`{"name":"http.kube_mvp.downstream_rq_active","value":%d},{"histograms":{"supported_quantiles":[0,50,100],"computed_quantiles":[]}},`+
		`{"name":"listener.admin.downstream_rq_active","value":7}]}`, active)
}

func options(t *testing.T, admin string) Options {
	return Options{
		Admin: admin, DrainTime: 5 * time.Second, PollInterval: 10 * time.Millisecond, ExitWait: 5 * time.Second,
		DoneFile: filepath.Join(t.TempDir(), "envoy-drained"),
		Logger:   slog.New(slog.NewTextHandler(testutil.LogWriter(t), nil)),
		retryFor: 300 * time.Millisecond, exitPoll: 10 * time.Millisecond,
	}
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// TestDrainUntilIdle: after the delay, drain_listeners?graceful, then the active requests
// counted until none is left; the done file written; Run returns once Envoy exited.
func TestDrainUntilIdle(t *testing.T) {
	counts := []int{3, 3, 2, 1, 0}
	f := newFakeEnvoy(t, func(n int) (int, string) { return 200, statsJSON(counts[min(n, len(counts))-1]) })
	o := options(t, f.addr())
	o.Delay = 100 * time.Millisecond
	if err := os.WriteFile(o.DoneFile, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := make(chan Result, 1)
	go func() { done <- Run(t.Context(), o) }()
	testutil.WaitFor(t, t.Context(), 10*time.Second, "the done file", testutil.Cond(func() bool {
		b, _ := os.ReadFile(o.DoneFile)
		return len(b) > 0 && string(b) != "stale"
	}))
	select {
	case res := <-done:
		t.Fatalf("Run returned %+v while Envoy still runs", res)
	case <-time.After(50 * time.Millisecond):
	}
	f.srv.Close() // Envoy exits on its SIGTERM
	res := <-done

	f.mu.Lock()
	defer f.mu.Unlock()
	if d := f.drainedAt.Sub(start); d < o.Delay {
		t.Errorf("drain_listeners after %s, before the delay %s", d, o.Delay)
	}
	if f.drainQuery != "graceful" || f.statsCalls != len(counts) {
		t.Errorf("drain query %q, %d stats reads; want graceful, %d", f.drainQuery, f.statsCalls, len(counts))
	}
	if !res.Draining || res.Unreachable || res.MaxActive != 3 || res.LastActive != 0 || !res.Exited || res.DoneErr != nil {
		t.Errorf("result %+v", res)
	}
	b, _ := os.ReadFile(o.DoneFile)
	for _, want := range []string{"Envoy drains its listeners", "active=3", "active=1", "Envoy is drained"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the done file lacks %q:\n%s", want, b)
		}
	}
}

// TestDrainTimeOver: requests that never end are waited for the drain time, no longer.
func TestDrainTimeOver(t *testing.T) {
	f := newFakeEnvoy(t, func(int) (int, string) { return 200, statsJSON(2) })
	o := options(t, f.addr())
	o.DrainTime, o.ExitWait = 300*time.Millisecond, 100*time.Millisecond
	start := time.Now()
	res := Run(t.Context(), o)
	took := time.Since(start)
	if res.Waited < o.DrainTime || took > o.DrainTime+o.ExitWait+2*time.Second {
		t.Errorf("waited %s, took %s; want the drain time %s and a bounded exit wait", res.Waited, took, o.DrainTime)
	}
	if !res.Draining || res.LastActive != 2 || res.Exited || !exists(o.DoneFile) {
		t.Errorf("result %+v, done file %v", res, exists(o.DoneFile))
	}
}

// TestEnvoyUnreachable: an admin that refuses connections (Envoy not running) is retried
// briefly; the done file is written all the same.
func TestEnvoyUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	o := options(t, addr)
	start := time.Now()
	res := Run(t.Context(), o)
	if took := time.Since(start); took < o.retryFor || took > o.retryFor+3*time.Second {
		t.Errorf("took %s; want about the retry time %s", took, o.retryFor)
	}
	if !res.Unreachable || res.Draining || !res.Exited || res.DoneErr != nil || !exists(o.DoneFile) {
		t.Errorf("result %+v, done file %v", res, exists(o.DoneFile))
	}
}

// TestEnvoyAnswersBadly: a refused drain is logged and the drain goes on; answers that are
// not Envoy's stats (malformed, huge, an error status, no gauge) count as nothing, never as
// drained, and end at the drain time without a panic.
func TestEnvoyAnswersBadly(t *testing.T) {
	huge := `{"stats":[` + strings.Repeat(`{"name":"http.x.downstream_rq_active","value":1},`, MaxBody/40) + `]}`
	for _, c := range []struct {
		name       string
		code       int
		body, want string
		drainTime  time.Duration // long enough to read the answer, on a busy machine
	}{
		{"truncated", 200, `{"stats":[{"name":`, "not Envoy's JSON", 0},
		{"huge", 200, huge, "longer than 4194304 bytes", 3 * time.Second},
		{"error", 500, statsJSON(0), "status 500", 0},
		{"admin-only", 200, `{"stats":[{"name":"http.admin.downstream_rq_active","value":1}]}`, "no http.*.downstream_rq_active gauge", 0},
		{"array", 200, `[1,2,3]`, "not Envoy's JSON", 0},
		{"object", 200, `{"stats":{"name":"http.x.downstream_rq_active"}}`, "not Envoy's JSON", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeEnvoy(t, func(int) (int, string) { return c.code, c.body })
			f.drainCode = http.StatusNotFound
			var logs testutil.SyncBuffer
			o := options(t, f.addr())
			o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			o.DrainTime, o.ExitWait = max(c.drainTime, 100*time.Millisecond), 10*time.Millisecond
			res := Run(t.Context(), o)
			if res.Draining || res.LastActive != -1 || res.Waited < o.DrainTime || !exists(o.DoneFile) {
				t.Errorf("result %+v, done file %v", res, exists(o.DoneFile))
			}
			for _, want := range []string{"Envoy refused to drain its listeners", "status=404", c.want, "the drain time is over"} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log lacks %q:\n%.2000s", want, logs.String())
				}
			}
		})
	}
}

// TestInterrupted: a signal (ctx) cuts the delay short; the done file is still written.
func TestInterrupted(t *testing.T) {
	f := newFakeEnvoy(t, func(int) (int, string) { return 200, statsJSON(1) })
	o := options(t, f.addr())
	o.Delay = time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	res := Run(ctx, o)
	f.mu.Lock()
	defer f.mu.Unlock()
	if res.Draining || !exists(o.DoneFile) || !f.drainedAt.IsZero() {
		t.Errorf("result %+v, done file %v, drained at %v", res, exists(o.DoneFile), f.drainedAt)
	}
}

// TestDoneFileUnwritable: a done file that cannot be written is reported, not fatal.
func TestDoneFileUnwritable(t *testing.T) {
	f := newFakeEnvoy(t, func(int) (int, string) { return 200, statsJSON(0) })
	o := options(t, f.addr())
	o.DoneFile = filepath.Join(t.TempDir(), "missing-dir", "envoy-drained")
	o.ExitWait = 10 * time.Millisecond
	if res := Run(t.Context(), o); res.DoneErr == nil || !res.Draining {
		t.Errorf("result %+v", res)
	}
}

func TestParseActive(t *testing.T) {
	for _, c := range []struct {
		body string
		want int
		err  string
	}{
		{statsJSON(4), 4, ""},
		{`{"stats":[{"name":"http.a.downstream_rq_active","value":2},{"name":"http.b.downstream_rq_active","value":3}]}`, 5, ""},
		{`{"stats":[{"name":"http.a.downstream_rq_active","value":0}]}`, 0, ""},
		// Values that are no gauge's: skipped.
		{`{"stats":[{"name":"http.a.downstream_rq_active","value":-1},{"name":"http.b.downstream_rq_active","value":"7"},` +
			`{"name":"http.c.downstream_rq_active","value":1.5},{"name":"http.d.downstream_rq_active"},{"name":"http.e.downstream_rq_active","value":1}]}`, 1, ""},
		{fmt.Sprintf(`{"stats":[{"name":"http.a.downstream_rq_active","value":%d},{"name":"http.b.downstream_rq_active","value":%d}]}`, math.MaxInt64, math.MaxInt64), math.MaxInt, ""},
		{`{"stats":[{"name":"http.a.downstream_rq_active","value":99999999999999999999999}]}`, 0, "no http"},
		{`{"stats":[{"name":"http.admin.downstream_rq_active","value":1},{"name":"cluster.x.upstream_rq_active","value":2}]}`, 0, "no http"},
		{`{"stats":[]}`, 0, "no http"},
		{`{}`, 0, "no http"},
		{``, 0, "not Envoy's JSON"},
		{`null`, 0, "no http"},
		{`{"stats":"x"}`, 0, "not Envoy's JSON"},
	} {
		got, err := ParseActive([]byte(c.body))
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseActive(%.80s) = %d, %v; want %d, %q", c.body, got, err, c.want, c.err)
		}
	}
}

func TestBoundedBuffer(t *testing.T) {
	b := &boundedBuffer{max: 10}
	b.Write([]byte("0123456"))
	b.Write([]byte("789abc"))
	if got := string(b.Bytes()); got != "(log truncated)\n3456789abc" {
		t.Errorf("%q", got)
	}
	if got := string((&boundedBuffer{max: 10}).Bytes()); got != "" {
		t.Errorf("%q", got)
	}
}
