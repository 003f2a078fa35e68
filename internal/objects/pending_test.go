package objects

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestPendingResources: which new CRDs' resources are pending, in which versions, and the
// bounds on what anyone who may create CRDs can make pending.
func TestPendingResources(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	svc := func(group, version string, automanaged string, service bool) APIService {
		var s APIService
		s.Name = version + "." + group
		s.Spec.Group, s.Spec.Version = group, version
		if automanaged != "" {
			s.Labels = map[string]string{AutomanagedLabel: automanaged}
		}
		if service {
			s.Spec.Service = &struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			}{"default", "x"}
		}
		return s
	}
	services := []APIService{
		svc("crd.example.com", "v1", "true", false), svc("crd.example.com", "v2", "true", false),
		svc("agg.example.com", "v1", "", true),    // an aggregated API: no CRD versions
		svc("apps", "v1", "onstart", false),       // built in
		svc("other.example.com", "v1", "", false), // a hand-made APIService: not kube-aggregator's for CRDs
	}
	tp, err := topology.New([]topology.APIServer{
		{ID: "a", Hostname: "a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "dead", Hostname: "dead", Address: "10.0.0.2:6443"},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	served := map[topology.Resource][]string{
		{Group: "crd.example.com", Version: "v1", Resource: "listed"}: {"a"},
		{Group: "crd.example.com", Version: "v1", Resource: "gone"}:   {"dead"},
	}
	crds := []CRD{
		{Name: "widgets.crd.example.com", Created: now.Add(-time.Second)},             // both versions
		{Name: "listed.crd.example.com", Created: now.Add(-time.Second)},              // v1 listed by a live one: v2 only
		{Name: "gone.crd.example.com", Created: now.Add(-time.Second)},                // only a dead one lists v1: both
		{Name: "old.crd.example.com", Created: now.Add(-PendingWindow)},               // just too old
		{Name: "future.crd.example.com", Created: now.Add(PendingWindow)},             // a clock far off
		{Name: "soon.crd.example.com", Created: now.Add(PendingWindow - time.Second)}, // a clock a little off
		{Name: "nodot", Created: now},
		{Name: "x.agg.example.com", Created: now},
		{Name: "deployments2.apps", Created: now},
		{Name: "y.other.example.com", Created: now},
		{Name: "Bad_Name.crd.example.com", Created: now},
		{Name: "zero.crd.example.com"},
	}
	keys, errs := pendingResources(crds, services, served, tp, now)
	var got []string
	for _, k := range keys {
		got = append(got, k.String())
	}
	want := "crd.example.com/v1/widgets crd.example.com/v2/widgets crd.example.com/v2/listed crd.example.com/v1/gone crd.example.com/v2/gone crd.example.com/v1/soon crd.example.com/v2/soon"
	if strings.Join(got, " ") != want {
		t.Errorf("pending:\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "Bad_Name") {
		t.Errorf("errors %v, want one naming the CRD whose resource name Kubernetes would refuse", errs)
	}

	// More than MaxPendingResources: the first ones, and an error.
	many := make([]CRD, MaxPendingResources+5)
	for i := range many {
		many[i] = CRD{Name: fmt.Sprintf("r%04d.crd.example.com", i), Created: now}
	}
	keys, errs = pendingResources(many, services[:1], nil, tp, now)
	if len(keys) != MaxPendingResources || len(errs) != 1 || !strings.Contains(errs[0].Error(), fmt.Sprint(MaxPendingResources)) {
		t.Errorf("%d CRDs: %d pending, errors %v; want %d and one error", len(many), len(keys), errs, MaxPendingResources)
	}
}
