//go:build node

package node_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/node"
	"github.com/kube-mvp/kube-mvp/test/skew"
)

// The release TestUpgradeFromOld upgrades from: the first commit test/skew found to
// interoperate with this one in every rollout state (test/skew/README.md).
const (
	oldCommit  = "2fddc4c"
	oldVersion = "0.0.0-" + oldCommit
)

// timedOut are a session that hung until the load's timeout (20 s): kubectl killed, or no
// Forwarding line. Only a session begun while an old Envoy pod terminated may end so.
var timedOut = regexp.MustCompile(`signal: killed|context deadline exceeded`)

// undrainedExit are the errors a client sees when an Envoy pod exits with requests in
// flight and connections open, or while kube-proxy still sends new connections to it: what
// the old chart's Envoy pods (no preStop drain) may cost while they terminate. kubectl words
// a refused connection as "The connection to the server HOST:443 was refused".
var undrainedExit = regexp.MustCompile(`connection refused|to the server [^ ]+ was refused|EOF|connection reset by peer|broken ` +
	`pipe|http2: client connection lost|abnormal closure|use of closed network connection|lost ` +
	`connection to pod`)

// TestUpgradeFromOld installs the chart and images of an older commit (oldCommit: its own
// deploy/kube-mvp, its own tools/images), starts the load of TestRollouts through the
// Service, and upgrades with `helm upgrade` to this checkout's chart and images, then once
// more to images of another version stamp. The old Envoy pods have no preStop drain, so the
// first upgrade may cut what they carry as they exit: each failed list or session of that
// step must be of the kinds an undrained exit causes (undrainedExit) and end while an old
// Envoy pod terminated (or within 3 s after it was gone), or be a session begun then that
// hung until its timeout (timedOut); they are counted and reported. The
// second upgrade replaces pods of this checkout's chart, which drain: it must cost nothing.
// Identities through kube-mvp equal the apiserver's before, between and after; no pod of the
// release restarts.
func TestUpgradeFromOld(t *testing.T) {
	began := time.Now()
	rel, err := skew.EnsureOldRelease(t.Context(), oldCommit, node.TestRegistry, oldVersion, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-mvp %.7s: chart and images %s (built in %s, from the cache: %t)", rel.Commit, rel.Version, rel.BuildTime.Round(100*time.Millisecond), rel.FromCache)
	// The old chart knows no envoy.shutdown.*: it installs with its defaults.
	in := installWith(t, node.InstallOptions{Mode: "front", ChartDir: rel.Chart, ImageTag: rel.Version}, []string{rel.XDSServer, rel.Extproc})
	ctx := testutil.Context(t, 10*time.Minute)
	installed := time.Since(began)
	in.checkImages(t, ctx, rel.Version)
	in.checkIdentities(t, ctx)

	// The images of the second upgrade, built while the first runs.
	upgradeImages := make(chan imagesResult, 1)
	go func() { upgradeImages <- buildUpgradeImages(ctx, filepath.Join(in.dir, "images-upgrade")) }()

	l := in.startRolloutLoad(t, ctx)
	defer l.stop()
	t.Logf("load running %s after the start (install of %.7s %s)", time.Since(began).Round(time.Second), rel.Commit, installed.Round(time.Second))
	l.take()

	// Step 1: from the old release to this checkout's chart and images.
	name := "helm upgrade from " + oldCommit
	var envoys, xdsServers func() []termination
	r := in.measureStep(t, ctx, l, name, func() {
		envoys, xdsServers = in.trackTerminations(ctx, "envoy"), in.trackTerminations(ctx, "xds-server")
		in.upgradeFromOld(t, ctx, rel)
	}, func() { in.checkImages(t, ctx, chartAppVersion(t)) })
	// Sessions still running began during the step: wait until they ended (execs and
	// port-forwards run one after another) and count them in this step.
	if err := l.covered(ctx, time.Now()); err != nil {
		t.Errorf("step %q: %v", name, err)
	}
	r.merge(l.take())
	windows := envoys()
	for _, w := range windows {
		t.Logf("step %q: old Envoy pod %s (%s) terminating %s-%s", name, w.pod, w.ip, w.began.Format("15:04:05.000"), w.gone.Format("15:04:05.000"))
	}
	for _, w := range xdsServers() {
		t.Logf("step %q: old xds-server pod %s (%s) terminating %s-%s", name, w.pod, w.ip, w.began.Format("15:04:05.000"), w.gone.Format("15:04:05.000"))
	}
	var cut, hung []string
	during := func(at time.Time, w termination) bool {
		return !at.Before(w.began) && !at.After(w.gone.Add(3*time.Second))
	}
	r.check(t, name, func(f failure) bool {
		for _, w := range windows {
			switch {
			case undrainedExit.MatchString(f.msg) && during(f.at, w):
				cut = append(cut, f.at.Format("15:04:05.000")+" "+f.msg)
				return true
			case timedOut.MatchString(f.msg) && during(f.began, w):
				hung = append(hung, f.at.Format("15:04:05.000")+" "+f.msg)
				return true
			}
		}
		return false
	})
	t.Logf("step %q: %d lists or sessions cut by an old Envoy pod's undrained exit, %d begun then that hung until their timeout (of %d failures): %q %q",
		name, len(cut), len(hung), len(r.failures), cut, hung)
	in.checkIdentities(t, ctx)

	// Step 2: the pods of this checkout's chart drain; replacing them loses nothing.
	var upgraded func()
	in.rolloutStep(t, ctx, l, "helm upgrade (drained pods)", func() { upgraded = in.helmUpgrade(t, ctx, upgradeImages) }, func() { upgraded() })
	in.checkIdentities(t, ctx)

	final := l.stop()
	t.Logf("after the last step: lists %d ok %d failed; exec %d/%d; port-forward %d/%d; test took %s",
		final.listsOK, final.listsFailed, final.execOK, final.execOK+final.execFailed, final.pfOK, final.pfOK+final.pfFailed, time.Since(began).Round(time.Second))
}

// upgradeFromOld runs `helm upgrade` from the old release to this checkout's chart, with its
// images (the chart's appVersion, imported by install) and TestRollouts' short drain.
//
// The values: --reuse-values, as operators upgrade: Helm renders the new templates with the
// values of the old release, the old chart's defaults included, so what this chart added is
// absent and the templates fall back to values.yaml's defaults.
func (in *installation) upgradeFromOld(t *testing.T, ctx context.Context, rel skew.OldRelease) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	helm := func(values string, extra ...string) ([]byte, error) {
		args := append([]string{"upgrade", node.Release, filepath.Join(root, "deploy", "kube-mvp"),
			"--namespace", node.Namespace, "--kubeconfig", in.node.Kubeconfig, values,
			"--set", "image.xdsServer.tag=", "--set", "image.extproc.tag=",
		}, rolloutInstall...)
		cmd := exec.CommandContext(hctx, in.Helm, append(args, extra...)...)
		cmd.Dir = in.Dir
		return cmd.CombinedOutput()
	}
	start := time.Now()
	out, err := helm("--reuse-values")
	if err != nil {
		t.Fatalf("helm upgrade from %.7s: %v\n%s", rel.Commit, err, out)
	}
	t.Logf("helm upgrade --reuse-values from %.7s to this checkout: %s", rel.Commit, time.Since(start).Round(100*time.Millisecond))
}

