package topology_test

import (
	"strings"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

func TestNotRoutable(t *testing.T) {
	tp, err := topology.New([]topology.APIServer{
		{ID: "live", Hostname: "a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "stale", Hostname: "b", Address: "10.0.0.2:6443"},
		{ID: "unverified", Hostname: "c", Address: "10.0.0.3:6443", Alive: true},
		{ID: "departed", Hostname: "d", Address: "10.0.0.4:6443"},
		{ID: "nowhere", Hostname: "e", Alive: true, Verified: true},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tp.Sources = map[string]topology.Source{
		"unverified": {From: topology.SourceNone, AwaitingDiscovery: true},
		"departed":   {From: topology.SourceRemembered},
	}
	want := map[string]string{
		"stale":      "not renewed within the liveness window",
		"unverified": "own discovery was never read",
		"departed":   "departed",
		"nowhere":    "no address is known",
	}
	got := tp.NotRoutable()
	if len(got) != len(want) {
		t.Fatalf("got %d not routable, want %d: %+v", len(got), len(want), got)
	}
	for _, n := range got {
		if w, ok := want[n.ID]; !ok || !strings.Contains(n.Reason, w) {
			t.Errorf("%s: reason %q, want one saying %q", n.ID, n.Reason, w)
		}
	}
	if (&topology.Topology{}).NotRoutable() != nil {
		t.Error("an empty control plane has apiservers that are not routable")
	}
}
