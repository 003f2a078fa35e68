package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestExtprocDown: extproc only decides where a routing decision is needed, so when it is
// gone (crashed, restarting) every other request is still served, with the identity the
// apiserver would give it: a kubelet-style client certificate, a bearer token, nobody. The
// merged discovery falls back to one apiserver's own (a client may miss the APIs only the
// other serves: allowed there, and only there), and a request that needs the decision gets
// a 503 Status with Retry-After (client-go retries it by itself, so a restarting extproc may
// go unnoticed), never a wrong apiserver's 404. Measured with kubectl and client-go on a cold
// discovery cache, as after a restart.
func TestExtprocDown(t *testing.T) {
	ctx := testutil.Context(t, 6*time.Minute)
	e := newEnv(t, ctx, controlplane.MixedServers()...) // cp-b does not serve batch/v1
	k := e.startKubeMVP(ctx, "front", "")
	admin := e.adminClient(e.cp.Server("cp-a"))
	token := serviceAccountToken(t, ctx, admin, "bob")

	// With extproc up: batch/v1 is routed to cp-a, so the merged discovery shows it.
	through := func(cert *controlplane.KeyPair, token string) *kubernetes.Clientset {
		return kubernetes.NewForConfigOrDie(e.through(k, cert, token))
	}
	if _, err := through(&e.cp.PKI.Admin, "").BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing jobs through kube-mvp with extproc up: %v", err)
	}
	decided := k.Envoy.MustStat(t, extProcStreams)
	if decided == 0 {
		t.Fatal("the batch/v1 request opened no ext_proc stream: the test would prove nothing")
	}

	k.StopExtproc()

	// Whoami, through kube-mvp, for every kind of caller: the route of
	// authentication.k8s.io/v1 (both apiservers serve it) needs no decision.
	whoami := func(c *kubernetes.Clientset) (string, error) {
		r, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		return r.Status.UserInfo.Username, nil
	}
	for _, c := range []struct {
		name   string
		client *kubernetes.Clientset
		want   string
	}{
		{"client certificate", through(&e.cp.PKI.Admin, ""), controlplane.AdminUser},
		{"bearer token", through(nil, token), "system:serviceaccount:default:bob"},
	} {
		for i := range 5 {
			got, err := whoami(c.client)
			if err != nil || got != c.want {
				t.Fatalf("%s, request %d with extproc down: %q, %v; want %q", c.name, i, got, err, c.want)
			}
		}
	}
	nss, err := through(&e.cp.PKI.Admin, "").CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil || len(nss.Items) == 0 {
		t.Fatalf("kubectl get ns with extproc down: %v", err)
	}

	// A cold discovery cache: /apis falls back to one apiserver's own discovery, which
	// must be served (and may lack batch/v1 when cp-b answers).
	for i := range 6 {
		dc := discovery.NewDiscoveryClientForConfigOrDie(e.through(k, &e.cp.PKI.Admin, ""))
		groups, err := dc.ServerGroups()
		if err != nil {
			t.Fatalf("discovery %d with extproc down: %v", i, err)
		}
		if !slices.ContainsFunc(groups.Groups, func(g metav1.APIGroup) bool { return g.Name == "apps" }) {
			t.Fatalf("discovery %d with extproc down lists no apps group: %v", i, groups.Groups)
		}
	}

	// kubectl itself, on a cold discovery cache each time: `get ns` works (discovery falls
	// back to the answering apiserver's own), `get jobs` is refused with the 503, or, when
	// cp-b's discovery answered, not known — never a wrong apiserver's 404 for the list.
	kubectl, err := controlplane.EnsureKubectl(ctx, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := e.cp.WriteKubeconfigFor(kubeconfig, k.Endpoint()); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", t.TempDir(), "--request-timeout", "30s"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for i := range 3 {
		if out, err := run("get", "ns", "-o", "name"); err != nil || !strings.Contains(out, "namespace/default") {
			t.Fatalf("kubectl get ns %d with extproc down: %v\n%s", i, err, out)
		}
		out, err := run("get", "jobs", "-A")
		if err == nil || !(strings.Contains(out, "503") || strings.Contains(out, "ServiceUnavailable") || strings.Contains(out, "the server doesn't have a resource type")) ||
			strings.Contains(out, "(NotFound)") {
			t.Fatalf("kubectl get jobs %d with extproc down: %v\n%s; want the 503 (or, from cp-b's discovery, an unknown type)", i, err, out)
		}
		t.Logf("kubectl get jobs %d with extproc down: %s", i, strings.TrimSpace(out))
	}

	// batch/v1 needs the decision: a 503 Status, every time (cp-b would have said 404).
	hc := e.rawClient(&e.cp.PKI.Admin)
	defer hc.CloseIdleConnections()
	for i := range 6 {
		req, err := http.NewRequestWithContext(ctx, "GET", k.Endpoint()+"/apis/batch/v1/namespaces/default/jobs", nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var st metav1.Status
		err = json.NewDecoder(res.Body).Decode(&st)
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable || err != nil || st.Kind != "Status" || st.Code != http.StatusServiceUnavailable {
			t.Fatalf("batch/v1 jobs %d with extproc down: %d %+v (%v); want a 503 Status", i, res.StatusCode, st, err)
		}
		// No apiserver saw it: clients may retry it (client-go does, by itself).
		if ra := res.Header.Get("Retry-After"); ra != "1" {
			t.Fatalf("batch/v1 jobs %d with extproc down: Retry-After %q, want 1", i, ra)
		}
	}
	_, err = through(&e.cp.PKI.Admin, "").BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("client-go batch/v1 list with extproc down: %v, want ServiceUnavailable", err)
	}
	if f := k.Envoy.MustStat(t, "http.kube_apiserver.ext_proc.kube_mvp.streams_failed"); f == 0 {
		t.Error("no ext_proc stream failed: were the batch/v1 requests decided at all?")
	}
}

