// Package testutil holds the small helpers the tests share: a bounded wait for a condition,
// a writer into the test log, a buffer safe for concurrent writers, a temporary directory
// kept when the test fails, a certificate authority, and ports for the processes tests start
// that no other test takes. It imports nothing but the standard library, so any package's
// tests may use it.
package testutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Interval is how often WaitFor and Until call their check.
const Interval = 50 * time.Millisecond

// Until calls check every Interval until it returns nil (Until then returns nil), or until
// timeout has passed or ctx is done: then the error names what was awaited and check's last
// error.
func Until(ctx context.Context, timeout time.Duration, what string, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (%v): %w", what, timeout, err)
		case <-tick.C:
		}
	}
}

// WaitFor is Until that fails the test, with what was awaited and check's last error.
func WaitFor(t testing.TB, ctx context.Context, timeout time.Duration, what string, check func() error) {
	t.Helper()
	if err := Until(ctx, timeout, what, check); err != nil {
		t.Fatal(err)
	}
}

// Context is t.Context() with a timeout: it ends when the test function returns (before its
// Cleanup functions run) or when timeout has passed, whichever comes first.
func Context(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// TempDirKeptOnFailure makes a new directory under /tmp whose name begins with prefix, and
// removes it when the test ends, unless the test failed: then it is kept, and its path logged,
// for the logs of a failed run are what one reads to find out why. It is under /tmp and not
// t.TempDir() because such directories hold unix sockets, whose paths must stay short (at
// most 108 bytes).
func TempDirKeptOnFailure(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// errNotYet is what Cond's check returns while the condition does not hold.
var errNotYet = errors.New("condition not met")

// Cond turns a condition into a check for WaitFor and Until.
func Cond(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}
}

// LogWriter writes into t's log, a line a write; with CI set in the environment it also
// copies to stderr, so that long builds show progress as it happens.
func LogWriter(t testing.TB) io.Writer { return logWriter{t} }

type logWriter struct{ t testing.TB }

func (l logWriter) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	if os.Getenv("CI") != "" {
		os.Stderr.Write(p)
	}
	return len(p), nil
}

// SyncBuffer is a bytes.Buffer that concurrent writers (loggers' goroutines) and the test's
// reads may share.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
