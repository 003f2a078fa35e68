package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// monitoringGroup is prometheus-operator's API group: its kinds are not in client-go's scheme,
// so render decodes them strictly into the types below (the fields the chart may use).
const monitoringGroup = "monitoring.coreos.com"

type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type podMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// decodeMonitoring decodes a prometheus-operator object strictly: a field the types above do
// not have is an error.
func decodeMonitoring(kind string, js []byte) error {
	var into any
	switch kind {
	case "PrometheusRule":
		into = &prometheusRule{}
	case "PodMonitor":
		into = &podMonitor{}
	default:
		return fmt.Errorf("the chart renders no %s/%s", monitoringGroup, kind)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

func (m *manifest) prometheusRule(t *testing.T) *prometheusRule {
	t.Helper()
	var r prometheusRule
	if err := json.Unmarshal(mustJSON(t, m.raw), &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

func mustJSON(t *testing.T, raw []byte) []byte {
	t.Helper()
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestMonitoringRender: the PrometheusRule comes with the API (auto) or when asked for; the
// PodMonitor scrapes ports the pods have, and the NetworkPolicy admits the scraper to
// xds-server's admin port only when asked; the dashboard ConfigMap carries the sidecar label.
func TestMonitoringRender(t *testing.T) {
	const ns = "kube-mvp"
	scraper := []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}}
	for _, c := range []struct {
		name     string
		vals     map[string]any
		apis     []string
		want     map[string]int // kinds beyond the default's, by count
		validate func(t *testing.T, r *rendered)
	}{
		{name: "no-api", want: map[string]int{}},
		{name: "auto", apis: MonitoringAPIs, want: map[string]int{"PrometheusRule": 1}},
		{name: "auto-off", apis: MonitoringAPIs, vals: map[string]any{"monitoring": map[string]any{"prometheusRule": map[string]any{"enabled": false}}}, want: map[string]int{}},
		{name: "forced", vals: map[string]any{"monitoring": map[string]any{"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "kps"}, "selector": `job="kube-mvp"`}}},
			want: map[string]int{"PrometheusRule": 1},
			validate: func(t *testing.T, r *rendered) {
				pr := r.mustFind(t, "PrometheusRule", fullname).prometheusRule(t)
				if pr.Metadata.Labels["release"] != "kps" {
					t.Errorf("labels %v lack release=kps", pr.Metadata.Labels)
				}
				for _, g := range pr.Spec.Groups {
					for _, rl := range g.Rules {
						if strings.Contains(rl.Expr, "namespace=") || !strings.Contains(rl.Expr, `{job="kube-mvp"`) {
							t.Errorf("%s: %s does not select by the selector alone", rl.Alert, rl.Expr)
						}
					}
				}
			}},
		{name: "pod-monitor", vals: map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true, "interval": "30s", "scraperFrom": scraper}}},
			want:     map[string]int{"PodMonitor": 1},
			validate: func(t *testing.T, r *rendered) { checkPodMonitor(t, r, "Deployment", scraper) }},
		{name: "pod-monitor-sidecar", vals: map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false},
			"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}}},
			want:     map[string]int{"PodMonitor": 1},
			validate: func(t *testing.T, r *rendered) { checkPodMonitor(t, r, "DaemonSet", nil) }},
		{name: "dashboards", vals: map[string]any{"monitoring": map[string]any{"dashboards": map[string]any{"enabled": true, "annotations": map[string]any{"grafana_folder": "kube-mvp"}}}},
			want: map[string]int{"ConfigMap": 1},
			validate: func(t *testing.T, r *rendered) {
				cm := r.mustFind(t, "ConfigMap", fullname+"-dashboards").typed.(*corev1.ConfigMap)
				if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "kube-mvp" || cm.Namespace != ns {
					t.Errorf("dashboard ConfigMap %s/%s labels %v annotations %v", cm.Namespace, cm.Name, cm.Labels, cm.Annotations)
				}
				var d map[string]any
				if err := json.Unmarshal([]byte(cm.Data["kube-mvp.json"]), &d); err != nil || d["uid"] != "kube-mvp" {
					t.Errorf("kube-mvp.json is no dashboard (uid %v): %v", d["uid"], err)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base, err := render(map[string]any{}, ns)
			if err != nil {
				t.Fatal(err)
			}
			r, err := render(c.vals, ns, c.apis...)
			if err != nil {
				t.Fatal(err)
			}
			want := base.kinds()
			if c.name == "pod-monitor-sidecar" {
				want = r.kinds() // another mode; only the PodMonitor is checked
				want["PodMonitor"] = 0
			}
			for k, n := range c.want {
				want[k] += n
			}
			if got := r.kinds(); !maps.Equal(got, want) {
				t.Errorf("kinds %v, want %v", got, want)
			}
			checkCommon(t, r, ns)
			if c.validate != nil {
				c.validate(t, r)
			}
		})
	}
}

// checkPodMonitor: every endpoint names a container port of the release's pods that serves
// metrics there (xds-server's and extproc's /metrics, Envoy's health listener's
// /stats/prometheus, which routes only that and /ready to the loopback admin), the selector
// picks exactly the xds-server and Envoy pods, and only scraper joins adminFrom.
func checkPodMonitor(t *testing.T, r *rendered, envoyKind string, scraper []any) {
	t.Helper()
	var pm podMonitor
	if err := json.Unmarshal(mustJSON(t, r.mustFind(t, "PodMonitor", fullname).raw), &pm); err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]string{} // port name -> container
	for _, o := range r.objs {
		var tmpl *corev1.PodTemplateSpec
		switch w := o.typed.(type) {
		case *appsv1.Deployment:
			tmpl = &w.Spec.Template
		case *appsv1.DaemonSet:
			tmpl = &w.Spec.Template
		default:
			continue
		}
		picked := sel.Matches(labelSet(tmpl.Labels))
		if want := o.obj.GetName() == fullname+"-xds-server" || o.obj.GetName() == fullname+"-envoy" && o.obj.GetKind() == envoyKind; picked != want {
			t.Errorf("the PodMonitor's selector picks %s %s: %v", o.obj.GetKind(), o.obj.GetName(), picked)
		}
		for _, c := range tmpl.Spec.Containers {
			for _, p := range c.Ports {
				ports[p.Name] = c.Name
			}
		}
	}
	want := map[string]string{"admin": "xds-server /metrics", "extproc-admin": "extproc /metrics", "health": "envoy /stats/prometheus"}
	got := map[string]string{}
	for _, e := range pm.Spec.PodMetricsEndpoints {
		got[e.Port] = ports[e.Port] + " " + e.Path
	}
	if !maps.Equal(got, want) {
		t.Errorf("PodMonitor endpoints %v, want %v", got, want)
	}
	if !slices.Equal(pm.Spec.NamespaceSelector.MatchNames, []string{"kube-mvp"}) {
		t.Errorf("namespaceSelector %v", pm.Spec.NamespaceSelector)
	}
	boot := r.mustFind(t, "ConfigMap", fullname+"-envoy").typed.(*corev1.ConfigMap)
	b, err := decodeBootstrap([]byte(boot.Data["envoy.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if admin := b.GetAdmin().GetAddress().GetSocketAddress().GetAddress(); admin != "127.0.0.1" {
		t.Errorf("Envoy's admin listens on %s", admin)
	}
	if !strings.Contains(boot.Data["envoy.yaml"], "match: {path: /stats/prometheus,") {
		t.Error("Envoy's health listener does not route /stats/prometheus")
	}
	if np := r.find("NetworkPolicy", fullname+"-xds-server"); np != nil {
		var admin []networkingv1.NetworkPolicyPeer
		for _, rule := range np.typed.(*networkingv1.NetworkPolicy).Spec.Ingress {
			if len(rule.Ports) == 1 && rule.Ports[0].Port.StrVal == "admin" {
				admin = rule.From
			}
		}
		js, _ := json.Marshal(admin)
		want, _ := json.Marshal(scraper)
		if string(js) != string(want) {
			t.Errorf("xds-server's admin port admits %s, want %s", js, want)
		}
	}
}

type labelSet map[string]string

func (l labelSet) Has(k string) bool              { _, ok := l[k]; return ok }
func (l labelSet) Get(k string) string            { return l[k] }
func (l labelSet) Lookup(k string) (string, bool) { v, ok := l[k]; return v, ok }

// promtoolVersion is the Prometheus release whose promtool checks the rules: the Go module
// github.com/prometheus/prometheus v0.316.0 (the module's v0.X.Y tags track Prometheus 3.X.Y).
const promtoolVersion = "v0.316.0"

// promtoolTags leave Prometheus' service discovery (cloud SDKs, about half the build) out of
// promtool: its rule tests and rule checks need none, and a cold build takes half the time.
const promtoolTags = "remove_all_sd"

// promtool returns a promtool binary, built with `go install` from Prometheus' Go module at
// promtoolVersion (checked against the Go checksum database) into the shared cache the first
// time: a cold build downloads the module and its requirements and takes minutes.
func promtool(t *testing.T) string {
	t.Helper()
	cache, err := controlplane.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(cache, "bin")
	dir := filepath.Join(bin, "promtool-"+promtoolVersion+"-"+promtoolTags+"-"+runtime.Version())
	exe := filepath.Join(dir, "promtool")
	if fi, err := os.Stat(exe); err == nil && fi.Mode()&0o111 != 0 {
		return exe
	}
	limit := 20 * time.Minute
	if d, ok := t.Deadline(); ok && time.Until(d)-30*time.Second < limit {
		limit = time.Until(d) - 30*time.Second
	}
	ctx := testutil.Context(t, limit)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	unlock, err := controlplane.LockFile(ctx, dir+".lock")
	if err != nil {
		t.Fatalf("waiting for another test's promtool build: %v", err)
	}
	defer unlock()
	if fi, err := os.Stat(exe); err == nil && fi.Mode()&0o111 != 0 {
		return exe
	}
	tmp, err := os.MkdirTemp(bin, ".build-promtool-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	pkg := "github.com/prometheus/prometheus/cmd/promtool@" + promtoolVersion
	t.Logf("building promtool: go install -tags %s %s (a cold build takes minutes; limit %s)", promtoolTags, pkg, limit.Round(time.Second))
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "install", "-trimpath", "-tags", promtoolTags, pkg)
	cmd.Dir = tmp // outside any module
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("not done within %s: %w", limit.Round(time.Second), ctx.Err())
	}
	if err != nil {
		t.Fatalf("building promtool from Go module %s (needs the Go module proxy, or a module cache that has it): %v\n%s", pkg, err, lastLines(out, 30))
	}
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("built promtool in %s, cached in %s", time.Since(start).Round(time.Second), dir)
	return exe
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// renderedRules renders the chart's PrometheusRule (release kmvp in namespace kube-mvp) and
// returns its spec as a Prometheus rules file.
func renderedRules(t *testing.T) (*prometheusRule, []byte) {
	t.Helper()
	r, err := render(map[string]any{}, "kube-mvp", MonitoringAPIs...)
	if err != nil {
		t.Fatal(err)
	}
	pr := r.mustFind(t, "PrometheusRule", fullname).prometheusRule(t)
	file, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return pr, file
}

// TestAlertRules runs `promtool test rules` on testdata/alerts_test.yaml against the rules of
// the rendered chart: every alert fires on series shaped like the real ones and stays quiet on
// healthy ones. Each alert has a severity, a summary, a description and a runbook: a section
// of docs/operating.md's "Alerts".
func TestAlertRules(t *testing.T) {
	pr, file := renderedRules(t)
	dir := t.TempDir()
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"rules.yaml": file, "alerts_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Log(runPromtool(t, dir, "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml"))
	t.Log(runPromtool(t, dir, "test", "rules", "alerts_test.yaml"))

	// Every alert is tested both ways.
	var suite struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &suite); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range suite.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	docs := operatingDoc(t)
	for _, g := range pr.Spec.Groups {
		for _, rl := range g.Rules {
			if rl.Alert == "" {
				continue
			}
			if !fires[rl.Alert] || !quiet[rl.Alert] {
				t.Errorf("%s: tested firing %v, quiet %v; want both", rl.Alert, fires[rl.Alert], quiet[rl.Alert])
			}
			if s := rl.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", rl.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if rl.Annotations[a] == "" {
					t.Errorf("%s: no %s", rl.Alert, a)
				}
			}
			anchor := strings.ToLower(rl.Alert)
			if !strings.HasSuffix(rl.Annotations["runbook_url"], "/docs/operating.md#"+anchor) {
				t.Errorf("%s: runbook_url %s, want docs/operating.md#%s", rl.Alert, rl.Annotations["runbook_url"], anchor)
			}
			if !regexp.MustCompile(`(?m)^#### ` + rl.Alert + `$`).MatchString(docs) {
				t.Errorf("docs/operating.md has no runbook section #### %s", rl.Alert)
			}
			checkAlertRow(t, docs, rl)
			delete(fires, rl.Alert)
			delete(quiet, rl.Alert)
		}
	}
	if len(fires)+len(quiet) > 0 {
		t.Errorf("alerts_test.yaml tests alerts the chart does not have: %v %v", slices.Sorted(maps.Keys(fires)), slices.Sorted(maps.Keys(quiet)))
	}
}

