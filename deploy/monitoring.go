package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/yaml"
)

// MonitoringAPIs are the prometheus-operator kinds the chart renders when the cluster serves
// them (monitoring.*.enabled: auto), as `helm template --api-versions` names them.
var MonitoringAPIs = []string{"monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/PodMonitor"}

// Query is one PromQL expression the chart ships: an alert's, or a dashboard panel's.
type Query struct {
	Source string // "alert KubeMVPEnvoyNACK", "dashboard panel Decisions by outcome"
	Expr   string
}

// DashboardVariables are what the dashboard's Grafana variables stand for when its queries
// are parsed outside Grafana.
var DashboardVariables = map[string]string{"$__rate_interval": "5m", "$namespace": "kube-mvp"}

// MonitoringQueries renders the chart in dir with every monitoring object on and returns the
// PromQL of its PrometheusRule and of its Grafana dashboard (Grafana's variables replaced by
// DashboardVariables), in the order they appear.
func MonitoringQueries(dir string) ([]Query, error) {
	vals := map[string]any{"monitoring": map[string]any{
		"prometheusRule": map[string]any{"enabled": true},
		"dashboards":     map[string]any{"enabled": true},
	}}
	out, err := RenderChartFor(dir, "kube-mvp", "kube-mvp", vals, MonitoringAPIs...)
	if err != nil {
		return nil, err
	}
	var qs []Query
	var rules, dashboards int
	for _, tpl := range slices.Sorted(maps.Keys(out)) {
		if filepath.Ext(tpl) != ".yaml" {
			continue // NOTES.txt, helpers
		}
		for _, doc := range releaseutil.SplitManifests(out[tpl]) {
			var obj struct {
				Kind string `json:"kind"`
				Spec struct {
					Groups []struct {
						Rules []struct {
							Alert, Record, Expr string
						} `json:"rules"`
					} `json:"groups"`
				} `json:"spec"`
				Data map[string]string `json:"data"`
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				return nil, fmt.Errorf("%s: %w", tpl, err)
			}
			switch {
			case obj.Kind == "PrometheusRule":
				rules++
				for _, g := range obj.Spec.Groups {
					for _, r := range g.Rules {
						qs = append(qs, Query{Source: "alert " + r.Alert + r.Record, Expr: r.Expr})
					}
				}
			case obj.Kind == "ConfigMap" && strings.HasSuffix(tpl, "/dashboards.yaml"):
				for _, name := range slices.Sorted(maps.Keys(obj.Data)) {
					dashboards++
					dq, err := DashboardQueries([]byte(obj.Data[name]))
					if err != nil {
						return nil, fmt.Errorf("%s %s: %w", tpl, name, err)
					}
					qs = append(qs, dq...)
				}
			}
		}
	}
	if rules == 0 || dashboards == 0 {
		return nil, fmt.Errorf("the chart rendered %d PrometheusRules and %d dashboards", rules, dashboards)
	}
	return qs, nil
}

// DashboardQueries returns the PromQL of every panel's targets of a Grafana dashboard (rows'
// nested panels included), with DashboardVariables substituted.
func DashboardQueries(dashboard []byte) ([]Query, error) {
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, err
	}
	var qs []Query
	var walk func([]json.RawMessage) error
	walk = func(ps []json.RawMessage) error {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				return err
			}
			for _, t := range p.Targets {
				expr := t.Expr
				for v, with := range DashboardVariables {
					expr = strings.ReplaceAll(expr, v, with)
				}
				qs = append(qs, Query{Source: "dashboard panel " + p.Title, Expr: expr})
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	return qs, walk(d.Panels)
}

// promqlWords are PromQL's keywords, aggregation operators and number words: identifiers
// that are never metric names. (Functions and aggregations are also told by the "(" after
// them; these are the ones that may be followed by something else, as in `sum by (x) (...)`.)
var promqlWords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"sum": true, "avg": true, "min": true, "max": true, "count": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "quantile": true, "count_values": true, "group": true,
	"limitk": true, "limit_ratio": true, "inf": true, "nan": true, "start": true, "end": true,
}

// PromQLNames returns the metric names an expression selects and the label names it uses
// (in matchers and in by/without/on/ignoring/group_left/group_right lists), each sorted and
// once. It is a tokenizer, not a parser: promtool checks that the expression parses.
func PromQLNames(expr string) (metrics, labels []string) {
	ms, ls := map[string]bool{}, map[string]bool{}
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	braces, grouping, inList := 0, false, false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			i = j + 1
		case c == '[':
			for i < len(expr) && expr[i] != ']' {
				i++
			}
			i++
		case c == '{':
			braces++
			i++
		case c == '}':
			braces--
			i++
		case c == '(':
			if grouping {
				inList = true
			}
			i++
		case c == ')':
			inList = false
			i++
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++
			}
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[k])) {
				k++
			}
			call := k < len(expr) && expr[k] == '('
			lower := strings.ToLower(word)
			switch {
			case braces > 0 || inList:
				ls[word] = true
			case lower == "by" || lower == "without" || lower == "on" || lower == "ignoring" || lower == "group_left" || lower == "group_right":
				grouping = true
				i = j
				continue
			case call || promqlWords[lower]:
			default:
				ms[word] = true
			}
			i = j
		default:
			i++
		}
		grouping = false
	}
	return slices.Sorted(maps.Keys(ms)), slices.Sorted(maps.Keys(ls))
}

// EnvoyMetrics are the Envoy metrics the chart's rules and dashboard use, with their type, and
// EnvoyLabels their tags. Envoy's HTTP connection manager counts
// http.<stat_prefix>.downstream_rq_total and downstream_rq_<class>xx (Envoy's docs, "HTTP
// connection manager statistics"); its default tag extraction (envoyproxy/envoy
// source/common/config/well_known_names.cc) takes <stat_prefix> out as
// envoy.http_conn_manager_prefix and <class> as envoy.response_code_class; /stats/prometheus
// (source/server/admin/prometheus_stats.cc) prefixes "envoy_" and turns every other character
// than [a-zA-Z0-9_] into "_" in names and tag names (not in tag values). The stand-in Envoy
// does the same (test/dataplane/tags.go), and test/e2e's TestMetricsLint finds these in its
// scrape.
var (
	EnvoyMetrics = map[string]string{"envoy_http_downstream_rq_total": "counter", "envoy_http_downstream_rq_xx": "counter"}
	EnvoyLabels  = []string{"envoy_http_conn_manager_prefix", "envoy_response_code_class"}
)
