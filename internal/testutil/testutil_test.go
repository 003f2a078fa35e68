package testutil

import (
	"context"
	"errors"
	"strings"
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
