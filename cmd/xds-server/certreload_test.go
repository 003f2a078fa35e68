package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestCertReload: a rotated serving certificate becomes the configuration in use; a
// half-done rotation (new certificate, old key) is refused and the previous pair kept until
// the key follows.
func TestCertReload(t *testing.T) {
	dir := t.TempDir()
	first, err := controlplane.NewPKI(mkdir(t, filepath.Join(dir, "first")))
	if err != nil {
		t.Fatal(err)
	}
	second, err := controlplane.NewPKI(mkdir(t, filepath.Join(dir, "second")))
	if err != nil {
		t.Fatal(err)
	}
	live := mkdir(t, filepath.Join(dir, "live"))
	put := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(live, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	put("tls.crt", first.Serving.CertPEM)
	put("tls.key", first.Serving.KeyPEM)
	raw := map[string]string{"serving-cert": filepath.Join(live, "tls.crt"), "serving-key": filepath.Join(live, "tls.key")}
	cfg, errs := parseEnvoyConfig(raw, nil)
	if errs != nil {
		t.Fatal(errs)
	}
	var logs bytes.Buffer
	r := newCertReloader(raw, cfg, slog.New(slog.NewTextHandler(&logs, nil)))

	if r.check() {
		t.Error("reload reported without any change")
	}
	put("tls.crt", second.Serving.CertPEM) // the key is still the first one
	if r.check() {
		t.Error("a certificate without its key was accepted")
	}
	if !bytes.Equal(r.Config().Secrets.ServingCert, first.Serving.CertPEM) || !strings.Contains(logs.String(), "do not make a valid configuration") {
		t.Errorf("half-done rotation: config not kept or not logged:\n%s", logs.String())
	}
	put("tls.key", second.Serving.KeyPEM)
	if !r.check() {
		t.Fatalf("completed rotation not picked up:\n%s", logs.String())
	}
	if got := r.Config().Secrets; !bytes.Equal(got.ServingCert, second.Serving.CertPEM) || !bytes.Equal(got.ServingKey, second.Serving.KeyPEM) {
		t.Error("the configuration in use is not the rotated pair")
	}
	if r.check() {
		t.Error("the same files reported as changed twice")
	}
}

func mkdir(t *testing.T, dir string) string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
