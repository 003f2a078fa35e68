package e2e

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/dataplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// anonymousOnlyHealthConfig is a structured authentication configuration that lets anonymous
// requests through on the health paths only, as a hardened cluster configures it.
const anonymousOnlyHealthConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
anonymous:
  enabled: true
  conditions:
  - path: /livez
  - path: /readyz
  - path: /healthz
`

// TestAnonymousAuthSettings: whatever an apiserver's anonymous policy (on, --anonymous-auth=
// false, or allowed only on the health paths by --authentication-config), every credential
// combination gets through kube-mvp the status and identity it gets from the apiserver
// directly. kube-mvp's proxy certificate must never turn a request the apiserver would
// refuse (401) into an anonymous one it serves (200), and a cluster with anonymous off must
// still work through kube-mvp (its health checks do not rely on anonymous).
func TestAnonymousAuthSettings(t *testing.T) {
	settings := []struct {
		name string
		args func(dir string) ([]string, error)
		// anonymousAPI: anonymous requests are authenticated on API paths; anonymousHealth:
		// on /readyz.
		anonymousAPI, anonymousHealth bool
	}{
		{"anonymous on", func(string) ([]string, error) { return nil, nil }, true, true},
		{"anonymous-auth=false", func(string) ([]string, error) { return []string{"--anonymous-auth=false"}, nil }, false, false},
		{"anonymous only on health paths", func(dir string) ([]string, error) {
			path := filepath.Join(dir, "authentication-config.yaml")
			return []string{"--authentication-config=" + path}, os.WriteFile(path, []byte(anonymousOnlyHealthConfig), 0o600)
		}, false, true},
	}
	for _, s := range settings {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := testutil.Context(t, 8*time.Minute)
			args, err := s.args(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			// With a UID header (RemoteRequestHeaderUID, on by default), an apiserver takes
			// the UID of a client certificate's user from kube-mvp too.
			args = append(args, "--requestheader-uid-headers=X-Remote-Uid")
			e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1", Args: args})
			k := e.startKubeMVP(ctx, "front", "")
			t.Logf("control plane and kube-mvp up in %s", time.Since(start).Round(100*time.Millisecond))
			anonymousScenarios(t, ctx, e, k, s.anonymousAPI, s.anonymousHealth)
		})
	}
}

// anonymousScenarios compares, for each credential combination and request, the answer
// through k with the answer of the apiserver directly.
func anonymousScenarios(t *testing.T, ctx context.Context, e *env, k *harness.KubeMVP, anonymousAPI, anonymousHealth bool) {
	server := e.cp.Server("cp-a")
	admin := e.adminClient(server)

	// Health checks reach the apiserver whatever its anonymous policy: every host of every
	// health-checked cluster passes.
	waitFor(t, ctx, "every apiserver host healthy in the data plane", func() error { return allHostsHealthy(ctx, k) })
	// The cluster works through kube-mvp: a client-certificate `kubectl get ns`.
	nss, err := kubernetes.NewForConfigOrDie(e.through(k, &e.cp.PKI.Admin, "")).CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing namespaces through kube-mvp with the admin certificate: %v", err)
	}
	if len(nss.Items) == 0 {
		t.Fatal("listing namespaces through kube-mvp: none")
	}

	// What anonymous may do once authenticated: list ConfigMaps in kube-system, and what
	// kubeadm grants for `kubeadm join`'s discovery, get kube-public/cluster-info.
	setupAnonymousRBAC(t, ctx, admin)

	alice, err := e.cp.PKI.ClientCert("alice", "developers")
	if err != nil {
		t.Fatal(err)
	}
	// The x509 authenticator ignores a certificate without a CommonName, but the front-proxy
	// (requestheader) authenticator, which every apiserver behind kube-mvp has, fails on a
	// certificate its CA did not sign: alone such a certificate is refused (401, never
	// anonymous); with a token, the token decides.
	noCN, err := e.cp.PKI.ClientCA.Issue(pkix.Name{Organization: []string{"no-name"}}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Kubernetes reads a user UID from the subject attribute 1.3.6.1.4.1.57683.2
	// (k8s.io/apimachinery/pkg/apis/asn1.X509UID; AllowParsingUserUIDFromCertAuth, on by
	// default) and refuses a certificate with two or an empty one; the LDAP UID attribute
	// (0.9.2342.19200300.100.1.1) means nothing to it.
	withUIDs := func(oid asn1.ObjectIdentifier, uids ...string) controlplane.KeyPair {
		name := pkix.Name{CommonName: "alice", Organization: []string{"developers"}}
		for _, u := range uids {
			name.ExtraNames = append(name.ExtraNames, pkix.AttributeTypeAndValue{Type: oid, Value: u})
		}
		kp, err := e.cp.PKI.ClientCA.Issue(name, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	kubernetesUID := asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}
	ldapUID := asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 1}
	oneUID, twoUIDs := withUIDs(kubernetesUID, "alice-uid"), withUIDs(kubernetesUID, "uid-1", "uid-2")
	ldapUIDCert, twoLDAPUIDs := withUIDs(ldapUID, "alice-ldap-uid"), withUIDs(ldapUID, "uid-1", "uid-2")
	const bob = "system:serviceaccount:default:bob"
	validToken := "Bearer " + serviceAccountToken(t, ctx, admin, "bob")
	const invalidToken = "Bearer not-a-token-anybody-issued"

	spoof := http.Header{"X-Remote-User": {"system:admin"}, "X-Remote-Group": {"system:masters"}, "X-Kube-Mvp-Identity": {"front-proxy"}}
	with := func(h http.Header, kv ...string) http.Header {
		out := h.Clone()
		if out == nil {
			out = http.Header{}
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = []string{kv[i+1]} // verbatim: an empty value is sent as such
		}
		return out
	}
	type kind int
	const (
		anonymous     kind = iota // the apiserver treats it as having no credentials
		refused                   // 401 whatever the policy
		authenticated             // as user
	)
	creds := []struct {
		name    string
		cert    *controlplane.KeyPair
		headers http.Header
		kind    kind
		user    string
	}{
		{"no credentials", nil, nil, anonymous, ""},
		{"empty Authorization header", nil, with(nil, "Authorization", ""), anonymous, ""},
		{"Basic auth", nil, with(nil, "Authorization", "Basic dXNlcjpwYXNz"), anonymous, ""},
		{"X-Remote-User spoof, no credentials", nil, spoof, anonymous, ""},
		{"client certificate without CN", &noCN, nil, refused, ""},
		{"invalid bearer token", nil, with(nil, "Authorization", invalidToken), refused, ""},
		{"valid bearer token", nil, with(nil, "Authorization", validToken), authenticated, bob},
		{"valid bearer token, X-Remote-User spoof", nil, with(spoof, "Authorization", validToken), authenticated, bob},
		{"client certificate", &alice, nil, authenticated, "alice"},
		{"client certificate, X-Remote-User spoof", &alice, spoof, authenticated, "alice"},
		{"client certificate and valid token", &alice, with(nil, "Authorization", validToken), authenticated, "alice"},
		{"client certificate and invalid token", &alice, with(nil, "Authorization", invalidToken), authenticated, "alice"},
		{"client certificate without CN and valid token", &noCN, with(nil, "Authorization", validToken), authenticated, bob},
		{"client certificate with a Kubernetes UID", &oneUID, nil, authenticated, "alice"},
		{"client certificate with two Kubernetes UIDs", &twoUIDs, nil, refused, ""},
		{"client certificate with an LDAP UID", &ldapUIDCert, nil, authenticated, "alice"},
		{"client certificate with two LDAP UIDs", &twoLDAPUIDs, nil, authenticated, "alice"},
	}

	type request struct {
		name, method, path, body string
		// anonymousCode is what an anonymous request must get directly when anonymous is
		// authenticated on the path (else 401).
		anonymousCode int
		health        bool
	}
	requests := []request{
		{"SelfSubjectReview", "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
			`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`, http.StatusForbidden, false},
		{"list kube-system configmaps", "GET", "/api/v1/namespaces/kube-system/configmaps", "", http.StatusOK, false},
		{"get kube-public/cluster-info", "GET", "/api/v1/namespaces/kube-public/configmaps/cluster-info", "", http.StatusOK, false},
		{"readyz", "GET", "/readyz", "", http.StatusOK, true},
	}

	direct := server.URL()
	for _, c := range creds {
		t.Run(c.name, func(t *testing.T) {
			hc := e.rawClient(c.cert)
			defer hc.CloseIdleConnections()
			for _, r := range requests {
				do := func(base string) answer {
					t.Helper()
					var body io.Reader
					if r.body != "" {
						body = strings.NewReader(r.body)
					}
					req, err := http.NewRequestWithContext(ctx, r.method, base+r.path, body)
					if err != nil {
						t.Fatal(err)
					}
					if r.body != "" {
						req.Header.Set("Content-Type", "application/json")
					}
					for h, v := range c.headers {
						req.Header[h] = v
					}
					return observe(t, hc, req)
				}
				want := do(direct)
				// Sanity: the apiserver itself answers as the setting says, else the
				// comparison proves nothing.
				switch c.kind {
				case anonymous:
					code := http.StatusUnauthorized
					if (r.health && anonymousHealth) || (!r.health && anonymousAPI) {
						code = r.anonymousCode
					}
					if want.code != code || (code == http.StatusForbidden && !strings.Contains(want.text, `"system:anonymous"`)) {
						t.Fatalf("%s directly: %s; want %d as system:anonymous", r.name, want, code)
					}
				case refused:
					if want.code != http.StatusUnauthorized {
						t.Fatalf("%s directly: %s; want 401", r.name, want)
					}
				case authenticated:
					if r.name == "SelfSubjectReview" && (want.code != http.StatusCreated || !strings.Contains(want.text, `"username":"`+c.user+`"`)) {
						t.Fatalf("%s directly: %s; want 201 naming %s", r.name, want, c.user)
					}
				}
				for i := range 3 {
					if got := do(k.Endpoint()); got != want {
						t.Errorf("%s %s with %s, request %d:\n  through kube-mvp: %s\n  directly:         %s", r.method, r.path, c.name, i, got, want)
						break
					}
				}
			}
		})
	}
	// One apiserver serves everything: no request of any kind needed a routing decision, so
	// none opened an ext_proc stream (Envoy's Lua filter decided every certificate).
	if n := k.Envoy.MustStat(t, extProcStreams); n != 0 {
		t.Errorf("%d ext_proc streams in a control plane whose apiservers all serve the same APIs, want 0", n)
	}
}

// extProcStreams is the data plane's count of ext_proc streams opened (Envoy's
// http.<stat_prefix>.ext_proc.<filter stat_prefix>.streams_started).
const extProcStreams = "http.kube_apiserver.ext_proc.kube_mvp.streams_started"

// answer is what a test compares of a response: the status code and either the identity the
// apiserver saw (SelfSubjectReview), the kind (and name) of the object, the Status message,
// or the text of a plain answer.
type answer struct {
	code int
	text string
}

func (a answer) String() string { return fmt.Sprintf("%d %s", a.code, a.text) }

func observe(t *testing.T, hc *http.Client, req *http.Request) answer {
	t.Helper()
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	a := answer{code: res.StatusCode}
	var obj struct {
		Kind     string `json:"kind"`
		Message  string `json:"message"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Status json.RawMessage `json:"status"` // a string in a Status, an object in a review
	}
	switch {
	case json.Unmarshal(body, &obj) != nil:
		a.text = fmt.Sprintf("%q", strings.TrimSpace(string(body)))
	case obj.Kind == "Status":
		a.text = "Status " + obj.Message
	case obj.Kind == "SelfSubjectReview":
		var st authenticationv1.SelfSubjectReviewStatus
		if err := json.Unmarshal(obj.Status, &st); err != nil {
			t.Fatalf("%s %s: %v", req.Method, req.URL, err)
		}
		u, _ := json.Marshal(st.UserInfo)
		a.text = "SelfSubjectReview " + string(u)
	default:
		a.text = strings.TrimSpace(obj.Kind + " " + obj.Metadata.Name)
	}
	return a
}

