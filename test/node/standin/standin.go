// Package standin builds the container image of kube-mvp's TEST stand-in for Envoy
// (test/cmd/envoy-stand-in, the test data plane behind Envoy's command line), for tests that
// run the Helm chart on a real cluster with image.envoy pointing at it. The image is named
// kube-mvp.test/envoy-stand-in:<hash> so that it can never be taken for Envoy; production
// runs Envoy.
//
// The image is built as tools/images builds the product images: one layer on top of nothing,
// the user 65532 named in /etc/passwd and /etc/group, its home and /tmp. The program is at
// /usr/local/bin/envoy and is the entrypoint, because the chart gives the Envoy container
// only arguments. The test data plane measures regexes with libre2 through cgo, so the
// binary is linked statically (external linker, -static, netgo and osusergo) and runs in the
// empty image.
package standin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kube-mvp/kube-mvp/internal/ociimage"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

const (
	// Repository is the image's name: a registry that does not exist, so that nothing pulls
	// it by mistake (load it into the node's runtime and set imagePullPolicy: Never).
	Repository = "kube-mvp.test/envoy-stand-in"
	// BinaryPath is where the image holds the stand-in, under Envoy's name: the entrypoint.
	BinaryPath = "/usr/local/bin/envoy"
	// Package is the command built into the image.
	Package = "./test/cmd/envoy-stand-in"

	uid = 65532
)

// buildFlags link the stand-in statically: libre2 (C++) and libstdc++ from their .a files,
// the pure-Go resolver and user lookup (no glibc NSS at run time).
var buildFlags = []string{"-trimpath", "-tags", "netgo,osusergo", "-ldflags", `-s -w -linkmode external -extldflags "-static"`}

// Image builds (or takes from the cache) the stand-in's image and returns its reference and
// the path of a `docker load`-able tarball. The cache is keyed by a hash of everything that
// goes into the build: the Go version and architecture, the flags, go.mod and go.sum, every
// file of the module's packages the command imports, and the static libre2. Progress goes to
// log.
func Image(ctx context.Context, log io.Writer) (ref, tarballPath string, err error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", "", err
	}
	key, err := inputsKey(ctx, root)
	if err != nil {
		return "", "", err
	}
	ref = Repository + ":" + key
	cache, err := controlplane.CacheDir()
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	tarballPath = filepath.Join(dir, "envoy-stand-in-"+key+".tar")
	if _, err := os.Stat(tarballPath); err == nil {
		fmt.Fprintf(log, "envoy-stand-in: using cached image %s (%s)\n", ref, tarballPath)
		return ref, tarballPath, nil
	}
	unlock, err := controlplane.LockFile(ctx, tarballPath+".lock")
	if err != nil {
		return "", "", err
	}
	defer unlock()
	if _, err := os.Stat(tarballPath); err == nil {
		return ref, tarballPath, nil
	}

	start := time.Now()
	fmt.Fprintf(log, "envoy-stand-in: building %s (static, cgo)...\n", ref)
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "envoy")
	args := append([]string{"build"}, buildFlags...)
	args = append(args, "-o", bin, Package)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOOS=linux", "GOFLAGS=-mod=readonly")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("building the envoy stand-in: %w\n%s", err, out.String())
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return "", "", err
	}
	img, err := NewImage(b, runtime.GOARCH)
	if err != nil {
		return "", "", err
	}
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return "", "", err
	}
	partial := filepath.Join(tmp, "image.tar")
	if err := tarball.WriteToFile(partial, tag, img); err != nil {
		return "", "", err
	}
	if err := os.Rename(partial, tarballPath); err != nil {
		return "", "", err
	}
	fmt.Fprintf(log, "envoy-stand-in: built %s in %s: %s\n", ref, time.Since(start).Round(time.Second), tarballPath)
	return ref, tarballPath, nil
}

// inputsKey hashes what decides the build's output.
func inputsKey(ctx context.Context, root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%q\n", runtime.Version(), runtime.GOARCH, buildFlags)
	list := exec.CommandContext(ctx, "go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", Package)
	list.Dir = root
	list.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %w", Package, err)
	}
	files := []string{filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum")}
	for _, dir := range strings.Fields(string(out)) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return "", err
		}
		for _, e := range entries {
			if e.Type().IsRegular() && !strings.HasSuffix(e.Name(), "_test.go") {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
	}
	// The C++ library linked in (its package's version changes the binary).
	if libs, _ := filepath.Glob("/usr/lib/*/libre2.a"); len(libs) > 0 {
		files = append(files, libs...)
	}
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(root, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// NewImage is the image of a stand-in binary for arch: no base, one layer.
func NewImage(binary []byte, arch string) (v1.Image, error) {
	return ociimage.New(arch, time.Unix(0, 0), v1.Config{
		User:       fmt.Sprintf("%d:%d", uid, uid),
		Entrypoint: []string{BinaryPath},
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "envoy-stand-in",
			"org.opencontainers.image.description": "kube-mvp's test stand-in for Envoy (test/dataplane); for tests only, not Envoy",
		},
	}, v1.History{CreatedBy: "test/node/standin: " + BinaryPath + " (test stand-in for Envoy), /etc/passwd, /etc/group"},
		ociimage.Nonroot(uid, uid, BinaryPath, binary))
}
