package dataplane

import (
	"crypto/tls"
	"crypto/x509/pkix"
	"net"
	"os"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// servingSerial is the serial of the certificate the listener presents now.
func (e *env) servingSerial(t *testing.T) string {
	t.Helper()
	conn, err := tls.Dial("tcp", e.dp.ListenerAddr("kube-apiserver"), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the certificate
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestSecretFilesRotate: secrets arrive over SDS as file references only; a renewed
// certificate written to the files is served at the next handshake, and a half-written
// rotation (a key that does not match) keeps the last good pair and counts
// key_rotation_failed, as Envoy does.
func TestSecretFilesRotate(t *testing.T) {
	e := newEnv(t, envOptions{})
	first := e.servingSerial(t)
	if first != e.pki.serving.Cert.SerialNumber.String() {
		t.Fatalf("listener presents serial %s, want the serving certificate's", first)
	}
	renewed := e.pki.servingCA.issue(t, pkix.Name{CommonName: "kube-mvp"}, true, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	// Key first, then certificate: between the two writes the pair does not match.
	write(t, e.secrets.ServingKey, renewed.KeyPEM)
	write(t, e.secrets.ServingCert, renewed.CertPEM)
	testutil.WaitFor(t, t.Context(), 10*time.Second, "the renewed certificate to be served", testutil.Cond(func() bool { return e.servingSerial(t) == renewed.Cert.SerialNumber.String() }))

	// The rotation above may have counted a failure between its two writes: count from here.
	const failed = "sds.kube-mvp-serving-cert.key_rotation_failed"
	before := e.stat(failed)
	write(t, e.secrets.ServingKey, e.pki.proxyClient.KeyPEM)
	testutil.WaitFor(t, t.Context(), 10*time.Second, "key_rotation_failed to be counted", testutil.Cond(func() bool { return e.stat(failed) > before }))
	if got := e.servingSerial(t); got != renewed.Cert.SerialNumber.String() {
		t.Errorf("after a mismatched key the listener presents %s, want the last good %s", got, renewed.Cert.SerialNumber)
	}
	if n := e.dp.NACKs(); len(n) > 0 {
		t.Errorf("file changes are not xDS updates, yet NACKs: %q", n)
	}
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
