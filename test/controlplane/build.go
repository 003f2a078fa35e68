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
var Versions = []string{"v1.35.8", "v1.36.4", "v1.37.1"}

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
	if _, _, ok := strings.Cut(strings.TrimPrefix(version, "v"), "."); !ok {
		return nil, fmt.Errorf("version %q is not vMAJOR.MINOR.PATCH", version)
	}
	return &recipe{version: version, moduleDir: dir, ldflags: stampFlags(version), goVersion: runtime.Version(), inputs: inputs.Bytes(), etcd: etcd}, nil
}

// stampFlags are the linker flags of a release build of version (vMAJOR.MINOR.PATCH): the
// binaries report it in /version and `kubectl version`; without them they say v0.0.0.
func stampFlags(version string) string {
	major, minor, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	stamp := "k8s.io/component-base/version"
	return strings.Join([]string{
		"-s", "-w",
		"-X", stamp + ".gitVersion=" + version,
		"-X", stamp + ".gitMajor=" + major,
		"-X", stamp + ".gitMinor=" + minor,
		"-X", stamp + ".gitTreeState=clean",
		"-X", stamp + ".buildDate=1970-01-01T00:00:00Z",
	}, " ")
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
	dir, err := CachedBuild(ctx, log, BuildSpec{
		Label:     "kubernetes " + version,
		What:      "kube-apiserver and etcd " + r.etcd,
		Key:       r.key(),
		Outputs:   []string{"kube-apiserver", "etcd"},
		ModuleDir: r.moduleDir,
		LDFlags:   r.ldflags,
		Packages:  []string{"k8s.io/kubernetes/cmd/kube-apiserver", "./etcd"},
	})
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{Version: version, KubeAPIServer: filepath.Join(dir, "kube-apiserver"), Etcd: filepath.Join(dir, "etcd")}, nil
}

// EnsureKubectl returns the path of kubectl built from the published k8s.io/kubectl module
// pinned in tools/kubectl (a small build, about a minute cold), cached like the apiservers.
func EnsureKubectl(ctx context.Context, log io.Writer) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "tools", "kubectl")
	var inputs bytes.Buffer
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&inputs, "%s %d\n", f, len(b))
		inputs.Write(b)
	}
	// k8s.io/kubectl v0.X.Y is Kubernetes v1.X.Y.
	version := ""
	for line := range strings.Lines(inputs.String()) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "k8s.io/kubectl" {
			version = "v1." + strings.TrimPrefix(f[1], "v0.")
			break
		}
	}
	if version == "" {
		return "", errors.New("tools/kubectl/go.mod does not require k8s.io/kubectl")
	}
	ldflags := stampFlags(version)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", runtime.Version(), ldflags, runtime.GOARCH)
	h.Write(inputs.Bytes())
	out, err := CachedBuild(ctx, log, BuildSpec{
		Label:     "kubectl " + version,
		What:      "kubectl",
		Key:       fmt.Sprintf("kubectl-%s-%s-%s", version, runtime.Version(), hex.EncodeToString(h.Sum(nil))[:12]),
		Outputs:   []string{"kubectl"},
		ModuleDir: dir,
		LDFlags:   ldflags,
		Packages:  []string{"."},
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(out, "kubectl"), nil
}

// BuildSpec is one cached `go build` in a pinned wrapper module (or any module).
type BuildSpec struct {
	Label, What string   // for progress lines
	Key         string   // the cache directory's name: changes whenever the output would
	Outputs     []string // the executables `go build -o DIR/` leaves, by name
	ModuleDir   string   // where go build runs
	LDFlags     string
	Packages    []string
	Flags       []string // more `go build` flags (e.g. -buildvcs=false)
}

// CachedBuild returns the cache directory holding spec's outputs, building them first (into
// a temporary directory renamed into place, under a file lock) when they are missing. The
// build is static (CGO_ENABLED=0), -trimpath and -mod=readonly, outside any go.work.
func CachedBuild(ctx context.Context, log io.Writer, spec BuildSpec) (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	binDir := filepath.Join(cache, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", err
	}
	dir := filepath.Join(binDir, spec.Key)
	if complete(dir, spec.Outputs) {
		fmt.Fprintf(log, "%s: using cached binaries in %s\n", spec.Label, dir)
		return dir, nil
	}

	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if complete(dir, spec.Outputs) { // built by whoever held the lock before us
		fmt.Fprintf(log, "%s: using cached binaries in %s\n", spec.Label, dir)
		return dir, nil
	}

	tmp, err := os.MkdirTemp(binDir, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(log, "%s: building %s from Go modules (a cold build can take minutes)...\n", spec.Label, spec.What)
	start := time.Now()
	args := append([]string{"build", "-mod=readonly", "-trimpath", "-ldflags", spec.LDFlags}, spec.Flags...)
	args = append(append(args, "-o", tmp+string(filepath.Separator)), spec.Packages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = spec.ModuleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan struct{})
	go progress(log, spec.Label, start, done)
	err = cmd.Run()
	close(done)
	if err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", spec.Label, err, out.String())
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	fmt.Fprintf(log, "%s: built in %s, cached in %s\n", spec.Label, time.Since(start).Round(time.Second), dir)
	return dir, nil
}

func progress(log io.Writer, label string, start time.Time, done <-chan struct{}) {
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			fmt.Fprintf(log, "%s: still building (%s)\n", label, time.Since(start).Round(time.Second))
		}
	}
}

