package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// apiserverMetric reads apiserver s's own /metrics, directly and as cluster admin (never
// through kube-mvp), and sums the samples of metric name whose labels include every one of
// labels: what that apiserver itself counts, whichever way a balancer sent the requests. A
// metric without samples (a vector no request has touched yet) is 0.
func (e *env) apiserverMetric(ctx context.Context, s *controlplane.Server, name string, labels map[string]string) (float64, error) {
	hc, err := e.cp.HTTPClient()
	if err != nil {
		return 0, err
	}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s's /metrics: %w", s.Spec.Name, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 1000))
		return 0, fmt.Errorf("%s's /metrics: %s: %s", s.Spec.Name, res.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return 0, fmt.Errorf("%s's /metrics: %w", s.Spec.Name, err)
	}
	sum := 0.0
	for _, m := range families[name].GetMetric() {
		if hasLabels(m, labels) {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return sum, nil
}

// hasLabels: m carries every label of want with its value (a label m lacks has the value
// "", as in Prometheus).
func hasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
