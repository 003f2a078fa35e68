//go:build node

package node_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/node"
)

var servers = node.DefaultServers

// TestHelmInstallFront installs the chart in front mode (Envoy Deployment behind a Service)
// on a real node and uses kube-mvp through that Service as clients would.
func TestHelmInstallFront(t *testing.T) {
	in := install(t, node.InstallOptions{Mode: "front"})
	ctx := t.Context()
	in.checkPods(t, ctx)
	in.checkIdentities(t, ctx)
	in.checkMixedVersions(t, ctx)
	in.checkExec(t, ctx)
	in.checkOperatorView(t, ctx)
	in.checkPods(t, ctx) // still no restart after all that
}

// TestHelmInstallSidecar installs the chart in sidecar mode (a DaemonSet with hostNetwork on
// the control-plane node, beside its apiserver) and uses kube-mvp through the node's port.
func TestHelmInstallSidecar(t *testing.T) {
	in := install(t, node.InstallOptions{Mode: "sidecar"})
	ctx := t.Context()
	in.checkPods(t, ctx)
	in.checkIdentities(t, ctx)
	in.checkMixedVersions(t, ctx)
	in.checkExec(t, ctx)
	in.checkOperatorView(t, ctx)
	in.checkPods(t, ctx)
}

// TestHelmInstallSidecarKubeadm is sidecar mode presenting the node's own kubeadm
// front-proxy client pair (root:root, key 0600) instead of one the chart holds.
func TestHelmInstallSidecarKubeadm(t *testing.T) {
	in := install(t, node.InstallOptions{Mode: "sidecar", KubeadmPKI: true})
	ctx := t.Context()
	in.checkPods(t, ctx)
	in.checkIdentities(t, ctx)
	in.checkMixedVersions(t, ctx)
	in.checkPods(t, ctx)
}

// installation is a node with kube-mvp installed by Helm.
type installation struct {
	node    *node.Node
	admin   *kubernetes.Clientset
	dir     string
	busybox string
	kubectl string
	*node.Installed
}

func install(t *testing.T, opts node.InstallOptions) *installation {
	t.Helper()
	return installWith(t, opts, nil)
}

