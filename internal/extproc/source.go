package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
)

// FileOptions tune a File source.
type FileOptions struct {
	// Now is the time Lease liveness is judged at; zero means every Lease counts as alive
	// (objects.Options.Now). A fixed time makes a fixture reproducible.
	Now time.Time
	// PollInterval, when positive, re-reads the file that often and applies it when its
	// bytes changed. Zero means reload only on Reload.
	PollInterval time.Duration
	// Reload forces a re-read on every receive (cmd/extproc sends SIGHUP here).
	Reload <-chan os.Signal
	// Logger receives reload results; nil discards.
	Logger *slog.Logger
}

// File is a routing-table source that reads an inventory fixture (the YAML format of
// internal/objects: Leases, StorageVersions, APIServices, APIServerDiscovery) and
// builds the table with objects.Build, without the watcher's client-go. It suits demos,
// tests and static control planes; a live cluster feeds extproc from xds-server's table
// stream instead.
//
// Reloading: on every Reload signal (an operator's explicit request, always applied) and,
// with PollInterval, whenever the file's bytes change (a ConfigMap update swaps the file
// under a mounted volume without any signal). A file that fails to load or build keeps the
// previous table in use and is logged.
type File struct {
	path    string
	opts    FileOptions
	log     *slog.Logger
	last    []byte // the bytes of the last file applied
	lastBad []byte // the bytes of the last file that failed, not retried until they change
}

// FileSource returns a source reading the fixture at path.
func FileSource(path string, opts FileOptions) *File {
	f := &File{path: path, opts: opts, log: opts.Logger}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	return f
}

// Load reads and builds the table once: the plans of every kind of Envoy, as xds-server
// makes them. The version is the table's content hash, the same one xds-server's table
// stream gives an equal table (internal/tablestream.ToProto). Objects Build skips are logged, not
// fatal.
func (f *File) Load() (*plan.Table, string, error) {
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return nil, "", err
	}
	t, version, err := f.build(raw)
	if err != nil {
		return nil, "", err
	}
	f.last = raw
	return t, version, nil
}

func (f *File) build(raw []byte) (*plan.Table, string, error) {
	objs, err := objects.DecodeFixture(bytes.NewReader(raw))
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", f.path, err)
	}
	t, errs := objects.Build(objs, objects.Options{Now: f.opts.Now})
	for _, e := range errs {
		f.log.Warn("routing table source: object skipped", "file", f.path, "error", e)
	}
	if t == nil {
		return nil, "", fmt.Errorf("%s: no routing table could be built: %w", f.path, errors.Join(errs...))
	}
	for _, n := range t.NotRoutable() {
		f.log.Warn("routing table source: apiserver not routable", "file", f.path, "apiserver", n.ID, "hostname", n.Hostname, "reason", n.Reason)
	}
	if len(t.Live()) == 0 {
		f.log.Warn("routing table source: no apiserver is routable: every request will be answered 503", "file", f.path)
	}
	tb, err := plan.TableOf(t)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", f.path, err)
	}
	return tb, tablestream.ToProto(tb, time.Time{}).GetVersion(), nil
}

// Run watches for reloads until ctx ends, calling apply with every table it loads. Call
// Load (and apply its result) first: Run only reloads.
func (f *File) Run(ctx context.Context, apply func(*plan.Table, string)) {
	var tick <-chan time.Time
	if f.opts.PollInterval > 0 {
		t := time.NewTicker(f.opts.PollInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		forced := false
		select {
		case <-ctx.Done():
			return
		case <-f.opts.Reload:
			forced = true
		case <-tick:
		}
		raw, err := os.ReadFile(f.path)
		if err != nil {
			f.log.Error("routing table source: reload failed; keeping the table in use", "file", f.path, "error", err)
			continue
		}
		if !forced && (bytes.Equal(raw, f.last) || bytes.Equal(raw, f.lastBad)) {
			continue
		}
		t, version, err := f.build(raw)
		if err != nil {
			f.log.Error("routing table source: reload failed; keeping the table in use", "error", err)
			f.lastBad = raw
			continue
		}
		f.last = raw
		f.log.Info("routing table source: reloaded", "file", f.path, "version", version, "forced", forced)
		apply(t, version)
	}
}
