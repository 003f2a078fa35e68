//go:build node

package node_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/node"
)

// The release's Deployments in front mode, by component.
var deployments = map[string]string{
	"envoy":      node.Release + "-envoy",
	"xds-server": node.Release + "-xds-server",
}

// components are the keys of deployments, in the order the test goes through them.
var components = []string{"envoy", "xds-server"}

// upgradeVersion stamps the images the helm upgrade step deploys.
const upgradeVersion = "0.0.0-upgrade"

// rolloutInstall are the values TestRollouts installs with besides the defaults: a short
// drain of stopping Envoy pods (the chart's defaults, 5 s and 45 s, would make the test
// minutes longer), long enough for every exec (2 s) and port-forward session to finish.
var rolloutInstall = []string{
	"--set", "envoy.shutdown.delaySeconds=2",
	"--set", "envoy.shutdown.drainSeconds=10",
	"--set", "envoy.terminationGracePeriodSeconds=25",
}

// TestRollouts replaces every pod of the release, one way after another, and renews every
// control-plane certificate, under continuous load through kube-mvp's Service: lists with a
// client certificate and a ServiceAccount token, informers on ConfigMaps and Jobs, kubectl
// exec and kubectl port-forward sessions.
// Each step must cost the clients nothing: no failed list, no watch.Error event, informer
// stores equal to the apiserver's, every exec and port-forward session complete, no pod of
// the release restarted.
func TestRollouts(t *testing.T) {
	began := time.Now()
	in := install(t, node.InstallOptions{Mode: "front", Extra: rolloutInstall})
	ctx := testutil.Context(t, 12*time.Minute)
	installed := time.Since(began)

	// The images of the upgrade, with another version stamp, built while the first steps run.
	upgradeImages := make(chan imagesResult, 1)
	go func() { upgradeImages <- buildUpgradeImages(ctx, filepath.Join(in.dir, "images-upgrade")) }()

	l := in.startRolloutLoad(t, ctx)
	defer l.stop()
	t.Logf("load running %s after the start (install %s)", time.Since(began).Round(time.Second), installed.Round(time.Second))
	l.take() // what happened while the informers synced is no step's

	in.rolloutStep(t, ctx, l, "rollout restart envoy", func() { in.rolloutRestart(t, ctx, deployments["envoy"]) })
	in.rolloutStep(t, ctx, l, "rollout restart xds-server", func() { in.rolloutRestart(t, ctx, deployments["xds-server"]) })
	in.rolloutStep(t, ctx, l, "delete a pod of each", func() {
		for _, component := range components {
			p := in.pods(t, ctx, component)[0]
			if err := in.admin.CoreV1().Pods(node.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Logf("deleted pod %s", p.Name)
		}
	})
	in.rolloutStep(t, ctx, l, "evict every pod", func() {
		for _, component := range components {
			in.evictAll(t, ctx, component)
		}
	})
	var upgraded func()
	in.rolloutStep(t, ctx, l, "helm upgrade", func() { upgraded = in.helmUpgrade(t, ctx, upgradeImages) }, func() { upgraded() })
	// Every role certificate renewed now (the CA Secret annotated, the CronJob's Job run by
	// hand), then xds-server restarted so that Envoy's ADS stream handshakes again.
	in.rolloutStep(t, ctx, l, "forced certgen renewal", func() { in.checkRenewal(t, ctx) })

	final := l.stop()
	t.Logf("after the last step: lists %d ok %d failed; exec %d/%d; port-forward %d/%d; test took %s",
		final.listsOK, final.listsFailed, final.execOK, final.execOK+final.execFailed, final.pfOK, final.pfOK+final.pfFailed, time.Since(began).Round(time.Second))
}

// rolloutStep runs one step under the load, waits until every pod of the release is Ready
// and the replaced ones gone, and the informers converged, then reports and checks what the
// load saw during the step.
func (in *installation) rolloutStep(t *testing.T, ctx context.Context, l *load, name string, run func(), settled ...func()) {
	t.Helper()
	r := in.measureStep(t, ctx, l, name, run, settled...)
	r.check(t, name, nil)
}

// stepResult is what the load saw during a step.
type stepResult struct {
	tally
	coverErr, convergeErr error
}

// measureStep runs one step under the load, waits until every pod of the release is Ready
// and the replaced ones gone, and the informers converged, then reports what the load saw
// during the step and checks that no pod of the release restarted.
func (in *installation) measureStep(t *testing.T, ctx context.Context, l *load, name string, run func(), settled ...func()) stepResult {
	t.Helper()
	before := map[types.UID]int32{}
	for _, component := range components {
		for uid, n := range in.podRestarts(t, ctx, component) {
			before[uid] = n
		}
	}
	start := time.Now()
	run()
	in.waitSettled(t, ctx)
	for _, f := range settled {
		f()
	}
	coverErr := l.covered(ctx, start)
	convergeErr := l.converge(ctx)
	took := time.Since(start)
	r := l.take()

	t.Logf("step %q (%s-%s): lists %d ok %d failed; informers %d lists (%d failed), watches %d "+
		"resumed (%d failed to start, %d ended), %d errors; exec %d/%d; port-forward %d/%d; writes "+
		"%d (%d failed); took %s",

		name, start.Format("15:04:05"), time.Now().Format("15:04:05"), r.listsOK, r.listsFailed+r.informerListsFailed, r.informerLists, r.informerListsFailed,
		r.watchResumed, r.watchStartFailed, r.watchEnded, r.watchErrors,
		r.execOK, r.execOK+r.execFailed, r.pfOK, r.pfOK+r.pfFailed, r.writes, r.writesFailed, took.Round(time.Second))
	if len(r.informerErrs) > 0 {
		t.Logf("step %q: the informers' reflectors reported %q", name, r.informerErrs)
	}
	// No pod of the release restarted: those that lived through the step kept their
	// restart counts, the new ones have none.
	for _, component := range components {
		for _, p := range in.pods(t, ctx, component) {
			var n int32
			for _, c := range p.Status.ContainerStatuses {
				n += c.RestartCount
			}
			if was, ok := before[p.UID]; (ok && n != was) || (!ok && n != 0) {
				t.Errorf("step %q: pod %s restarted (%d restarts, %d before the step)\n%s", name, p.Name, n, was, in.node.PodReport(ctx, node.Namespace))
			}
		}
	}
	return stepResult{tally: r, coverErr: coverErr, convergeErr: convergeErr}
}

// check fails the test for whatever the load lost during the step: a failed list, a
// watch.Error event, informers that did not converge, a failed exec or port-forward session
// or direct write. A failed list or session that tolerated accepts (and the caller reports)
// is not counted; tolerated nil accepts none.
func (r stepResult) check(t *testing.T, name string, tolerated func(failure) bool) {
	t.Helper()
	coverErr, convergeErr := r.coverErr, r.convergeErr
	if tolerated != nil {
		var rest []string
		for _, f := range r.failures {
			if !tolerated(f) {
				rest = append(rest, f.at.Format("15:04:05.000")+" "+f.msg)
			}
		}
		if len(rest) > 0 {
			t.Errorf("step %q: %d of %d failed lists and sessions are not of the tolerated kind: %q", name, len(rest), len(r.failures), rest)
		}
		r.listsFailed, r.informerListsFailed, r.execFailed, r.pfFailed = 0, 0, 0, 0
	}
	if r.listsFailed+r.informerListsFailed > 0 {
		t.Errorf("step %q: %d lists failed (%d ok), first: %q", name, r.listsFailed+r.informerListsFailed, r.listsOK, r.listErrs)
	}
	if r.listsOK == 0 {
		t.Errorf("step %q: no list ran", name)
	}
	if r.watchErrors > 0 {
		t.Errorf("step %q: %d watch.Error events reached the informers, first: %q", name, r.watchErrors, r.watchErrs)
	}
	if coverErr != nil {
		t.Errorf("step %q: %v", name, coverErr)
	}
	if convergeErr != nil {
		t.Errorf("step %q: %v", name, convergeErr)
	}
	if r.execFailed > 0 {
		t.Errorf("step %q: %d of %d exec sessions failed, first: %q", name, r.execFailed, r.execOK+r.execFailed, r.execErrs)
	}
	if r.pfFailed > 0 {
		t.Errorf("step %q: %d of %d port-forward sessions failed, first: %q", name, r.pfFailed, r.pfOK+r.pfFailed, r.pfErrs)
	}
	if r.writesFailed > 0 {
		// Direct writes: not kube-mvp's, but the watches then carried less than meant.
		t.Errorf("step %q: %d direct writes failed: %q", name, r.writesFailed, r.writeErrs)
	}
}

// waitSettled waits until each Deployment of the release has its replicas, all updated and
// Ready, and no other pod: the replaced ones are gone, not merely terminating. It logs what
// it waits for as that changes, and the logs of a pod that stays unready for 15 s.
func (in *installation) waitSettled(t *testing.T, ctx context.Context) {
	t.Helper()
	start := time.Now()
	last := ""
	dumped := map[types.UID]bool{}
	defer func() {
		t.Logf("settled %s after the step's action", time.Since(start).Round(100*time.Millisecond))
	}()
	testutil.WaitFor(t, ctx, 3*time.Minute, "every pod of the release Ready and the replaced ones gone", func() (err error) {
		defer func() {
			if err != nil && err.Error() != last {
				last = err.Error()
				t.Logf("%s: waiting: %s", time.Now().Format("15:04:05.000"), last)
			}
		}()
		for _, component := range components {
			name := deployments[component]
			pods, err := in.admin.CoreV1().Pods(node.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
			if err != nil {
				return err
			}
			for _, p := range pods.Items {
				if podReady(&p) {
					continue
				}
				var unready []string
				for _, c := range p.Status.ContainerStatuses {
					if !c.Ready {
						unready = append(unready, c.Name)
					}
				}
				if p.DeletionTimestamp == nil && time.Since(p.CreationTimestamp.Time) > 15*time.Second && !dumped[p.UID] {
					dumped[p.UID] = true
					in.logPodLogs(t, ctx, &p)
				}
				return fmt.Errorf("pod %s: %s, deleting %t, containers not ready %v", p.Name, p.Status.Phase, p.DeletionTimestamp != nil, unready)
			}
			d, err := in.admin.AppsV1().Deployments(node.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			want := *d.Spec.Replicas
			if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != want || d.Status.ReadyReplicas != want || d.Status.Replicas != want || int32(len(pods.Items)) != want {
				return fmt.Errorf("%s: %d updated, %d ready, %d in all, %d pods, want %d", name, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.Replicas, len(pods.Items), want)
			}
		}
		return nil
	})
}

// logPodLogs logs the last lines of every container of p, to show why it is not Ready.
func (in *installation) logPodLogs(t *testing.T, ctx context.Context, p *corev1.Pod) {
	t.Helper()
	for _, c := range p.Spec.Containers {
		b, err := in.admin.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: new(int64(15)), Timestamps: true}).DoRaw(ctx)
		t.Logf("pod %s (created %s) container %s, unready for 15 s; its log (%v):\n%s", p.Name, p.CreationTimestamp.Format("15:04:05"), c.Name, err, b)
	}
}

// evictAll evicts every pod of a component through the Eviction API as kubectl drain does,
// one at a time: an eviction refused by the PodDisruptionBudget (429) is retried until
// allowed. Each eviction after the first must be refused while the replacement of the one
// before is not Ready: the budget is what keeps one pod serving.
func (in *installation) evictAll(t *testing.T, ctx context.Context, component string) {
	t.Helper()
	pods := in.pods(t, ctx, component)
	if len(pods) < 2 {
		t.Fatalf("%s: %d pods, want at least 2 to evict one at a time", component, len(pods))
	}
	for i, p := range pods {
		start := time.Now()
		var refused, refusedUnready int
		var firstRefusal string
		testutil.WaitFor(t, ctx, 3*time.Minute, "the eviction of "+p.Name, func() error {
			err := in.admin.PolicyV1().Evictions(node.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: node.Namespace}})
			if err == nil {
				return nil
			}
			if !apierrors.IsTooManyRequests(err) {
				t.Fatalf("evicting %s: %v", p.Name, err)
			}
			refused++
			if firstRefusal == "" {
				firstRefusal = err.Error()
			}
			// Was a replacement not Ready when the budget refused?
			list, lerr := in.admin.CoreV1().Pods(node.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
			if lerr == nil {
				ready := 0
				for _, q := range list.Items {
					if podReady(&q) {
						ready++
					}
				}
				if ready < len(pods) {
					refusedUnready++
				}
			}
			return err
		})
		t.Logf("evicted %s after %s: %d refusals by the PodDisruptionBudget (%d while a replacement was not Ready), first %q",
			p.Name, time.Since(start).Round(10*time.Millisecond), refused, refusedUnready, firstRefusal)
		if i > 0 && refusedUnready == 0 {
			t.Errorf("the PodDisruptionBudget of %s let %s be evicted without waiting for the replacement of %s to be Ready", component, p.Name, pods[i-1].Name)
		}
	}
}