// TestWatchOutlivesExtprocRestart: a watch on batch/v1, which only cp-a serves (extproc
// decides where it goes), goes on through an extproc restart and sees what is written after
// it, on a data plane modelling Envoy 1.36, which keeps each ext_proc stream for its request's
// life: extproc ends the stream after its answer, so its restart takes no watch with it. With
// a real Envoy (make test-envoy) it runs on that Envoy's own release.
func TestWatchOutlivesExtprocRestart(t *testing.T) {
	ctx := testutil.Context(t, 4*time.Minute)
	e := newEnv(t, ctx, controlplane.MixedServers()...) // cp-b does not serve batch/v1
	k := e.startKubeMVP(ctx, "front", "", func(o *harness.Options) {
		if harness.UsingStandIn() {
			o.EnvoyVersion = "1.36.7"
		}
	})
	direct := e.adminClient(e.cp.Server("cp-a"))
	job := func(name string) {
		t.Helper()
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
		if _, err := direct.BatchV1().Jobs("default").Create(ctx, j, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := direct.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tc := e.tlsConfig(&e.cp.PKI.Admin)
	tc.NextProtos = []string{"h2"}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}
	req, _ := http.NewRequestWithContext(ctx, "GET", k.Endpoint()+"/apis/batch/v1/namespaces/default/jobs?watch=true&resourceVersion="+list.ResourceVersion, nil)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("watch through kube-mvp: %d %s", res.StatusCode, b)
	}
	type event struct {
		name string
		err  error
	}
	events := make(chan event, 16)
	go func() {
		dec := json.NewDecoder(res.Body)
		for {
			var ev struct {
				Object struct {
					Metadata struct {
						Name string `json:"name"`
					} `json:"metadata"`
				} `json:"object"`
			}
			if err := dec.Decode(&ev); err != nil {
				events <- event{err: err}
				return
			}
			events <- event{name: ev.Object.Metadata.Name}
		}
	}()
	await := func(name string) {
		t.Helper()
		select {
		case ev := <-events:
			if ev.err != nil || ev.name != name {
				t.Fatalf("the watch: %q, %v; want job %s", ev.name, ev.err, name)
			}
		case <-time.After(time.Minute):
			t.Fatalf("the watch did not show job %s within a minute", name)
		}
	}
	job("before-restart")
	await("before-restart")
	if err := k.ReplaceExtproc(ctx, ""); err != nil {
		t.Fatal(err)
	}
	job("after-restart")
	await("after-restart")
}
