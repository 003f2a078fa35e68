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

// OldRelease is what an operator had installed from an older commit: its Helm chart and its
// product images (xds-server and extproc), built by that commit's own tools/images.
type OldRelease struct {
	Commit  string // the full hash
	Version string // the images' tag and version stamp
	// Chart is the commit's deploy/kube-mvp.
	Chart string
	// XDSServer and Extproc are the image tarballs (docker save format) for this machine's
	// architecture, to import into a node's containerd.
	XDSServer, Extproc string
	BuildTime          time.Duration // 0 when they came from the cache
	FromCache          bool
}

// EnsureOldRelease returns the chart and images of commit (anything git rev-parse takes) of
// this repository, the images tagged registry/<program>:version, building them first if
// needed: the commit's tree is extracted (git archive) into a temporary directory and its own
// `go run ./tools/images` builds them there (its go.mod and go.sum, -mod=readonly, outside
// any go.work; the Go module proxy provides what the module cache lacks). The result is
// cached under <CacheDir>/old/<commit>/release-<registry>-<version>-<go version>-<arch>/
// (chart/, images/), behind a file lock as EnsureOld's binaries.
func EnsureOldRelease(ctx context.Context, commit, registry, version string, log io.Writer) (OldRelease, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return OldRelease{}, err
	}
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", commit+"^{commit}").Output()
	if err != nil {
		return OldRelease{}, fmt.Errorf("git rev-parse %s: %w", commit, err)
	}
	full := strings.TrimSpace(string(out))
	cache, err := controlplane.CacheDir()
	if err != nil {
		return OldRelease{}, err
	}
	base := filepath.Join(cache, "old", full)
	key := strings.NewReplacer("/", "_", ":", "_").Replace(registry) + "-" + version + "-" + runtime.Version() + "-" + runtime.GOARCH
	dir := filepath.Join(base, "release-"+key)
	rel := OldRelease{
		Commit: full, Version: version, Chart: filepath.Join(dir, "chart"),
		XDSServer: filepath.Join(dir, "images", "xds-server-"+runtime.GOARCH+".tar"),
		Extproc:   filepath.Join(dir, "images", "extproc-"+runtime.GOARCH+".tar"),
	}
	if rel.complete() {
		rel.FromCache = true
		fmt.Fprintf(log, "kube-mvp %.12s: using the cached chart and images in %s\n", full, dir)
		return rel, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return OldRelease{}, err
	}
	unlock, err := controlplane.LockFile(ctx, dir+".lock")
	if err != nil {
		return OldRelease{}, err
	}
	defer unlock()
	if rel.complete() { // built by whoever held the lock before us
		rel.FromCache = true
		return rel, nil
	}

	tmp, err := os.MkdirTemp(base, ".release-")
	if err != nil {
		return OldRelease{}, err
	}
	defer os.RemoveAll(tmp)
	src, result := filepath.Join(tmp, "src"), filepath.Join(tmp, "release")
	for _, d := range []string{src, result} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return OldRelease{}, err
		}
	}
	start := time.Now()
	fmt.Fprintf(log, "kube-mvp %.12s: building the images %s (its tools/images)...\n", full, version)
	if err := extract(ctx, root, full, src); err != nil {
		return OldRelease{}, err
	}
	// The extracted tree has no .git: the commit stamp is given.
	build := exec.CommandContext(ctx, "go", "run", "./tools/images", "-registry", registry, "-arch", runtime.GOARCH,
		"-version", version, "-commit", full[:7], "-out", filepath.Join(result, "images"))
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	var buildOut bytes.Buffer
	build.Stdout, build.Stderr = &buildOut, &buildOut
	if err := build.Run(); err != nil {
		return OldRelease{}, fmt.Errorf("building the images of kube-mvp %.12s: %w\n%s", full, err, buildOut.String())
	}
	if err := os.Rename(filepath.Join(src, "deploy", "kube-mvp"), filepath.Join(result, "chart")); err != nil {
		return OldRelease{}, err
	}
	if err := os.Rename(result, dir); err != nil {
		return OldRelease{}, err
	}
	rel.BuildTime = time.Since(start)
	if !rel.complete() {
		return OldRelease{}, fmt.Errorf("kube-mvp %.12s: tools/images wrote no %s or %s\n%s", full, rel.XDSServer, rel.Extproc, buildOut.String())
	}
	fmt.Fprintf(log, "kube-mvp %.12s: chart and images built in %s, cached in %s\n", full, rel.BuildTime.Round(time.Second), dir)
	return rel, nil
}

func (r OldRelease) complete() bool {
	for _, f := range []string{r.XDSServer, r.Extproc, filepath.Join(r.Chart, "Chart.yaml")} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			return false
		}
	}
	return true
}
