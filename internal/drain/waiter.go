package drain

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// MaxWaiters is how many requests Waiter lets wait at once (the kubelet's preStop hook is
// one); more are answered 503.
const MaxWaiters = 4

// Waiter is extproc's GET /drained: it answers 200 once File exists (drain-envoy wrote it),
// at the latest after MaxWait from the request's start, so the Envoy container's preStop hook
// (an httpGet, which the kubelet does not time out) ends when Envoy is drained, or when
// drain-envoy evidently did not run. It changes nothing: whoever reaches the admin port can
// only wait. MaxWait 0 disables it (404).
type Waiter struct {
	File    string
	MaxWait time.Duration
	// Stop ends every wait (extproc stopping); may be nil.
	Stop <-chan struct{}
	// Logger gets what drain-envoy logged in File, and the waits that gave up; nil
	// discards.
	Logger *slog.Logger

	// check: how often File is looked for (default 200ms).
	check   time.Duration
	waiting atomic.Int32
}

func (w *Waiter) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if w.MaxWait <= 0 {
		http.NotFound(rw, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		rw.Header().Set("Allow", "GET, HEAD")
		http.Error(rw, "GET /drained waits until Envoy is drained", http.StatusMethodNotAllowed)
		return
	}
	if w.waiting.Add(1) > MaxWaiters {
		w.waiting.Add(-1)
		http.Error(rw, fmt.Sprintf("already %d waiting", MaxWaiters), http.StatusServiceUnavailable)
		return
	}
	defer w.waiting.Add(-1)
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	every := w.check
	if every <= 0 {
		every = 200 * time.Millisecond
	}
	start := time.Now()
	giveUp := time.NewTimer(w.MaxWait)
	defer giveUp.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if summary, ok := readDone(w.File); ok {
			log.Info("Envoy is drained; its container may stop", "waited", time.Since(start).Round(time.Millisecond), "drain-envoy", summary)
			fmt.Fprintln(rw, "drained")
			return
		}
		select {
		case <-tick.C:
		case <-giveUp.C:
			log.Warn("no word of Envoy's drain; letting its container stop", "file", w.File, "waited", w.MaxWait)
			fmt.Fprintf(rw, "not drained after %s; giving up\n", w.MaxWait)
			return
		case <-w.Stop:
			log.Info("extproc is stopping; letting Envoy's container stop", "waited", time.Since(start).Round(time.Millisecond))
			fmt.Fprintln(rw, "extproc is stopping")
			return
		case <-r.Context().Done():
			log.Info("the wait for Envoy's drain ended", "reason", r.Context().Err(), "waited", time.Since(start).Round(time.Millisecond))
			return
		}
	}
}

// readDone reports whether the done file exists, with (at most maxSummary bytes of) what it
// says.
func readDone(path string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, maxSummary))
	return strings.TrimSpace(string(b)), true
}
