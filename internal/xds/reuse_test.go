package xds_test

import (
	"testing"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// crdTopology is topo's control plane with a CRD group served everywhere and merged
// discovery doc: what a CRD burst changes at every fetch.
func crdTopology(t *testing.T, address string, crds []topology.GroupVersion, doc string) *topology.Topology {
	t.Helper()
	served := map[topology.Resource][]string{{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-a"}}
	for _, gv := range crds {
		served[topology.Resource{Group: gv.Group, Version: gv.Version, Resource: "widgets"}] = []string{"apiserver-a", "apiserver-b"}
	}
	tp, err := topology.New([]topology.APIServer{
		{ID: "apiserver-a", Hostname: "cp-a", Address: "127.0.0.1:1", Alive: true},
		{ID: "apiserver-b", Hostname: "cp-b", Address: address, Alive: true},
	}, served, crds)
	if err != nil {
		t.Fatal(err)
	}
	tp.Discovery = topology.NewDiscovery([]byte(doc))
	return tp
}

func TestTranslationReusedWhileThePlanIsTheSame(t *testing.T) {
	translations := 0
	srv := xds.New(xds.Options{Translate: func(p *plan.Plan) (*cachev3.Snapshot, error) {
		translations++
		return buildSnapshot(p)
	}, MakeBeforeBreak: noMBB})
	update := func(tp *topology.Topology) {
		t.Helper()
		if err := srv.Update(plans(t, tp)); err != nil {
			t.Fatal(err)
		}
	}
	one := []topology.GroupVersion{{Group: "a.example.com", Version: "v1"}}
	two := append(one, topology.GroupVersion{Group: "b.example.com", Version: "v1"})
	first := crdTopology(t, "127.0.0.1:2", one, `{"n":1}`)
	update(first)
	if translations != 1 {
		t.Fatalf("first Update: %d translations, want 1", translations)
	}

	// A CRD every apiserver serves and a new merged document: no route, cluster or
	// apiserver changes, so the translation is reused; and it is what translating anew gives.
	second := crdTopology(t, "127.0.0.1:2", two, `{"n":2}`)
	update(second)
	if translations != 1 {
		t.Errorf("a new CRD served everywhere and a new merged document: %d translations, want the first reused", translations)
	}
	assertSameResources(t, plans(t, first).Front, plans(t, second).Front)

	// An apiserver's address is read by the endpoints: translated again.
	update(crdTopology(t, "127.0.0.1:3", two, `{"n":2}`))
	if translations != 2 {
		t.Errorf("apiserver-b moved: %d translations, want 2", translations)
	}
	// A route that changes (jobs now served by cp-b too): translated again.
	moved := crdTopology(t, "127.0.0.1:3", two, `{"n":2}`)
	moved.Served[topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}] = []string{"apiserver-a", "apiserver-b"}
	update(moved)
	if translations != 3 {
		t.Errorf("jobs served everywhere: %d translations, want 3", translations)
	}
}

// assertSameResources: a and b translate to the same Envoy resources, type by type.
func assertSameResources(t *testing.T, a, b *plan.Plan) {
	t.Helper()
	sa, err := buildSnapshot(a)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := buildSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	for typ, ra := range sa.Resources {
		rb := sb.Resources[typ]
		if len(ra.Items) != len(rb.Items) {
			t.Fatalf("resource type %d: %d resources, then %d", typ, len(ra.Items), len(rb.Items))
		}
		for name, r := range ra.Items {
			other, ok := rb.Items[name]
			if !ok || !proto.Equal(r.Resource, other.Resource) {
				t.Errorf("resource %s differs between plans the server takes as the same", name)
			}
		}
	}
}