// chartAppVersion is this checkout's chart's appVersion: the tag of the images
// node.BuildImages builds.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "kube-mvp", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Chart.yaml: no appVersion")
	}
	return string(m[1])
}

// checkImages: every pod of the release runs xds-server and extproc images tagged tag.
func (in *installation) checkImages(t *testing.T, ctx context.Context, tag string) {
	t.Helper()
	for _, component := range components {
		pods := in.pods(t, ctx, component)
		if len(pods) == 0 {
			t.Errorf("no %s pod runs", component)
		}
		for _, p := range pods {
			for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
				if (c.Name == "xds-server" || c.Name == "extproc") && c.Image != node.TestRegistry+"/"+c.Name+":"+tag {
					t.Errorf("pod %s container %s runs %s, want tag %s", p.Name, c.Name, c.Image, tag)
				}
			}
		}
	}
}

// termination is when a pod was deleted (its deletionTimestamp less its grace period: whole
// seconds, so up to 1 s early) and when it was seen gone (polled every 100 ms).
type termination struct {
	pod, ip     string
	began, gone time.Time
}

// trackTerminations follows the pods of component that run now until each is gone; the
// returned function stops following and returns what was seen (a pod still there is gone
// "now"). It observes, it asserts nothing.
func (in *installation) trackTerminations(ctx context.Context, component string) func() []termination {
	list, err := in.admin.CoreV1().Pods(node.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
	var mu sync.Mutex
	seen := map[types.UID]*termination{}
	if err == nil {
		for _, p := range list.Items {
			seen[p.UID] = &termination{pod: p.Name, ip: p.Status.PodIP}
		}
	}
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for tctx.Err() == nil {
			list, err := in.admin.CoreV1().Pods(node.Namespace).List(tctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
			if err == nil {
				now := time.Now()
				present := map[types.UID]bool{}
				mu.Lock()
				pending := 0
				for _, p := range list.Items {
					present[p.UID] = true
					if w := seen[p.UID]; w != nil && w.began.IsZero() && p.DeletionTimestamp != nil {
						grace := time.Duration(0)
						if p.DeletionGracePeriodSeconds != nil {
							grace = time.Duration(*p.DeletionGracePeriodSeconds) * time.Second
						}
						w.began = p.DeletionTimestamp.Add(-grace)
					}
				}
				for uid, w := range seen {
					if w.gone.IsZero() && !present[uid] {
						w.gone = now
						if w.began.IsZero() {
							w.began = now // deleted between two polls
						}
					}
					if w.gone.IsZero() {
						pending++
					}
				}
				mu.Unlock()
				if pending == 0 {
					return
				}
			}
			sleep(tctx, 100*time.Millisecond)
		}
	}()
	return func() []termination {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		var out []termination
		for _, w := range seen {
			if w.gone.IsZero() {
				w.gone = time.Now()
			}
			if w.began.IsZero() {
				w.began = w.gone
			}
			out = append(out, *w)
		}
		slices.SortFunc(out, func(a, b termination) int { return a.began.Compare(b.began) })
		return out
	}
}
