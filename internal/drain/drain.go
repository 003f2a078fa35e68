// Package drain stops an Envoy without cutting what it is serving: `extproc drain-envoy`, the
// Envoy pod's preStop hook, asks Envoy's admin API to drain its listeners, waits until no
// request is active (or the drain time is over), then writes a file; extproc's /drained
// (Waiter), the Envoy container's preStop hook, answers once the file exists, so that the
// kubelet sends Envoy its SIGTERM only then.
//
// Envoy's admin is read as untrusted input: every answer is read to a bound, and nothing it
// says makes the drain wait longer than the drain time.
package drain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/adminhttp"
)

// DefaultDoneFile is where drain-envoy says Envoy is drained and /drained looks: in the
// emptyDir the chart mounts in both containers.
const DefaultDoneFile = "/var/run/kube-mvp/envoy-drained"

// MaxBody bounds every answer of Envoy's admin that is read.
const MaxBody = 4 << 20

// maxSummary bounds the log kept for the done file.
const maxSummary = 64 << 10

// Options are drain-envoy's settings.
type Options struct {
	// Admin is Envoy's admin address, HOST:PORT.
	Admin string
	// Delay: Envoy keeps serving as before this long first, while the EndpointSlice and
	// kube-proxy stop sending it new connections.
	Delay time.Duration
	// DrainTime is Envoy's --drain-time-s: the longest wait for active requests after the
	// drain began.
	DrainTime time.Duration
	// PollInterval: how often the active requests are counted.
	PollInterval time.Duration
	// ExitWait: the longest wait for Envoy to exit once the done file is written.
	ExitWait time.Duration
	// DoneFile is written (atomically) when the drain is over, whatever happened.
	DoneFile string
	// Logger gets the progress; nil discards it.
	Logger *slog.Logger

	// For tests: how long drain_listeners is retried while Envoy refuses connections
	// (default 2s), and how often Envoy's exit is checked (default 200ms).
	retryFor, exitPoll time.Duration
}

// Result is what Run saw.
type Result struct {
	// Draining: Envoy answered drain_listeners with 200.
	Draining bool
	// Unreachable: Envoy's admin refused every connection; nothing was drained.
	Unreachable bool
	// MaxActive and LastActive are the active requests counted (-1: never counted).
	MaxActive, LastActive int
	// Waited is the time from the drain's start to its end.
	Waited time.Duration
	// DoneErr is the error writing DoneFile.
	DoneErr error
	// Exited: Envoy's admin refused connections before ExitWait passed.
	Exited bool
}

// Run drains the Envoy at o.Admin (see Options) and returns what it saw. Whatever happens, it
// writes o.DoneFile before it returns (a drain that fails must not hold up the pod's
// termination), then waits up to o.ExitWait for Envoy to exit. ctx ending (a signal) cuts the
// waits short.
func Run(ctx context.Context, o Options) (res Result) {
	if o.retryFor == 0 {
		o.retryFor = 2 * time.Second
	}
	if o.exitPoll == 0 {
		o.exitPoll = 200 * time.Millisecond
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	// The log goes to the done file too: the kubelet keeps a preStop hook's output only when
	// the hook fails, and extproc logs what it finds in the file.
	summary := &boundedBuffer{max: maxSummary}
	var base slog.Handler = slog.DiscardHandler
	if o.Logger != nil {
		base = o.Logger.Handler()
	}
	log := slog.New(teeHandler{base, slog.NewTextHandler(summary, nil)})
	res.MaxActive, res.LastActive = -1, -1
	start := time.Now()
	log.Info("draining Envoy", "admin", o.Admin, "delay", o.Delay, "drainTime", o.DrainTime, "doneFile", o.DoneFile)
	// A file left by an earlier run must not end the Envoy container's hook early.
	if err := os.Remove(o.DoneFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("removing an old done file", "error", err)
	}

	defer func() {
		if p := recover(); p != nil {
			log.Error("drain-envoy failed", "panic", fmt.Sprint(p))
		}
		log.Info("drain over", "draining", res.Draining, "maxActive", res.MaxActive, "lastActive", res.LastActive,
			"waited", res.Waited.Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond))
		if res.DoneErr = writeDone(o.DoneFile, summary.Bytes()); res.DoneErr != nil {
			log.Error("cannot tell Envoy's container the drain is over; it stops when its hook's wait ends", "error", res.DoneErr)
		}
		res.Exited = waitExit(ctx, o.Admin, o.ExitWait, o.exitPoll)
		log.Info("drain-envoy done", "envoyExited", res.Exited, "total", time.Since(start).Round(time.Millisecond))
	}()

	if !sleep(ctx, o.Delay) {
		log.Warn("interrupted before the drain")
		return res
	}
	c := newClient()
	res.Draining, res.Unreachable = drainListeners(ctx, c, o, log)
	if res.Unreachable {
		log.Warn("Envoy's admin refuses connections: nothing to drain")
		return res
	}
	drainStart := time.Now()
	deadline := drainStart.Add(o.DrainTime)
	defer func() { res.Waited = time.Since(drainStart) }()
	lastErr := ""
	for {
		rctx, cancel := context.WithDeadline(ctx, minTime(deadline, time.Now().Add(5*time.Second)))
		n, err := ActiveRequests(rctx, c, o.Admin)
		cancel()
		switch {
		case isRefused(err):
			log.Info("Envoy's admin refuses connections: Envoy is gone", "after", time.Since(drainStart).Round(time.Millisecond))
			return res
		case err != nil:
			if err.Error() != lastErr {
				log.Warn("counting Envoy's active requests", "error", err)
				lastErr = err.Error()
			}
		default:
			lastErr = ""
			if n != res.LastActive {
				log.Info("active requests", "active", n, "after", time.Since(drainStart).Round(time.Millisecond))
			}
			res.LastActive = n
			res.MaxActive = max(res.MaxActive, n)
		}
		if err == nil && n == 0 {
			log.Info("Envoy is drained", "waited", time.Since(drainStart).Round(time.Millisecond))
			return res
		}
		left := time.Until(deadline)
		if left <= 0 {
			log.Warn("the drain time is over; the requests still active will be cut", "active", res.LastActive, "waited", time.Since(drainStart).Round(time.Millisecond))
			return res
		}
		if !sleep(ctx, min(o.PollInterval, left)) {
			log.Warn("interrupted during the drain", "active", res.LastActive)
			return res
		}
	}
}

