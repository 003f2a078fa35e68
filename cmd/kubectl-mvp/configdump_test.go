package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"

	"github.com/kube-mvp/kube-mvp/internal/configdiff"
	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
)

// portForwardAPI is fakeAPI with pods/portforward (SPDY, as the apiserver and kubelet
// speak it): a forward to pod envoy-a's port envoyPort reaches envoyAdmin, any other port
// is refused as the kubelet refuses it; and xds-server's /debug/config_dump.
type portForwardAPI struct {
	*fakeAPI
	envoyAdmin         string // host:port
	envoyPort          string
	xdsDump            string
	forbidPortForward  bool
	forwards, requests atomic.Int32
}

func (f *portForwardAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	const pods = "/api/v1/namespaces/kube-mvp/pods/"
	switch {
	case !f.forbidden && r.URL.Path == pods+"xds-0:9100/proxy/debug/config_dump":
		if r.URL.Query().Get("node") != "envoy-a" {
			http.Error(w, "no snapshot for node", http.StatusNotFound)
			return
		}
		w.Write([]byte(f.xdsDump))
	case r.URL.Path == pods+"envoy-a/portforward" && r.Method == http.MethodPost:
		if f.forbidPortForward {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonForbidden, Code: 403,
				Message: `pods "envoy-a" is forbidden: User "u" cannot create resource "pods/portforward" in API group "" in the namespace "kube-mvp"`})
			return
		}
		f.forwards.Add(1)
		f.serveForward(w, r)
	default:
		f.fakeAPI.ServeHTTP(w, r)
	}
}

func (f *portForwardAPI) serveForward(w http.ResponseWriter, r *http.Request) {
	if _, err := httpstream.Handshake(r, w, []string{"portforward.k8s.io"}); err != nil {
		return
	}
	// outcomes pair a forwarded connection's data and error streams (by requestID, per
	// port-forward): the data stream's failure, or "", is what the error stream says.
	var mu sync.Mutex
	outcomes := map[string]chan string{}
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, func(s httpstream.Stream, replySent <-chan struct{}) error {
		mu.Lock()
		id := s.Headers().Get("requestID")
		if outcomes[id] == nil {
			outcomes[id] = make(chan string, 1)
		}
		done := outcomes[id]
		mu.Unlock()
		go func() {
			<-replySent
			if s.Headers().Get("streamType") == "error" {
				if msg := <-done; msg != "" {
					s.Write([]byte(msg))
				}
				s.Close()
				return
			}
			defer s.Close()
			if port := s.Headers().Get("port"); port != f.envoyPort {
				done <- "failed to connect to localhost:" + port + " inside the pod: connection refused"
				return
			}
			f.requests.Add(1)
			target, err := net.Dial("tcp", f.envoyAdmin)
			if err != nil {
				done <- err.Error()
				return
			}
			defer target.Close()
			go io.Copy(target, s)
			io.Copy(s, target)
			done <- ""
		}()
		return nil
	})
	if conn != nil {
		<-conn.CloseChan()
	}
}

const (
	testXDSDump = `{"listeners":[],"routes":[],"clusters":[{"@type":"type.googleapis.com/` +
		`envoy.config.cluster.v3.Cluster","name":"c","type":"STATIC"},` +
		`{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"new",` +
		`"type":"STATIC"}],"endpoints":[],"secrets":[]}`
	testEnvoyDump = `{"configs":[{"@type":"type.googleapis.com/envoy.admin.v3.ClustersConfigDump",` +
		`"version_info":"v9","dynamic_active_clusters":[{"version_info":"v9",` +
		`"cluster":{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"c",` +
		`"type":"STATIC"}}]}]}`
)

