package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestRollingUpgrade restarts three apiservers one by one into a newer release (cp-b with
// batch/v1 off throughout, so the control plane is mixed the whole time) while two identical
// load generators run: one through kube-mvp, one through a plain round-robin balancer in
// front of the same servers. Through kube-mvp there must be no 404 for resources that some
// server serves, no 5xx and no transport error for reads (but a 503 Status with Retry-After
// for the new API until kube-mvp first answers it: its only server is just starting), and
// every watch must end cleanly (client-go resumes those) or, while an apiserver is frozen, be
// reset and resume. The balancer's numbers are logged for contrast (docs/testing.md, "End to end").
//
// gates-on: v1.36.4 → v1.37.1 with the test gates (StorageVersion API, peer-proxy gate), cp-b
// frozen (SIGSTOP) while cp-a upgrades, xds-server's watches on cp-b. cluster-defaults:
// v1.35.8 → v1.36.4 as real clusters of those releases run (the v1.35.8 Leases carry no
// address: xds-server gets --apiserver-addresses), with load on an API only v1.36 serves; to
// stay within make test's time budget, on this pair only, not also on v1.36.4 → v1.37.1.
func TestRollingUpgrade(t *testing.T) {
	t.Run("gates-on", func(t *testing.T) {
		rollingUpgrade(t, upgradePlan{from: "v1.36.4", to: "v1.37.1", freeze: "cp-b"})
	})
	t.Run("cluster-defaults", func(t *testing.T) {
		rollingUpgrade(t, upgradePlan{from: "v1.35.8", to: "v1.36.4", clusterDefaults: true, newAPI: &newIn136})
	})
}

// newIn136 is served by v1.36.4 with its default settings and not by v1.35.8 (their
// discovery, TestClusterDefaultsFacts): MutatingAdmissionPolicy went GA in 1.36, a new
// resource in admissionregistration.k8s.io/v1, a group/version both releases serve.
var newIn136 = request{"list mutatingadmissionpolicies", "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"}

type request struct{ what, path string }

type upgradePlan struct {
	from, to        string
	clusterDefaults bool
	// newAPI, when set, is served by `to` and not by `from`: the readers ask for it too.
	// Before an upgraded server serves it, 404 is the right answer; from then on it must
	// never be 404 again.
	newAPI *request
	// freeze, when set, is stopped with SIGSTOP while the first server upgrades (its Lease
	// fresh for the liveness window, its connections open and silent: a hung apiserver), and
	// resumed before its own upgrade.
	freeze string
}

func rollingUpgrade(t *testing.T, plan upgradePlan) {
	ctx := testutil.Context(t, 20*time.Minute)
	servers := []string{"cp-a", "cp-b", "cp-c"}
	e := newEnv(t, ctx,
		controlplane.ServerSpec{Name: "cp-a", Version: plan.from, ClusterDefaults: plan.clusterDefaults},
		controlplane.ServerSpec{Name: "cp-b", Version: plan.from, ClusterDefaults: plan.clusterDefaults, RuntimeConfig: []string{"batch/v1=false"}},
		controlplane.ServerSpec{Name: "cp-c", Version: plan.from, ClusterDefaults: plan.clusterDefaults},
	)
	hc := e.rawClient(&e.cp.PKI.Admin)
	direct := func(server, path string) int {
		res, err := hc.Get(e.cp.Server(server).URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if plan.newAPI != nil {
		if code := direct("cp-a", plan.newAPI.path); code != http.StatusNotFound {
			t.Fatalf("%s answers %d for %s: the premise (an API new in %s) does not hold", plan.from, code, plan.newAPI.path, plan.to)
		}
	}
	front := e.startKubeMVP(ctx, "front", "", func(o *harness.Options) {
		// xds-server's watches go through the apiserver that will hang: its view of the
		// Leases stops while that apiserver is frozen (until client-go finds the connection
		// dead), and routing must not suffer for it.
		o.WatchThrough = plan.freeze
	})
	var backends []string
	for _, s := range servers {
		backends = append(backends, e.cp.Server(s).Address())
	}
	lb, err := harness.StartRoundRobin(backends)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	// The contrast, arranged rather than left to the load: nothing else connects to this
	// balancer yet, so as many connections in a row as there are servers reach each of them
	// once (round robin), and exactly one, cp-b's (batch/v1 off), answers 404.
	probe := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: e.tlsConfig(&e.cp.PKI.Admin), DisableKeepAlives: true}}
	contrast := map[int]int{}
	for range servers {
		res, err := probe.Get("https://" + lb.Addr() + "/apis/batch/v1/namespaces/default/jobs")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		contrast[res.StatusCode]++
	}
	if contrast[http.StatusNotFound] != 1 || contrast[http.StatusOK] != len(servers)-1 {
		t.Fatalf("listing jobs through the plain balancer once per server: %v, want one 404 (cp-b) and 200 from the others: the scenario is not mixed", contrast)
	}

	adminC := e.adminClient(e.cp.Server("cp-a"))
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "upgrade-load"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "c", Image: "busybox"}},
		}}},
	}
	if _, err := adminC.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	streams := front.Envoy.MustStat(t, extProcStreams)
	ours := newLoad(t, e, "kube-mvp", front.Endpoint(), plan.newAPI)
	plain := newLoad(t, e, "round-robin", "https://"+lb.Addr(), plan.newAPI)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range []*load{ours, plain} {
		wg.Go(func() { l.run(loadCtx) })
	}

	time.Sleep(3 * time.Second) // load on the old versions first
	for i, s := range servers {
		if plan.freeze != "" && i == 0 {
			if err := e.cp.Freeze(plan.freeze); err != nil {
				t.Fatal(err)
			}
			ours.frozen.Store(true)
			plain.frozen.Store(true)
			t.Logf("%s frozen (SIGSTOP) while %s upgrades", plan.freeze, s)
		}
		if plan.freeze != "" && s == plan.freeze {
			if err := e.cp.Thaw(plan.freeze); err != nil {
				t.Fatal(err)
			}
			// Watches reset while it was frozen end within a keepalive round after it.
			time.Sleep(20 * time.Second)
			ours.frozen.Store(false)
			plain.frozen.Store(false)
			t.Logf("%s resumed", plan.freeze)
		}
		t.Logf("upgrading %s to %s", s, plan.to)
		if err := e.cp.Restart(ctx, s, plan.to); err != nil {
			stopLoad()
			wg.Wait()
			t.Fatal(err)
		}
		if plan.newAPI != nil && ours.servedSince.Load() == 0 {
			// The first upgraded server is ready: it serves the new API from now on (checked
			// directly), so from now on a 404 for it through kube-mvp is a failure.
			if code := direct(s, plan.newAPI.path); code != http.StatusOK {
				stopLoad()
				wg.Wait()
				t.Fatalf("%s (%s) answers %d for %s directly", s, plan.to, code, plan.newAPI.path)
			}
			now := time.Now()
			ours.servedSince.Store(now.UnixNano())
			plain.servedSince.Store(now.UnixNano())
			t.Logf("%s serves %s (checked directly at %s): from now on it must never be 404 through kube-mvp", s, plan.newAPI.what, now.UTC().Format("15:04:05.000"))
		}
		time.Sleep(5 * time.Second) // traffic on the new version, and its Lease and discovery seen
	}
	time.Sleep(3 * time.Second)
	stopLoad()
	wg.Wait()

	t.Logf("through kube-mvp:   %s", ours)
	t.Logf("through round robin: %s", plain)
	// ext_proc only where a routing decision is needed: batch/v1 while cp-b (batch/v1 off) is
	// live, and the group/versions that are mixed while the versions are (new resources in
	// v1.37); while cp-b restarts, the live apiservers all serve batch/v1.
	total, batch := ours.total.Load(), ours.countWhat("list jobs", "get job", "list cronjobs", "watch jobs")
	opened := front.Envoy.MustStat(t, extProcStreams) - streams
	t.Logf("ext_proc streams per 1,000 requests: %.0f (batch/v1, mixed while cp-b is live: %.0f per 1,000)", 1000*float64(opened)/float64(total), 1000*float64(batch)/float64(total))
	if opened >= uint64(total) {
		t.Errorf("%d ext_proc streams for %d requests: every request took ext_proc", opened, total)
	}
	logUpstreamResets(t, front.Envoy.Admin)
	t.Logf("goal, through kube-mvp: %s", ours.goal())
	t.Logf("goal, through round robin: %s", plain.goal())
	if ours.total.Load() < 500 {
		t.Errorf("only %d requests through kube-mvp: the load generator did not run", ours.total.Load())
	}
	if plan.newAPI != nil {
		if first, since := ours.firstOK.Load(), ours.servedSince.Load(); first != 0 && since != 0 {
			t.Logf("through kube-mvp: first 200 for %s %s after it was served directly", plan.newAPI.what, time.Duration(first-since).Round(time.Millisecond))
		}
	}
	for key, n := range ours.snapshot() {
		if key.beforeServed && (key.code == 404 || key.code == 200) {
			continue // nobody served it yet: 404 is the apiservers' right answer
		}
		if key.comingUp && key.code == 503 {
			// Its only server is starting, or ready but not yet seen healthy by the data
			// plane's health checks (an unhealthy host is checked every second): a 503 with
			// a Status and Retry-After (counted below), which client-go retries by itself.
			continue
		}
		if key.code == 404 || key.code >= 500 || key.code == 0 {
			ours.mu.Lock()
			w := ours.when[key]
			ours.mu.Unlock()
			t.Errorf("through kube-mvp: %d × %s → %s, from %s to %s", n, key, key.codeString(), w[0].UTC().Format("15:04:05.000"), w[1].UTC().Format("15:04:05.000"))
		}
	}
	ours.mu.Lock()
	bad503 := ours.no503RetryAfter
	ours.mu.Unlock()
	if bad503 > 0 {
		t.Errorf("through kube-mvp: %d × 503 without a Status and Retry-After", bad503)
	}
	if plan.freeze != "" {
		t.Logf("through kube-mvp: %d watches reset while %s was frozen, each resumed", ours.watchReset.Load(), plan.freeze)
		// Whether xds-server's view went stuck with it (its watches share one connection,
		// which went to the frozen apiserver): information, the outcome is checked above.
		xlog, _ := os.ReadFile(filepath.Join(e.dir, "front", "xds-server.log"))
		t.Logf("xds-server: %d warnings that its Lease watch was quiet (stuck on %s)", strings.Count(string(xlog), "no identity Lease renewal seen"), plan.freeze)
	}
	if ours.watchBroken.Load() > 0 {
		t.Errorf("through kube-mvp: %d watches ended uncleanly: %q", ours.watchBroken.Load(), ours.errorSamples())
	}
	if ours.watchEvents.Load() == 0 {
		t.Error("through kube-mvp: the watches received no events at all")
	}
	if plan.newAPI != nil && ours.snapshot()[reqKey{what: plan.newAPI.what, code: 200}] == 0 {
		t.Errorf("through kube-mvp: %s never answered 200 after %s served it", plan.newAPI.what, plan.to)
	}
}

