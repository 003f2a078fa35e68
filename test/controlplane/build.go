// Package controlplane runs a real Kubernetes control plane for tests: one etcd and any number
// of kube-apiservers, each of its own version and with its own hostname, on 127.0.0.1. The
// binaries are built from Go modules (no download of a release is reachable from our
// machines) with the pinned wrapper modules under tools/kube/<version>/, and cached.
package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Versions are the Kubernetes releases with a pinned wrapper module under tools/kube.
var Versions = []string{"v1.36.4", "v1.37.1"}

// Binaries are the executables of one Kubernetes release.
type Binaries struct {
	Version       string
	KubeAPIServer string
	Etcd          string
}

// RepoRoot finds the kube-mvp checkout from the working directory upwards, so tests (which run
// in their package's folder) and the CLI (run anywhere inside the checkout) find tools/kube.
func RepoRoot() (string, error) {
	if root := os.Getenv("KUBE_MVP_ROOT"); root != "" {
		return root, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "tools", "kube", "gen.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the kube-mvp checkout (tools/kube/gen.sh) above the working directory; set KUBE_MVP_ROOT")
		}
		dir = parent
	}
}

// CacheDir is where built binaries live, outside the repository so every clone and every
// test package shares them: $KUBE_MVP_CACHE, else the user cache dir + /kube-mvp.
func CacheDir() (string, error) {
	if dir := os.Getenv("KUBE_MVP_CACHE"); dir != "" {
		return dir, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "kube-mvp"), nil
}

// recipe is everything that decides what a build produces; its hash keys the cache.
type recipe struct {
	version   string
	moduleDir string
	ldflags   string
	goVersion string
	inputs    []byte
	etcd      string
}

func newRecipe(root, version string) (*recipe, error) {
	dir := filepath.Join(root, "tools", "kube", version)
	var inputs bytes.Buffer
	for _, f := range []string{"go.mod", "go.sum", "etcd/main.go"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("kubernetes %s has no pinned wrapper module (run tools/kube/gen.sh %s): %w", version, version, err)
		}
		fmt.Fprintf(&inputs, "%s %d\n", f, len(b))
		inputs.Write(b)
	}
	etcd := "unknown"
	for line := range strings.Lines(inputs.String()) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "go.etcd.io/etcd/server/v3" {
			etcd = f[1]
			break
		}
	}
	major, minor, ok := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	if !ok {
		return nil, fmt.Errorf("version %q is not vMAJOR.MINOR.PATCH", version)
	}
	minor, _, _ = strings.Cut(minor, ".")
	// The apiserver reports these in /version; without them it calls itself v0.0.0.
	stamp := "k8s.io/component-base/version"
	ldflags := strings.Join([]string{
		"-s", "-w",
		"-X", stamp + ".gitVersion=" + version,
		"-X", stamp + ".gitMajor=" + major,
		"-X", stamp + ".gitMinor=" + minor,
		"-X", stamp + ".gitTreeState=clean",
		"-X", stamp + ".buildDate=1970-01-01T00:00:00Z",
	}, " ")
	return &recipe{version: version, moduleDir: dir, ldflags: ldflags, goVersion: runtime.Version(), inputs: inputs.Bytes(), etcd: etcd}, nil
}

func (r *recipe) key() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", r.version, r.goVersion, r.ldflags, runtime.GOARCH)
	h.Write(r.inputs)
	return fmt.Sprintf("%s-etcd%s-%s-%s", r.version, r.etcd, r.goVersion, hex.EncodeToString(h.Sum(nil))[:12])
}

// EnsureBinaries returns the cached binaries for a Kubernetes version, building them first if
// needed. Concurrent callers (parallel test packages) wait on a file lock instead of building
// twice. A cold build takes minutes; progress goes to log.
func EnsureBinaries(ctx context.Context, version string, log io.Writer) (Binaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	r, err := newRecipe(root, version)
	if err != nil {
		return Binaries{}, err
	}
	cache, err := CacheDir()
	if err != nil {
		return Binaries{}, err
	}
	binDir := filepath.Join(cache, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return Binaries{}, err
	}
	dir := filepath.Join(binDir, r.key())
	bins := Binaries{Version: version, KubeAPIServer: filepath.Join(dir, "kube-apiserver"), Etcd: filepath.Join(dir, "etcd")}
	if complete(bins) {
		fmt.Fprintf(log, "kubernetes %s: using cached binaries in %s\n", version, dir)
		return bins, nil
	}

	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()
	if complete(bins) { // built by whoever held the lock before us
		fmt.Fprintf(log, "kubernetes %s: using cached binaries in %s\n", version, dir)
		return bins, nil
	}

	tmp, err := os.MkdirTemp(binDir, ".build-")
	if err != nil {
		return Binaries{}, err
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(log, "kubernetes %s: building kube-apiserver and etcd %s from Go modules (a cold build takes several minutes)...\n", version, r.etcd)
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-mod=readonly", "-trimpath", "-ldflags", r.ldflags,
		"-o", tmp+string(filepath.Separator), "k8s.io/kubernetes/cmd/kube-apiserver", "./etcd")
	cmd.Dir = r.moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan struct{})
	go progress(log, version, start, done)
	err = cmd.Run()
	close(done)
	if err != nil {
		return Binaries{}, fmt.Errorf("building kubernetes %s: %w\n%s", version, err, out.String())
	}
	if err := os.Rename(tmp, dir); err != nil {
		return Binaries{}, err
	}
	fmt.Fprintf(log, "kubernetes %s: built in %s, cached in %s\n", version, time.Since(start).Round(time.Second), dir)
	return bins, nil
}

func progress(log io.Writer, version string, start time.Time, done <-chan struct{}) {
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			fmt.Fprintf(log, "kubernetes %s: still building (%s)\n", version, time.Since(start).Round(time.Second))
		}
	}
}

func complete(b Binaries) bool {
	for _, p := range []string{b.KubeAPIServer, b.Etcd} {
		if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// lockFile takes an exclusive flock, polling so the context can cancel the wait.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
