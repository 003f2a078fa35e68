package cptls_test

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kube-mvp/kube-mvp/internal/certgen"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/testutil/cptlstest"
)

// serve starts a gRPC health server behind the control plane's TLS, callable by extproc only.
func serve(t *testing.T, pki *cptlstest.PKI) (addr string, denied chan string) {
	t.Helper()
	creds, err := cptls.Load(pki.Files(cptls.RoleXDSServer), cptls.RoleXDSServer, nil)
	if err != nil {
		t.Fatal(err)
	}
	denied = make(chan string, 16)
	policy := cptls.Policy{"grpc.health.v1.Health": {cptls.RoleExtproc}}
	opts := append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(creds.ServerConfig()))},
		policy.ServerOptions(func(method string, role cptls.Role, err error) { denied <- string(role) + " " + err.Error() })...)
	g := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(g, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis) //nolint:errcheck
	t.Cleanup(g.Stop)
	return lis.Addr().String(), denied
}

func check(addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func clientCreds(t *testing.T, pki *cptlstest.PKI, role cptls.Role) credentials.TransportCredentials {
	t.Helper()
	c, err := cptls.Load(pki.Files(role), role, nil)
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(c.ClientConfig())
}

// TestMutualTLS: only a certificate of the control plane's CA naming an allowed role gets an
// answer; the client accepts only a server certificate of its CA naming the xds-server role.
func TestMutualTLS(t *testing.T) {
	pki := cptlstest.New(t, t.TempDir())
	other := cptlstest.New(t, t.TempDir()) // another control plane: same roles, other CA
	addr, denied := serve(t, pki)

	if err := check(addr, clientCreds(t, pki, cptls.RoleExtproc)); err != nil {
		t.Fatalf("extproc with its certificate: %v", err)
	}

	// Without a certificate the handshake fails; crypto/tls never asks the policy.
	noCert := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the server is not what is tested
	if err := check(addr, noCert); err == nil {
		t.Error("a client without a certificate got an answer")
	}
	if err := check(addr, clientCreds(t, other, cptls.RoleExtproc)); err == nil {
		t.Error("a certificate of another CA got an answer")
	}
	err := check(addr, clientCreds(t, pki, cptls.RoleEnvoyFront))
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a front Envoy's certificate calling an extproc-only service: %v, want PermissionDenied", err)
	}
	select {
	case d := <-denied:
		if !strings.HasPrefix(d, "envoy-front ") {
			t.Errorf("denied callback got %q", d)
		}
	case <-time.After(5 * time.Second):
		t.Error("the refusal was not reported")
	}

	// The client side: a server with another CA's certificate, or with the right CA but a
	// client role's certificate, is refused.
	otherAddr, _ := serve(t, other)
	if err := check(otherAddr, clientCreds(t, pki, cptls.RoleExtproc)); err == nil || !strings.Contains(err.Error(), "not from the control plane's CA") {
		t.Errorf("server of another CA: %v, want a verification error", err)
	}
	if _, err := cptls.Load(cptls.Files{Cert: pki.Files(cptls.RoleEnvoyFront).Cert,
		Key: pki.Files(cptls.RoleEnvoyFront).Key, CA: pki.Files(cptls.RoleXDSServer).CA}, cptls.RoleXDSServer,
		nil); err == nil ||
		!strings.Contains(err.Error(), "incompatible key usage") {
		t.Errorf("an Envoy certificate loaded as xds-server's: %v, want refused", err)
	}
}

// TestRotation: renewed files take effect at the next handshake without a restart; files
// that do not load (a half-written rotation) keep the previous credentials.
func TestRotation(t *testing.T) {
	pki := cptlstest.New(t, t.TempDir())
	addr, _ := serve(t, pki)
	dir := t.TempDir()
	copyDir(t, pki.Dir(cptls.RoleExtproc), dir)
	c, err := cptls.Load(cptls.DirFiles(dir), cptls.RoleExtproc, nil)
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(c.ClientConfig())
	if err := check(addr, creds); err != nil {
		t.Fatal(err)
	}
	first := c.NotAfter()

	// certgen renews the certificate from the same CA (a shorter lifetime forces it now).
	policy := certgen.DefaultPolicy()
	policy.CertLifetime = 30 * 24 * time.Hour
	renewed, _, err := certgen.Renew(time.Now(), pki.State, []certgen.Spec{{Role: cptls.RoleExtproc}}, policy)
	if err != nil {
		t.Fatal(err)
	}
	if err := cptlstest.WriteLeaf(dir, renewed.Leaves[cptls.RoleExtproc]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // files are re-read at most once a second
	if err := check(addr, creds); err != nil {
		t.Fatalf("after renewal: %v", err)
	}
	second := c.NotAfter()
	if second.Equal(first) {
		t.Fatalf("certificate in use expires %v, before renewal %v: not reloaded", second, first)
	}

	// Half-written: a key of another pair. The handshake still works with the last good pair.
	copyFile(t, filepath.Join(dir, "tls.key"), filepath.Join(pki.Dir(cptls.RoleEnvoyFront), "tls.key"))
	time.Sleep(1100 * time.Millisecond)
	if err := check(addr, creds); err != nil {
		t.Errorf("a half-written rotation broke the handshake: %v", err)
	}
	if !c.NotAfter().Equal(second) {
		t.Error("a pair that does not match was taken")
	}

	// Material of another control plane loads (it is consistent) and the server refuses it.
	copyDir(t, cptlstest.New(t, t.TempDir()).Dir(cptls.RoleExtproc), dir)
	time.Sleep(1100 * time.Millisecond)
	if err := check(addr, creds); err == nil {
		t.Error("after the client moved to another CA, the handshake still succeeded")
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	for _, n := range []string{"tls.crt", "tls.key", "ca.crt"} {
		copyFile(t, filepath.Join(to, n), filepath.Join(from, n))
	}
}

func copyFile(t *testing.T, to, from string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
