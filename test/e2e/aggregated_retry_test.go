package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestAggregatedWriteSentOnce: an aggregated API's backend that answers a POST with 503 and
// Retry-After (as any server may, after doing the work) gets each POST exactly once through
// kube-mvp, as it does directly: the apiserver passes the backend's status and headers
// through, so they prove nothing about whether the backend acted, and kube-mvp's route for
// the aggregated group/version retries only what never reached an apiserver. Before it,
// every route retried answers with Retry-After and the backend got each POST three times.
//
// The APIService names an ExternalName Service whose name is 127.0.0.1: kube-apiserver's
// default service resolver (no --enable-aggregator-routing) sends the requests to the
// external name and the APIService's port, the test's own TLS server; endpoints on a loopback
// address would be refused.
func TestAggregatedWriteSentOnce(t *testing.T) {
	ctx := testutil.Context(t, 3*time.Minute)
	const group, version = "retrytest.kube-mvp.io", "v1"
	gvPath := "/apis/" + group + "/" + version
	createPath := gvPath + "/namespaces/default/widgets"

	var posts atomic.Int64
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == createPath:
			posts.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"backend busy","reason":"ServiceUnavailable","code":503}`)
		case r.Method == http.MethodGet && r.URL.Path == gvPath:
			// The aggregator's availability check and discovery.
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w,
				`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"%s/%s","resources":[{"name":"widgets","singularName":"widget","namespaced":true,"kind":"Widget","verbs":["create","get","list"]}]}`,
				group, version)
		default:
			http.NotFound(w, r)
		}
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend.Listener = ln
	backend.StartTLS()
	t.Cleanup(backend.Close)
	port, err := strconv.Atoi(strings.TrimPrefix(backend.Listener.Addr().String(), "127.0.0.1:"))
	if err != nil {
		t.Fatal(err)
	}

	e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"})
	k := e.startKubeMVP(ctx, "aggregated", "")
	direct := e.adminClient(e.cp.Server("cp-a"))
	if _, err := direct.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "retrytest"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "127.0.0.1"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apiService := fmt.Sprintf(`{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService","metadata":{"name":"%s.%s"},
		"spec":{"group":"%s","version":"%s","service":{"namespace":"default","name":"retrytest","port":%d},
		"insecureSkipTLSVerify":true,"groupPriorityMinimum":1000,"versionPriority":15}}`, version, group, group, version, port)
	if err := direct.Discovery().RESTClient().Post().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices").
		SetHeader("Content-Type", "application/json").Body([]byte(apiService)).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}

	admin, err := e.cp.PKI.ClientCert("aggregated-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	cl := e.rawClient(&admin)
	post := func(cl *http.Client, base, authorization string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+createPath, strings.NewReader(`{"kind":"Widget","apiVersion":"`+group+`/`+version+`","metadata":{"name":"w"}}`))
		req.Header.Set("Content-Type", "application/json")
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		res, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode, res.Header.Get("Retry-After")
	}
	apiserverURL := "https://" + e.cp.Server("cp-a").Address()

	// The apiserver proxies the group/version once the APIService is available.
	waitFor(t, ctx, "the aggregated API served directly", func() error {
		res, err := cl.Get(apiserverURL + gvPath)
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %d", gvPath, res.StatusCode)
		}
		return nil
	})
	// kube-mvp's data plane has the group/version's own routes.
	start := time.Now()
	for !strings.Contains(configDump(t, ctx, k.Envoy.Admin), `"`+group+`/`+version+`:write"`) {
		if time.Since(start) > 30*time.Second {
			t.Errorf("after 30 s the data plane has no route of its own for %s/%s", group, version)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Directly: one POST reaches the backend, whose 503 and Retry-After come back.
	before := posts.Load()
	if code, ra := post(cl, apiserverURL, ""); code != http.StatusServiceUnavailable || ra != "1" {
		t.Fatalf("directly: status %d, Retry-After %q; want the backend's 503 and 1", code, ra)
	}
	if got := posts.Load() - before; got != 1 {
		t.Fatalf("directly: the backend got %d POSTs, want 1", got)
	}
	// Through kube-mvp, with a client certificate (the front-proxy routes) and with a bearer
	// token (the plain ones): each POST reaches the backend once and its answer comes back.
	token := serviceAccountToken(t, ctx, direct, "retrytest")
	if _, err := direct.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "retrytest"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "retrytest"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokenClient := e.rawClient(nil)
	for i, c := range []struct {
		name string
		cl   *http.Client
		hdr  string
	}{
		{"client certificate", cl, ""},
		{"client certificate", cl, ""},
		{"service account token", tokenClient, "Bearer " + token},
		{"service account token", tokenClient, "Bearer " + token},
	} {
		before := posts.Load()
		code, ra := post(c.cl, k.Endpoint(), c.hdr)
		if got := posts.Load() - before; got != 1 || code != http.StatusServiceUnavailable || ra != "1" {
			t.Errorf("POST %d (%s) through kube-mvp: the backend got it %d times, answer %d with Retry-After %q; want once, its 503 with 1", i, c.name, got, code, ra)
		}
	}
	t.Logf("the backend got %d POSTs in all", posts.Load())
}

// configDump is the data plane's /config_dump.
func configDump(t *testing.T, ctx context.Context, adminURL string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/config_dump", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
