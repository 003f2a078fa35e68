package xds

import (
	"reflect"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kube-mvp/kube-mvp/internal/plan"
)

// translation is the last plan of one kind of Envoy and what Translate made of it.
type translation struct {
	in  *plan.Plan
	out *cachev3.Snapshot
}

// sameForTranslation reports whether plans a and b make the same Envoy resources. They do
// when they agree on everything snapshot.Build reads: every field of the plan but its
// topology, and of the topology only the apiservers (names, addresses, liveness). The
// merged discovery and who serves what reach Envoy only through the plan's decisions, so a
// discovery change that moves no route, cluster or apiserver costs no translation (issue:
// a CRD burst changed the merged document hundreds of times, the plans rarely).
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
