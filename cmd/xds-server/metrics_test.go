package main

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-mvp/kube-mvp/internal/inventory"
)

// TestDiscoveryRefusedSeries: every reason a discovery fetch is refused for has a series from
// the start, so that increase() sees the first refusal.
func TestDiscoveryRefusedSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newInventoryMetrics(reg)
	m.discoveryRefused.WithLabelValues(inventory.RefusedTooLarge).Inc()
	want := `
# HELP kube_mvp_xds_discovery_refused_total ` + discoveryRefusedHelp + `
# TYPE kube_mvp_xds_discovery_refused_total counter
kube_mvp_xds_discovery_refused_total{reason="redirect"} 0
kube_mvp_xds_discovery_refused_total{reason="too-large"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kube_mvp_xds_discovery_refused_total"); err != nil {
		t.Error(err)
	}
}
