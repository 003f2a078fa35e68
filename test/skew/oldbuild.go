// Package skew runs two versions of kube-mvp side by side, as an upgrade does: xds-server,
// extproc and Envoy's configuration of an older commit of this repository beside the
// current ones, against real apiservers (test/controlplane), with the test data plane
// standing in for Envoy.
package skew

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// OldBinaries are xds-server and extproc built from an older commit.
type OldBinaries struct {
	Commit     string // the full hash
	XDSServer  string
	Extproc    string
	BuildTime  time.Duration // 0 when they came from the cache
	FromCached bool
}

// EnsureOld returns xds-server and extproc built from commit (anything git rev-parse takes)
// of this repository, building them first if needed: the commit's tree is extracted (git
// archive) into a temporary directory and built with its own go.mod and go.sum (static,
// -trimpath, -mod=readonly, outside any go.work; the Go module proxy provides what the
// module cache lacks). The result is cached under <CacheDir>/old/<commit>/ with the
// Go version and architecture, behind a file lock for concurrent test packages.
func EnsureOld(ctx context.Context, commit string, log io.Writer) (OldBinaries, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return OldBinaries{}, err
	}
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", commit+"^{commit}").Output()
	if err != nil {
		return OldBinaries{}, fmt.Errorf("git rev-parse %s: %w", commit, err)
	}
	full := strings.TrimSpace(string(out))
	cache, err := controlplane.CacheDir()
	if err != nil {
		return OldBinaries{}, err
	}
	base := filepath.Join(cache, "old", full)
	dir := filepath.Join(base, runtime.Version()+"-"+runtime.GOARCH)
	bins := OldBinaries{Commit: full, XDSServer: filepath.Join(dir, "xds-server"), Extproc: filepath.Join(dir, "extproc")}
	if complete(bins) {
		bins.FromCached = true
		fmt.Fprintf(log, "kube-mvp %.12s: using cached binaries in %s\n", full, dir)
		return bins, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return OldBinaries{}, err
	}
	unlock, err := controlplane.LockFile(ctx, dir+".lock")
	if err != nil {
		return OldBinaries{}, err
	}
	defer unlock()
	if complete(bins) { // built by whoever held the lock before us
		bins.FromCached = true
		return bins, nil
	}

	tmp, err := os.MkdirTemp(base, ".build-")
	if err != nil {
		return OldBinaries{}, err
	}
	defer os.RemoveAll(tmp)
	src, outDir := filepath.Join(tmp, "src"), filepath.Join(tmp, "bin")
	for _, d := range []string{src, outDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return OldBinaries{}, err
		}
	}
	start := time.Now()
	fmt.Fprintf(log, "kube-mvp %.12s: building xds-server and extproc...\n", full)
	if err := extract(ctx, root, full, src); err != nil {
		return OldBinaries{}, err
	}
	build := exec.CommandContext(ctx, "go", "build", "-mod=readonly", "-trimpath", "-o", outDir+string(filepath.Separator), "./cmd/xds-server", "./cmd/extproc")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
	var buildOut bytes.Buffer
	build.Stdout, build.Stderr = &buildOut, &buildOut
	if err := build.Run(); err != nil {
		return OldBinaries{}, fmt.Errorf("building kube-mvp %.12s: %w\n%s", full, err, buildOut.String())
	}
	if err := os.Rename(outDir, dir); err != nil {
		return OldBinaries{}, err
	}
	bins.BuildTime = time.Since(start)
	fmt.Fprintf(log, "kube-mvp %.12s: built in %s, cached in %s\n", full, bins.BuildTime.Round(time.Second), dir)
	return bins, nil
}

func complete(b OldBinaries) bool {
	for _, f := range []string{b.XDSServer, b.Extproc} {
		if fi, err := os.Stat(f); err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// extract writes the tree of commit (a full hash) of the repository at root into dst, an
// existing directory (git archive | tar -x).
func extract(ctx context.Context, root, commit, dst string) error {
	var tarball, stderr bytes.Buffer
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	archive.Stdout, archive.Stderr = &tarball, &stderr
	if err := archive.Run(); err != nil {
		return fmt.Errorf("git archive %s: %w\n%s", commit, err, stderr.String())
	}
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dst)
	untar.Stdin, untar.Stderr = &tarball, &stderr
	if err := untar.Run(); err != nil {
		return fmt.Errorf("extracting %s: %w\n%s", commit, err, stderr.String())
	}
	return nil
}
