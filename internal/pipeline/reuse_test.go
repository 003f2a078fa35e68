package pipeline

import (
	"log/slog"
	"reflect"
	"testing"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// crdTopology is a two-apiserver control plane with CRD groups served everywhere and a
// merged discovery document: what a CRD burst changes at every fetch.
func crdTopology(t *testing.T, address string, crds []topology.GroupVersion, doc string) *topology.Topology {
	t.Helper()
	served := map[topology.Resource][]string{{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-a"}}
	for _, gv := range crds {
		served[topology.Resource{Group: gv.Group, Version: gv.Version, Resource: "widgets"}] = []string{"apiserver-a", "apiserver-b"}
	}
	tp, err := topology.New([]topology.APIServer{
		{ID: "apiserver-a", Hostname: "cp-a", Address: "127.0.0.1:1", Alive: true, Verified: true},
		{ID: "apiserver-b", Hostname: "cp-b", Address: address, Alive: true, Verified: true},
	}, served, crds)
	if err != nil {
		t.Fatal(err)
	}
	tp.Discovery = topology.NewDiscovery([]byte(doc))
	return tp
}

func frontPlan(t *testing.T, tp *topology.Topology) *plan.Plan {
	t.Helper()
	p, err := plan.Build(tp)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTranslationReusedWhileThePlanIsTheSame: a plan the same for translation as the last
// one of its kind of Envoy gets the last snapshot, and it is what translating anew gives;
// anything snapshot.Build reads translates again.
func TestTranslationReusedWhileThePlanIsTheSame(t *testing.T) {
	translate := Translation{Config: snapshot.Config{ExtProcAddress: "unix:/run/kube-mvp/extproc.sock"}, Log: slog.New(slog.DiscardHandler)}.Snapshot
	translations := 0
	r := &reusing{translate: func(p *plan.Plan) (*cachev3.Snapshot, error) {
		translations++
		return translate(p)
	}}
	snap := func(p *plan.Plan) *cachev3.Snapshot {
		t.Helper()
		s, err := r.Snapshot(p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	one := []topology.GroupVersion{{Group: "a.example.com", Version: "v1"}}
	two := append(one, topology.GroupVersion{Group: "b.example.com", Version: "v1"})
	first := snap(frontPlan(t, crdTopology(t, "127.0.0.1:2", one, `{"n":1}`)))

	// A CRD every apiserver serves and a new merged document: the same plan for translation.
	second := frontPlan(t, crdTopology(t, "127.0.0.1:2", two, `{"n":2}`))
	if s := snap(second); s != first || translations != 1 {
		t.Errorf("a new CRD served everywhere and a new merged document: %d translations, want the first reused", translations)
	}
	anew, err := translate(second)
	if err != nil {
		t.Fatal(err)
	}
	for typ, rs := range first.Resources {
		for name, res := range rs.Items {
			if other, ok := anew.Resources[typ].Items[name]; !ok || !proto.Equal(res.Resource, other.Resource) {
				t.Errorf("resource %s differs between plans taken as the same", name)
			}
		}
	}

	snap(frontPlan(t, crdTopology(t, "127.0.0.1:3", two, `{"n":2}`)))
	if translations != 2 {
		t.Errorf("apiserver-b moved: %d translations, want 2", translations)
	}
	moved := crdTopology(t, "127.0.0.1:3", two, `{"n":2}`)
	moved.Served[topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}] = []string{"apiserver-a", "apiserver-b"}
	snap(frontPlan(t, moved))
	if translations != 3 {
		t.Errorf("jobs served everywhere: %d translations, want 3", translations)
	}
	// A sidecar's plan is another kind of Envoy: its own translation, kept apart.
	sidecar := frontPlan(t, moved.WithLocal("apiserver-a"))
	snap(sidecar)
	snap(sidecar)
	if translations != 4 {
		t.Errorf("a sidecar's plan twice: %d translations, want 4", translations)
	}
}

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
	tp := crdTopology(t, "127.0.0.1:2", nil, `{}`)
	if !sameForTranslation(frontPlan(t, tp), frontPlan(t, tp)) {
		t.Fatal("two plans of one topology differ")
	}
	for name, change := range compared {
		p := frontPlan(t, tp)
		change(p)
		if sameForTranslation(frontPlan(t, tp), p) {
			t.Errorf("a plan with another %s is taken as the same", name)
		}
	}
}
