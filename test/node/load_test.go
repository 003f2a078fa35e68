//go:build node

package node_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// loadNS holds what the load uses besides the lists (which go to default, as
// checkMixedVersions's do): the exec and port-forward pods, the ConfigMaps and Jobs the
// informers watch, and the ServiceAccount of the token client.
const loadNS = "rollout-load"

// maxErrs is how many errors of each kind a tally keeps.
const maxErrs = 5

// tally counts what the load saw since the last take.
type tally struct {
	listsOK, listsFailed int
	listErrs             []string
	// informerLists are the informers' initial lists and relists: ListFunc calls and
	// watches with sendInitialEvents (client-go's streaming list, on by default).
	informerLists, informerListsFailed int
	// watchResumed are watches started from a resourceVersion without a list before them:
	// the reflector resuming after a watch ended.
	watchResumed, watchStartFailed, watchEnded int
	// watchErrors are watch.Error events the watches surfaced to the informers.
	watchErrors int
	watchErrs   []string
	// informerErrs are what the reflectors reported (list and watch failures).
	informerErrs         []string
	execOK, execFailed   int
	execErrs             []string
	pfOK, pfFailed       int
	pfErrs               []string
	writes, writesFailed int
	writeErrs            []string
	// failures are every failed list, informer list, exec and port-forward session, with
	// when it failed (the *Errs keep only the first few).
	failures []failure
}

// failure is one failed request or session of the load: when it began and when it failed.
type failure struct {
	began, at time.Time
	msg       string
}

// merge adds what b counted to t (the counts a step's checks read, and the failures).
func (t *tally) merge(b tally) {
	t.listsOK += b.listsOK
	t.listsFailed += b.listsFailed
	t.listErrs = append(t.listErrs, b.listErrs...)
	t.informerLists += b.informerLists
	t.informerListsFailed += b.informerListsFailed
	t.watchResumed += b.watchResumed
	t.watchStartFailed += b.watchStartFailed
	t.watchEnded += b.watchEnded
	t.watchErrors += b.watchErrors
	t.watchErrs = append(t.watchErrs, b.watchErrs...)
	t.informerErrs = append(t.informerErrs, b.informerErrs...)
	t.execOK += b.execOK
	t.execFailed += b.execFailed
	t.execErrs = append(t.execErrs, b.execErrs...)
	t.pfOK += b.pfOK
	t.pfFailed += b.pfFailed
	t.pfErrs = append(t.pfErrs, b.pfErrs...)
	t.writes += b.writes
	t.writesFailed += b.writesFailed
	t.writeErrs = append(t.writeErrs, b.writeErrs...)
	t.failures = append(t.failures, b.failures...)
}

// load is continuous load through kube-mvp's Service: lists with a client certificate and
// a ServiceAccount token, informers on ConfigMaps and Jobs, kubectl exec sessions and
// kubectl port-forward sessions. Its counts are taken per step (take).
type load struct {
	t          *testing.T
	in         *installation
	start      time.Time
	kubeconfig string
	cancel     context.CancelFunc
	wg         sync.WaitGroup

	mu  sync.Mutex
	cur tally
	// lastExec and lastPortForward are when the last session of each kind to end began.
	lastExec, lastPortForward time.Time

	// writeMu is held by the writer for each write; converge holds it so that the stores
	// can be compared with a list that does not move.
	writeMu   sync.Mutex
	informers map[string]cache.SharedIndexInformer // ConfigMaps, Jobs
}

// add changes the current tally under the lock.
func (l *load) add(f func(*tally)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.cur)
}

// note appends a timestamped error to errs unless it holds maxErrs already.
func (l *load) note(errs *[]string, format string, args ...any) {
	if len(*errs) < maxErrs {
		*errs = append(*errs, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
	}
}

// take returns what was counted since the last take and starts counting anew.
func (l *load) take() tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.cur
	l.cur = tally{}
	return t
}

