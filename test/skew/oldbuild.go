// Package skew runs two versions of kube-mvp side by side, as an upgrade does: xds-server,
// extproc and Envoy's configuration of an older commit of this repository beside the
// current ones, against real apiservers (test/controlplane), with the test data plane
// standing in for Envoy.
package skew

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"
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
	root, full, base, err := oldCommit(ctx, commit)
	if err != nil {
		return OldBinaries{}, err
	}
	dir := filepath.Join(base, runtime.Version()+"-"+runtime.GOARCH)
	bins := OldBinaries{Commit: full, XDSServer: filepath.Join(dir, "xds-server"), Extproc: filepath.Join(dir, "extproc")}
	complete := func() bool {
		for _, f := range []string{bins.XDSServer, bins.Extproc} {
			if fi, err := os.Stat(f); err != nil || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	bins.BuildTime, err = buildOnce(ctx, log, "xds-server and extproc", root, full, base, dir, complete, func(src, out string) error {
		if err := goCommand(ctx, src, []string{"CGO_ENABLED=0"}, "build", "-mod=readonly", "-trimpath", "-o", out+string(filepath.Separator), "./cmd/xds-server", "./cmd/extproc"); err != nil {
			return fmt.Errorf("building kube-mvp %.12s: %w", full, err)
		}
		return nil
	})
	if err != nil {
		return OldBinaries{}, err
	}
	bins.FromCached = bins.BuildTime == 0
	return bins, nil
}
