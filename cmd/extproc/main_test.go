package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/extproc"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/testutil/cptlstest"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

const fixture = "../../internal/extproc/testdata/upgrade.yaml"

// TestBadFlagsAllAtOnce: every problem of a command line is reported in one go, each saying
// what to fix, with exit code 2.
func TestBadFlagsAllAtOnce(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{
		"--source", "http://example.com/table",
		"--listen=localhost",
		"--admin-address", "127.0.0.1:http",
		"--now", "yesterday",
		"--poll-interval", "-1s",
		"--verbose", "yes",
		"stray",
		"--xds-tls-dir",
	}, &stdout, &stderr)
	if code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	for _, want := range []string{
		`--source "http://example.com/table": unknown kind of source; use xds:HOST:PORT or file:FILE`,
		`--listen "localhost": address localhost: missing port in address; want unix:/path or host:port`,
		`--admin-address "127.0.0.1:http": port "http" is not a number`,
		`--now "yesterday" is not an RFC 3339 time, e.g. 2026-11-23T10:00:00Z`,
		`--poll-interval "-1s" is not a non-negative duration`,
		`unknown flag "--verbose"`,
		`unexpected argument "stray"`,
		`--xds-tls-dir needs a value`,
		"8 problem(s)",
		"Run extproc --help for usage.",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q", stdout.String())
	}
}

