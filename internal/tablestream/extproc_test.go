package tablestream_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kube-mvp/kube-mvp/internal/extproc"
	"github.com/kube-mvp/kube-mvp/internal/plan/plantest"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
)

// TestExtprocSeesFailedUpdates wires Follow to an extproc.Server as cmd/extproc does: a table
// that cannot be used leaves the server ready on its last table, and its metrics say so.
func TestExtprocSeesFailedUpdates(t *testing.T) {
	ep := extproc.New(extproc.Options{})
	reg := ep.Registry()
	if got := metric(t, reg, "kube_mvp_extproc_table_last_update_timestamp_seconds"); got != 0 {
		t.Errorf("last update %v before any table, want 0", got)
	}
	srv := tablestream.NewServer(tablestream.ServerOptions{MaxTableSize: 64 << 10, Log: slog.New(slog.DiscardHandler)})
	srv.Publish(sample(t, true), time.Now())
	addr, _ := serve(t, "127.0.0.1:0", srv)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tablestream.Follow(ctx, conn, "test", ep.SetTable, tablestream.FollowOptions{Log: slog.New(slog.DiscardHandler), OnReject: ep.TableUpdateFailed})
	}()
	defer func() { cancel(); <-done }()

	waitMetric := func(what, name string, want float64, label ...string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); metric(t, reg, name, label...) != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s%v = %v, want %v", what, name, label, metric(t, reg, name, label...), want)
			}
		}
	}
	for deadline := time.Now().Add(20 * time.Second); !ep.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no table")
		}
	}
	first := ep.Version()
	if got := metric(t, reg, "kube_mvp_extproc_table_last_update_timestamp_seconds"); got < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last update %v after a table", got)
	}
	for _, r := range tablestream.Reasons {
		if got := metric(t, reg, "kube_mvp_extproc_table_update_failures_total", r); got != 0 {
			t.Errorf("failures{%s} = %v before any", r, got)
		}
	}
	if got := metric(t, reg, "kube_mvp_extproc_table_update_failing"); got != 0 {
		t.Errorf("failing %v", got)
	}

	srv.Publish(tableOf(t, plantest.BigTopology(t, 20, 3)), time.Now()) // over the limit
	waitMetric("after a table too large", "kube_mvp_extproc_table_update_failing", 1)
	if got := metric(t, reg, "kube_mvp_extproc_table_update_failures_total", tablestream.ReasonTooLarge); got < 1 {
		t.Errorf("failures{too_large} = %v", got)
	}
	if !ep.Ready() || ep.Version() != first {
		t.Errorf("ready %v, version %q: want still ready on %q", ep.Ready(), ep.Version(), first)
	}

	srv.Publish(sample(t, false), time.Now())
	waitMetric("after a good table", "kube_mvp_extproc_table_update_failing", 0)
	if ep.Version() == first {
		t.Error("the next good table was not applied")
	}
}