// startRolloutLoad prepares the load's namespace, pods, credentials and informers and starts
// every generator; stop it with stop.
func (in *installation) startRolloutLoad(t *testing.T, ctx context.Context) *load {
	t.Helper()
	l := &load{t: t, in: in, start: time.Now()}
	setup, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	// The namespace, a ServiceAccount that may read default (for the token client) and the
	// two pods.
	if _, err := in.admin.CoreV1().Namespaces().Create(setup, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: loadNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := in.admin.CoreV1().ServiceAccounts(loadNS).Create(setup,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "lister"}}, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "rollout-load-view", Namespace: "default"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "lister", Namespace: loadNS}},
	}
	if _, err := in.admin.RbacV1().RoleBindings("default").Create(setup, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tolerations := []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
	for _, p := range []*corev1.Pod{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "shell", Namespace: loadNS},
			Spec: corev1.PodSpec{
				Containers:  []corev1.Container{{Name: "shell", Image: in.busybox, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}},
				Tolerations: tolerations,
			},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: loadNS},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{
					Name: "web", Image: in.busybox, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", "mkdir -p /tmp/www && echo hello-through-kube-mvp > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"},
					Ports:   []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
						PeriodSeconds: 1,
					},
				}},
				Tolerations: tolerations,
			},
		},
	} {
		if _, err := in.admin.CoreV1().Pods(loadNS).Create(setup, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	token, err := in.node.CP.Server(servers[0].Name).ServiceAccountToken(setup, loadNS, "lister")
	if err != nil {
		t.Fatal(err)
	}
	l.kubeconfig = filepath.Join(in.dir, "rollout-through-kube-mvp.kubeconfig")
	if err := in.node.CP.WriteKubeconfigFor(l.kubeconfig, "https://"+in.Endpoint); err != nil {
		t.Fatal(err)
	}
	certClient := in.client(t, rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: in.node.CP.PKI.Admin.CertPEM, KeyData: in.node.CP.PKI.Admin.KeyPEM}}, true)
	tokenClient := in.client(t, rest.Config{BearerToken: token}, true)
	// kube-mvp learns the apiservers from their Leases and discovery, and both apiservers
	// the RoleBinding: wait until both clients list Jobs through it.
	testutil.WaitFor(t, setup, 2*time.Minute, "Jobs and ConfigMaps listed through kube-mvp with both credentials", func() error {
		for _, c := range []*kubernetes.Clientset{certClient, tokenClient} {
			if _, err := c.BatchV1().Jobs("default").List(setup, metav1.ListOptions{}); err != nil {
				return err
			}
			if _, err := c.CoreV1().ConfigMaps("default").List(setup, metav1.ListOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	testutil.WaitFor(t, setup, 2*time.Minute, "the pods shell and web Ready", func() error {
		for _, name := range []string{"shell", "web"} {
			p, err := in.admin.CoreV1().Pods(loadNS).Get(setup, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podReady(p) {
				return fmt.Errorf("pod %s: %s, not Ready", name, p.Status.Phase)
			}
		}
		return nil
	})

	// Objects for the watches to carry from the start, then the informers, through kube-mvp
	// with the client certificate.
	for i := range 3 {
		l.writeConfigMap(setup, i)
		l.writeJob(setup, i)
	}
	if w := l.take(); w.writesFailed > 0 {
		t.Fatalf("seeding the watched objects: %v", w.writeErrs)
	}
	runCtx, stop := context.WithCancel(ctx)
	l.cancel = stop
	l.informers = map[string]cache.SharedIndexInformer{
		"ConfigMaps": cache.NewSharedIndexInformer(l.listWatch("ConfigMaps",
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return certClient.CoreV1().ConfigMaps(loadNS).List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return certClient.CoreV1().ConfigMaps(loadNS).Watch(ctx, o)
			}), &corev1.ConfigMap{}, 0, cache.Indexers{}),
		"Jobs": cache.NewSharedIndexInformer(l.listWatch("Jobs",
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return certClient.BatchV1().Jobs(loadNS).List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return certClient.BatchV1().Jobs(loadNS).Watch(ctx, o)
			}), &batchv1.Job{}, 0, cache.Indexers{}),
	}
	for kind, inf := range l.informers {
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			l.add(func(t *tally) { l.note(&t.informerErrs, "%s: %v", kind, err) })
		}); err != nil {
			t.Fatal(err)
		}
		l.wg.Go(func() { inf.RunWithContext(runCtx) })
	}
	testutil.WaitFor(t, setup, time.Minute, "the informers synced", func() error {
		for kind, inf := range l.informers {
			if !inf.HasSynced() {
				return fmt.Errorf("%s not synced", kind)
			}
		}
		return nil
	})

	l.wg.Go(func() { l.lists(runCtx, "client certificate", certClient) })
	l.wg.Go(func() { l.lists(runCtx, "ServiceAccount token", tokenClient) })
	l.wg.Go(func() { l.writer(runCtx) })
	l.wg.Go(func() { l.execs(runCtx) })
	l.wg.Go(func() { l.portForwards(runCtx) })
	return l
}

