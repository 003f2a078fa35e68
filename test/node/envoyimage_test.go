package node

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTar(t *testing.T, files map[string]string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := tar.NewWriter(f)
	for name, body := range files {
		if err := w.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestImageArchiveRef: the name `ctr images import` gives an archive's image, for docker save
// and OCI archives; an archive that names none or several is refused.
func TestImageArchiveRef(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  string // "" : an error containing bad
		bad   string
	}{
		{"docker save", map[string]string{"manifest.json": `[{"Config":"c.json","RepoTags":["envoyproxy/envoy:v1.40.0"],"Layers":[]}]`}, "envoyproxy/envoy:v1.40.0", ""},
		{"OCI, containerd's name", map[string]string{"oci-layout": `{}`,
			"index.json": `{"manifests":[{"annotations":{"io.containerd.image.name":"docker.io/envoyproxy/envoy:v1.39.3","org.opencontainers.image.ref.name":"v1.39.3"}}]}`},
			"docker.io/envoyproxy/envoy:v1.39.3", ""},
		{"OCI, a whole ref.name", map[string]string{"index.json": `{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"example.com/envoy:v1.38.1"}}]}`}, "example.com/envoy:v1.38.1", ""},
		{"OCI, a bare tag", map[string]string{"index.json": `{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"v1.38.1"}}]}`}, "", "names 0 images"},
		{"two images", map[string]string{"manifest.json": `[{"RepoTags":["a:1"]},{"RepoTags":["b:1"]}]`}, "", "names 2 images"},
		{"not an image", map[string]string{"README": "hello"}, "", "neither manifest.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ImageArchiveRef(writeTar(t, c.files))
			if c.want != "" {
				if err != nil || got != c.want {
					t.Errorf("got %q, %v; want %q", got, err, c.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("got %q, %v; want an error saying %q", got, err, c.bad)
			}
		})
	}
}
