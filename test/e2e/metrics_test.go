package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/deploy"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestMetricsLint scrapes /metrics of xds-server and extproc as they run in front of real
// apiservers (a front proxy and a sidecar beside cp-b, each with requests through it) and
// fails on every problem Prometheus' linter (promlint) finds, and on the series operators
// alert on that are missing, and on any kube_mvp_ metric that the chart's alerts or dashboard
// name and no scrape has; and it finds the Envoy series they name in the data plane's
// /stats/prometheus.
func TestMetricsLint(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Minute)
	documented := documentedMetrics(t)
	monitored := monitoredMetrics(t)
	scraped := map[string]bool{} // every series name in any scrape
	e := newEnv(t, ctx, controlplane.MixedServers()...)
	for _, d := range []struct{ name, local, role string }{{"front", "", "envoy-front"}, {"sidecar-b", "cp-b", "envoy-sidecar"}} {
		k := e.startKubeMVP(ctx, d.name, d.local)
		client, err := kubernetes.NewForConfig(e.through(k, &e.cp.PKI.Admin, ""))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := client.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []struct {
			process, url string
			want         []string // patterns of lines that must be there
		}{
			{"xds-server", k.XDSAdmin, []string{
				`kube_mvp_certificate_expiry_timestamp_seconds\{certificate="control-plane",role="xds-server"\} \S+`,
				`kube_mvp_certificate_expiry_timestamp_seconds\{certificate="control-plane",role="` + d.role + `"\} \S+`,
				`kube_mvp_xds_apiserver_state\{apiserver="apiserver-\w+",hostname="cp-a",state="live"\} 1`,
				`kube_mvp_xds_apiserver_state\{apiserver="apiserver-\w+",hostname="cp-b",state="live"\} 1`,
				`kube_mvp_xds_nacks_total\{node="` + d.name + `"\} 0`,
			}},
			{"extproc", k.ExtprocAdmin, []string{
				`kube_mvp_certificate_expiry_timestamp_seconds\{certificate="control-plane",role="extproc"\} \S+`,
				`kube_mvp_certificate_expiry_timestamp_seconds\{certificate="proxy-client",role="extproc"\} \S+`,
				`kube_mvp_extproc_decision_duration_seconds_count [1-9]\d*`,
			}},
		} {
			body := scrape(t, ctx, c.url+"/metrics")
			for _, m := range sampleName.FindAllSubmatch(body, -1) {
				scraped[string(m[1])] = true
			}
			problems, err := promlint.New(bytes.NewReader(body)).Lint()
			if err != nil {
				t.Fatalf("%s %s: %v", d.name, c.process, err)
			}
			t.Logf("%s %s: %d bytes, %d problems", d.name, c.process, len(body), len(problems))
			for _, p := range problems {
				t.Errorf("%s %s: %s: %s", d.name, c.process, p.Metric, p.Text)
			}
			for _, m := range typeLine.FindAllSubmatch(body, -1) {
				if name, typ := string(m[1]), string(m[2]); documented[name] != typ {
					t.Errorf("%s %s: %s is a %s; docs/operating.md's table says %q", d.name, c.process, name, typ, documented[name])
				}
			}
			for _, w := range c.want {
				if !regexp.MustCompile(`(?m)^` + w + `$`).Match(body) {
					t.Errorf("%s %s: no line matches %s", d.name, c.process, w)
				}
			}
			if t.Failed() {
				t.Logf("%s %s /metrics:\n%s", d.name, c.process, grepKubeMVP(body))
			}
		}
		// The Envoy series the alerts and the dashboard read, as the data plane exports them
		// (the stand-in names its stats as Envoy's /stats/prometheus does): the listener's
		// connection manager is kube_apiserver, and the requests above were answered 2xx.
		body := scrape(t, ctx, k.Envoy.Admin+"/stats/prometheus")
		for name, typ := range deploy.EnvoyMetrics {
			if !strings.Contains(string(body), "# TYPE "+name+" "+typ+"\n") {
				t.Errorf("%s Envoy: no %s %s", d.name, typ, name)
			}
		}
		for _, w := range []string{
			`envoy_http_downstream_rq_total\{envoy_http_conn_manager_prefix="kube_apiserver"\} [1-9]\d*`,
			`envoy_http_downstream_rq_xx\{envoy_http_conn_manager_prefix="kube_apiserver",envoy_response_code_class="2"\} [1-9]\d*`,
		} {
			if !regexp.MustCompile(`(?m)^` + w + `$`).Match(body) {
				t.Errorf("%s Envoy: no line matches %s in\n%s", d.name, w, body)
			}
		}
	}
	// The chart's alerts and dashboard name only series the processes export (a histogram's
	// by its _bucket, _sum or _count series, as queries name them).
	t.Logf("the chart's alerts and dashboard name %d kube_mvp_ metrics", len(monitored))
	for name, sources := range monitored {
		if !scraped[name] {
			t.Errorf("%s names %s, which no scrape has", strings.Join(sources, ", "), name)
		}
	}
}

var sampleName = regexp.MustCompile(`(?m)^(kube_mvp_\w+)[{ ]`)

// monitoredMetrics are the kube_mvp_ metrics the chart's PrometheusRule and Grafana dashboard
// name, each with the alerts and panels that do.
func monitoredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	qs, err := deploy.MonitoringQueries(filepath.Join(root, "deploy", "kube-mvp"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, q := range qs {
		metrics, _ := deploy.PromQLNames(q.Expr)
		for _, m := range metrics {
			if strings.HasPrefix(m, "kube_mvp_") && !slices.Contains(out[m], q.Source) {
				out[m] = append(out[m], q.Source)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("the chart's rules and dashboard name no kube_mvp_ metric")
	}
	return out
}

func scrape(t *testing.T, ctx context.Context, url string) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatal(fmt.Errorf("GET %s: %d %v", url, resp.StatusCode, err))
	}
	return body
}

// grepKubeMVP keeps kube-mvp's own lines (not the Go runtime's or the process's).
func grepKubeMVP(body []byte) string {
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.Contains(l, "kube_mvp_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var typeLine = regexp.MustCompile(`(?m)^# TYPE (kube_mvp_\w+) (\w+)$`)

// documentedMetrics are the rows of docs/operating.md's metrics table: name to type.
func documentedMetrics(t *testing.T) map[string]string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(kube_mvp_\\w+)` \\| (\\w+) \\|").FindAllSubmatch(b, -1) {
		out[string(m[1])] = string(m[2])
	}
	if len(out) == 0 {
		t.Fatal("docs/operating.md has no metrics table")
	}
	// A metric that went stays in no table: each row's name is in the code.
	var code strings.Builder
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, _ fs.DirEntry, err error) error {
			if err != nil || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			code.Write(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for name := range out {
		if !strings.Contains(code.String(), `"`+name+`"`) {
			t.Errorf("docs/operating.md documents %s, which no code exports", name)
		}
	}
	return out
}