// checkAlertRow: docs/operating.md's table of alerts has the alert's severity, expression
// (without the release's selector) and for; "the same `< N`" stands for the row above's
// expression with another threshold.
func checkAlertRow(t *testing.T, docs string, rl rule) {
	t.Helper()
	m := regexp.MustCompile("(?m)^\\| `" + rl.Alert + "` \\| (\\w+) \\| (.*) \\|\\s*(\\w*)\\s*\\|$").FindStringSubmatch(docs)
	if m == nil {
		t.Errorf("docs/operating.md's table of alerts has no row for %s", rl.Alert)
		return
	}
	expr := strings.NewReplacer(`{namespace="kube-mvp"}`, "", `namespace="kube-mvp",`, "").Replace(rl.Expr)
	expr = strings.Join(strings.Fields(expr), " ")
	var ok bool
	if same, found := strings.CutPrefix(m[2], "the same `"); found {
		ok = strings.HasSuffix(expr, " "+strings.TrimSuffix(same, "`"))
	} else {
		ok = m[2] == "`"+expr+"`"
	}
	if !ok || m[1] != rl.Labels["severity"] || m[3] != rl.For {
		t.Errorf("docs/operating.md's row for %s: %s, %s, for %q; the rule: %s, `%s`, for %q", rl.Alert, m[1], m[2], m[3], rl.Labels["severity"], expr, rl.For)
	}
}

