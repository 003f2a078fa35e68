package skew

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// oldCommit resolves commit (anything git rev-parse takes) of this repository: the
// repository's root, the full hash, and the commit's cache directory, <CacheDir>/old/<hash>.
func oldCommit(ctx context.Context, commit string) (root, full, base string, err error) {
	root, err = controlplane.RepoRoot()
	if err != nil {
		return "", "", "", err
	}
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", commit+"^{commit}").Output()
	if err != nil {
		return "", "", "", fmt.Errorf("git rev-parse %s: %w", commit, err)
	}
	full = strings.TrimSpace(string(out))
	cache, err := controlplane.CacheDir()
	if err != nil {
		return "", "", "", err
	}
	return root, full, filepath.Join(cache, "old", full), nil
}

// buildOnce makes dir, below base, with build unless complete says it is there already,
// before or after taking dir's file lock (another test package may be building it). build
// gets src, the tree of commit full of the repository at root (git archive), and out, an
// empty directory that becomes dir when build succeeds; both are in a temporary directory
// removed after. It returns how long the build took, 0 when dir was complete, and says which
// on log, naming what it makes.
func buildOnce(ctx context.Context, log io.Writer, what, root, full, base, dir string, complete func() bool, build func(src, out string) error) (time.Duration, error) {
	took, err := buildLocked(ctx, log, what, root, full, base, dir, complete, build)
	switch {
	case err != nil:
		return 0, err
	case took == 0:
		fmt.Fprintf(log, "kube-mvp %.12s: using the cached %s in %s\n", full, what, dir)
	default:
		fmt.Fprintf(log, "kube-mvp %.12s: %s built in %s, cached in %s\n", full, what, took.Round(time.Second), dir)
	}
	return took, nil
}

func buildLocked(ctx context.Context, log io.Writer, what, root, full, base, dir string, complete func() bool, build func(src, out string) error) (time.Duration, error) {
	if complete() {
		return 0, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return 0, err
	}
	unlock, err := controlplane.LockFile(ctx, dir+".lock")
	if err != nil {
		return 0, err
	}
	defer unlock()
	if complete() { // built by whoever held the lock before us
		return 0, nil
	}
	tmp, err := os.MkdirTemp(base, ".build-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	src, out := filepath.Join(tmp, "src"), filepath.Join(tmp, "out")
	for _, d := range []string{src, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	fmt.Fprintf(log, "kube-mvp %.12s: building %s...\n", full, what)
	if err := extract(ctx, root, full, src); err != nil {
		return 0, err
	}
	if err := build(src, out); err != nil {
		return 0, err
	}
	if err := os.Rename(out, dir); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// goCommand runs go with args in dir, outside any go.work and with -mod=readonly, plus env;
// its output comes with the error.
func goCommand(ctx context.Context, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w\n%s", err, out.String())
	}
	return nil
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