// installWith is install with more image tarballs imported into the node before the install.
func installWith(t *testing.T, opts node.InstallOptions, moreImages []string) *installation {
	t.Helper()
	if testing.Short() {
		t.Skip("a real node takes minutes")
	}
	if err := node.Missing(); err != nil {
		t.Fatalf("this machine cannot run the test node: %v (.ci/run installs what is missing)", err)
	}
	ctx := t.Context()
	log := testLog{t}
	dir := t.TempDir()
	tarballs, busybox, err := node.BuildImages(ctx, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := controlplane.EnsureKubectl(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(ctx, node.Options{Servers: servers, ControlPlane: opts.Mode == "sidecar", Log: log, Images: append(tarballs, moreImages...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	admin, err := n.Client()
	if err != nil {
		t.Fatal(err)
	}
	installed, err := n.Install(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &installation{node: n, admin: admin, dir: dir, busybox: busybox, kubectl: kubectl, Installed: installed}
}

// checkPods: every pod of the release runs Ready and never restarted, and nothing had to
// wait for a Secret the certgen hook makes.
func (in *installation) checkPods(t *testing.T, ctx context.Context) {
	t.Helper()
	pods, err := in.admin.CoreV1().Pods(node.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded {
			continue // a certgen Job's pod
		}
		running++
		for _, c := range p.Status.ContainerStatuses {
			if !c.Ready || c.RestartCount != 0 {
				t.Errorf("pod %s container %s: ready=%t restarts=%d\n%s", p.Name, c.Name, c.Ready, c.RestartCount, in.node.PodReport(ctx, node.Namespace))
			}
		}
	}
	if running == 0 {
		t.Fatalf("no pod of the release runs")
	}
	// The API server accepted the chart's NetworkPolicy and PodDisruptionBudgets (the
	// bridge CNI enforces no policy: nothing here shows what it admits).
	policies, err := in.admin.NetworkingV1().NetworkPolicies(node.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(policies.Items) == 0 {
		t.Errorf("no NetworkPolicy of the release: %v", err)
	}
	pdbs, err := in.admin.PolicyV1().PodDisruptionBudgets(node.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(pdbs.Items) == 0 {
		t.Errorf("no PodDisruptionBudget of the release: %v", err)
	}
	events, err := in.admin.CoreV1().Events(node.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning && (e.Reason == "FailedMount" || e.Reason == "BackOff" || e.Reason == "Failed") {
			t.Errorf("event %s %s/%s: %s", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
		}
	}
}

// client is a client of kube-mvp (through its Service or node port) with the given
// credentials; direct is the same client of the first apiserver.
func (in *installation) client(t *testing.T, cfg rest.Config, through bool) *kubernetes.Clientset {
	t.Helper()
	cfg.CAData = in.node.CP.PKI.ServerCA.CertPEM
	if through {
		cfg.Host = "https://" + in.Endpoint
		cfg.ServerName = in.ServerName
	} else {
		cfg.Host = in.node.RESTConfig().Host
	}
	c, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkIdentities: a client certificate, a ServiceAccount token and an anonymous request are
// each seen through kube-mvp exactly as the apiserver sees them directly.
func (in *installation) checkIdentities(t *testing.T, ctx context.Context) {
	t.Helper()
	cert, err := in.node.CP.PKI.ClientCert("alice", "team-a", "team-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.admin.CoreV1().ServiceAccounts("default").Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tester"}}, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token, err := in.node.CP.Server(servers[0].Name).ServiceAccountToken(ctx, "default", "tester")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  rest.Config
	}{
		{"client certificate", rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: cert.CertPEM, KeyData: cert.KeyPEM}}},
		{"ServiceAccount token", rest.Config{BearerToken: token}},
		{"anonymous", rest.Config{}},
	} {
		direct, derr := selfSubjectReview(ctx, in.client(t, c.cfg, false))
		via, verr := selfSubjectReview(ctx, in.client(t, c.cfg, true))
		if fmt.Sprint(derr) != fmt.Sprint(verr) || !reflect.DeepEqual(direct, via) {
			t.Errorf("%s: through kube-mvp %+v (%v), directly %+v (%v)", c.name, via, verr, direct, derr)
			continue
		}
		t.Logf("%s: %+v %v, as directly", c.name, via, verr)
	}
}

func selfSubjectReview(ctx context.Context, c *kubernetes.Clientset) (authenticationv1.UserInfo, error) {
	r, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

// checkMixedVersions: batch/v1, which only cp-a serves, answers every list through kube-mvp,
// while cp-b alone answers 404.
func (in *installation) checkMixedVersions(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := in.node.CP.Server(servers[1].Name).Client(); err != nil {
		t.Fatal(err)
	}
	onlyB, _ := in.node.CP.Server(servers[1].Name).Client()
	if _, err := onlyB.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("cp-b should not serve batch/v1, got %v", err)
	}
	admin := in.client(t, rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: in.node.CP.PKI.Admin.CertPEM, KeyData: in.node.CP.PKI.Admin.KeyPEM}}, true)
	// kube-mvp learns the apiservers from their Leases and discovery: wait until it has.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := admin.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch/v1 through kube-mvp: %v", err)
		}
		time.Sleep(time.Second)
	}
	failed := 0
	for range 60 {
		if _, err := admin.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); err != nil {
			failed++
			t.Logf("list jobs: %v", err)
		}
		if _, err := admin.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
			failed++
			t.Logf("list configmaps: %v", err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of 120 lists through kube-mvp failed", failed)
	}
}

// checkExec: kubectl exec into a pod on the node, through kube-mvp.
func (in *installation) checkExec(t *testing.T, ctx context.Context) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers:  []corev1.Container{{Name: "sleeper", Image: in.busybox, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}},
			Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	if _, err := in.admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := in.admin.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod sleeper not running: %v\n%s", err, in.node.PodReport(ctx, "default"))
		}
		time.Sleep(time.Second)
	}
	kubeconfig := filepath.Join(in.dir, "through-kube-mvp.kubeconfig")
	if err := in.node.CP.WriteKubeconfigFor(kubeconfig, "https://"+in.Endpoint); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, in.kubectl, "--kubeconfig", kubeconfig, "--tls-server-name", in.ServerName,
		"exec", "-n", "default", "sleeper", "--", "sh", "-c", "echo hello from $(hostname)").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello from sleeper" {
		t.Fatalf("kubectl exec through kube-mvp: %v: %q", err, out)
	}
}

// checkOperatorView runs kubectl mvp as an operator would, with the admin kubeconfig, on the
// installed release: status through the pod proxy, config-dump through a real kubelet's
// port-forward to each Envoy pod's loopback admin; once the data plane settled, every
// resource of every Envoy is what xds-server holds (config-dump --exit-code).
func (in *installation) checkOperatorView(t *testing.T, ctx context.Context) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(in.dir, "kubectl-mvp")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kubectl-mvp")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kubectl-mvp: %v\n%s", err, out)
	}
	mvp := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", in.node.Kubeconfig, "-n", node.Namespace)...).CombinedOutput()
		return string(out), err
	}
	// Every Envoy pod is listed, acknowledging its configuration, whichever of the two
	// xds-server replicas it is connected to.
	envoys, err := in.admin.CoreV1().Pods(node.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=envoy"})
	if err != nil || len(envoys.Items) == 0 {
		t.Fatalf("Envoy pods: %v (%d)", err, len(envoys.Items))
	}
	listed := func(out string) error {
		for _, p := range envoys.Items {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(p.Name) + ` .* ACK `).MatchString(out) {
				return fmt.Errorf("Envoy pod %s not listed with ACK", p.Name)
			}
		}
		return nil
	}
	var out string
	deadline := time.Now().Add(time.Minute)
	for {
		out, err = mvp("status")
		if err == nil {
			err = listed(out)
		}
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil || !strings.Contains(out, servers[0].Name) || !strings.Contains(out, servers[1].Name) {
		t.Errorf("kubectl mvp status: %v\n%s", err, out)
	}
	t.Logf("kubectl mvp status:\n%s", out)
	// A new Lease or discovery may change the configuration between the two reads.
	deadline = time.Now().Add(time.Minute)
	for {
		out, err = mvp("config-dump", "--exit-code")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil || !strings.Contains(out, "equal") {
		t.Errorf("kubectl mvp config-dump --exit-code: %v\n%s", err, out)
	}
	t.Logf("kubectl mvp config-dump:\n%s", out)
}

type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