// load is a bounded load generator: readers that list and get core, apps and batch
// resources in turn, and watchers that hold watches open and resume them like client-go.
type load struct {
	t      *testing.T
	name   string
	base   string
	client *http.Client // no keep-alives: every request is a new connection, so a balancer
	// sees as many choices as there are requests
	watchClient *http.Client

	// newAPI (may be nil) is read too; servedSince is when an apiserver first served it
	// (UnixNano, 0: not yet).
	newAPI      *request
	servedSince atomic.Int64
	// firstOK is when this load first got a 200 for newAPI (UnixNano, 0: not yet).
	firstOK atomic.Int64

	mu    sync.Mutex
	codes map[reqKey]int
	// when: the first and last time each failing key (not 200) was recorded.
	when    map[reqKey][2]time.Time
	samples []string
	// no503RetryAfter counts 503s that are not a Status with Retry-After.
	no503RetryAfter int

	total, watchEvents, watchClean, watchBroken atomic.Int64
	// frozen: an apiserver is frozen (or was, a keepalive round ago); a watch that ends with
	// a reset meanwhile counts in watchReset, not watchBroken: the data plane cut it, as it
	// must, when its connection to the frozen apiserver stopped answering pings, and a
	// proxy cannot end a stream cleanly whose end it never saw. The watcher resumes it.
	frozen     atomic.Bool
	watchReset atomic.Int64
}

