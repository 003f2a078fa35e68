package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	calls := 0
	err := Until(context.Background(), time.Second, "three calls", func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Until: %v after %d calls", err, calls)
	}
	start := time.Now()
	err = Until(context.Background(), 200*time.Millisecond, "never", func() error { return errors.New("last error") })
	if err == nil || !strings.Contains(err.Error(), "waiting for never") || !strings.Contains(err.Error(), "last error") {
		t.Errorf("Until after the timeout: %v", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 2*time.Second {
		t.Errorf("Until gave up after %v, want 200ms", d)
	}
	if err := Until(context.Background(), time.Second, "cond", Cond(func() bool { return true })); err != nil {
		t.Errorf("Cond true: %v", err)
	}
}

func TestContextEndsWithTheTest(t *testing.T) {
	var ctx context.Context
	t.Run("inner", func(t *testing.T) { ctx = Context(t, time.Hour) })
	if ctx.Err() == nil {
		t.Error("the context outlived its test")
	}
}

func TestTempDirKeptOnFailure(t *testing.T) {
	var dir string
	t.Run("passes", func(t *testing.T) {
		dir = TempDirKeptOnFailure(t, "testutil-")
		if !strings.HasPrefix(dir, "/tmp/testutil-") {
			t.Errorf("dir %s, want one under /tmp", dir)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Error(err)
		}
	})
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after a passed test: %v, want it removed", err)
	}

	failed := &failedTB{TB: t}
	dir = TempDirKeptOnFailure(failed, "testutil-")
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, f := range failed.cleanups {
		f()
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("after a failed test: %v, want it kept", err)
	}
	if len(failed.logs) != 1 || !strings.Contains(failed.logs[0], dir) {
		t.Errorf("logged %q, want the kept directory", failed.logs)
	}
}

// failedTB is a test that has failed, whose Cleanup functions the caller runs.
type failedTB struct {
	testing.TB
	cleanups []func()
	logs     []string
}

func (f *failedTB) Helper()           {}
func (f *failedTB) Failed() bool      { return true }
func (f *failedTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *failedTB) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

// TestProcessCPU: this process's CPU time grows while it spins (however busy the machine:
// it spins until /proc counts 50 ms more, for at most a minute), and its group is found.
func TestProcessCPU(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	after := before
	for deadline := time.Now().Add(time.Minute); after-before < 50*time.Millisecond && time.Now().Before(deadline); {
		for start := time.Now(); time.Since(start) < 10*time.Millisecond; {
		}
		if after, err = ProcessCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after-before < 50*time.Millisecond {
		t.Errorf("a minute of spinning counted %s of CPU", after-before)
	}
	group, err := ProcessGroupCPU(syscall.Getpgrp())
	if err != nil || group < after {
		t.Errorf("this process's group: %s, %v; want at least this process's %s", group, err, after)
	}
	if _, err := ProcessGroupCPU(1 << 30); err == nil {
		t.Error("a group nobody is in has a CPU time")
	}
}
