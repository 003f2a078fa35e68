// Package e2e runs kube-mvp's whole request path against real apiservers of the pinned versions (three):
// client → Envoy → extproc → kube-apiserver, with Envoy configured over ADS by a real
// xds-server process watching the real control plane, and extproc fed by xds-server's table
// stream. Envoy is a process started as the chart starts it (harness.Envoy) and observed only
// through its listener and admin API: the stand-in's binary (test/cmd/envoy-stand-in) in make
// test, your Envoy in make test-envoy ENVOY=... (KUBE_MVP_ENVOY).
package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// livenessWindow is xds-server's --liveness-window here. Apiservers renew their identity
// Lease every 10 s, so a window well above that never flaps, and a stopped server leaves
// the table within it.
const livenessWindow = 20 * time.Second

// binDir holds xds-server and extproc, built once by TestMain from this checkout.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "kube-mvp-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if err := harness.BuildBinaries(context.Background(), dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		binDir = dir
		return m.Run()
	}())
}

// env is one control plane with kube-mvp in front of it.
type env struct {
	t   testing.TB
	cp  *controlplane.ControlPlane
	dir string // short: unix socket paths are limited to 108 bytes
}

func newEnv(t testing.TB, ctx context.Context, servers ...controlplane.ServerSpec) *env {
	t.Helper()
	return newEnvOptions(t, ctx, controlplane.Options{Servers: servers})
}

// newEnvOptions is newEnv for a control plane with opts.
func newEnvOptions(t testing.TB, ctx context.Context, opts controlplane.Options) *env {
	t.Helper()
	cp := controlplane.ForTest(t, ctx, opts)
	return &env{t: t, cp: cp, dir: testutil.TempDirKeptOnFailure(t, "kmvp-")}
}

// startKubeMVP starts a deployment of kube-mvp (see harness.Start); local names the
// apiserver of a sidecar deployment, empty for a front proxy. It is stopped when the test
// ends; its logs are shown if the test failed, and any NACK fails the test.
func (e *env) startKubeMVP(ctx context.Context, name, local string, edit ...func(*harness.Options)) *harness.KubeMVP {
	t := e.t
	t.Helper()
	opts := harness.Options{
		ControlPlane: e.cp, BinDir: binDir, Dir: e.dir, Name: name, LocalAPIServer: local,
		LivenessWindow: livenessWindow,
	}
	for _, f := range edit {
		f(&opts)
	}
	k, err := harness.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r, err := k.Envoy.Rejected(context.Background()); err != nil || len(r) > 0 {
			t.Errorf("Envoy %s rejected our configuration (its admin's update_rejected counters): %v %v", name, r, err)
		}
		if t.Failed() {
			t.Logf("kube-mvp %s:\n%s", name, k.Logs())
		}
		k.Close()
	})
	return k
}

// adminClient talks to one apiserver directly, as cluster admin.
func (e *env) adminClient(s *controlplane.Server) *kubernetes.Clientset {
	c, err := s.Client()
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// through returns a client config for the data plane's listener with the given identity:
// a client certificate (cert non-nil), a bearer token, or neither (anonymous).
func (e *env) through(k *harness.KubeMVP, cert *controlplane.KeyPair, token string) *rest.Config {
	cfg := &rest.Config{
		Host:            k.Endpoint(),
		TLSClientConfig: rest.TLSClientConfig{CAData: e.cp.PKI.ServerCA.CertPEM},
		BearerToken:     token,
		QPS:             -1,
		Burst:           -1,
		Timeout:         30 * time.Second,
	}
	if cert != nil {
		cfg.CertData, cfg.KeyData = cert.CertPEM, cert.KeyPEM
	}
	return cfg
}

// rawClient is an http.Client for the data plane's listener (for requests client-go does not
// make: spoofed headers, upgrades, raw bodies).
func (e *env) rawClient(cert *controlplane.KeyPair) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: e.tlsConfig(cert)}, Timeout: 30 * time.Second}
}

// tlsConfig trusts the apiservers' serving CA (which also serves the data plane's listener)
// and presents cert, if any.
func (e *env) tlsConfig(cert *controlplane.KeyPair) *tls.Config {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.cp.PKI.ServerCA.CertPEM)
	tc := &tls.Config{RootCAs: roots}
	if cert != nil {
		c, err := cert.TLS()
		if err != nil {
			e.t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc
}

// status is the part of a Kubernetes Status the tests look at.
type status struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Status     string `json:"status"`
	Message    string `json:"message"`
	Reason     string `json:"reason"`
	Code       int    `json:"code"`
}

func decodeStatus(t *testing.T, res *http.Response) status {
	t.Helper()
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var s status
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("%s %s: %d, body is not a Status: %v\n%s", res.Request.Method, res.Request.URL, res.StatusCode, err, body)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Status with content-type %q", ct)
	}
	return s
}

// waitFor polls check until it succeeds, failing the test after two minutes.
func waitFor(t *testing.T, ctx context.Context, what string, check func() error) {
	t.Helper()
	testutil.WaitFor(t, ctx, 2*time.Minute, what, check)
}

// serviceAccountToken creates service account name in namespace default and returns a token
// of it.
func serviceAccountToken(t *testing.T, ctx context.Context, admin *kubernetes.Clientset, name string) string {
	t.Helper()
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