type reqKey struct {
	what string
	code int // 0: transport error
	// beforeServed: a request for the new API sent before any apiserver served it.
	beforeServed bool
	// comingUp: a request for the new API sent before this load's first 200 for it: the
	// apiserver serving it may be up but not yet seen healthy by the data plane.
	comingUp bool
}

func (k reqKey) String() string {
	switch {
	case k.beforeServed:
		return k.what + " (before any apiserver served it)"
	case k.comingUp:
		return k.what + " (before kube-mvp first answered it)"
	}
	return k.what
}

func (k reqKey) codeString() string {
	if k.code == 0 {
		return "transport error"
	}
	return fmt.Sprint(k.code)
}

func newLoad(t *testing.T, e *env, name, base string, newAPI *request) *load {
	tc := e.tlsConfig(&e.cp.PKI.Admin)
	tc.NextProtos = []string{"http/1.1"}
	return &load{
		t: t, name: name, base: base, codes: map[reqKey]int{}, when: map[reqKey][2]time.Time{}, newAPI: newAPI,
		client:      &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}},
		watchClient: &http.Client{Transport: &http.Transport{TLSClientConfig: tc}},
	}
}

// reads are the requests the readers cycle through: every one is served by some apiserver
// at every moment of the upgrade.
var reads = []request{
	{"list pods", "/api/v1/namespaces/default/pods"},
	{"list configmaps", "/api/v1/namespaces/kube-system/configmaps?limit=50"},
	{"list deployments", "/apis/apps/v1/namespaces/default/deployments"},
	{"list jobs", "/apis/batch/v1/namespaces/default/jobs"},
	{"get job", "/apis/batch/v1/namespaces/default/jobs/upgrade-load"},
	{"list cronjobs", "/apis/batch/v1/cronjobs"},
}