// TestConfigDumpThroughTheKubernetesAPI: without --xds-admin, config-dump reads xds-server
// through the pod proxy and each Envoy pod's loopback admin through a port-forward, and
// says when kube-mvp is not there or the user may not port-forward.
func TestConfigDumpThroughTheKubernetesAPI(t *testing.T) {
	envoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/config_dump" || !r.URL.Query().Has("include_eds") {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(testEnvoyDump))
	}))
	defer envoy.Close()
	api := &portForwardAPI{
		fakeAPI: &fakeAPI{
			xds:    []corev1.Pod{pod("xds-0", "admin", 9100, corev1.PodRunning)},
			envoys: []corev1.Pod{pod("envoy-a", "extproc-admin", 9002, corev1.PodRunning), pod("envoy-b", "extproc-admin", 9002, corev1.PodPending)},
		},
		envoyAdmin: envoy.Listener.Addr().String(),
		envoyPort:  "9901",
		xdsDump:    testXDSDump,
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	kubeconfig := kubeconfigFor(t, srv.URL)
	configDump := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(append([]string{"config-dump", "--kubeconfig", kubeconfig, "--timeout", "20s"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}

	code, out, errOut := configDump("-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r configdiff.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Nodes) != 1 || r.Nodes[0].Node != "envoy-a" || r.Nodes[0].Envoy != "pod envoy-a" || r.Nodes[0].Sync != "ACK" || len(r.Nodes[0].Resources) != 2 ||
		r.Nodes[0].Resources[0].Name != "c" || r.Nodes[0].Resources[0].State != configdiff.Equal || r.Nodes[0].Resources[0].EnvoyVersion != "v9" ||
		r.Nodes[0].Resources[1].Name != "new" || r.Nodes[0].Resources[1].State != configdiff.OnlyXDSServer {
		t.Errorf("report: %s", out)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "envoy-b is not running") {
		t.Errorf("problems %q, want envoy-b's", r.Problems)
	}
	if api.forwards.Load() != 1 || api.requests.Load() != 1 {
		t.Errorf("%d port-forwards, %d connections to the Envoy admin; want one of each", api.forwards.Load(), api.requests.Load())
	}

	// The chart's annotation names the pod's admin port; --envoy-admin-port wins over it.
	api.envoyPort = "19901"
	api.envoys[0].Annotations = map[string]string{contract.AnnotationEnvoyAdminPort: "19901"}
	if code, _, errOut := configDump(); code != 0 {
		t.Errorf("admin port from the annotation: exit %d, %q", code, errOut)
	}
	if code, _, errOut := configDump("--envoy-admin-port", "9901"); code != 1 || !strings.Contains(errOut, "--envoy-admin-port") {
		t.Errorf("--envoy-admin-port over the annotation: exit %d, %q", code, errOut)
	}
	api.envoyPort, api.envoys[0].Annotations = "9901", nil

	if code, _, errOut := configDump("--envoy-admin-port", "9999"); code != 1 ||
		!strings.Contains(errOut, "no Envoy's admin could be read: ") ||
		!strings.Contains(errOut, "pod envoy-a: Envoy's admin does not answer") ||
		!strings.Contains(errOut, "--envoy-admin-port") {
		t.Errorf("another admin port: exit %d, %q", code, errOut)
	}
	if code, _, errOut := configDump("--node", "envoy-b"); code != 1 || !strings.Contains(errOut, "no running Envoy pod envoy-b in namespace kube-mvp") {
		t.Errorf("--node of a pending pod: exit %d, %q", code, errOut)
	}
	api.forbidPortForward = true
	if code, _, errOut := configDump(); code != 1 ||
		!strings.Contains(errOut, "you may not port-forward to pod envoy-a in namespace kube-mvp") ||
		!strings.Contains(errOut, "create on pods/portforward") {
		t.Errorf("port-forward forbidden: exit %d, %q", code, errOut)
	}
	api.xds = nil
	if code, _, errOut := configDump(); code != 1 || !strings.Contains(errOut, "no xds-server pod in namespace kube-mvp") || !strings.Contains(errOut, "is kube-mvp installed there?") {
		t.Errorf("not installed: exit %d, %q", code, errOut)
	}
	api.forbidden = true
	if code, _, errOut := configDump(); code != 1 || !strings.Contains(errOut, "you may not list pods in namespace kube-mvp") {
		t.Errorf("forbidden: exit %d, %q", code, errOut)
	}
}

// TestConnectedTo: config-dump asks each Envoy's configuration of the replica it is connected
// to (the one listing it with open streams), not of one that keeps it disconnected after it
// moved, nor of the first replica unless no replica knows it.
func TestConnectedTo(t *testing.T) {
	a := replicaSyncz{admin: "a", nodes: []xdsstatus.NodeStatus{{NodeID: "moved", Streams: 0}, {NodeID: "on-a", Streams: 1}}}
	b := replicaSyncz{admin: "b", nodes: []xdsstatus.NodeStatus{{NodeID: "moved", Streams: 1}}}
	for node, want := range map[string]string{"moved": "b", "on-a": "a", "unknown": "a"} {
		if got := connectedTo([]replicaSyncz{a, b}, node).admin; got != want {
			t.Errorf("%s: replica %s, want %s", node, got, want)
		}
	}
}
