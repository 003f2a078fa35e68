package certgen_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-mvp/kube-mvp/internal/certgen"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

var (
	storeNow   = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	storeSpecs = []certgen.Spec{{Role: cptls.RoleXDSServer, DNSNames: []string{"xds.example"}}, {Role: cptls.RoleExtproc}}
	discard    = slog.New(slog.DiscardHandler)
)

// TestKeepSecrets: the first run creates the CA Secret and each role's, labelled; a second
// run at the same time changes nothing; a Secret of the wrong type is left alone.
func TestKeepSecrets(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	opts := certgen.Secrets{Namespace: "kube-mvp", CASecret: "ca", Labels: map[string]string{"team": "cp"},
		Roles: []certgen.RoleSecret{{Role: cptls.RoleXDSServer, Name: "xds"}, {Role: cptls.RoleExtproc, Name: "extproc"}}}
	summary, err := certgen.KeepSecrets(ctx, client, opts, storeSpecs, certgen.DefaultPolicy(), storeNow, discard)
	if err != nil || !strings.Contains(summary, "3 created, 0 updated, 0 unchanged") {
		t.Fatalf("first run: %q, %v", summary, err)
	}
	for name, typ := range map[string]corev1.SecretType{"ca": corev1.SecretTypeOpaque, "xds": corev1.SecretTypeTLS, "extproc": corev1.SecretTypeTLS} {
		s, err := client.CoreV1().Secrets("kube-mvp").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Type != typ || s.Labels[certgen.ManagedByKey] != certgen.ManagedByValue || s.Labels["team"] != "cp" {
			t.Errorf("Secret %s: type %s, labels %v", name, s.Type, s.Labels)
		}
		if typ == corev1.SecretTypeTLS && (len(s.Data[certgen.CertKey]) == 0 || len(s.Data[certgen.KeyKey]) == 0 || len(s.Data[certgen.TrustBundleKey]) == 0) {
			t.Errorf("Secret %s lacks a key: %v", name, s.Data)
		}
	}
	if summary, err := certgen.KeepSecrets(ctx, client, opts, storeSpecs, certgen.DefaultPolicy(), storeNow,
		discard); err != nil || !strings.Contains(summary, "0 change(s)") ||
		!strings.Contains(summary, "3 unchanged") {
		t.Errorf("second run: %q, %v", summary, err)
	}

	opts.Roles[1].Name = "opaque"
	if _, err := client.CoreV1().Secrets("kube-mvp").Create(ctx,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "opaque", Namespace: "kube-mvp"},
			Type: corev1.SecretTypeOpaque}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := certgen.KeepSecrets(ctx, client, opts, storeSpecs, certgen.DefaultPolicy(), storeNow, discard); !errors.Is(err, certgen.ErrBadSecret) {
		t.Errorf("a role Secret of type Opaque: %v, want ErrBadSecret", err)
	}
}

// TestKeepFiles: the first run writes the CA's and each role's files, keys mode 0600; a
// second run changes nothing; a renewal request file is carried out and removed; errors name
// the directory as Files.Name says.
func TestKeepFiles(t *testing.T) {
	dir := t.TempDir()
	files := certgen.Files{Dir: dir, Name: "--out-dir"}
	if summary, err := certgen.KeepFiles(files, storeSpecs, certgen.DefaultPolicy(), storeNow, discard); err != nil || !strings.Contains(summary, "9 written, 0 removed") {
		t.Fatalf("first run: %q, %v", summary, err)
	}
	for path, mode := range map[string]os.FileMode{"ca.key": 0o600, "ca.crt": 0o644, "xds-server/tls.key": 0o600, "extproc/tls.crt": 0o644} {
		fi, err := os.Stat(filepath.Join(dir, path))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v, want %v", path, err, fi.Mode().Perm(), mode)
		}
	}
	if summary, err := certgen.KeepFiles(files, storeSpecs, certgen.DefaultPolicy(), storeNow, discard); err != nil || !strings.Contains(summary, "0 change(s)") {
		t.Errorf("second run: %q, %v", summary, err)
	}
	marker := filepath.Join(dir, "extproc", certgen.RenewFile)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if summary, err := certgen.KeepFiles(files, storeSpecs, certgen.DefaultPolicy(), storeNow, discard); err != nil || !strings.Contains(summary, "1 removed") {
		t.Errorf("renewal request: %q, %v", summary, err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the request file is still there: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "extproc-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := certgen.KeepFiles(certgen.Files{Dir: filepath.Join(dir, "extproc-file"), Name: "--out-dir"},
		storeSpecs, certgen.DefaultPolicy(), storeNow, discard); err == nil ||
		!strings.HasPrefix(err.Error(), "--out-dir: ") {
		t.Errorf("a file as the directory: %v", err)
	}
}
