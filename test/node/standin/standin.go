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
	"archive/tar"
	"bytes"
	"compress/gzip"
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
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

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

var (
	passwd = fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)
	group  = fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", uid)
)

// NewImage is the image of a stand-in binary for arch: no base, one layer.
func NewImage(binary []byte, arch string) (v1.Image, error) {
	layer, err := newLayer(binary)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: time.Unix(0, 0).UTC()}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(base, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      created,
		Config: v1.Config{
			User:       fmt.Sprintf("%d:%d", uid, uid),
			Entrypoint: []string{BinaryPath},
			WorkingDir: "/",
			Env:        []string{"PATH=/usr/local/bin"},
			Labels: map[string]string{
				"org.opencontainers.image.title":       "envoy-stand-in",
				"org.opencontainers.image.description": "kube-mvp's test stand-in for Envoy (test/dataplane); for tests only, not Envoy",
			},
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		History:   v1.History{Created: created, CreatedBy: "test/node/standin: " + BinaryPath + " (test stand-in for Envoy), /etc/passwd, /etc/group"},
		MediaType: types.OCILayer,
	})
}

func newLayer(binary []byte) (v1.Layer, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	mod := time.Unix(0, 0).UTC()
	dir := func(name string, mode int64, owner int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: owner, Gid: owner, ModTime: mod, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(b)), ModTime: mod, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	for _, step := range []func() error{
		func() error { return dir("etc", 0o755, 0) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return dir("home", 0o755, 0) },
		func() error { return dir("home/nonroot", 0o700, uid) },
		func() error { return dir("tmp", 0o1777, 0) },
		func() error { return dir("usr", 0o755, 0) },
		func() error { return dir("usr/local", 0o755, 0) },
		func() error { return dir("usr/local/bin", 0o755, 0) },
		func() error { return file(strings.TrimPrefix(BinaryPath, "/"), 0o755, binary) },
		tw.Close,
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	compressed := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
