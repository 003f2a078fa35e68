package skew

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
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
	root, full, base, err := oldCommit(ctx, commit)
	if err != nil {
		return OldRelease{}, err
	}
	key := strings.NewReplacer("/", "_", ":", "_").Replace(registry) + "-" + version + "-" + runtime.Version() + "-" + runtime.GOARCH
	dir := filepath.Join(base, "release-"+key)
	rel := OldRelease{
		Commit: full, Version: version, Chart: filepath.Join(dir, "chart"),
		XDSServer: filepath.Join(dir, "images", "xds-server-"+runtime.GOARCH+".tar"),
		Extproc:   filepath.Join(dir, "images", "extproc-"+runtime.GOARCH+".tar"),
	}
	rel.BuildTime, err = buildOnce(ctx, log, "chart and images "+version+" (its tools/images)", root, full, base, dir, rel.complete, func(src, out string) error {
		// The extracted tree has no .git: the commit stamp is given.
		if err := goCommand(ctx, src, nil, "run", "./tools/images", "-registry", registry, "-arch", runtime.GOARCH,
			"-version", version, "-commit", full[:7], "-out", filepath.Join(out, "images")); err != nil {
			return fmt.Errorf("building the images of kube-mvp %.12s: %w", full, err)
		}
		return os.Rename(filepath.Join(src, "deploy", "kube-mvp"), filepath.Join(out, "chart"))
	})
	if err != nil {
		return OldRelease{}, err
	}
	if !rel.complete() {
		return OldRelease{}, fmt.Errorf("kube-mvp %.12s: tools/images wrote no %s or %s", full, rel.XDSServer, rel.Extproc)
	}
	rel.FromCache = rel.BuildTime == 0
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
