package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// certFlags are the flags naming certificate files, re-read while serving.
var certFlags = []string{"serving-cert", "serving-key", "client-ca", "proxy-client-cert", "proxy-client-key", "peer-ca"}

// certReloader keeps the Envoy configuration's certificates in step with their files, so a
// rotation (cert-manager, a Secret volume update) reaches Envoy over SDS without a restart.
// It polls: mounted Secrets change by an atomic symlink swap that inotify on the file itself
// would miss, and a read of six small files every few seconds costs nothing.
type certReloader struct {
	raw     map[string]string // the envoy configuration flags as given
	current atomic.Pointer[snapshot.Config]
	last    map[string][]byte // flag -> bytes of the configuration in use
	log     *slog.Logger
}

func newCertReloader(raw map[string]string, cfg snapshot.Config, log *slog.Logger) *certReloader {
	r := &certReloader{raw: raw, log: log}
	r.current.Store(&cfg)
	r.last = r.read()
	return r
}

// Config is the configuration in use.
func (r *certReloader) Config() snapshot.Config { return *r.current.Load() }

// read returns the bytes of every certificate file (nil for one that cannot be read).
func (r *certReloader) read() map[string][]byte {
	files := map[string][]byte{}
	for _, f := range certFlags {
		if path, ok := r.raw[f]; ok {
			b, _ := os.ReadFile(path)
			files[f] = b
		}
	}
	return files
}

// check re-reads the files; when they changed and make a valid configuration, that becomes
// the one in use and check reports true. A change that does not validate (say the
// certificate was replaced and its key not yet) keeps the previous configuration, is logged,
// and is tried again on the next check.
func (r *certReloader) check() bool {
	files := r.read()
	changed := false
	for f, b := range files {
		if !bytes.Equal(b, r.last[f]) {
			changed = true
		}
	}
	if !changed {
		return false
	}
	cfg, errs := parseEnvoyConfig(r.raw, nil)
	if errs != nil {
		errs.ErrorFormat = listErrors
		r.log.Warn("certificate files changed but do not make a valid configuration yet; Envoy keeps the previous ones", "error", errs)
		return false
	}
	r.current.Store(&cfg)
	r.last = files
	r.log.Info("certificates reloaded; Envoy gets them over SDS")
	return true
}

// run checks every interval until ctx ends, calling changed after each reload.
func (r *certReloader) run(ctx context.Context, interval time.Duration, changed func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if r.check() {
				changed()
			}
		}
	}
}
