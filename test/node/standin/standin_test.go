package standin

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestImage builds the stand-in's image and checks it: named as a stand-in, the binary at
// /usr/local/bin/envoy as the entrypoint, user 65532; and, as root, that the binary runs in a
// root holding nothing but the image's layer (chroot): it is statically linked.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the stand-in (cgo, static): skipped with -short")
	}
	ctx := testutil.Context(t, 8*time.Minute)
	ref, path, err := Image(ctx, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, "kube-mvp.test/envoy-stand-in:") {
		t.Errorf("reference %s", ref)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if ep := cf.Config.Entrypoint; len(ep) != 1 || ep[0] != "/usr/local/bin/envoy" || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q", ep, cf.Config.Cmd)
	}
	if cf.Config.User != "65532:65532" || cf.OS != "linux" {
		t.Errorf("user %q os %q", cf.Config.User, cf.OS)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	root := t.TempDir()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, os.FileMode(h.Mode)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, want := range []string{"usr/local/bin/envoy", "etc/passwd", "etc/group", "tmp/"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("the layer lacks %s: %q", want, names)
		}
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the chroot check is skipped")
		return
	}
	out, err := exec.CommandContext(ctx, "chroot", root, "/usr/local/bin/envoy", "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "test stand-in for Envoy") {
		t.Errorf("chroot %s /usr/local/bin/envoy --version: %v\n%s", root, err, out)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
