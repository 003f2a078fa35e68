package xds

import (
	"reflect"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestSameForTranslationReadsEveryPlanField: every field of plan.Plan is compared (or, for
// Topology, its apiservers), and a change to any of them makes plans differ. A field added to
// Plan fails here until sameForTranslation compares it: Envoy would otherwise keep a stale
// translation.
func TestSameForTranslationReadsEveryPlanField(t *testing.T) {
	compared := map[string]func(p *plan.Plan){
		"Topology": func(p *plan.Plan) {
			p.Topology.APIServers = append([]topology.APIServer(nil), p.Topology.APIServers...)
			p.Topology.APIServers[0].Address = "127.0.0.1:9"
		},
		"LocalID":  func(p *plan.Plan) { p.LocalID = "apiserver-a" },
		"Clusters": func(p *plan.Plan) { p.Clusters = append([]plan.Cluster{{Name: "x"}}, p.Clusters...) },
		"Hosts":    func(p *plan.Plan) { p.Hosts = append(topology.ServerSet{"x"}, p.Hosts...) },
		"GroupVersions": func(p *plan.Plan) {
			p.GroupVersions = append([]plan.GroupVersion{{GroupVersion: topology.GroupVersion{Group: "x", Version: "v1"}}}, p.GroupVersions...)
		},
		"Aggregated":        func(p *plan.Plan) { p.Aggregated = []topology.GroupVersion{{Group: "x", Version: "v1"}} },
		"Routes":            func(p *plan.Plan) { p.Routes = &plan.Routes{LocalID: "x"} },
		"RequestHeaders":    func(p *plan.Plan) { p.RequestHeaders.User = []string{"X-Someone"} },
		"ProxyCertExcluded": func(p *plan.Plan) { p.ProxyCertExcluded = topology.ServerSet{"apiserver-a"} },
	}
	fields := reflect.TypeFor[plan.Plan]()
	for i := range fields.NumField() {
		if _, ok := compared[fields.Field(i).Name]; !ok {
			t.Errorf("plan.Plan.%s: sameForTranslation does not compare it (nor this test change it)", fields.Field(i).Name)
		}
	}

	tp, err := topology.New([]topology.APIServer{
		{ID: "apiserver-a", Hostname: "cp-a", Address: "127.0.0.1:1", Alive: true},
		{ID: "apiserver-b", Hostname: "cp-b", Address: "127.0.0.1:2", Alive: true},
	}, map[topology.Resource][]string{{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-a"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() *plan.Plan {
		p, err := plan.Build(tp)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if !sameForTranslation(fresh(), fresh()) {
		t.Fatal("two plans of one topology differ")
	}
	for name, change := range compared {
		p := fresh()
		change(p)
		if sameForTranslation(fresh(), p) {
			t.Errorf("a plan with another %s is taken as the same", name)
		}
	}
}
