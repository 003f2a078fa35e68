package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// upstreamBaseline is upstream's own Mixed Version Proxy beside ours: A v1.37.1 and B v1.36.4
// with batch/v1 off, both with the in-process proxy on (--peer-ca-file); a Job created on A.
// Listing Jobs directly on B takes upstream's path (B → A, two hops); through a kube-mvp
// sidecar beside B it takes ours (data plane → A, one hop).
type upstreamBaseline struct {
	e        *env
	sidecarB *harness.KubeMVP
	viaB     string // https://B/apis/batch/v1/namespaces/default/jobs
	viaOurs  string
	direct   string // straight to A: what neither proxy adds
	client   *http.Client
}

func newUpstreamBaseline(tb testing.TB, ctx context.Context) *upstreamBaseline {
	servers := controlplane.MixedServers()
	for i := range servers {
		servers[i].PeerProxy = true
	}
	e := newEnv(tb, ctx, servers...)
	var quiet []func(*harness.Options)
	if _, bench := tb.(*testing.B); bench {
		quiet = append(quiet, func(o *harness.Options) { o.EnvoyLogLevel = "info" })
	}
	u := &upstreamBaseline{e: e, sidecarB: e.startKubeMVP(ctx, "sidecar-b", "cp-b", quiet...), client: e.rawClient(&e.cp.PKI.Admin)}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "baseline"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
		}}},
	}
	if _, err := e.adminClient(e.cp.Server("cp-a")).BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	const path = "/apis/batch/v1/namespaces/default/jobs"
	u.viaB, u.viaOurs = "https://"+e.cp.Server("cp-b").Address()+path, u.sidecarB.Endpoint()+path
	u.direct = "https://" + e.cp.Server("cp-a").Address() + path
	// Upstream's proxy learns its peers from their Leases and StorageVersions: wait until B
	// serves Jobs through it.
	testutil.WaitFor(tb, ctx, 2*time.Minute, "upstream's proxy on cp-b to serve Jobs", func() error {
		code, err := u.get(ctx, u.viaB)
		if err == nil && code != 200 {
			err = fmt.Errorf("status %d", code)
		}
		return err
	})
	return u
}

func (u *upstreamBaseline) get(ctx context.Context, url string) (int, error) {
	return getWith(ctx, u.client, url, nil)
}

// getWith GETs url with c and extra headers and reads the whole body.
func getWith(ctx context.Context, c *http.Client, url string, hdr map[string]string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	return res.StatusCode, err
}

// TestUpstreamProxyBaseline: upstream's in-process proxy and kube-mvp both serve the Jobs
// that B cannot; the latency comparison is BenchmarkProxiedList.
func TestUpstreamProxyBaseline(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Minute)
	u := newUpstreamBaseline(t, ctx)
	for range 10 {
		for _, url := range []string{u.viaB, u.viaOurs} {
			if code, err := u.get(ctx, url); err != nil || code != 200 {
				t.Fatalf("GET %s: %d %v", url, code, err)
			}
		}
	}
}

// BenchmarkProxiedList times the same list, in turn through upstream's proxy (client → B →
// A), through kube-mvp (client → data plane → extproc decision → A) and straight to A, over
// kept-alive TLS connections, and reports each, the ratio of the totals (goal: ours ≤ 0.7×
// upstream's) and the ratio of what each path adds to the direct request. Two more lines
// explain kube-mvp's share: the direct request as the data plane sends it (front-proxy
// certificate and X-Remote-* headers), and the data plane's own timings (the whole request,
// the ext_proc exchange, A's answer up to its headers). The data plane is the Go stand-in for
// Envoy, so this compares paths, not Envoy's own speed.
func BenchmarkProxiedList(b *testing.B) {
	ctx := testutil.Context(b, 10*time.Minute)
	u := newUpstreamBaseline(b, ctx)
	proxied := u.e.rawClient(&u.e.cp.PKI.ProxyClient)
	var upstream, ours, direct, front time.Duration
	timedWith := func(c *http.Client, url string, hdr map[string]string) time.Duration {
		start := time.Now()
		if code, err := getWith(ctx, c, url, hdr); err != nil || code != 200 {
			b.Fatalf("GET %s: %d %v", url, code, err)
		}
		return time.Since(start)
	}
	timed := func(url string) time.Duration { return timedWith(u.client, url, nil) }
	// What the data plane sends A: the front-proxy certificate and the caller's identity.
	asProxy := map[string]string{"X-Remote-User": controlplane.AdminUser, "X-Remote-Group": "system:masters"}
	for _, url := range []string{u.viaB, u.viaOurs, u.direct} {
		timed(url) // connections up before the clock counts
	}
	timedWith(proxied, u.direct, asProxy)
	dp := u.sidecarB.Envoy
	timings := []string{"downstream_rq", "ext_proc_request_headers", "upstream_rq_headers"}
	before := map[string][2]uint64{}
	for _, t := range timings {
		before[t] = [2]uint64{dp.MustStat(b, "dataplane.timing."+t+"_us"), dp.MustStat(b, "dataplane.timing."+t+"_count")}
	}
	for b.Loop() {
		upstream += timed(u.viaB)
		ours += timed(u.viaOurs)
		direct += timed(u.direct)
		front += timedWith(proxied, u.direct, asProxy)
	}
	n := float64(b.N)
	b.ReportMetric(float64(upstream.Microseconds())/n, "upstream-µs/op")
	b.ReportMetric(float64(ours.Microseconds())/n, "kube-mvp-µs/op")
	b.ReportMetric(float64(direct.Microseconds())/n, "direct-µs/op")
	b.ReportMetric(float64(front.Microseconds())/n, "direct-as-front-proxy-µs/op")
	b.ReportMetric(float64(ours)/float64(upstream), "ratio")
	// Where kube-mvp's time goes, as the data plane saw it: the whole request, the ext_proc
	// exchange, and A's answer up to its headers.
	for _, t := range timings {
		us, count := dp.MustStat(b, "dataplane.timing."+t+"_us")-before[t][0], dp.MustStat(b, "dataplane.timing."+t+"_count")-before[t][1]
		if count > 0 {
			b.ReportMetric(float64(us)/float64(count), "dp-"+t+"-µs/op")
		}
	}
	if upstream > direct {
		b.ReportMetric(float64(ours-direct)/float64(upstream-direct), "added-ratio")
	}
}
