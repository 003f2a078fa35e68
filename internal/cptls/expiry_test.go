package cptls_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/testutil/cptlstest"
)

// TestExpiryCollector: one series per certificate known now; a file that stops parsing
// keeps its last good expiry.
func TestExpiryCollector(t *testing.T) {
	pki := cptlstest.New(t, t.TempDir())
	files := pki.Files(cptls.RoleExtproc)
	creds, err := cptls.Load(files, cptls.RoleExtproc, nil)
	if err != nil {
		t.Fatal(err)
	}
	proxy := filepath.Join(t.TempDir(), "proxy.crt")
	c := cptls.NewExpiryCollector(
		cptls.Expiry{Certificate: cptls.CertificateControlPlane, Role: cptls.RoleExtproc, NotAfter: creds.NotAfterOf()},
		cptls.Expiry{Certificate: cptls.CertificateProxyClient, Role: cptls.RoleExtproc, NotAfter: cptls.FileNotAfter(proxy)},
		cptls.Expiry{Certificate: cptls.CertificateControlPlane, Role: cptls.RoleEnvoyFront, NotAfter: func() (time.Time, bool) { return time.Time{}, false }},
	)
	if n := testutil.CollectAndCount(c, cptls.ExpiryMetric); n != 1 {
		t.Errorf("%d series with no proxy certificate file and no Envoy, want 1", n)
	}
	b, err := os.ReadFile(pki.Files(cptls.RoleEnvoySidecar).Cert)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(proxy, b, 0o600); err != nil {
		t.Fatal(err)
	}
	sidecar, err := cptls.Load(pki.Files(cptls.RoleEnvoySidecar), cptls.RoleEnvoySidecar, nil)
	if err != nil {
		t.Fatal(err)
	}
	notAfter := sidecar.NotAfter()
	want := `
# HELP kube_mvp_certificate_expiry_timestamp_seconds Unix time at which a certificate expires, by certificate ` +
		`(control-plane: a role's certificate of the control plane's own CA; proxy-client: the proxy certificate) ` +
		`and role (its holder). Alert on (value - time()) / 86400 < 14.
# TYPE kube_mvp_certificate_expiry_timestamp_seconds gauge
kube_mvp_certificate_expiry_timestamp_seconds{certificate="control-plane",role="extproc"} ` + unix(creds.NotAfter()) + `
kube_mvp_certificate_expiry_timestamp_seconds{certificate="proxy-client",role="extproc"} ` + unix(notAfter) + `
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), cptls.ExpiryMetric); err != nil {
		t.Error(err)
	}
	if err := os.WriteFile(proxy, []byte("being replaced"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), cptls.ExpiryMetric); err != nil {
		t.Errorf("after the file broke: %v", err)
	}
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