// stop ends every generator and waits for them (each is bounded by its own timeouts).
func (l *load) stop() tally {
	l.cancel()
	l.wg.Wait()
	return l.take()
}

// lists lists Jobs (only cp-a serves batch/v1) and ConfigMaps in default, each every 50 ms.
func (l *load) lists(ctx context.Context, who string, c *kubernetes.Clientset) {
	for i := 0; ctx.Err() == nil; i++ {
		began := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var err error
		what := "Jobs"
		if i%2 == 0 {
			_, err = c.BatchV1().Jobs("default").List(rctx, metav1.ListOptions{})
		} else {
			what = "ConfigMaps"
			_, err = c.CoreV1().ConfigMaps("default").List(rctx, metav1.ListOptions{})
		}
		cancel()
		if ctx.Err() != nil {
			return // stopped: the request was cancelled by the test, not failed
		}
		l.add(func(t *tally) {
			if err != nil {
				t.listsFailed++
				l.note(&t.listErrs, "list %s (%s): %v", what, who, err)
				t.failures = append(t.failures, failure{began, time.Now(), fmt.Sprintf("list %s (%s): %v", what, who, err)})
			} else {
				t.listsOK++
			}
		})
		sleep(ctx, 50*time.Millisecond)
	}
}

// listWatch is a ListWatch through c that counts lists, watch starts and watch.Error events.
func (l *load) listWatch(kind string, list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	var afterList atomic.Bool // the next plain watch follows a list: not a resumption
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			began := time.Now()
			obj, err := list(ctx, o)
			l.add(func(t *tally) {
				t.informerLists++
				if err != nil && ctx.Err() == nil {
					t.informerListsFailed++
					l.note(&t.listErrs, "informer list %s: %v", kind, err)
					t.failures = append(t.failures, failure{began, time.Now(), fmt.Sprintf("informer list %s: %v", kind, err)})
				}
			})
			afterList.Store(err == nil)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			streamingList := o.SendInitialEvents != nil && *o.SendInitialEvents
			began := time.Now()
			w, err := watchFn(ctx, o)
			l.add(func(t *tally) {
				switch {
				case streamingList:
					t.informerLists++
					if err != nil && ctx.Err() == nil {
						t.informerListsFailed++
						l.note(&t.listErrs, "informer streaming list %s: %v", kind, err)
						t.failures = append(t.failures, failure{began, time.Now(), fmt.Sprintf("informer streaming list %s: %v", kind, err)})
					}
				case err != nil:
					if ctx.Err() == nil {
						t.watchStartFailed++
						l.note(&t.informerErrs, "watch %s from %s: %v", kind, o.ResourceVersion, err)
					}
				case afterList.Swap(false):
				default:
					t.watchResumed++
				}
			})
			if err != nil {
				return nil, err
			}
			return l.countingWatch(ctx, kind, w), nil
		},
	}
}

// countingWatch passes inner's events on, counting watch.Error events and ends the test did
// not ask for.
func (l *load) countingWatch(ctx context.Context, kind string, inner watch.Interface) watch.Interface {
	w := &countedWatch{inner: inner, out: make(chan watch.Event), stopped: make(chan struct{})}
	go func() {
		defer close(w.out)
		for {
			select {
			case ev, ok := <-inner.ResultChan():
				if !ok {
					select {
					case <-w.stopped:
					default:
						if ctx.Err() == nil {
							l.add(func(t *tally) { t.watchEnded++ })
						}
					}
					return
				}
				if ev.Type == watch.Error {
					err := apierrors.FromObject(ev.Object)
					l.add(func(t *tally) {
						t.watchErrors++
						l.note(&t.watchErrs, "watch %s: watch.Error event: %v", kind, err)
					})
				}
				select {
				case w.out <- ev:
				case <-w.stopped:
					return
				}
			case <-w.stopped:
				return
			}
		}
	}()
	return w
}

type countedWatch struct {
	inner   watch.Interface
	out     chan watch.Event
	stopped chan struct{}
	once    sync.Once
}

func (w *countedWatch) Stop() {
	w.once.Do(func() {
		close(w.stopped)
		w.inner.Stop()
	})
}

