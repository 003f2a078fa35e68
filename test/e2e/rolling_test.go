package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestRollingUpgrade restarts three apiservers one by one from v1.36.4 into v1.37.1 (cp-b with
// batch/v1 off throughout, so the control plane is mixed the whole time) while two identical
// load generators run: one through kube-mvp, one through a plain round-robin balancer in
// front of the same servers. Through kube-mvp there must be no 404 for resources that some
// server serves, no 5xx and no transport error for reads, and every watch must end cleanly
// (client-go resumes those). The balancer's numbers are logged for contrast (README).
func TestRollingUpgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	servers := []string{"cp-a", "cp-b", "cp-c"}
	e := newEnv(t, ctx,
		controlplane.ServerSpec{Name: "cp-a", Version: "v1.36.4"},
		controlplane.ServerSpec{Name: "cp-b", Version: "v1.36.4", RuntimeConfig: []string{"batch/v1=false"}},
		controlplane.ServerSpec{Name: "cp-c", Version: "v1.36.4"},
	)
	front := e.startKubeMVP(ctx, "front", "")
	var backends []string
	for _, s := range servers {
		backends = append(backends, e.cp.Server(s).Address())
	}
	lb, err := harness.StartRoundRobin(backends)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()

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

	streams := front.DataPlane.Stat(extProcStreams)
	ours := newLoad(t, e, "kube-mvp", front.Endpoint())
	plain := newLoad(t, e, "round-robin", "https://"+lb.Addr())
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range []*load{ours, plain} {
		wg.Go(func() { l.run(loadCtx) })
	}

	time.Sleep(3 * time.Second) // load on the old versions first
	for _, s := range servers {
		t.Logf("upgrading %s to v1.37.1", s)
		if err := e.cp.Restart(ctx, s, "v1.37.1"); err != nil {
			stopLoad()
			wg.Wait()
			t.Fatal(err)
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
	opened := front.DataPlane.Stat(extProcStreams) - streams
	t.Logf("ext_proc streams per 1,000 requests: %.0f (batch/v1, mixed while cp-b is live: %.0f per 1,000)", 1000*float64(opened)/float64(total), 1000*float64(batch)/float64(total))
	if opened >= uint64(total) {
		t.Errorf("%d ext_proc streams for %d requests: every request took ext_proc", opened, total)
	}
	logUpstreamResets(t, front.DataPlane.AdminURL())
	if ours.total.Load() < 500 {
		t.Errorf("only %d requests through kube-mvp: the load generator did not run", ours.total.Load())
	}
	for key, n := range ours.snapshot() {
		if key.code == 404 || key.code >= 500 || key.code == 0 {
			t.Errorf("through kube-mvp: %d × %s → %s", n, key.what, key.codeString())
		}
	}
	if ours.watchBroken.Load() > 0 {
		t.Errorf("through kube-mvp: %d watches ended uncleanly: %q", ours.watchBroken.Load(), ours.errorSamples())
	}
	if ours.watchEvents.Load() == 0 {
		t.Error("through kube-mvp: the watches received no events at all")
	}
	// The contrast must show what kube-mvp is for, or this test proves nothing about it.
	if plain.count(404) == 0 {
		t.Errorf("the plain balancer saw no 404 (jobs on cp-b): the scenario is not mixed")
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

	mu      sync.Mutex
	codes   map[reqKey]int
	samples []string

	total, watchEvents, watchClean, watchBroken atomic.Int64
}

type reqKey struct {
	what string
	code int // 0: transport error
}

func (k reqKey) codeString() string {
	if k.code == 0 {
		return "transport error"
	}
	return fmt.Sprint(k.code)
}

func newLoad(t *testing.T, e *env, name, base string) *load {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.cp.PKI.ServerCA.CertPEM)
	cert, err := e.cp.PKI.Admin.TLS()
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	return &load{
		t: t, name: name, base: base, codes: map[reqKey]int{},
		client:      &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}},
		watchClient: &http.Client{Transport: &http.Transport{TLSClientConfig: tc}},
	}
}

// reads are the requests the readers cycle through: every one is served by some apiserver
// at every moment of the upgrade.
var reads = []struct{ what, path string }{
	{"list pods", "/api/v1/namespaces/default/pods"},
	{"list configmaps", "/api/v1/namespaces/kube-system/configmaps?limit=50"},
	{"list deployments", "/apis/apps/v1/namespaces/default/deployments"},
	{"list jobs", "/apis/batch/v1/namespaces/default/jobs"},
	{"get job", "/apis/batch/v1/namespaces/default/jobs/upgrade-load"},
	{"list cronjobs", "/apis/batch/v1/cronjobs"},
}

var watches = []struct{ what, path string }{
	{"watch configmaps", "/api/v1/namespaces/kube-system/configmaps"},
	{"watch jobs", "/apis/batch/v1/namespaces/default/jobs"},
	{"watch leases", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"},
}

func (l *load) run(ctx context.Context) {
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
	req, _ := http.NewRequestWithContext(ctx, "GET", l.base+path, nil)
	res, err := l.client.Do(req)
	if ctx.Err() != nil {
		return // the test ended, not a failure of the path
	}
	code := 0
	if err == nil {
		code = res.StatusCode
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if code != 200 {
			err = fmt.Errorf("%s: %.200s", res.Status, body)
		}
	}
	l.record(reqKey{what, code}, err)
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
			l.record(reqKey{what, 0}, err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if res.StatusCode != 200 {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			l.record(reqKey{what, res.StatusCode}, fmt.Errorf("%s: %.200s", res.Status, body))
			time.Sleep(200 * time.Millisecond)
			continue
		}
		l.record(reqKey{what, 200}, nil)
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
				l.record(reqKey{what + " (event)", 0}, err)
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
		case err != nil && !errors.Is(err, io.EOF):
			l.watchBroken.Add(1)
			l.record(reqKey{what + " (ended)", 0}, err)
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
	if err != nil && len(l.samples) < 20 {
		l.samples = append(l.samples, k.what+": "+err.Error())
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
// the run met the race the GET/HEAD read twins retry (a stopping apiserver closing a
// kept-alive connection as a request is written on it). Information only: the race is rare.
func logUpstreamResets(t *testing.T, admin string) {
	res, err := http.Get(admin + "/stats")
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