type imagesResult struct {
	xdsServer, extproc string // tarballs
	err                error
	took               time.Duration
}

// buildUpgradeImages is `make images` with another version stamp, into dir.
func buildUpgradeImages(ctx context.Context, dir string) imagesResult {
	start := time.Now()
	root, err := controlplane.RepoRoot()
	if err != nil {
		return imagesResult{err: err}
	}
	cmd := exec.CommandContext(ctx, "go", "run", "./tools/images", "-registry", node.TestRegistry, "-arch", runtime.GOARCH, "-version", upgradeVersion, "-out", dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return imagesResult{err: fmt.Errorf("images %s: %w\n%s", upgradeVersion, err, out)}
	}
	return imagesResult{
		xdsServer: filepath.Join(dir, "xds-server-"+runtime.GOARCH+".tar"),
		extproc:   filepath.Join(dir, "extproc-"+runtime.GOARCH+".tar"),
		took:      time.Since(start),
	}
}

// helmUpgrade upgrades the release as an operator would: the same values (--reuse-values)
// with new images and values that change every workload's pods. It returns the check, for
// once the release settled, that every pod runs what the upgrade asked for.
func (in *installation) helmUpgrade(t *testing.T, ctx context.Context, images <-chan imagesResult) (check func()) {
	t.Helper()
	var im imagesResult
	select {
	case im = <-images:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if im.err != nil {
		t.Fatal(im.err)
	}
	for _, tarball := range []string{im.xdsServer, im.extproc} {
		if err := in.node.ImportImage(ctx, tarball); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("images %s built in %s and imported", upgradeVersion, im.took.Round(time.Second))
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	stamp := fmt.Sprint(time.Now().Unix())
	args := []string{"upgrade", node.Release, filepath.Join(root, "deploy", "kube-mvp"),
		"--namespace", node.Namespace, "--kubeconfig", in.node.Kubeconfig, "--reuse-values",
		"--set", "image.xdsServer.tag=" + upgradeVersion, "--set", "image.extproc.tag=" + upgradeVersion,
		"--set-string", "envoy.podAnnotations.rollout-upgrade=" + stamp, "--set-string", "xdsServer.podAnnotations.rollout-upgrade=" + stamp,
		"--set", "envoy.logLevel=debug",
	}
	hctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(hctx, in.Helm, args...)
	cmd.Dir = in.Dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	return func() {
		for _, component := range components {
			for _, p := range in.pods(t, ctx, component) {
				if p.Annotations["rollout-upgrade"] != stamp {
					t.Errorf("pod %s was not replaced by the upgrade (annotations %v)", p.Name, p.Annotations)
				}
				for _, c := range p.Spec.Containers {
					if (c.Name == "xds-server" || c.Name == "extproc") && !strings.HasSuffix(c.Image, ":"+upgradeVersion) {
						t.Errorf("pod %s container %s runs %s, want tag %s", p.Name, c.Name, c.Image, upgradeVersion)
					}
					if c.Name == "envoy" && !slices.Contains(c.Args, "debug") {
						t.Errorf("pod %s: envoy %v, want --log-level debug", p.Name, c.Args)
					}
				}
			}
		}
	}
}
