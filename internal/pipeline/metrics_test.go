package pipeline

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestAPIServerStateSeries: live, unverified and departed apiservers have series, dead and
// forgotten ones none, and unverified ones (a Lease is only a claim) at most
// maxUnverifiedSeries.
func TestAPIServerStateSeries(t *testing.T) {
	servers := []topology.APIServer{
		{ID: "a-live", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "b-departed", Hostname: "cp-b", Address: "10.0.0.2:6443"},
		{ID: "c-dead", Hostname: "cp-c"},
	}
	sources := map[string]topology.Source{
		"a-live":     {From: topology.SourceDiscovery},
		"b-departed": {From: topology.SourceRemembered},
	}
	for i := range maxUnverifiedSeries + 5 {
		id := fmt.Sprintf("u-%02d", i)
		servers = append(servers, topology.APIServer{ID: id, Hostname: "forged-" + id, Address: fmt.Sprintf("10.1.0.%d:6443", i)})
		sources[id] = topology.Source{From: topology.SourceNone, AwaitingDiscovery: true}
	}
	top, err := topology.New(servers, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	top.Sources = sources
	c := newAPIServerStateCollector()
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d series before the first topology", n)
	}
	c.t.Store(top)
	if n, want := testutil.CollectAndCount(c), 3*(2+maxUnverifiedSeries); n != want {
		t.Errorf("%d series, want %d", n, want)
	}
	want := `
kube_mvp_xds_apiserver_state{apiserver="a-live",hostname="cp-a",state="departed"} 0
kube_mvp_xds_apiserver_state{apiserver="a-live",hostname="cp-a",state="live"} 1
kube_mvp_xds_apiserver_state{apiserver="a-live",hostname="cp-a",state="unverified"} 0
kube_mvp_xds_apiserver_state{apiserver="b-departed",hostname="cp-b",state="departed"} 1
kube_mvp_xds_apiserver_state{apiserver="b-departed",hostname="cp-b",state="live"} 0
kube_mvp_xds_apiserver_state{apiserver="b-departed",hostname="cp-b",state="unverified"} 0
`
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(gather(t, c)), "\n") {
		if !strings.HasPrefix(l, "#") && !strings.Contains(l, `apiserver="u-`) {
			got = append(got, l)
		}
	}
	if g := strings.Join(got, "\n"); g != strings.TrimSpace(want) {
		t.Errorf("series:\n%s\nwant:\n%s", g, want)
	}
	if s := gather(t, c); !strings.Contains(s, `apiserver="u-15"`) || strings.Contains(s, `apiserver="u-16"`) {
		t.Errorf("unverified series are not the first %d by ID:\n%s", maxUnverifiedSeries, s)
	}
}

func gather(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	b, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "kube_mvp_xds_apiserver_state")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
