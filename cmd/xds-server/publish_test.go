package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/table"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestDelayedPublisher: the first table goes out at once, later ones after the delay, and an
// older table never replaces a newer one.
func TestDelayedPublisher(t *testing.T) {
	topo := func(aliveB bool) *topology.Topology {
		tp, err := topology.New([]topology.APIServer{
			{ID: "apiserver-a", Hostname: "cp-a", Address: "127.0.0.1:1", Alive: true},
			{ID: "apiserver-b", Hostname: "cp-b", Address: "127.0.0.1:2", Alive: aliveB},
		}, map[topology.Resource][]string{{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-a"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	version := func(tp *topology.Topology) string { return table.ToProto(tp, time.Time{}).GetVersion() }
	up, down := topo(true), topo(false)
	if version(up) == version(down) {
		t.Fatal("test topologies have equal tables")
	}
	tables := table.NewServer()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if tables.Version() == want {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("table version %s, want %s", tables.Version(), want)
	}

	publish := delayedPublisher(tables, 100*time.Millisecond)
	publish(down)
	if got := tables.Version(); got != version(down) {
		t.Fatalf("first table not published at once: %q", got)
	}
	// cp-b comes alive, and with it the cluster of cp-a alone: Envoy needs the delay to warm
	// them.
	publish(up)
	if got := tables.Version(); got != version(down) {
		t.Fatalf("a table naming a new cluster and apiserver was published without the delay")
	}
	waitFor(version(up))
	// cp-b gone: nothing new to warm, published at once.
	publish(down)
	if got := tables.Version(); got != version(down) {
		t.Fatalf("a table naming nothing new waited: %s", got)
	}
	// Two in a row: the last one wins and stays, even though the first is delayed.
	publish(up)
	publish(down)
	if got := tables.Version(); got != version(down) {
		t.Fatalf("table %s, want %s", got, version(down))
	}
	time.Sleep(300 * time.Millisecond)
	if got := tables.Version(); got != version(down) {
		t.Errorf("an older table replaced the newer one: %s", got)
	}
}

// TestServeTimingFlags: the make-before-break durations are checked together, every problem
// reported at once.
func TestServeTimingFlags(t *testing.T) {
	code, _, errOut := runCmd("serve", "--kubeconfig", "/nonexistent", "--routing-table-delay", "5s", "--cluster-linger", "3s", "--liveness-window", "1s")
	if code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	for _, want := range []string{"--cluster-linger 3s must be longer than --routing-table-delay 5s", "--liveness-window \"1s\""} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if code, _, errOut := runCmd("serve", "--kubeconfig", "/nonexistent", "--routing-table-delay", "soon"); code != 2 || !strings.Contains(errOut, "--routing-table-delay \"soon\"") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}