var watches = []request{
	{"watch configmaps", "/api/v1/namespaces/kube-system/configmaps"},
	{"watch jobs", "/apis/batch/v1/namespaces/default/jobs"},
	{"watch leases", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"},
}

func (l *load) run(ctx context.Context) {
	reads := reads
	if l.newAPI != nil {
		reads = append(slices.Clone(reads), *l.newAPI)
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := w; ctx.Err() == nil; i++ {
				r := reads[i%len(reads)]
				l.read(ctx, r.what, r.path)
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	for _, w := range watches {
		wg.Go(func() { l.watch(ctx, w.what, w.path) })
	}
	wg.Wait()
}

func (l *load) read(ctx context.Context, what, path string) {
	key := reqKey{what: what}
	if l.newAPI != nil && what == l.newAPI.what {
		since := l.servedSince.Load()
		key.beforeServed = since == 0 || time.Now().UnixNano() < since
		key.comingUp = l.firstOK.Load() == 0
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", l.base+path, nil)
	res, err := l.client.Do(req)
	if ctx.Err() != nil {
		return // the test ended, not a failure of the path
	}
	if err == nil {
		key.code = res.StatusCode
		if key.code == 200 && l.newAPI != nil && what == l.newAPI.what {
			l.firstOK.CompareAndSwap(0, time.Now().UnixNano())
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if key.code != 200 {
			err = fmt.Errorf("%s: %.200s", res.Status, body)
		}
		if key.code == http.StatusServiceUnavailable && (res.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"kind":"Status"`)) {
			l.mu.Lock()
			l.no503RetryAfter++
			l.mu.Unlock()
		}
	}
	l.record(key, err)
}

// watch holds a watch open, and when it ends, resumes from the last resourceVersion seen, as
// client-go's reflector does (a 410 Gone means relist, which is also fine). A watch ends
// cleanly when the response body ends at a chunk boundary after whole events; anything else
// (a reset, a truncated event, an error status that is not 410) counts as broken.
func (l *load) watch(ctx context.Context, what, path string) {
	rv := ""
	for ctx.Err() == nil {
		if rv == "" {
			rv = l.list(ctx, path)
			if rv == "" {
				time.Sleep(200 * time.Millisecond)
				continue
			}
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", l.base+path+"?watch=true&allowWatchBookmarks=true&resourceVersion="+rv, nil)
		res, err := l.watchClient.Do(req)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.watchBroken.Add(1)
			l.record(reqKey{what: what}, err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if res.StatusCode != 200 {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			l.record(reqKey{what: what, code: res.StatusCode}, fmt.Errorf("%s: %.200s", res.Status, body))
			time.Sleep(200 * time.Millisecond)
			continue
		}
		l.record(reqKey{what: what, code: 200}, nil)
		scanner := bufio.NewScanner(res.Body)
		scanner.Buffer(make([]byte, 1<<20), 16<<20)
		gone := false
		for scanner.Scan() {
			var ev struct {
				Type   string `json:"type"`
				Object struct {
					Code     int `json:"code"`
					Metadata struct {
						ResourceVersion string `json:"resourceVersion"`
					} `json:"metadata"`
				} `json:"object"`
			}
			if err := json.Unmarshal(scanner.Bytes(), &ev); err != nil {
				l.record(reqKey{what: what + " (event)"}, err)
				break
			}
			if ev.Type == "ERROR" {
				gone = ev.Object.Code == http.StatusGone
				break
			}
			l.watchEvents.Add(1)
			rv = ev.Object.Metadata.ResourceVersion
		}
		err = scanner.Err()
		res.Body.Close()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !errors.Is(err, io.EOF) && l.frozen.Load():
			l.watchReset.Add(1)
		case err != nil && !errors.Is(err, io.EOF):
			l.watchBroken.Add(1)
			l.record(reqKey{what: what + " (ended)"}, err)
		default:
			l.watchClean.Add(1)
		}
		if gone {
			rv = ""
		}
	}
}

// list returns the collection's resourceVersion, or "" (counted) on failure.
func (l *load) list(ctx context.Context, path string) string {
	req, _ := http.NewRequestWithContext(ctx, "GET", l.base+path, nil)
	res, err := l.client.Do(req)
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if res.StatusCode != 200 || json.NewDecoder(res.Body).Decode(&list) != nil {
		return ""
	}
	return list.Metadata.ResourceVersion
}

func (l *load) record(k reqKey, err error) {
	l.total.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.codes[k]++
	if k.code != 200 {
		now := time.Now()
		w, ok := l.when[k]
		if !ok {
			w[0] = now
		}
		w[1] = now
		l.when[k] = w
	}
	if err != nil && len(l.samples) < 20 {
		l.samples = append(l.samples, k.String()+": "+err.Error())
	}
}

func (l *load) snapshot() map[reqKey]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.codes)
}

// countWhat is how many requests (watch requests included) of the kinds in whats were made.
func (l *load) countWhat(whats ...string) int64 {
	var n int64
	for k, c := range l.snapshot() {
		if slices.Contains(whats, k.what) {
			n += int64(c)
		}
	}
	return n
}

func (l *load) count(code int) int {
	n := 0
	for k, c := range l.snapshot() {
		if k.code == code {
			n += c
		}
	}
	return n
}

func (l *load) errorSamples() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.samples)
}

// String summarises the responses by code, then watch endings.
func (l *load) String() string {
	byCode := map[string]int{}
	for k, n := range l.snapshot() {
		byCode[k.codeString()] += n
	}
	var parts []string
	for c, n := range byCode {
		parts = append(parts, fmt.Sprintf("%s: %d", c, n))
	}
	slices.Sort(parts)
	return fmt.Sprintf("%d requests {%s}; watches: %d events, %d clean ends, %d broken; first errors: %q",
		l.total.Load(), strings.Join(parts, ", "), l.watchEvents.Load(), l.watchClean.Load(), l.watchBroken.Load(), l.errorSamples())
}

// logUpstreamResets logs, summed over the data plane's clusters, how many upstream
// connections closed under a request already sent (Envoy's
// upstream_cx_destroy_remote_with_active_rq) and how many retries the routes made: whether
// the run met the race the GET/HEAD read variants retry (a stopping apiserver closing a
// kept-alive connection as a request is written on it). Information only: the race is rare.
func logUpstreamResets(t *testing.T, admin string) {
	res, err := http.Get(admin + "/stats?format=json")
	if err != nil {
		t.Logf("data plane stats: %v", err)
		return
	}
	defer res.Body.Close()
	var st struct {
		Stats []struct {
			Name  string `json:"name"`
			Value uint64 `json:"value"`
		} `json:"stats"`
	}
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		t.Logf("data plane stats: %v", err)
		return
	}
	var resets, retries uint64
	for _, s := range st.Stats {
		switch {
		case strings.HasSuffix(s.Name, ".upstream_cx_destroy_remote_with_active_rq"):
			resets += s.Value
		case strings.HasSuffix(s.Name, ".upstream_rq_retry"):
			retries += s.Value
		}
	}
	t.Logf("data plane: %d upstream connections closed under a sent request, %d retries", resets, retries)
}

// goal summarises the counts the rolling upgrade's goal is about (docs/testing.md, "End to end"): 404s for APIs
// some apiserver served, 5xx, 503s and whether they carried a Status with Retry-After, and
// the new API's answers before and after an apiserver served it.
func (l *load) goal() string {
	var served404, fivexx, x503, newBefore404, newAfter200, newAfter404 int
	for k, n := range l.snapshot() {
		isNew := l.newAPI != nil && k.what == l.newAPI.what
		switch {
		case k.code == 404 && k.beforeServed:
			newBefore404 += n
		case k.code == 404:
			served404 += n
		case k.code >= 500:
			fivexx += n
		}
		if k.code == 503 {
			x503 += n
		}
		if isNew && !k.beforeServed && k.code == 200 {
			newAfter200 += n
		}
		if isNew && !k.beforeServed && k.code == 404 {
			newAfter404 += n
		}
	}
	l.mu.Lock()
	bad503 := l.no503RetryAfter
	l.mu.Unlock()
	out := fmt.Sprintf("404 for served APIs: %d; 5xx: %d (503: %d, of which without a Status and Retry-After: %d); transport errors: %d",
		served404, fivexx, x503, bad503, l.count(0))
	if l.newAPI != nil {
		out += fmt.Sprintf("; %s: %d × 404 before any apiserver served it, then %d × 200 and %d × 404", l.newAPI.what, newBefore404, newAfter200, newAfter404)
	}
	return out
}
