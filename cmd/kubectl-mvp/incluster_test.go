package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/opstatus"
	"github.com/kube-mvp/kube-mvp/internal/plan"
)

// fakeAPI is a Kubernetes API that lists kube-mvp's pods and proxies to their admin ports
// with canned pages; forbidden answers 403 to everything.
type fakeAPI struct {
	xds, envoys []corev1.Pod
	view        plan.View
	forbidden   bool
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.forbidden {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: "Failure", Reason: metav1.StatusReasonForbidden, Code: 403,
			Message: `pods is forbidden: User "u" cannot list resource "pods"`})
		return
	}
	const ns = "/api/v1/namespaces/kube-mvp/pods"
	switch {
	case r.URL.Path == "/api/v1/namespaces/elsewhere/pods": // a namespace without kube-mvp
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}})
	case r.URL.Path == ns:
		pods := f.envoys
		if strings.Contains(r.URL.Query().Get("labelSelector"), "xds-server") {
			pods = f.xds
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: pods})
	case strings.HasPrefix(r.URL.Path, ns+"/"):
		switch strings.TrimPrefix(r.URL.Path, ns+"/") {
		case "xds-0:9100/proxy/debug/topology":
			json.NewEncoder(w).Encode(f.view)
		case "xds-0:9100/proxy/debug/syncz":
			w.Write([]byte(`[{"nodeID":"envoy-a","role":"envoy-front","openStreams":1,"snapshotVersion":"v9",` +
				`"types":{"type.googleapis.com/envoy.config.route.v3.RouteConfiguration":{"sent":"1",` +
				`"acked":"1"}}}]`))
		case "envoy-a:9002/proxy/readyz":
			w.Write([]byte("ok: routing table t1\n"))
		case "envoy-a:9002/proxy/metrics":
			w.Write([]byte("# TYPE kube_mvp_extproc_table_version_info gauge\nkube_mvp_extproc_table_version_info{vers" +
				"ion=\"t1\"} 1\n# TYPE kube_mvp_extproc_table_age_seconds " +
				"gauge\nkube_mvp_extproc_table_age_seconds 12\n"))
		default:
			http.NotFound(w, r)
		}
	default:
		http.NotFound(w, r)
	}
}

func pod(name, port string, number int32, phase corev1.PodPhase) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-mvp"},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: port, ContainerPort: number}}}}},
		Status: corev1.PodStatus{Phase: phase}}
	if phase != corev1.PodRunning {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}
	}
	return p
}

func kubeconfigFor(t *testing.T, server string) string {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, server)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStatusThroughTheKubernetesAPI: without --xds-admin, status finds the pods and reads
// their admin pages through the pod proxy, and says when it cannot.
func TestStatusThroughTheKubernetesAPI(t *testing.T) {
	p, err := plan.Build(fixtures.Topology(t, "batch-off"))
	if err != nil {
		t.Fatal(err)
	}
	api := &fakeAPI{
		xds:    []corev1.Pod{pod("xds-0", "admin", 9100, corev1.PodRunning)},
		envoys: []corev1.Pod{pod("envoy-a", "extproc-admin", 9002, corev1.PodRunning), pod("envoy-b", "extproc-admin", 9002, corev1.PodPending)},
		view:   p.View(),
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	kubeconfig := kubeconfigFor(t, srv.URL)
	status := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(append([]string{"status", "--kubeconfig", kubeconfig}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}

	code, out, errOut := status("-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r opstatus.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.APIServers) != 3 || len(r.Envoys) != 1 || r.Envoys[0].State != "ACK" || len(r.ExtProcs) != 1 || r.ExtProcs[0].Name != "envoy-a" || r.ExtProcs[0].TableVersion != "t1" {
		t.Errorf("report: %s", out)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "envoy-b is not running: Pending, c ImagePullBackOff") {
		t.Errorf("problems %q, want envoy-b's", r.Problems)
	}

	api.envoys = nil
	api.xds = []corev1.Pod{pod("xds-0", "admin", 9100, corev1.PodPending)}
	if code, _, errOut := status(); code != 1 ||
		!strings.Contains(errOut,
			"no running xds-server pod in namespace kube-mvp: kube-mvp is down (xds-server pod xds-0 is not running: Pending, c ImagePullBackOff)") {
		t.Errorf("kube-mvp down: exit %d, %q", code, errOut)
	}
	api.xds = nil
	if code, _, errOut := status(); code != 1 || !strings.Contains(errOut, "no xds-server pod in namespace kube-mvp") || !strings.Contains(errOut, "is kube-mvp installed there?") {
		t.Errorf("not installed: exit %d, %q", code, errOut)
	}
	if code, _, errOut := status("-n", "elsewhere"); code != 1 || !strings.Contains(errOut, "namespace elsewhere") {
		t.Errorf("--namespace: exit %d, %q", code, errOut)
	}
	api.forbidden = true
	if code, _, errOut := status(); code != 1 || !strings.Contains(errOut, "you may not list pods in namespace kube-mvp") {
		t.Errorf("forbidden: exit %d, %q", code, errOut)
	}
}