var (
	// targetLabels are the labels Prometheus (prometheus-operator's PodMonitor) gives every
	// series of a target; le is a histogram bucket's.
	targetLabels = []string{"namespace", "pod", "container", "endpoint", "instance", "job", "le"}
)

// TestMonitoringQueries: every PromQL expression of the rules and of the dashboard parses
// (promtool check rules, the dashboard's as recording rules) and names only metrics that
// docs/operating.md's table documents (TestMetricsLint checks the table against the running
// processes and test/e2e's TestMonitoringMetricsScraped the names against a scrape) or
// Envoy's, and only their labels.
func TestMonitoringQueries(t *testing.T) {
	qs, err := MonitoringQueries(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	docs := operatingDoc(t)
	documented, docLabels := documentedMetrics(t, docs)
	var recording []rule
	alerts, panels := 0, 0
	for i, q := range qs {
		if strings.HasPrefix(q.Source, "alert ") {
			alerts++
		} else {
			panels++
			recording = append(recording, rule{Record: fmt.Sprintf("kube_mvp_dashboard:query_%d", i), Expr: q.Expr})
		}
		if strings.Contains(q.Expr, "$") {
			t.Errorf("%s: a Grafana variable left in %s", q.Source, q.Expr)
		}
		metrics, labels := PromQLNames(q.Expr)
		if len(metrics) == 0 {
			t.Errorf("%s: no metric in %s", q.Source, q.Expr)
		}
		for _, m := range metrics {
			if documented[m] == "" && EnvoyMetrics[m] == "" {
				t.Errorf("%s: %s is no metric kube-mvp or Envoy exports (docs/operating.md's table, EnvoyMetrics)", q.Source, m)
			}
		}
		for _, l := range labels {
			if !docLabels[l] && !slices.Contains(EnvoyLabels, l) && !slices.Contains(targetLabels, l) {
				t.Errorf("%s: label %s is in no metric's labels (docs/operating.md's table) nor a target's", q.Source, l)
			}
		}
	}
	if alerts == 0 || panels == 0 {
		t.Fatalf("%d alert and %d dashboard queries", alerts, panels)
	}
	dir := t.TempDir()
	file, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": recording}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yaml"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Log(runPromtool(t, dir, "check", "rules", "dashboard.yaml"))
}

func TestPromQLNames(t *testing.T) {
	for _, c := range []struct {
		expr            string
		metrics, labels []string
	}{
		{`increase(kube_mvp_xds_nacks_total{namespace="a b {c}"}[10m]) > 0`, []string{"kube_mvp_xds_nacks_total"}, []string{"namespace"}},
		{`count by (namespace, job) (count by (job, version) (x{version!~"on|by"})) > 1`, []string{"x"}, []string{"job", "namespace", "version"}},
		{"histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))", []string{"h_bucket"}, []string{"le"}},
		{"(min by (role) (a) - time()) / 86400 < 14 and on(role) group_left(x) b offset 5m unless bool c", []string{"a", "b", "c"}, []string{"role", "x"}},
		{"sum without (pod) (rate(a[5m])) / sum(rate(b [1m:30s]))", []string{"a", "b"}, []string{"pod"}},
		{"a and ignoring(x) group_right c", []string{"a", "c"}, []string{"x"}},
	} {
		m, l := PromQLNames(c.expr)
		if !slices.Equal(m, c.metrics) || !slices.Equal(l, c.labels) {
			t.Errorf("PromQLNames(%q) = %v, %v; want %v, %v", c.expr, m, l, c.metrics, c.labels)
		}
	}
}

func operatingDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// documentedMetrics reads docs/operating.md's metrics table: every series name (a histogram's
// _bucket, _sum and _count) with its type, and every label named in it.
func documentedMetrics(t *testing.T, doc string) (map[string]string, map[string]bool) {
	t.Helper()
	names, labels := map[string]string{}, map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(kube_mvp_\\w+)` \\| (\\w+) \\|([^|]*)\\|").FindAllStringSubmatch(doc, -1) {
		names[m[1]] = m[2]
		if m[2] == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+s] = m[2]
			}
		}
		// The labels are the column's names outside parentheses (which list values).
		cell := regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(m[3], "")
		for _, l := range regexp.MustCompile("`(\\w+)`").FindAllStringSubmatch(cell, -1) {
			labels[l[1]] = true
		}
	}
	if len(names) == 0 {
		t.Fatal("docs/operating.md has no metrics table")
	}
	return names, labels
}