func TestRequiredFlags(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(nil, io.Discard, &stderr); code != 2 {
		t.Errorf("exit code %d", code)
	}
	for _, want := range []string{"--source is required", "--listen is required", "2 problem(s)"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	stderr.Reset()
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if code := run([]string{"--source", "file:" + missing, "--listen", "unix:", "--source", "file:" + t.TempDir()}, io.Discard, &stderr); code != 2 {
		t.Errorf("exit code %d", code)
	}
	for _, want := range []string{"--source given more than once", "is a directory", "--listen unix: needs a socket path"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

func TestHelp(t *testing.T) {
	var stdout bytes.Buffer
	if code := run([]string{"--help"}, &stdout, io.Discard); code != 0 || !strings.Contains(stdout.String(), "xds:HOST:PORT") {
		t.Errorf("exit %d, usage %q", code, stdout.String())
	}
}

func TestBadSourceFailsFast(t *testing.T) {
	var stderr bytes.Buffer
	dir := shortTempDir(t)
	code := run([]string{"--source", "file:../../internal/extproc/testdata/broken.yaml", "--listen", "unix:" + filepath.Join(dir, "s.sock"), "--admin-address", "127.0.0.1:0"}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "broken.yaml") {
		t.Errorf("exit %d, stderr %s", code, stderr.String())
	}
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "extproc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestServe starts extproc on a unix socket left behind by a previous run, asks it for a
// decision over gRPC, checks the admin endpoints, reloads on SIGHUP and stops gracefully.
func TestServe(t *testing.T) {
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "extproc.sock")
	// A stale socket: bound, closed, file left behind.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	var logs testutil.SyncBuffer
	hup := make(chan os.Signal, 1)
	a, stop := runExtproc(t, &logs, hup, "--source", "file:"+fixture, "--listen", "unix:"+sock, "--admin-address", "127.0.0.1:0", "--now", "2026-11-23T10:00:10Z")

	// A second instance on the same socket must not steal it.
	if _, err := extproc.Listen("unix:" + sock); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("second listener: %v", err)
	}

	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp := decideJobs(t, conn)
	if cluster(resp) != "kube-apiservers-only-cp-a" {
		t.Errorf("response %v", resp)
	}
	rpcCtx := testutil.Context(t, 10*time.Second)
	hc, err := healthpb.NewHealthClient(conn).Check(rpcCtx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health %v %v", hc, err)
	}

	admin := "http://" + a.AdminAddr().String()
	for path, want := range map[string]string{
		"/healthz": "ok",
		"/readyz":  "ok: routing table ",
		"/metrics": `kube_mvp_extproc_decisions_total{group="batch",outcome="subset",resource="jobs",version="v1"} 1`,
	} {
		res, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d %q, want %q", path, res.StatusCode, body, want)
		}
	}

	hup <- syscall.SIGHUP
	testutil.WaitFor(t, t.Context(), 30*time.Second, "the reload on SIGHUP", testutil.Cond(func() bool { return strings.Contains(logs.String(), "reloaded") }))

	stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestXDSSource runs extproc on xds-server's table stream, over the control plane's mutual
// TLS: before the first table it answers 503 and is not ready; it follows the stream, keeps
// the last table while xds-server is away, and picks up the next table when it is back.
func TestXDSSource(t *testing.T) {
	tableAddr := freeAddr(t)
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "extproc.sock")
	pki := cptlstest.New(t, filepath.Join(dir, "pki"))
	tlsDir := pki.Dir(cptls.RoleExtproc)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--now", "2026-11-23T10:00:10Z", "--xds-tls-dir", tlsDir}, "--now applies to a file source only"},
		{nil, "--xds-tls-dir is required: with an xds source"},
		{[]string{"--xds-tls-dir", pki.Dir(cptls.RoleEnvoyFront)}, "names role envoy-front; this component needs a extproc certificate"},
		{[]string{"--xds-tls-dir", tlsDir, "--xds-insecure-plaintext"}, "exclude each other"},
	} {
		args := append([]string{"--source", "xds:" + tableAddr, "--listen", "unix:" + sock}, tc.args...)
		if _, err := parseArgs(args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	a, stop := runExtproc(t, io.Discard, nil, "--source", "xds:"+tableAddr, "--xds-tls-dir", tlsDir, "--listen", "unix:"+sock, "--admin-address", "127.0.0.1:0")
	defer stop()
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := "http://" + a.AdminAddr().String()

	// No xds-server yet.
	if code := immediateStatus(t, decideJobs(t, conn)); code != 503 {
		t.Errorf("before the first table: status %d, want an immediate 503", code)
	}
	if code := httpStatus(t, admin+"/readyz"); code != 503 {
		t.Errorf("/readyz before the first table: %d", code)
	}

	fileTable := func(at time.Time) *plan.Table {
		topo, _, err := extproc.FileSource(fixture, extproc.FileOptions{Now: at}).Load()
		if err != nil {
			t.Fatal(err)
		}
		return topo
	}
	tables := tablestream.NewServer(tablestream.ServerOptions{})
	tables.Publish(fileTable(time.Date(2026, 11, 23, 10, 0, 10, 0, time.UTC)), time.Now())
	stopTables := serveTables(t, tableAddr, tables, pki)
	testutil.WaitFor(t, t.Context(), 30*time.Second,
		"batch/v1 jobs decided to kube-apiservers-only-cp-a from the first table",
		testutil.Cond(func() bool { return cluster(decideJobs(t, conn)) == "kube-apiservers-only-cp-a" }))
	if code := httpStatus(t, admin+"/readyz"); code != 200 {
		t.Errorf("/readyz with a table: %d", code)
	}
	first := a.Server().Version()

	// xds-server goes away: the last table stays in use.
	stopTables()
	time.Sleep(200 * time.Millisecond)
	if got := cluster(decideJobs(t, conn)); got != "kube-apiservers-only-cp-a" || a.Server().Version() != first {
		t.Errorf("after the stream dropped: cluster %q, version %q (was %q)", got, a.Server().Version(), first)
	}

	// It comes back with a different table (every Lease counts as alive): extproc reconnects.
	tables = tablestream.NewServer(tablestream.ServerOptions{})
	tables.Publish(fileTable(time.Time{}), time.Now())
	defer serveTables(t, tableAddr, tables, pki)()
	testutil.WaitFor(t, t.Context(), 30*time.Second, "the table after the reconnect", testutil.Cond(func() bool { return a.Server().Version() != first }))
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return testutil.FreeAddr(t)
}

// serveTables serves the table stream on addr until the returned function is called.
// serveTables serves the table stream as xds-server does: mutual TLS, extproc's role only.
func serveTables(t *testing.T, addr string, tables *tablestream.Server, pki *cptlstest.PKI) (stop func()) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := cptls.Load(pki.Files(cptls.RoleXDSServer), cptls.RoleXDSServer, nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := cptls.Policy{"kubemvp.table.v1.TableService": {cptls.RoleExtproc}}
	g := grpc.NewServer(append(policy.ServerOptions(nil), grpc.Creds(credentials.NewTLS(creds.ServerConfig())))...)
	tablev1.RegisterTableServiceServer(g, tables)
	go g.Serve(l) //nolint:errcheck // ends with Stop
	return g.Stop
}

func decideJobs(t *testing.T, conn *grpc.ClientConn) *extprocv3.ProcessingResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("GET")}, {Key: ":path", RawValue: []byte("/apis/batch/v1/jobs")}, {Key: ":authority", RawValue: []byte("k")},
	}}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	return resp
}

