package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-mvp/kube-mvp/internal/certgen"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

func TestParseCertgen(t *testing.T) {
	cluster := []string{"--kubeconfig", certgenDummyKubeconfig(t), "--namespace", "kube-mvp", "--ca-secret", "kmvp-ca"}
	for _, c := range []struct {
		name  string
		args  []string
		want  []string // substrings, one per reported problem; nil: accepted
		check func(t *testing.T, o certgenOptions)
	}{
		{
			name: "cluster",
			args: append(slices.Clone(cluster), "--secret", "xds-server=kmvp-xds,envoy-front=kmvp-envoy, extproc=kmvp-extproc",
				"--dns-names", "kmvp-xds-server,kmvp-xds-server.kube-mvp.svc", "--labels", "app.kubernetes.io/instance=kmvp,team=cp",
				"--ca-lifetime=730d", "--cert-lifetime", "2160h", "--propagation-delay", "1h"),
			check: func(t *testing.T, o certgenOptions) {
				want := []certgen.RoleSecret{{Role: cptls.RoleXDSServer, Name: "kmvp-xds"}, {Role: cptls.RoleEnvoyFront, Name: "kmvp-envoy"}, {Role: cptls.RoleExtproc, Name: "kmvp-extproc"}}
				if !slices.Equal(o.secrets.Roles, want) || o.secrets.Namespace != "kube-mvp" || o.secrets.CASecret != "kmvp-ca" || o.rest == nil {
					t.Errorf("options %+v", o)
				}
				if len(o.specs) != 3 || o.specs[0].Role != cptls.RoleXDSServer || len(o.specs[0].DNSNames) != 2 || len(o.specs[1].DNSNames) != 0 {
					t.Errorf("specs %+v", o.specs)
				}
				if o.policy != (certgen.Policy{CALifetime: 730 * 24 * time.Hour, CertLifetime: 90 * 24 * time.Hour, PropagationDelay: time.Hour}) {
					t.Errorf("policy %+v", o.policy)
				}
				if o.secrets.Labels["team"] != "cp" || o.secrets.Labels["app.kubernetes.io/instance"] != "kmvp" {
					t.Errorf("labels %v", o.secrets.Labels)
				}
			},
		},
		{
			name: "cluster, clients only, defaults",
			args: append(slices.Clone(cluster), "--secret", "envoy-sidecar=kmvp-envoy"),
			check: func(t *testing.T, o certgenOptions) {
				if o.policy != certgen.DefaultPolicy() || len(o.specs) != 1 {
					t.Errorf("options %+v", o)
				}
			},
		},
		{
			name: "local",
			args: []string{"--out-dir", "/tmp/x", "--dns-names", "localhost"},
			check: func(t *testing.T, o certgenOptions) {
				if o.outDir != "/tmp/x" || len(o.specs) != 4 || o.rest != nil {
					t.Errorf("options %+v", o)
				}
			},
		},
		{
			name: "local, some roles",
			args: []string{"--out-dir", "/tmp/x", "--roles", "extproc,envoy-front"},
			check: func(t *testing.T, o certgenOptions) {
				if len(o.specs) != 2 || o.specs[0].Role != cptls.RoleExtproc {
					t.Errorf("specs %+v", o.specs)
				}
			},
		},
		{name: "nothing", args: nil, want: []string{"--namespace is required", "--ca-secret is required", "--secret ROLE=NAME,... is required"}},
		{
			name: "every problem at once",
			args: []string{"--namespace", "Kube_MVP", "--ca-secret", "ca", "--secret", "xds-server=x,bogus=y,extproc,envoy-front=ca,extproc=Z!,envoy-sidecar=s,envoy-sidecar=t",
				"--labels", "app.kubernetes.io/managed-by=me,novalue,bad key=v,k=in valid", "--ca-lifetime", "ten years", "--cert-lifetime", "0s",
				"--propagation-delay", "-1h", "--roles", "extproc", "--frobnicate", "--kubeconfig"},
			want: []string{
				`unknown flag "--frobnicate"`, "--kubeconfig needs a value",
				`--ca-lifetime "ten years"`, "--cert-lifetime 0s is too short", "--propagation-delay -1h0m0s is negative",
				"--roles is for --out-dir", `--namespace "Kube_MVP"`,
				`unknown role "bogus"`, `"extproc" is not ROLE=SECRET-NAME`, "envoy-front=ca: that Secret is already --ca-secret",
				`"Z!" is not a Secret name`, "role envoy-sidecar is listed twice",
				"managed-by is always kube-mvp-certgen", `"novalue" is not KEY=VALUE`, `"bad key" is not a label key`, `"in valid" is not a label value`,
				"--dns-names is required for the xds-server certificate",
			},
		},
		{
			name: "both modes",
			args: []string{"--out-dir", "d", "--namespace", "ns", "--secret", "extproc=e"},
			want: []string{"--out-dir writes files; --namespace, --secret are for Secrets"},
		},
		{
			name: "local problems",
			args: []string{"--out-dir", "", "--roles", "extproc,extproc,admin", "--dns-names", "a.example"},
			want: []string{"--out-dir needs a directory", "--roles: extproc is listed twice", `--roles: unknown role "admin"`, "--dns-names: only the xds-server certificate"},
		},
		{
			name: "bad DNS names and lifetimes",
			args: []string{"--out-dir", "d", "--dns-names", "ok.example,Not_OK", "--cert-lifetime", "3650d", "--propagation-delay", "5000d"},
			want: []string{"--cert-lifetime 87600h0m0s must be shorter than the CA lifetime", "--propagation-delay 120000h0m0s must be shorter than a third", `--dns-names: "Not_OK" is not a DNS name`},
		},
		{name: "repeated flag", args: []string{"--out-dir", "a", "--out-dir", "b", "--roles", "extproc"}, want: []string{"--out-dir given more than once"}},
		{name: "stray argument", args: []string{"--out-dir", "a", "--roles", "extproc", "now"}, want: []string{`unexpected argument "now"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseCertgen(c.args)
			if c.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				c.check(t, o)
				return
			}
			if err == nil {
				t.Fatalf("accepted: %+v", o)
			}
			msg := err.Error()
			if !strings.Contains(msg, " problem(s) with the command line") {
				t.Errorf("not the shared list format: %s", msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("does not say %q:\n%s", w, msg)
				}
			}
			if n := strings.Count(msg, "\n  - "); n != len(c.want) {
				t.Errorf("%d problems reported, want %d:\n%s", n, len(c.want), msg)
			}
		})
	}
	if _, err := parseCertgen([]string{"--out-dir", "x", "-h"}); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// certgenDummyKubeconfig writes a syntactically valid kubeconfig (nothing is dialled).
func certgenDummyKubeconfig(t *testing.T) string {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "t"}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCertgenAt runs the command at now and returns its exit code and output.
func runCertgenAt(t *testing.T, now time.Time, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runCertgen(context.Background(), args, &stdout, &stderr, func() time.Time { return now })
	return code, stdout.String(), stderr.String()
}

// certgenNoPEM fails if out shows key material.
func certgenNoPEM(t *testing.T, out string) {
	t.Helper()
	if strings.Contains(out, "PRIVATE KEY") || strings.Contains(out, "BEGIN") {
		t.Errorf("output shows PEM material:\n%s", out)
	}
}

// TestCertgenFiles runs local mode: the files appear with the right modes and verify, a second
// run changes nothing, a damaged file is repaired alone, and a year later the certificates are
// renewed.
func TestCertgenFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	now := time.Now()
	args := []string{"--out-dir", dir, "--dns-names", "localhost,xds.example"}
	code, out, errOut := runCertgenAt(t, now, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	certgenNoPEM(t, out+errOut)
	if !strings.Contains(out, "written") || !strings.Contains(errOut, "xds-server certificate created") {
		t.Errorf("output:\n%s%s", out, errOut)
	}
	snapshot := func() map[string]string {
		files := map[string]string{}
		filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			if d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(path)
			info, _ := d.Info()
			rel, _ := filepath.Rel(dir, path)
			files[rel] = info.Mode().Perm().String() + " " + string(b)
			return nil
		})
		return files
	}
	first := snapshot()
	var names []string
	for name, v := range first {
		names = append(names, name)
		wantMode := "-rw-r--r--"
		if strings.HasSuffix(name, ".key") {
			wantMode = "-rw-------"
		}
		if !strings.HasPrefix(v, wantMode+" ") {
			t.Errorf("%s: mode %s, want %s", name, strings.Fields(v)[0], wantMode)
		}
	}
	slices.Sort(names)
	want := []string{"ca-bundle.crt", "ca.crt", "ca.key", "envoy-front/ca.crt", "envoy-front/tls.crt", "envoy-front/tls.key",
		"envoy-sidecar/ca.crt", "envoy-sidecar/tls.crt", "envoy-sidecar/tls.key", "extproc/ca.crt", "extproc/tls.crt", "extproc/tls.key",
		"xds-server/ca.crt", "xds-server/tls.crt", "xds-server/tls.key"}
	if !slices.Equal(names, want) {
		t.Errorf("files %v, want %v", names, want)
	}
	// The files work as cptls reads them: the server's certificate verifies with a client's
	// bundle for the dialled name, and a client's with the server's bundle.
	certgenCheckFiles(t, dir, now)

	code, out, errOut = runCertgenAt(t, now.Add(time.Minute), args...)
	if code != 0 || !strings.Contains(out, "0 change(s)") || !strings.Contains(out, "0 written, 0 removed") {
		t.Errorf("second run: exit %d: %s%s", code, out, errOut)
	}
	if second := snapshot(); !maps.Equal(first, second) {
		t.Error("the second run changed files")
	}

	// A renewal asked for with a file: DIR/ROLE/renew renews that role's certificate,
	// DIR/renew every role's; the file goes and the next run changes nothing.
	for _, c := range []struct {
		marker  string
		renewed []string
	}{
		{filepath.Join("envoy-sidecar", "renew"), []string{"envoy-sidecar"}},
		{"renew", []string{"xds-server", "envoy-front", "envoy-sidecar", "extproc"}},
	} {
		before := snapshot()
		if err := os.WriteFile(filepath.Join(dir, c.marker), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errOut = runCertgenAt(t, now.Add(90*time.Second), args...)
		if code != 0 || strings.Count(errOut, "certificate renewed") != len(c.renewed) || !strings.Contains(errOut, "renewal requested (file "+filepath.Join(dir, c.marker)) {
			t.Errorf("%s: exit %d: %s%s", c.marker, code, out, errOut)
		}
		if _, err := os.Lstat(filepath.Join(dir, c.marker)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after the run (%v)", c.marker, err)
		}
		after := snapshot()
		for name := range before {
			role, file, _ := strings.Cut(name, "/")
			want := slices.Contains(c.renewed, role) && (file == "tls.crt" || file == "tls.key")
			if changed := after[name] != before[name]; changed != want {
				t.Errorf("%s: %s changed %v, want %v", c.marker, name, changed, want)
			}
		}
		code, out, errOut = runCertgenAt(t, now.Add(100*time.Second), args...)
		if code != 0 || !strings.Contains(out, "0 change(s)") || !strings.Contains(out, "0 written, 0 removed") {
			t.Errorf("%s, a second run: exit %d: %s%s", c.marker, code, out, errOut)
		}
		certgenCheckFiles(t, dir, now)
	}
	first = snapshot()

	// Damage: a truncated client key, a missing trust bundle.
	if err := os.WriteFile(filepath.Join(dir, "extproc", "tls.key"), []byte("-----BEGIN PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "envoy-front", "ca.crt")); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCertgenAt(t, now.Add(2*time.Minute), args...)
	if code != 0 || !strings.Contains(errOut, "extproc certificate renewed") || !strings.Contains(errOut, "envoy-front trust bundle updated") {
		t.Errorf("repair: exit %d: %s%s", code, out, errOut)
	}
	repaired := snapshot()
	for name := range first {
		// envoy-front/ca.crt comes back as it was: the same trust bundle.
		changed := repaired[name] != first[name]
		if changed != strings.HasPrefix(name, "extproc/tls.") {
			t.Errorf("%s changed: %v", name, changed)
		}
	}
	certgenCheckFiles(t, dir, now)

	// A DNS name more: only the server certificate is re-issued.
	code, _, errOut = runCertgenAt(t, now.Add(3*time.Minute), "--out-dir", dir, "--dns-names", "localhost,xds.example,xds2.example")
	if code != 0 || !strings.Contains(errOut, "xds-server certificate renewed") || strings.Contains(errOut, "extproc certificate") {
		t.Errorf("new DNS name: exit %d: %s", code, errOut)
	}

	// Ten months later every certificate is due.
	code, _, errOut = runCertgenAt(t, now.Add(300*24*time.Hour), args...)
	if code != 0 || strings.Count(errOut, "certificate renewed") != 4 || !strings.Contains(errOut, "less than 1/3") {
		t.Errorf("ten months later: exit %d: %s", code, errOut)
	}
	certgenCheckFiles(t, dir, now.Add(300*24*time.Hour))

	// Files that cannot be read are an error naming the flag, not overwritten.
	if err := os.Chmod(filepath.Join(dir, "ca.key"), 0); err == nil && os.Getuid() != 0 {
		code, _, errOut = runCertgenAt(t, now, args...)
		if code != 1 || !strings.Contains(errOut, "--out-dir") || !strings.Contains(errOut, "permission denied") {
			t.Errorf("unreadable ca.key: exit %d: %s", code, errOut)
		}
	}
}

// certgenCheckFiles checks the files as a TLS server (xds-server) and clients would use them.
func certgenCheckFiles(t *testing.T, dir string, now time.Time) {
	t.Helper()
	load := func(role string) (*x509.Certificate, *x509.CertPool) {
		kp, err := tls.LoadX509KeyPair(filepath.Join(dir, role, "tls.crt"), filepath.Join(dir, role, "tls.key"))
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, role, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			t.Fatalf("%s/ca.crt holds no certificate", role)
		}
		return kp.Leaf, pool
	}
	server, serverPool := load("xds-server")
	for _, role := range []string{"envoy-front", "envoy-sidecar", "extproc"} {
		client, clientPool := load(role)
		if _, err := server.Verify(x509.VerifyOptions{Roots: clientPool, DNSName: "localhost", CurrentTime: now}); err != nil {
			t.Errorf("%s does not accept xds-server: %v", role, err)
		}
		if _, err := client.Verify(x509.VerifyOptions{Roots: serverPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now}); err != nil {
			t.Errorf("xds-server does not accept %s: %v", role, err)
		}
		if r, err := cptls.RoleOf(client); err != nil || string(r) != role {
			t.Errorf("%s names role %s (%v)", role, r, err)
		}
	}
}

// TestCertgenAgainstRealAPIServer runs `xds-server certgen` against a real kube-apiserver as
// the chart's Job does, with a ServiceAccount that has only the chart's minimal rules (get and
// update on the named Secrets, create on Secrets): the first run creates the Secrets, the
// second changes nothing (same resourceVersions), a renewal asked for with the annotation
// kube-mvp.io/renew is carried out once, a damaged Secret is repaired alone, a Secret
// of the wrong type is refused, a concurrent change is a conflict, and without update the run
// fails saying which permission is missing.
func TestCertgenAgainstRealAPIServer(t *testing.T) {
	ctx := testutil.Context(t, 15*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: []controlplane.ServerSpec{{Name: "cp-a", Version: "v1.37.1"}}})
	srv := cp.Server("cp-a")
	admin, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "kube-mvp"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{"ca": "kmvp-ca", "xds-server": "kmvp-xds-server-tls", "envoy-front": "kmvp-envoy-tls", "extproc": "kmvp-extproc-tls"}
	kubeconfig := certgenSAKubeconfig(t, ctx, cp, admin, ns, "certgen", []string{names["ca"], names["xds-server"], names["envoy-front"], names["extproc"]}, true)
	args := []string{"--kubeconfig", kubeconfig, "--namespace", ns, "--ca-secret", names["ca"],
		"--secret", "xds-server=" + names["xds-server"] + ",envoy-front=" + names["envoy-front"] + ",extproc=" + names["extproc"],
		"--dns-names", "kmvp-xds-server.kube-mvp.svc,kmvp-xds-server.kube-mvp.svc.cluster.local", "--labels", "app.kubernetes.io/instance=kmvp"}
	now := time.Now()

	versions := func() map[string]string {
		v := map[string]string{}
		for k, name := range names {
			s, err := admin.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v[k] = s.ResourceVersion
		}
		return v
	}
	secret := func(name string) *corev1.Secret {
		s, err := admin.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	code, out, errOut := runCertgenAt(t, now, args...)
	if code != 0 || !strings.Contains(out, "4 created, 0 updated, 0 unchanged") {
		t.Fatalf("first run: exit %d: %s%s", code, out, errOut)
	}
	certgenNoPEM(t, out+errOut)
	for role, name := range names {
		s := secret(name)
		if s.Labels["app.kubernetes.io/managed-by"] != "kube-mvp-certgen" || s.Labels["app.kubernetes.io/instance"] != "kmvp" {
			t.Errorf("%s labels %v", name, s.Labels)
		}
		wantType, wantKeys := corev1.SecretTypeTLS, []string{"ca.crt", "tls.crt", "tls.key"}
		if role == "ca" {
			wantType, wantKeys = corev1.SecretTypeOpaque, []string{"ca-bundle.crt", "ca.crt", "ca.key"}
		}
		var keys []string
		for k := range s.Data {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if s.Type != wantType || !slices.Equal(keys, wantKeys) {
			t.Errorf("%s: type %s keys %v, want %s %v", name, s.Type, keys, wantType, wantKeys)
		}
	}
	// The server and a client accept each other with what their Secrets hold.
	xs, ex := secret(names["xds-server"]), secret(names["extproc"])
	if err := certgenVerifyTLS(xs, ex, "kmvp-xds-server.kube-mvp.svc", now); err != nil {
		t.Error(err)
	}
	before := versions()

	code, out, errOut = runCertgenAt(t, now.Add(time.Hour), args...)
	if code != 0 || !strings.Contains(out, "0 created, 0 updated, 4 unchanged") || !strings.Contains(errOut, "nothing due") {
		t.Errorf("second run: exit %d: %s%s", code, out, errOut)
	}
	if after := versions(); !maps.Equal(before, after) {
		t.Errorf("resourceVersions changed: %v -> %v", before, after)
	}

	// A renewal asked for as an operator does (kubectl annotate, a patch): the annotated
	// Secret's certificate alone is re-issued, the annotation goes, and the next run changes
	// nothing. On the CA Secret: every role's certificate, from the same CA.
	annotate := func(name string) {
		t.Helper()
		patch := []byte(`{"metadata":{"annotations":{"kube-mvp.io/renew":"now"}}}`)
		if _, err := admin.CoreV1().Secrets(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	serial := func(s *corev1.Secret) string {
		t.Helper()
		kp, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		return kp.Leaf.SerialNumber.String()
	}
	requestAt := now.Add(time.Hour + 10*time.Minute)
	for _, c := range []struct {
		annotated string   // the Secret annotated
		renewed   []string // the roles renewed
		summary   string
	}{
		{names["envoy-front"], []string{"envoy-front"}, "0 created, 1 updated, 3 unchanged"},
		{names["ca"], []string{"xds-server", "envoy-front", "extproc"}, "0 created, 4 updated, 0 unchanged"},
	} {
		old := map[string]*corev1.Secret{}
		for k, name := range names {
			old[k] = secret(name)
		}
		annotate(c.annotated)
		requestAt = requestAt.Add(time.Minute)
		code, out, errOut := runCertgenAt(t, requestAt, args...)
		if code != 0 || !strings.Contains(out, c.summary) {
			t.Errorf("renewal requested on %s: exit %d: %s%s", c.annotated, code, out, errOut)
		}
		if !strings.Contains(errOut, "renewal requested (annotation kube-mvp.io/renew") || strings.Contains(errOut, "CA rotated") {
			t.Errorf("renewal requested on %s: the log does not say why:\n%s", c.annotated, errOut)
		}
		if n := strings.Count(errOut, "certificate renewed"); n != len(c.renewed) {
			t.Errorf("renewal requested on %s: %d certificates renewed, want %d:\n%s", c.annotated, n, len(c.renewed), errOut)
		}
		for k, name := range names {
			s := secret(name)
			if _, ok := s.Annotations["kube-mvp.io/renew"]; ok {
				t.Errorf("%s still carries the annotation after the run", name)
			}
			if k == "ca" {
				if !maps.EqualFunc(s.Data, old[k].Data, bytes.Equal) {
					t.Error("the CA Secret's data changed: a requested renewal keeps the CA")
				}
				continue
			}
			renewed := slices.Contains(c.renewed, k)
			if changed := !bytes.Equal(s.Data["tls.crt"], old[k].Data["tls.crt"]); changed != renewed {
				t.Errorf("%s: certificate changed %v, want %v", name, changed, renewed)
			}
			if differs := serial(s) != serial(old[k]); differs != renewed {
				t.Errorf("%s: serial differs %v, want %v", name, differs, renewed)
			}
		}
		if err := certgenVerifyTLS(secret(names["xds-server"]), secret(names["envoy-front"]), "kmvp-xds-server.kube-mvp.svc", requestAt); err != nil {
			t.Error(err)
		}
		before := versions()
		requestAt = requestAt.Add(time.Minute)
		code, out, errOut = runCertgenAt(t, requestAt, args...)
		if code != 0 || !strings.Contains(out, "0 created, 0 updated, 4 unchanged") || !strings.Contains(errOut, "nothing due") {
			t.Errorf("after the renewal requested on %s, a second run: exit %d: %s%s", c.annotated, code, out, errOut)
		}
		if after := versions(); !maps.Equal(before, after) {
			t.Errorf("after the renewal requested on %s, a second run changed resourceVersions: %v -> %v", c.annotated, before, after)
		}
	}

	// Damage the envoy Secret's certificate: only it is rewritten.
	env := secret(names["envoy-front"])
	env.Data["tls.crt"] = []byte("garbage")
	if _, err := admin.CoreV1().Secrets(ns).Update(ctx, env, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before = versions()
	code, out, errOut = runCertgenAt(t, now.Add(2*time.Hour), args...)
	if code != 0 || !strings.Contains(out, "0 created, 1 updated, 3 unchanged") || !strings.Contains(errOut, "envoy-front certificate renewed") {
		t.Errorf("repair: exit %d: %s%s", code, out, errOut)
	}
	after := versions()
	for k := range names {
		if changed := before[k] != after[k]; changed != (k == "envoy-front") {
			t.Errorf("%s changed: %v", k, changed)
		}
	}
	if err := certgenVerifyTLS(xs, secret(names["envoy-front"]), "kmvp-xds-server.kube-mvp.svc", now.Add(2*time.Hour)); err != nil {
		t.Error(err)
	}

	// The whole CA Secret deleted: a new CA, every certificate re-issued, the loss said loudly.
	if err := admin.CoreV1().Secrets(ns).Delete(ctx, names["ca"], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCertgenAt(t, now.Add(3*time.Hour), args...)
	if code != 0 || !strings.Contains(out, "1 created, 3 updated") || !strings.Contains(errOut, "OUTAGE possible") {
		t.Errorf("lost CA: exit %d: %s%s", code, out, errOut)
	}

	// A role Secret of the wrong type is refused (exit 2), naming the fix.
	if err := admin.CoreV1().Secrets(ns).Delete(ctx, names["extproc"], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: names["extproc"]}, Type: corev1.SecretTypeOpaque}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCertgenAt(t, now.Add(4*time.Hour), args...)
	if code != 2 || !strings.Contains(errOut, "has type Opaque, want kubernetes.io/tls") || !strings.Contains(errOut, "delete the Secret") {
		t.Errorf("wrong type: exit %d: %s", code, errOut)
	}
	if err := admin.CoreV1().Secrets(ns).Delete(ctx, names["extproc"], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Without update on the Secrets the run fails and says what is missing.
	readOnly := certgenSAKubeconfig(t, ctx, cp, admin, ns, "certgen-no-update", []string{names["ca"], names["xds-server"], names["envoy-front"], names["extproc"]}, false)
	readOnlyArgs := append([]string{"--kubeconfig", readOnly}, args[2:]...) // args[:2] is --kubeconfig FILE
	code, _, errOut = runCertgenAt(t, now.Add(400*24*time.Hour), readOnlyArgs...)
	if code != 1 || !strings.Contains(errOut, "may not update it") {
		t.Errorf("without update: exit %d: %s", code, errOut)
	}
}

// certgenSAKubeconfig makes a ServiceAccount with the chart's certgen rules (create on
// secrets; get and, with update, update on the named ones), and a kubeconfig with its token.
func certgenSAKubeconfig(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, admin *kubernetes.Clientset, ns, sa string, secrets []string, update bool) string {
	t.Helper()
	verbs := []string{"get"}
	if update {
		verbs = append(verbs, "update")
	}
	objs := []func() error{
		func() error {
			_, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: secrets, Verbs: verbs},
			}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: sa},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objs {
		if err := create(); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := cp.Server("cp-a").ServiceAccountToken(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), sa+".kubeconfig")
	if err := cp.Server("cp-a").WriteTokenKubeconfig(path, tok, ns); err != nil {
		t.Fatal(err)
	}
	// RBAC reads new roles from an informer: wait until the token may read a Secret name.
	client, err := kubernetes.NewForConfig(&rest.Config{Host: cp.Server("cp-a").URL(), BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{CAData: cp.PKI.ServerCA.CertPEM}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, ctx, 30*time.Second, "the ServiceAccount's RBAC to take effect", func() error {
		_, err := client.CoreV1().Secrets(ns).Get(ctx, secrets[0], metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	return path
}

// certgenVerifyTLS checks that the server's and client's Secrets accept each other.
func certgenVerifyTLS(server, client *corev1.Secret, name string, now time.Time) error {
	parse := func(s *corev1.Secret) (*x509.Certificate, *x509.CertPool, error) {
		kp, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
		if err != nil {
			return nil, nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.Data["ca.crt"])
		return kp.Leaf, pool, nil
	}
	sc, sp, err := parse(server)
	if err != nil {
		return err
	}
	cc, cpool, err := parse(client)
	if err != nil {
		return err
	}
	if _, err := sc.Verify(x509.VerifyOptions{Roots: cpool, DNSName: name, CurrentTime: now}); err != nil {
		return err
	}
	_, err = cc.Verify(x509.VerifyOptions{Roots: sp, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now})
	return err
}
