package extproc

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

func TestFileSource(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join("testdata", "upgrade.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fixture.yaml")
	write := func(b []byte) {
		t.Helper()
		// Replace the file as a ConfigMap volume does: write aside, rename over.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(orig)

	reload := make(chan os.Signal, 1)
	f := FileSource(path, FileOptions{Now: fixtureNow, PollInterval: 5 * time.Millisecond, Reload: reload})
	topo, version, err := f.Load()
	if err != nil {
		t.Fatal(err)
	}
	if want := tablestream.ToProto(must(plan.TableOf(loadFixture(t, "upgrade.yaml", fixtureNow))), time.Time{}).GetVersion(); version != want {
		t.Errorf("version %q, want the table stream's content hash %q", version, want)
	}
	svm := topology.Resource{Group: "storagemigration.k8s.io", Version: "v1alpha1", Resource: "storageversionmigrations"}
	if d := topo.Routes[""].Lookup(svm); d.Outcome != topology.Unavailable {
		t.Fatalf("cp-c should be dead at the fixed time: %+v", d)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type applied struct {
		topo    *plan.Table
		version string
	}
	got := make(chan applied, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx, func(t *plan.Table, v string) { got <- applied{t, v} })
	}()
	next := func() applied {
		t.Helper()
		select {
		case a := <-got:
			return a
		case <-time.After(20 * time.Second):
			t.Fatal("no table applied")
		}
		return applied{}
	}

	// A broken file is not applied (the previous table stays), even when forced.
	write([]byte("apiVersion: v1\nkind: Nonsense\n"))
	reload <- syscall.SIGHUP
	// cp-c renews its Lease: a new table, picked up by polling.
	write([]byte(strings.Replace(string(orig), `renewTime: "2026-11-23T08:00:00.000000Z"`, `renewTime: "2026-11-23T10:00:09.000000Z"`, 1)))
	a := next()
	if a.version == version {
		t.Errorf("changed table kept version %q", version)
	}
	if d := a.topo.Routes[""].Lookup(svm); d.Outcome != topology.Subset {
		t.Errorf("after the renewal: %+v", d)
	}
	// SIGHUP re-applies even an unchanged file.
	reload <- syscall.SIGHUP
	if b := next(); b.version != a.version {
		t.Errorf("forced reload of the same file: version %q, want %q", b.version, a.version)
	}
	cancel()
	<-done
	select {
	case a := <-got:
		t.Errorf("unexpected extra table %q", a.version)
	default:
	}
}

func TestFileSourceOptions(t *testing.T) {
	path := filepath.Join("testdata", "upgrade.yaml")
	// Without a time, every Lease is live.
	topo, _, err := FileSource(path, FileOptions{}).Load()
	if err != nil {
		t.Fatal(err)
	}
	if live := topo.Live(); live != 3 {
		t.Errorf("%d live, want all three", live)
	}
	// The front proxy's plan and one per apiserver, for sidecars beside it.
	for _, local := range []string{"", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-imkgstwjs6opnbwk2ixluu6fiq", "apiserver-npbtitaxiimvptb5rwlxt4xbci"} {
		if topo.Routes[local] == nil {
			t.Errorf("no plan for %q", local)
		}
	}
	if got := topo.Routes["apiserver-imkgstwjs6opnbwk2ixluu6fiq"].Default.Cluster; got != "kube-apiserver-local" {
		t.Errorf("cp-b's sidecar plan: default cluster %q", got)
	}
	// Errors name the file.
	for _, p := range []string{filepath.Join("testdata", "broken.yaml"), filepath.Join("testdata", "missing.yaml")} {
		if _, _, err := FileSource(p, FileOptions{}).Load(); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v should name the file", p, err)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A fixture whose apiservers have no discovery of their own builds a table that answers 503
// to everything: the source says so, naming each apiserver and why.
func TestFileSourceWarnsWhenNothingIsRoutable(t *testing.T) {
	var logs strings.Builder
	path := filepath.Join("..", "snapshot", "testdata", "storageversion-only.in.yaml")
	tb, _, err := FileSource(path, FileOptions{Now: fixtureNow, Logger: slog.New(slog.NewTextHandler(&logs, nil))}).Load()
	if err != nil {
		t.Fatal(err)
	}
	if tb.Live() != 0 {
		t.Fatalf("%d live apiservers, want none (the fixture has no discovery)", tb.Live())
	}
	for _, want := range []string{
		"apiserver not routable", "apiserver=apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "hostname=cp-a",
		"apiserver=apiserver-imkgstwjs6opnbwk2ixluu6fiq", "own discovery was never read",
		"no apiserver is routable",
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}

	// A fixture where every apiserver routes says nothing of the kind.
	logs.Reset()
	if _, _, err := FileSource(filepath.Join("testdata", "upgrade.yaml"), FileOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))}).Load(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "routable") {
		t.Errorf("warned about a fixture where every apiserver routes:\n%s", logs.String())
	}
}