// newClient talks to Envoy's admin only: no proxy from the environment, no kept-alive
// connections (they would outlive Envoy's exit check).
func newClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, MaxResponseHeaderBytes: 64 << 10},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// drainListeners asks Envoy to drain gracefully (for its --drain-time-s, with its
// --drain-strategy), retrying refused connections for o.retryFor (Envoy may still be
// starting). unreachable: every attempt was refused.
func drainListeners(ctx context.Context, c *http.Client, o Options, log *slog.Logger) (draining, unreachable bool) {
	giveUp := time.Now().Add(o.retryFor)
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		status, body, err := adminhttp.Do(rctx, c, http.MethodPost, "http://"+o.Admin+"/drain_listeners?graceful", 512)
		cancel()
		switch {
		case err == nil && status == http.StatusOK:
			log.Info("Envoy drains its listeners")
			return true, false
		case err == nil:
			log.Warn("Envoy refused to drain its listeners", "status", status, "answer", strings.TrimSpace(string(body)))
			return false, false
		case !isRefused(err) || !time.Now().Before(giveUp):
			log.Warn("asking Envoy to drain its listeners", "error", err)
			return false, isRefused(err)
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return false, false
		}
	}
}

// ActiveRequests counts the requests Envoy at admin is serving: the sum of its
// http.*.downstream_rq_active gauges but the admin's own.
func ActiveRequests(ctx context.Context, c *http.Client, admin string) (int, error) {
	status, body, err := adminhttp.Do(ctx, c, http.MethodGet, "http://"+admin+"/stats?format=json&filter=downstream_rq_active", MaxBody)
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK {
		return 0, fmt.Errorf("stats: status %d", status)
	}
	return ParseActive(body)
}

// ParseActive reads Envoy's /stats?format=json answer, {"stats":[{"name":…,"value":…},…]},
// and sums the http.<prefix>.downstream_rq_active gauges but http.admin's (the admin's own,
// counting this very request). Entries without a name or a non-negative integer value (a
// histogram) are skipped; an answer without a single such gauge is an error, not zero, so
// that an answer of another shape never passes for a drained Envoy.
func ParseActive(body []byte) (int, error) {
	var s struct {
		Stats []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return 0, fmt.Errorf("stats: not Envoy's JSON: %w", err)
	}
	sum, found := 0, false
	for _, st := range s.Stats {
		prefix, ok := strings.CutSuffix(st.Name, ".downstream_rq_active")
		if !ok || !strings.HasPrefix(prefix, "http.") || prefix == "http.admin" || strings.HasPrefix(prefix, "http.admin.") {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(st.Value)), 10, 63)
		if err != nil {
			continue
		}
		found = true
		if n > uint64(math.MaxInt-sum) {
			sum = math.MaxInt
		} else {
			sum += int(n)
		}
	}
	if !found {
		return 0, errors.New("stats: no http.*.downstream_rq_active gauge in Envoy's answer")
	}
	return sum, nil
}

// writeDone writes content to path atomically (a temporary file renamed), so a reader sees
// no file or the whole file.
func writeDone(path string, content []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// waitExit waits up to wait until a TCP connection to addr is refused, that is until Envoy
// exited. It reports whether it did. (A dial that times out, on a busy node, proves nothing.)
func waitExit(ctx context.Context, addr string, wait, every time.Duration) bool {
	giveUp := time.Now().Add(wait)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if isRefused(err) {
			return true
		}
		if err == nil {
			c.Close()
		}
		if !time.Now().Before(giveUp) || !sleep(ctx, min(every, time.Until(giveUp))) {
			return false
		}
	}
}

func isRefused(err error) bool { return err != nil && errors.Is(err, syscall.ECONNREFUSED) }

// sleep waits d unless ctx ends first; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// boundedBuffer keeps the last max bytes written to it (the drain's end matters most).
type boundedBuffer struct {
	mu        sync.Mutex
	b         []byte
	max       int
	truncated bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
		b.truncated = true
	}
	return len(p), nil
}

// Bytes is what was kept, after a line saying so when the start was dropped.
func (b *boundedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.truncated {
		return append([]byte("(log truncated)\n"), b.b...)
	}
	return bytes.Clone(b.b)
}

// teeHandler logs each record to both handlers.
type teeHandler struct{ a, b slog.Handler }

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.a.Enabled(ctx, l) || t.b.Enabled(ctx, l)
}

func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	for _, h := range []slog.Handler{t.a, t.b} {
		if h.Enabled(ctx, r.Level) {
			errs = append(errs, h.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{t.a.WithAttrs(as), t.b.WithAttrs(as)}
}

func (t teeHandler) WithGroup(name string) slog.Handler {
	return teeHandler{t.a.WithGroup(name), t.b.WithGroup(name)}
}
