package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/dataplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestUpstreamScenarios replays upstream's Mixed Version Proxy scenarios through kube-mvp:
// A v1.37.1 serves everything, B v1.36.4 runs with batch/v1 off, C v1.37.1. A front proxy
// and a sidecar beside B must serve Jobs whatever server the client would have hit; when the
// servers of batch/v1 go away, the answer is a 503 Status, never a 404. Both settings: the
// test gates on (StorageVersion API, peer-proxy gate), and cluster defaults (as real
// clusters of these releases run).
func TestUpstreamScenarios(t *testing.T) {
	for _, setting := range settings {
		t.Run(setting.name, func(t *testing.T) { upstreamScenarios(t, setting.clusterDefaults) })
	}
}

// settings are the two ways the e2e tests start apiservers (controlplane.ServerSpec's
// ClusterDefaults).
var settings = []struct {
	name            string
	clusterDefaults bool
}{
	{"gates-on", false},
	{"cluster-defaults", true},
}

func upstreamScenarios(t *testing.T, clusterDefaults bool) {
	ctx := testutil.Context(t, 20*time.Minute)
	specs := append(controlplane.MixedServers(), controlplane.ServerSpec{Name: "cp-c", Version: "v1.37.1"})
	for i := range specs {
		specs[i].ClusterDefaults = clusterDefaults
	}
	e := newEnv(t, ctx, specs...)
	if clusterDefaults {
		// The premise of this setting: nothing beyond what the releases ship.
		if _, err := e.adminClient(e.cp.Server("cp-a")).Discovery().ServerResourcesForGroupVersion("internal.apiserver.k8s.io/v1alpha1"); err == nil {
			t.Fatal("cluster defaults, but the StorageVersion API is served")
		}
	}
	front := e.startKubeMVP(ctx, "front", "")
	sidecarB := e.startKubeMVP(ctx, "sidecar-b", "cp-b")
	admin := &e.cp.PKI.Admin

	// Upstream's premise: B itself does not serve Jobs.
	if _, err := e.adminClient(e.cp.Server("cp-b")).BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("cp-b serves batch/v1 although it runs with batch/v1=false")
	}

	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "created-through-a"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "c", Image: "busybox"}},
		}}},
	}
	if _, err := e.adminClient(e.cp.Server("cp-a")).BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, k := range []*harness.KubeMVP{front, sidecarB} {
		t.Run("list jobs through "+k.Name, func(t *testing.T) {
			c := kubernetes.NewForConfigOrDie(e.through(k, admin, ""))
			// Round robin over three servers would send a third of these to B (404).
			for i := range 30 {
				jobs, err := c.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if len(jobs.Items) != 1 || jobs.Items[0].Name != job.Name {
					t.Fatalf("request %d: jobs %v", i, jobs.Items)
				}
			}
			// Everybody serves apps/v1 and core/v1: straight through.
			if _, err := c.AppsV1().Deployments("default").List(ctx, metav1.ListOptions{}); err != nil {
				t.Error(err)
			}
			if _, err := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); err != nil {
				t.Error(err)
			}
		})
	}

	t.Run("non-resource requests", func(t *testing.T) {
		hc := e.rawClient(admin)
		for _, path := range []string{"/healthz", "/readyz", "/livez", "/version", "/api", "/apis", "/openapi/v2"} {
			res, err := hc.Get(front.Endpoint() + path)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Errorf("%s: %s", path, res.Status)
			}
		}
	})

	t.Run("a CRD created through one server is served through all", func(t *testing.T) {
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1",
			"kind":       "CustomResourceDefinition",
			"metadata":   map[string]any{"name": "widgets.e2e.kube-mvp.io"},
			"spec": map[string]any{
				"group": "e2e.kube-mvp.io",
				"scope": "Namespaced",
				"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
				"versions": []any{map[string]any{
					"name": "v1", "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
				}},
			},
		}}
		crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
		if _, err := dynamic.NewForConfigOrDie(e.cp.Server("cp-b").RESTConfig()).Resource(crds).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		gvr := schema.GroupVersionResource{Group: "e2e.kube-mvp.io", Version: "v1", Resource: "widgets"}
		dyn := dynamic.NewForConfigOrDie(e.through(front, admin, ""))
		// Every server must have established it before a run of successes means anything.
		waitFor(t, ctx, "widgets served through kube-mvp", func() error {
			for range 10 {
				if _, err := dyn.Resource(gvr).Namespace("default").List(ctx, metav1.ListOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	})

	t.Run("merged discovery", func(t *testing.T) {
		const v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
		for _, k := range []*harness.KubeMVP{front, sidecarB} {
			// client-go's discovery, as kubectl uses it: B alone does not know batch/v1,
			// and the sidecar sends /apis to B.
			dc := discovery.NewDiscoveryClientForConfigOrDie(e.through(k, admin, ""))
			lacking := func() error {
				_, lists, err := dc.ServerGroupsAndResources()
				if err != nil {
					return err
				}
				found := map[string]bool{}
				for _, l := range lists {
					for _, r := range l.APIResources {
						found[l.GroupVersion+"/"+r.Name] = true
					}
				}
				for _, want := range []string{"batch/v1/jobs", "apps/v1/deployments", "v1/pods", "e2e.kube-mvp.io/v1/widgets"} {
					if !found[want] {
						return fmt.Errorf("discovery lacks %s", want)
					}
				}
				return nil
			}
			// The CRD just created reaches the merged discovery within seconds (refetched
			// at the change and once more when the apiservers have published it).
			start := time.Now()
			waitFor(t, ctx, k.Name+": the new CRD in the merged discovery", lacking)
			t.Logf("%s: the new CRD was in the merged discovery %s after the check began", k.Name, time.Since(start).Round(time.Millisecond))
			for i := range 6 {
				if err := lacking(); err != nil {
					t.Fatalf("%s, discovery %d: %v", k.Name, i, err)
				}
			}
		}
		get := func(k *harness.KubeMVP, cert *controlplane.KeyPair, accept, ifNoneMatch string) (*http.Response, string) {
			req, _ := http.NewRequestWithContext(ctx, "GET", k.Endpoint()+"/apis", nil)
			req.Header.Set("Accept", accept)
			if ifNoneMatch != "" {
				req.Header.Set("If-None-Match", ifNoneMatch)
			}
			res, err := e.rawClient(cert).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			return res, string(body)
		}
		// profile=nopeer asks for one apiserver's own view: the sidecar's is B's.
		if res, body := get(sidecarB, admin, v2+";profile=nopeer", ""); res.StatusCode != 200 || strings.Contains(body, `"name":"batch"`) {
			t.Errorf("profile=nopeer through sidecar-b: %s, batch listed: %v", res.Status, strings.Contains(body, `"name":"batch"`))
		}
		// The merged document carries an ETag; asking again with it gives 304.
		res, body := get(front, admin, v2, "")
		etag := res.Header.Get("Etag")
		if res.StatusCode != 200 || etag == "" || !strings.Contains(body, `"name":"batch"`) || res.Header.Get("Content-Type") != v2 {
			t.Fatalf("merged discovery: %s etag %q content-type %q", res.Status, etag, res.Header.Get("Content-Type"))
		}
		// Go's transport asked for gzip (Accept-Encoding) and took the encoding off.
		if !res.Uncompressed {
			t.Errorf("merged discovery: not gzip-compressed for a client that accepts gzip (%d bytes)", len(body))
		}
		if res, _ := get(front, admin, v2, etag); res.StatusCode != http.StatusNotModified {
			t.Errorf("with If-None-Match %s: %s, want 304", etag, res.Status)
		}
		// Without credentials the apiserver decides, as it would directly: nothing leaks.
		direct, _ := http.NewRequestWithContext(ctx, "GET", "https://"+e.cp.Server("cp-a").Address()+"/apis", nil)
		direct.Header.Set("Accept", v2)
		dres, err := e.rawClient(nil).Do(direct)
		if err != nil {
			t.Fatal(err)
		}
		dres.Body.Close()
		if res, body := get(front, nil, v2, ""); res.StatusCode != dres.StatusCode || strings.Contains(body, `"name":"batch"`) {
			t.Errorf("anonymous: %s (directly %s), batch listed: %v", res.Status, dres.Status, strings.Contains(body, `"name":"batch"`))
		}
	})

	t.Run("identity", func(t *testing.T) {
		var servers []string
		for _, s := range specs {
			servers = append(servers, s.Name)
		}
		identityScenarios(t, ctx, e, front, servers)
	})

	t.Run("a stopped server's work moves to its peer", func(t *testing.T) {
		if err := e.cp.Stop("cp-a"); err != nil {
			t.Fatal(err)
		}
		c := kubernetes.NewForConfigOrDie(e.through(front, admin, ""))
		// At once (A's Lease is still fresh: the retry policy moves the request to C) and
		// after A has left the table.
		deadline := time.Now().Add(livenessWindow + 5*time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			if _, err := c.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatalf("request %d, %s after stopping cp-a: %v", i, time.Until(deadline), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("nobody left to serve jobs: 503 Status, never 404", func(t *testing.T) {
		e.cp.Kill("cp-c")
		hc := e.rawClient(admin)
		url := front.Endpoint() + "/apis/batch/v1/namespaces/default/jobs"
		// First C's Lease is still fresh: the data plane fails to connect and answers with
		// its local reply; once the Lease expires, extproc answers at once.
		sawImmediate := false
		deadline := time.Now().Add(livenessWindow + 10*time.Second)
		for time.Now().Before(deadline) && !sawImmediate {
			res, err := hc.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			st := decodeStatus(t, res)
			if res.StatusCode != http.StatusServiceUnavailable || st.Kind != "Status" || st.APIVersion != "v1" ||
				st.Status != "Failure" || st.Reason != "ServiceUnavailable" || st.Code != 503 {
				t.Fatalf("%d %+v, want a 503 ServiceUnavailable Status", res.StatusCode, st)
			}
			sawImmediate = strings.Contains(st.Message, "batch/v1")
			time.Sleep(200 * time.Millisecond)
		}
		if !sawImmediate {
			t.Errorf("extproc never answered for jobs itself within %s of the Lease expiring", livenessWindow+10*time.Second)
		}
		// Others still work through B.
		c := kubernetes.NewForConfigOrDie(e.through(front, admin, ""))
		if _, err := c.AppsV1().Deployments("default").List(ctx, metav1.ListOptions{}); err != nil {
			t.Error(err)
		}
	})
}

// identityScenarios: whoever the client is (certificate, token, nobody), the apiserver sees
// that identity, whatever X-Remote-* headers the client sends; each of servers (hostnames)
// answers at least one request of each case.
func identityScenarios(t *testing.T, ctx context.Context, e *env, k *harness.KubeMVP, servers []string) {
	alice, err := e.cp.PKI.ClientCert("alice", "developers", "testers")
	if err != nil {
		t.Fatal(err)
	}
	bobToken := serviceAccountToken(t, ctx, e.adminClient(e.cp.Server("cp-a")), "bob")
	const bob = "system:serviceaccount:default:bob"

	spoof := http.Header{
		"X-Remote-User":             {"system:admin"},
		"X-Remote-Group":            {"system:masters"},
		"X-Remote-Uid":              {"0"},
		"X-Remote-Extra-Scopes":     {"everything"},
		"X-Kubernetes-Peer-Proxied": {"true"},
		"X-Kube-Mvp-Cluster":        {"kube-apiservers"},
		"X-Kube-Mvp-Identity":       {"front-proxy"}, // what Envoy's Lua filter writes for a certificate user
	}
	cases := []struct {
		name     string
		cert     *controlplane.KeyPair
		token    string
		headers  http.Header
		wantUser string // what a direct request to an apiserver must show, as a sanity check
	}{
		{"client certificate", &alice, "", nil, "alice"},
		{"client certificate, spoofed headers", &alice, "", spoof, "alice"},
		{"bearer token", nil, bobToken, nil, bob},
		{"bearer token, spoofed headers", nil, bobToken, spoof, bob},
		{"anonymous, spoofed headers", nil, "", spoof, ""}, // 401, or 403 naming system:anonymous
	}
	direct := "https://" + e.cp.Server("cp-a").Address()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hc := e.rawClient(c.cert)
			// The reference: the same credentials straight to an apiserver, no spoofing.
			want := selfSubjectReview(t, ctx, hc, direct, c.token, nil)
			if (c.wantUser != "" && !strings.Contains(want, `"`+c.wantUser+`"`)) || strings.Contains(want, "system:admin") || strings.Contains(want, "system:masters") {
				t.Fatalf("directly, the apiserver answered %s; want it to name %s", want, c.wantUser)
			}
			// Until every apiserver has answered one, as the data plane counts each host's
			// answers (least request picks at random among idle hosts; the apiservers' own
			// request counters would also count extproc's SelfSubjectReviews, sent to each
			// every minute), at most 60.
			before := answeredBy(t, ctx, k)
			for i := 0; ; i++ {
				got := selfSubjectReview(t, ctx, hc, k.Endpoint(), c.token, c.headers)
				if got != want {
					t.Fatalf("request %d through kube-mvp: %s\nwant what the apiserver answers directly: %s", i, got, want)
				}
				after := answeredBy(t, ctx, k)
				var missing []string
				for _, s := range servers {
					if after[s] == before[s] {
						missing = append(missing, s)
					}
				}
				if len(missing) == 0 {
					answers := map[string]uint64{}
					for _, s := range servers {
						answers[s] = after[s] - before[s]
					}
					t.Logf("%d requests through kube-mvp before every apiserver had answered one: %v", i+1, answers)
					break
				}
				if i+1 == 60 {
					t.Fatalf("%d requests through kube-mvp, none answered by %v", i+1, missing)
				}
			}
		})
	}

	t.Run("upgrade request keeps the caller's identity", func(t *testing.T) {
		// exec needs a kubelet, which this control plane has not; the authorizer runs first
		// and names the user it saw, which is all this checks.
		hc := e.rawClient(&alice)
		req, _ := http.NewRequestWithContext(ctx, "POST", k.Endpoint()+
			"/api/v1/namespaces/default/pods/nope/exec?command=true&stdout=true", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "SPDY/3.1")
		req.Header.Set("X-Remote-User", "system:admin")
		req.Header.Set("X-Remote-Group", "system:masters")
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		st := decodeStatus(t, res)
		if res.StatusCode != http.StatusForbidden || !strings.Contains(st.Message, `User "alice" cannot create resource "pods/exec"`) {
			t.Errorf("%d %q, want 403 naming alice", res.StatusCode, st.Message)
		}
	})
}

// selfSubjectReview asks base who the caller is and returns the status code and the user the
// apiserver saw (or, when refused, the refusal's message, which names the user).
func selfSubjectReview(t *testing.T, ctx context.Context, hc *http.Client, base, token string, headers http.Header) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	req.Header.Set("Content-Type", "application/json")
	for h, v := range headers {
		req.Header[h] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusCreated {
		return fmt.Sprintf("%d %s", res.StatusCode, decodeStatus(t, res).Message)
	}
	var review authenticationv1.SelfSubjectReview
	if err := decodeJSON(res, &review); err != nil {
		t.Fatal(err)
	}
	u, _ := json.Marshal(review.Status.UserInfo)
	return fmt.Sprintf("%d %s", res.StatusCode, u)
}

// answeredBy is, by apiserver hostname, how many answers the data plane of k has had from it
// (rq_success of each of its hosts, summed over the clusters; health checks are not counted).
func answeredBy(t *testing.T, ctx context.Context, k *harness.KubeMVP) map[string]uint64 {
	t.Helper()
	clusters, err := dataplane.ReadClusters(ctx, k.Envoy.Admin)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]uint64{}
	for _, c := range clusters.GetClusterStatuses() {
		for _, h := range c.GetHostStatuses() {
			for _, st := range h.GetStats() {
				if st.GetName() == "rq_success" {
					n[h.GetHostname()] += st.GetValue()
				}
			}
		}
	}
	return n
}

func decodeJSON(res *http.Response, v any) error {
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", res.Status, body)
	}
	return json.Unmarshal(body, v)
}