func (w *countedWatch) ResultChan() <-chan watch.Event { return w.out }

// writer changes the watched objects directly (not through kube-mvp) every 200 ms: a
// ConfigMap each time (created, updated, now and then deleted), a Job every tenth.
func (l *load) writer(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		l.writeMu.Lock()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if i%10 == 9 {
			l.writeJob(wctx, i/10)
		} else {
			l.writeConfigMap(wctx, i)
		}
		cancel()
		l.writeMu.Unlock()
		sleep(ctx, 200*time.Millisecond)
	}
}

// writeConfigMap updates (or creates) ConfigMap load-(i mod 6), or deletes it every
// seventh time.
func (l *load) writeConfigMap(ctx context.Context, i int) {
	c := l.in.admin.CoreV1().ConfigMaps(loadNS)
	name := fmt.Sprintf("load-%d", i%6)
	var err error
	if i%7 == 6 {
		err = c.Delete(ctx, name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			err = nil
		}
	} else {
		patch := fmt.Appendf(nil, `{"data":{"n":"%d"}}`, i)
		_, err = c.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			_, err = c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"n": fmt.Sprint(i)}}, metav1.CreateOptions{})
		}
	}
	l.wrote(ctx, "ConfigMap "+name, err)
}

// writeJob annotates (or creates) the suspended Job load-(i mod 3): no pod ever runs.
func (l *load) writeJob(ctx context.Context, i int) {
	c := l.in.admin.BatchV1().Jobs(loadNS)
	name := fmt.Sprintf("load-%d", i%3)
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"kube-mvp.test/n":"%d"}}}`, i)
	_, err := c.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: batchv1.JobSpec{
				Suspend: new(true),
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "never", Image: l.in.busybox, ImagePullPolicy: corev1.PullNever, Command: []string{"true"}}},
				}},
			},
		}
		_, err = c.Create(ctx, job, metav1.CreateOptions{})
	}
	l.wrote(ctx, "Job "+name, err)
}

func (l *load) wrote(ctx context.Context, what string, err error) {
	if ctx.Err() != nil && err != nil {
		return
	}
	l.add(func(t *tally) {
		t.writes++
		if err != nil {
			t.writesFailed++
			l.note(&t.writeErrs, "%s: %v", what, err)
		}
	})
}

// covered waits until an exec and a port-forward session that began after since have
// ended, so that every step's counts hold sessions that overlapped it.
func (l *load) covered(ctx context.Context, since time.Time) error {
	return testutil.Until(ctx, 45*time.Second, "an exec and a port-forward session begun during the step to end", func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.lastExec.After(since) || !l.lastPortForward.After(since) {
			return fmt.Errorf("the last sessions to end began at %s (exec) and %s (port-forward)", l.lastExec.Format("15:04:05.000"), l.lastPortForward.Format("15:04:05.000"))
		}
		return nil
	})
}

// converge pauses the writer and waits until every informer's store holds exactly what a
// direct list of the first apiserver returns (names and resourceVersions): no event lost.
func (l *load) converge(ctx context.Context) error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	return testutil.Until(ctx, 30*time.Second, "the informers' stores to equal a direct list", func() error {
		var direct []metav1.Object
		if list, err := l.in.admin.CoreV1().ConfigMaps(loadNS).List(ctx, metav1.ListOptions{}); err != nil {
			return err
		} else {
			for i := range list.Items {
				direct = append(direct, &list.Items[i])
			}
		}
		if err := sameObjects("ConfigMaps", l.informers["ConfigMaps"].GetStore().List(), direct); err != nil {
			return err
		}
		direct = nil
		if list, err := l.in.admin.BatchV1().Jobs(loadNS).List(ctx, metav1.ListOptions{}); err != nil {
			return err
		} else {
			for i := range list.Items {
				direct = append(direct, &list.Items[i])
			}
		}
		return sameObjects("Jobs", l.informers["Jobs"].GetStore().List(), direct)
	})
}

func sameObjects(kind string, store []any, direct []metav1.Object) error {
	key := func(o metav1.Object) string { return o.GetName() + "@" + o.GetResourceVersion() }
	var have, want []string
	for _, o := range store {
		have = append(have, key(o.(metav1.Object)))
	}
	for _, o := range direct {
		want = append(want, key(o))
	}
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) {
		return fmt.Errorf("%s: the informer holds %v, a direct list %v", kind, have, want)
	}
	return nil
}

// execs runs `kubectl exec` sessions through kube-mvp one after another, each of which must
// print done after two seconds and exit 0.
func (l *load) execs(ctx context.Context) {
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		cmd := exec.CommandContext(sctx, l.in.kubectl, "--kubeconfig", l.kubeconfig, "--tls-server-name", l.in.ServerName,
			"exec", "-n", loadNS, "shell", "--", "sh", "-c", "sleep 2; echo done")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		started := time.Now()
		err := cmd.Run()
		cancel()
		if ctx.Err() != nil {
			return
		}
		l.add(func(t *tally) {
			l.lastExec = started
			if err != nil || stdout.String() != "done\n" {
				t.execFailed++
				l.note(&t.execErrs, "exec started %s: %v: stdout %q stderr %q", started.Format("15:04:05.000"), err, stdout.String(), strings.TrimSpace(stderr.String()))
				t.failures = append(t.failures, failure{started, time.Now(),
					fmt.Sprintf("exec started %s: %v: stdout %q stderr %q", started.Format("15:04:05.000"), err, stdout.String(),
						strings.TrimSpace(stderr.String()))})
			} else {
				t.execOK++
			}
		})
		sleep(ctx, 100*time.Millisecond)
	}
}

var forwarding = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// portForwards runs short `kubectl port-forward` sessions through kube-mvp one after
// another: a random local port, three GETs of the web pod's file, then kubectl is stopped.
func (l *load) portForwards(ctx context.Context) {
	for ctx.Err() == nil {
		started := time.Now()
		err := l.portForward(ctx)
		if ctx.Err() != nil {
			return
		}
		l.add(func(t *tally) {
			l.lastPortForward = started
			if err != nil {
				t.pfFailed++
				l.note(&t.pfErrs, "port-forward started %s: %v", started.Format("15:04:05.000"), err)
				t.failures = append(t.failures, failure{started, time.Now(), fmt.Sprintf("port-forward started %s: %v", started.Format("15:04:05.000"), err)})
			} else {
				t.pfOK++
			}
		})
		sleep(ctx, 300*time.Millisecond)
	}
}

func (l *load) portForward(ctx context.Context) (err error) {
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(sctx, l.in.kubectl, "--kubeconfig", l.kubeconfig, "--tls-server-name", l.in.ServerName,
		"port-forward", "-n", loadNS, "pod/web", ":8080")
	var stderr lockedBuffer
	port := make(chan string, 1)
	out := lockedBuffer{onWrite: func(b []byte) {
		if m := forwarding.FindSubmatch(b); m != nil {
			select {
			case port <- string(m[1]):
			default:
			}
		}
	}}
	cmd.Stdout, cmd.Stderr = &out, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (kubectl stdout %q, stderr %q)", err, out.String(), strings.TrimSpace(stderr.String()))
		}
	}()
	var p string
	select {
	case p = <-port:
	case werr := <-exited:
		return fmt.Errorf("kubectl exited before forwarding: %v", werr)
	case <-sctx.Done():
		<-exited
		return fmt.Errorf("no Forwarding line: %w", sctx.Err())
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 3 {
		resp, gerr := client.Get("http://127.0.0.1:" + p + "/index.html")
		if gerr == nil {
			var body []byte
			body, gerr = io.ReadAll(resp.Body)
			resp.Body.Close()
			if gerr == nil && (resp.StatusCode != http.StatusOK || string(body) != "hello-through-kube-mvp\n") {
				gerr = fmt.Errorf("%s: %q", resp.Status, body)
			}
		}
		if gerr != nil {
			cmd.Process.Signal(os.Interrupt)
			<-exited
			return fmt.Errorf("GET %d through the forward: %w", i+1, gerr)
		}
		sleep(sctx, 200*time.Millisecond)
	}
	select {
	case werr := <-exited:
		return fmt.Errorf("kubectl exited by itself during the session: %v", werr)
	default:
	}
	cmd.Process.Signal(os.Interrupt)
	<-exited
	return nil
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader in different goroutines;
// onWrite, if set, sees everything written so far after each write.
type lockedBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	onWrite func([]byte)
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.b.Write(p)
	if b.onWrite != nil {
		b.onWrite(b.b.Bytes())
	}
	return n, err
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// sleep waits d or until ctx is done: pacing for the generators, never a condition.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
