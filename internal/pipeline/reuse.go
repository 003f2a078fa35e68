package pipeline

import (
	"reflect"
	"slices"
	"sync"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// reusing wraps a translator that depends on the plan alone (Translation: snapshot.Build
// with a fixed configuration) and hands back its last snapshot for a kind of Envoy while the
// plan is the same for translation: a new merged document that moves no route, cluster or
// apiserver costs no translation (a CRD burst changes the document hundreds of times, the
// plans rarely).
type reusing struct {
	translate xds.Translator
	mu        sync.Mutex
	last      map[string]translation // by the plan's LocalID ("" the front proxy)
}

type translation struct {
	in  *plan.Plan
	out *cachev3.Snapshot
}

func (r *reusing) Snapshot(p *plan.Plan) (*cachev3.Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p != nil && p.Topology != nil {
		for local := range r.last { // a kind of Envoy whose apiserver is gone
			if local != "" && !slices.ContainsFunc(p.Topology.APIServers, func(s topology.APIServer) bool { return s.ID == local }) {
				delete(r.last, local)
			}
		}
	}
	if p != nil {
		if last, ok := r.last[p.LocalID]; ok && sameForTranslation(last.in, p) {
			r.last[p.LocalID] = translation{in: p, out: last.out} // the older plan is let go
			return last.out, nil
		}
	}
	snap, err := r.translate(p)
	if err == nil && p != nil {
		if r.last == nil {
			r.last = map[string]translation{}
		}
		r.last[p.LocalID] = translation{in: p, out: snap}
	}
	return snap, err
}

// sameForTranslation reports whether plans a and b make the same Envoy resources. They do
// when they agree on everything snapshot.Build reads: every field of the plan but its
// topology, and of the topology only the apiservers (names, addresses, liveness). The merged
// discovery and who serves what reach Envoy only through the plan's decisions.
// TestSameForTranslationReadsEveryPlanField fails when Plan gains a field this does not compare.
func sameForTranslation(a, b *plan.Plan) bool {
	if a == nil || b == nil || a.Topology == nil || b.Topology == nil {
		return false
	}
	return a.LocalID == b.LocalID &&
		reflect.DeepEqual(a.Topology.APIServers, b.Topology.APIServers) &&
		reflect.DeepEqual(a.Clusters, b.Clusters) &&
		reflect.DeepEqual(a.Hosts, b.Hosts) &&
		reflect.DeepEqual(a.GroupVersions, b.GroupVersions) &&
		reflect.DeepEqual(a.Aggregated, b.Aggregated) &&
		sameRoutes(a.Routes, b.Routes) &&
		reflect.DeepEqual(a.RequestHeaders, b.RequestHeaders) &&
		reflect.DeepEqual(a.ProxyCertExcluded, b.ProxyCertExcluded)
}

func sameRoutes(a, b *plan.Routes) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.LocalID == b.LocalID && reflect.DeepEqual(a.Default, b.Default) && reflect.DeepEqual(a.All(), b.All())
}