// cluster is where resp sends the request: the serving set it names in the load balancer's
// dynamic metadata, else the cluster it names.
func cluster(resp *extprocv3.ProcessingResponse) string {
	if set := resp.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["kube-mvp-set"].GetStringValue(); set != "" {
		return set
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-kube-mvp-cluster" {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

func immediateStatus(t *testing.T, resp *extprocv3.ProcessingResponse) int {
	return int(resp.GetImmediateResponse().GetStatus().GetCode())
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestProxyCheckFlags: the proxy certificate check's flags go together, each problem saying
// what to give.
func TestProxyCheckFlags(t *testing.T) {
	dir := shortTempDir(t)
	f := writeProxyFiles(t, dir, newCheckPKI(t))
	base := []string{"--source", "file:" + fixture, "--listen", "unix:" + filepath.Join(dir, "s.sock")}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-client-cert", f.Cert, "--peer-ca", f.PeerCA}, "--proxy-client-cert and --proxy-client-key go together"},
		{[]string{"--proxy-client-key", f.Key}, "--proxy-client-cert and --proxy-client-key go together"},
		{[]string{"--proxy-client-cert", f.Cert, "--proxy-client-key", f.Key}, "--proxy-client-cert needs --peer-ca"},
		{[]string{"--peer-ca", f.PeerCA}, "--peer-ca applies only with --proxy-client-cert and --proxy-client-key"},
		{[]string{"--upstream-server-name", "apiserver.example.com"}, "--upstream-server-name applies only with --proxy-client-cert"},
		{[]string{"--proxy-client-cert", f.Cert, "--proxy-client-key", f.Key, "--peer-ca", f.PeerCA,
			"--upstream-server-name", "Kubernetes:443"},
			`--upstream-server-name "Kubernetes:443" is not a lower-case DNS name`},
		{[]string{"--proxy-client-cert", f.Cert, "--proxy-client-key", f.PeerCA, "--peer-ca", f.PeerCA}, "--proxy-client-cert, --proxy-client-key, --peer-ca: proxy client certificate " + f.Cert},
		{[]string{"--proxy-client-cert", f.Cert, "--proxy-client-key", f.Key, "--peer-ca", filepath.Join(dir,
			"nope")}, "--proxy-client-cert, --proxy-client-key, --peer-ca: peer CA: open " + filepath.Join(dir, "nope")},
	} {
		if _, err := parseArgs(append(base, c.args...)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	cfg, err := parseArgs(append(base, "--proxy-client-cert", f.Cert, "--proxy-client-key", f.Key, "--peer-ca", f.PeerCA))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ProxyCheck == nil || *cfg.ProxyCheck != f {
		t.Errorf("proxy check files %+v, want %+v", cfg.ProxyCheck, f)
	}
	if cfg, err := parseArgs(base); err != nil || cfg.ProxyCheck != nil {
		t.Errorf("without the flags: %v, check %+v", err, cfg.ProxyCheck)
	}
}

// checkPKI is the certificates of the proxy certificate check.
type checkPKI struct {
	servingCA, frontProxyCA *testutil.CA
	serving                 tls.Certificate
	proxy                   testutil.Leaf
}

func newCheckPKI(t *testing.T) *checkPKI {
	t.Helper()
	p := &checkPKI{}
	var err error
	if p.servingCA, err = testutil.NewCA("serving-ca"); err != nil {
		t.Fatal(err)
	}
	if p.frontProxyCA, err = testutil.NewCA("front-proxy-ca"); err != nil {
		t.Fatal(err)
	}
	leaf, err := p.servingCA.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"kubernetes.default.svc"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.serving, err = tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM); err != nil {
		t.Fatal(err)
	}
	if p.proxy, err = p.frontProxyCA.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeProxyFiles(t *testing.T, dir string, p *checkPKI) proxycert.Files {
	t.Helper()
	f := proxycert.Files{Cert: filepath.Join(dir, "proxy-client.crt"), Key: filepath.Join(dir, "proxy-client.key"), PeerCA: filepath.Join(dir, "peer-ca.crt"), ServerName: proxycert.DefaultServerName}
	for path, b := range map[string][]byte{f.Cert: p.proxy.CertPEM, f.Key: p.proxy.KeyPEM, f.PeerCA: p.servingCA.CertPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// fakeAPIServer answers a SelfSubjectReview as an apiserver whose
// --requestheader-allowed-names are allowed: as the X-Remote-User of a front proxy it
// accepts, 401 otherwise.
func fakeAPIServer(t *testing.T, p *checkPKI, allowed string) string {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(p.frontProxyCA.Cert)
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		certs := r.TLS.PeerCertificates
		if len(certs) == 0 || certs[0].Subject.CommonName != allowed || r.URL.Path != proxycert.ReviewPath {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"kind":"SelfSubjectReview","status":{"userInfo":{"username":%q}}}`, r.Header.Get("X-Remote-User"))
	}))
	s.TLS = &tls.Config{Certificates: []tls.Certificate{p.serving}, ClientAuth: tls.RequestClientCert}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

// TestProxyCertificateCheck: with the proxy certificate's flags, /readyz lists an apiserver
// that refuses the certificate as a warning while another accepts it, and fails, naming
// each and what to fix, once every apiserver refuses it; /metrics has the gauge.
func TestProxyCertificateCheck(t *testing.T) {
	dir := shortTempDir(t)
	p := newCheckPKI(t)
	f := writeProxyFiles(t, dir, p)
	accepting, refusing := fakeAPIServer(t, p, "front-proxy-client"), fakeAPIServer(t, p, "someone-else")
	orig, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	table := filepath.Join(dir, "table.yaml")
	writeTable := func(a, b string) {
		s := strings.NewReplacer("10.0.0.1:6443", a, "10.0.0.2:6443", b).Replace(string(orig))
		if err := os.WriteFile(table, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeTable(accepting, refusing)
	var logs testutil.SyncBuffer
	hup := make(chan os.Signal, 1)
	a, stop := runExtproc(t, &logs, hup, "--source", "file:"+table, "--listen", "unix:"+filepath.Join(dir, "s.sock"), "--admin-address", "127.0.0.1:0",
		"--now", "2026-11-23T10:00:10Z", "--proxy-client-cert", f.Cert, "--proxy-client-key", f.Key, "--peer-ca", f.PeerCA)
	defer stop()
	admin := "http://" + a.AdminAddr().String()
	get := func(path string) (int, string) {
		res, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	refusedB := "  - apiserver-imkgstwjs6opnbwk2ixluu6fiq (hostname cp-b, address " + refusing +
		`): does not accept the proxy certificate as a front proxy: add its CN ` +
		`"front-proxy-client" to --requestheader-allowed-names and its issuer's CA ` +
		`(CN=front-proxy-ca) to --requestheader-client-ca-file`
	var code int
	var body string
	testutil.WaitFor(t, t.Context(), 30*time.Second, "/readyz warning about cp-b", testutil.Cond(func() bool {
		code, body = get("/readyz")
		return strings.Contains(body, "warning")
	}))
	if code != 200 || !strings.HasPrefix(body, "ok: routing table ") || !strings.Contains(body, "warning: 1 of 2 apiservers that answered refuse kube-mvp's proxy certificate") ||
		!strings.Contains(body, refusedB) || !strings.Contains(body, "accepted by: cp-a\n") {
		t.Errorf("/readyz: %d\n%s", code, body)
	}
	if _, metrics := get("/metrics"); !strings.Contains(metrics, `kube_mvp_extproc_proxy_certificate_accepted{apiserver="apiserver-tqsyvnc7rs47fayzipsuqpfg4m"} 1`) ||
		!strings.Contains(metrics, `kube_mvp_extproc_proxy_certificate_accepted{apiserver="apiserver-imkgstwjs6opnbwk2ixluu6fiq"} 0`) ||
		!strings.Contains(metrics,
			fmt.Sprintf(`kube_mvp_certificate_expiry_timestamp_seconds{certificate="proxy-client",role="extproc"} %s`+
				"\n", strconv.FormatFloat(float64(p.proxy.Cert.NotAfter.Unix()), 'g', -1, 64))) {
		t.Errorf("/metrics lacks the gauges:\n%s", metrics)
	}

	// cp-a moves to an apiserver that refuses the certificate too: not ready.
	refusingToo := fakeAPIServer(t, p, "someone-else") // one address is one host
	writeTable(refusingToo, refusing)
	hup <- syscall.SIGHUP
	// Not ready as soon as cp-b's refusal is the only answer; wait for cp-a's at its new address.
	testutil.WaitFor(t, t.Context(), 30*time.Second, "/readyz failing with both answers", testutil.Cond(func() bool {
		code, body = get("/readyz")
		return code == 503 && strings.Contains(body, "answered (2)")
	}))
	for _, want := range []string{
		"every apiserver that answered (2) refuses kube-mvp's proxy certificate",
		"  - apiserver-tqsyvnc7rs47fayzipsuqpfg4m (hostname cp-a, address " + refusingToo + "): does not accept the proxy certificate as a front proxy",
		refusedB,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz lacks %q:\n%s", want, body)
		}
	}
	if n := strings.Count(logs.String(), "apiserver refuses the proxy certificate"); n != 2 {
		t.Errorf("%d refusals logged, want one per apiserver:\n%s", n, logs.String())
	}
}

// runExtproc starts extproc with args, logging to log and reloading on hup (may be nil);
// stop ends it and checks that it ended cleanly.
func runExtproc(t *testing.T, log io.Writer, hup chan os.Signal, args ...string) (a *extproc.Process, stop func()) {
	t.Helper()
	cfg, err := parseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	a, err = extproc.Start(cfg.Config, slog.New(slog.NewTextHandler(log, nil)), hup)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- a.Wait(ctx) }()
	return a, func() {
		cancel()
		if err := <-waited; err != nil {
			t.Errorf("wait: %v", err)
		}
	}
}

// TestStreamLimitFlags: a stream bound that cannot work stops start-up, saying what to give.
func TestStreamLimitFlags(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"--source", "file:" + fixture, "--listen", "127.0.0.1:0",
		"--max-streams", "0", "--max-streams-per-connection", "lots", "--first-message-timeout", "10ms"}, io.Discard, &stderr)
	if code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	for _, want := range []string{
		`--max-streams "0" is not a whole number from 1 to 2147483647`,
		`--max-streams-per-connection "lots" is not a whole number from 1 to 2147483647`,
		`--first-message-timeout "10ms" is not a duration of at least 100ms, e.g. 5s`,
		"3 problem(s)",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// TestStreamLimits: --max-streams reaches the ext_proc server, and past
// --max-streams-per-connection a stream waits for a place on its connection (the client
// honours HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS) while another connection is served.
func TestStreamLimits(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "extproc.sock")
	a, stop := runExtproc(t, io.Discard, nil, "--source", "file:"+fixture, "--listen", "unix:"+sock, "--admin-address", "127.0.0.1:0",
		"--now", "2026-11-23T10:00:10Z", "--max-streams", "100", "--max-streams-per-connection", "2", "--first-message-timeout", "1h")
	defer stop()
	metric := func(name string) string {
		res, err := http.Get("http://" + a.AdminAddr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		for line := range strings.Lines(string(body)) {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	if got := metric("kube_mvp_extproc_streams_limit"); got != "100" {
		t.Errorf("kube_mvp_extproc_streams_limit %q, want 100 (--max-streams)", got)
	}

	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	// What the server announces on a connection.
	raw, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a read past it fails the test
	if _, err := io.WriteString(raw, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(raw, raw)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != 2 {
				t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %v (sent: %v), want 2 (--max-streams-per-connection)", v, ok)
			}
			break
		}
	}

	ctx := testutil.Context(t, 30*time.Second)
	idleCtx, endIdle := context.WithCancel(ctx)
	defer endIdle() // before stop, which would wait for it
	first := extprocv3.NewExternalProcessorClient(dial())
	var open []extprocv3.ExternalProcessor_ProcessClient
	for range 2 {
		s, err := first.Process(idleCtx)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, s)
	}
	testutil.WaitFor(t, ctx, 10*time.Second, "2 open streams", testutil.Cond(func() bool { return metric("kube_mvp_extproc_streams_open") == "2" }))

	third := make(chan error, 1)
	go func() {
		s, err := first.Process(ctx) // waits for a place on the connection
		if err == nil {
			err = s.Send(jobsRequest())
		}
		if err == nil {
			_, err = s.Recv()
		}
		third <- err
	}()
	if resp := decideJobs(t, dial()); cluster(resp) != "kube-apiservers-only-cp-a" {
		t.Errorf("another connection: %v", resp)
	}
	select {
	case err := <-third:
		t.Fatalf("a third stream on a connection limited to 2 was served while both were open: %v", err)
	default:
	}
	// One of the two ends (served), and the third gets its place.
	if err := open[0].Send(jobsRequest()); err != nil {
		t.Fatal(err)
	}
	if _, err := open[0].Recv(); err != nil {
		t.Fatal(err)
	}
	if err := <-third; err != nil {
		t.Fatalf("third stream: %v", err)
	}
}

func jobsRequest() *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("GET")}, {Key: ":path", RawValue: []byte("/apis/batch/v1/jobs")}, {Key: ":authority", RawValue: []byte("k")},
	}}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}
}