// setupAnonymousRBAC grants anonymous requests listing ConfigMaps in kube-system (bound to the
// group system:unauthenticated) and, as kubeadm does (phases/bootstraptoken/clusterinfo),
// getting ConfigMap kube-public/cluster-info (bound to the user system:anonymous), creates
// that ConfigMap, and waits until the authorizer allows both.
func setupAnonymousRBAC(t *testing.T, ctx context.Context, admin *kubernetes.Clientset) {
	t.Helper()
	// kube-public is created by the apiserver shortly after it starts.
	waitFor(t, ctx, "ConfigMap kube-public/cluster-info created", func() error {
		_, err := admin.CoreV1().ConfigMaps("kube-public").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "cluster-info"},
			Data:       map[string]string{"kubeconfig": "apiVersion: v1\nkind: Config\n"},
		}, metav1.CreateOptions{})
		return err
	})
	rbac := admin.RbacV1()
	if _, err := rbac.Roles("kube-public").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:bootstrap-signer-clusterinfo"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"cluster-info"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings("kube-public").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:bootstrap-signer-clusterinfo"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kubeadm:bootstrap-signer-clusterinfo"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "system:anonymous"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.Roles("kube-system").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-anonymous-configmap-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings("kube-system").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-anonymous-configmap-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "e2e-anonymous-configmap-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:unauthenticated"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "RBAC to allow anonymous the ConfigMap reads", func() error {
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Namespace: "kube-system", Verb: "list", Resource: "configmaps"},
			{Namespace: "kube-public", Verb: "get", Resource: "configmaps", Name: "cluster-info"},
		} {
			sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "system:anonymous", Groups: []string{"system:unauthenticated"}, ResourceAttributes: &ra,
			}}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			if !sar.Status.Allowed {
				return fmt.Errorf("%s %s/%s %s: not allowed yet (%s)", ra.Verb, ra.Namespace, ra.Resource, ra.Name, sar.Status.Reason)
			}
		}
		return nil
	})
}