func complete(dir string, outputs []string) bool {
	for _, name := range outputs {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// LockFile takes an exclusive lock on path (created if missing) for a build that other test
// packages may run at the same time, waiting until ctx ends; call the returned func to
// release it.
func LockFile(ctx context.Context, path string) (func(), error) { return lockFile(ctx, path) }

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

// NodeVersion is the Kubernetes release of the test node's components (test/node): the newest
// with a pinned wrapper module under tools/node.
const NodeVersion = "v1.37.1"

// NodeBinaries are the node components of one Kubernetes release.
type NodeBinaries struct {
	Version                                                  string
	Kubelet, KubeProxy, KubeControllerManager, KubeScheduler string
}

// EnsureNodeBinaries returns the cached kubelet, kube-proxy, kube-controller-manager and
// kube-scheduler of NodeVersion, built from tools/node/<version> first if needed (a cold
// build takes several minutes and about 1.5 GB of memory).
func EnsureNodeBinaries(ctx context.Context, log io.Writer) (NodeBinaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return NodeBinaries{}, err
	}
	version := NodeVersion
	dir := filepath.Join(root, "tools", "node", version)
	var inputs bytes.Buffer
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return NodeBinaries{}, fmt.Errorf("kubernetes %s has no pinned node module (run tools/node/gen.sh %s): %w", version, version, err)
		}
		fmt.Fprintf(&inputs, "%s %d\n", f, len(b))
		inputs.Write(b)
	}
	ldflags := stampFlags(version)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", runtime.Version(), ldflags, runtime.GOARCH)
	h.Write(inputs.Bytes())
	names := []string{"kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler"}
	packages := make([]string, len(names))
	for i, n := range names {
		packages[i] = "k8s.io/kubernetes/cmd/" + n
	}
	out, err := CachedBuild(ctx, log, BuildSpec{
		Label:     "kubernetes node " + version,
		What:      strings.Join(names, ", "),
		Key:       fmt.Sprintf("node-%s-%s-%s", version, runtime.Version(), hex.EncodeToString(h.Sum(nil))[:12]),
		Outputs:   names,
		ModuleDir: dir,
		LDFlags:   ldflags,
		Packages:  packages,
	})
	if err != nil {
		return NodeBinaries{}, err
	}
	return NodeBinaries{
		Version:               version,
		Kubelet:               filepath.Join(out, "kubelet"),
		KubeProxy:             filepath.Join(out, "kube-proxy"),
		KubeControllerManager: filepath.Join(out, "kube-controller-manager"),
		KubeScheduler:         filepath.Join(out, "kube-scheduler"),
	}, nil
}