// allHostsHealthy reports an error unless some cluster of the data plane has an active health
// check and every host of every such cluster has passed it.
func allHostsHealthy(ctx context.Context, k *harness.KubeMVP) error {
	get := func(path string, v any) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", k.Envoy.Admin+path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		return json.NewDecoder(res.Body).Decode(v)
	}
	var dump struct {
		Configs []struct {
			Clusters []struct {
				Cluster struct {
					Name         string            `json:"name"`
					HealthChecks []json.RawMessage `json:"health_checks"`
				} `json:"cluster"`
			} `json:"dynamic_active_clusters"`
		} `json:"configs"`
	}
	if err := get("/config_dump", &dump); err != nil {
		return err
	}
	checked := map[string]bool{}
	for _, c := range dump.Configs {
		for _, cl := range c.Clusters {
			if len(cl.Cluster.HealthChecks) > 0 {
				checked[cl.Cluster.Name] = true
			}
		}
	}
	if len(checked) == 0 {
		return errors.New("no cluster with an active health check")
	}
	clusters, err := dataplane.ReadClusters(ctx, k.Envoy.Admin)
	if err != nil {
		return err
	}
	hosts := 0
	for _, c := range clusters.GetClusterStatuses() {
		if !checked[c.GetName()] {
			continue
		}
		for _, h := range c.GetHostStatuses() {
			hosts++
			if hs := h.GetHealthStatus(); hs.GetFailedActiveHealthCheck() || hs.GetPendingActiveHc() {
				return fmt.Errorf("cluster %s host %s: health %v", c.GetName(), h.GetHostname(), hs)
			}
		}
	}
	if hosts == 0 {
		return fmt.Errorf("no hosts in the health-checked clusters %v", checked)
	}
	return nil
}
