package makebeforebreak

import (
	"math/bits"
	"slices"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// maxNarrowSearch bounds the serving sets whose every subset narrowTo tries (2^n names);
// a larger one is narrowed to one known member.
const maxNarrowSearch = 10

// narrowTo returns e with every route to a serving set that known (the names of the last
// routing table Envoy has had time to learn) lacks narrowed to the largest subset of its
// members that known has — a known host's set of one always is — preferring members that
// were live then (a returning apiserver may not pass Envoy's health checks yet), or, when
// none of its members is known, to Unavailable (a 503 with Retry-After, as while nobody can
// serve it). Every member of the narrowed set serves the resource, so no request reaches an
// apiserver that would answer 404. A pure function: only the routes change, e's other parts
// are shared, and a plan with nothing to narrow is returned as it is.
func narrowTo(e *plan.Envoys, known Names) *plan.Envoys {
	n := &narrower{front: e.Front, known: known, memo: map[string]plan.Route{}}
	out := &plan.Envoys{Front: n.plan(e.Front), Local: make(map[string]*plan.Plan, len(e.Local))}
	for id, p := range e.Local {
		out.Local[id] = n.plan(p)
	}
	return out
}

type narrower struct {
	// front names the serving sets (its topology) and refuses a set of only dangerous
	// apiservers (plan.Plan.SubsetRoute) for every plan alike.
	front *plan.Plan
	known Names
	// memo holds the narrowed route (cluster, outcome, servers) of each unknown set by name.
	memo map[string]plan.Route
}

func (n *narrower) plan(p *plan.Plan) *plan.Plan {
	all := p.Routes.All()
	var routes []plan.Route
	for i, r := range all {
		if r.Outcome != topology.Subset || n.known.Cluster(r.Cluster) {
			continue
		}
		if routes == nil {
			routes = slices.Clone(all)
		}
		narrowed := n.narrow(r)
		routes[i].Outcome, routes[i].Cluster, routes[i].Servers = narrowed.Outcome, narrowed.Cluster, narrowed.Servers
		routes[i].ProxyCertRefused = narrowed.ProxyCertRefused
	}
	if routes == nil {
		return p
	}
	return p.WithRoutes(routes)
}

// narrow is the route to the largest known subset of r's serving set.
func (n *narrower) narrow(r plan.Route) plan.Route {
	if got, ok := n.memo[r.Cluster]; ok {
		return got
	}
	best := plan.Route{Outcome: topology.Unavailable, Servers: r.Servers}
	// Members live in the last table first, then all of them.
	var established topology.ServerSet
	for _, id := range r.Servers {
		if n.known.Live(id) {
			established = append(established, id)
		}
	}
	for _, members := range []topology.ServerSet{established, r.Servers} {
		if set, ok := n.largestKnown(members, len(members) < len(r.Servers)); ok {
			best = n.front.SubsetRoute(set)
			break
		}
	}
	n.memo[r.Cluster] = best
	return best
}

// largestKnown is the largest subset of members whose serving set known names (members
// itself too if whole), the first in bit order among equals; one known member alone for a
// set too large to search.
func (n *narrower) largestKnown(members topology.ServerSet, whole bool) (topology.ServerSet, bool) {
	known := func(set topology.ServerSet) bool {
		return n.known.Cluster(plan.SubsetClusterName(n.front.Topology, set))
	}
	if len(members) > maxNarrowSearch {
		for _, id := range members {
			if set := (topology.ServerSet{id}); known(set) {
				return set, true
			}
		}
		return nil, false
	}
	top := len(members) - 1
	if whole {
		top = len(members)
	}
	for size := top; size > 0; size-- {
		for mask := 1; mask < 1<<len(members); mask++ {
			if bits.OnesCount(uint(mask)) != size {
				continue
			}
			var set topology.ServerSet
			for i, id := range members {
				if mask&(1<<i) != 0 {
					set = append(set, id)
				}
			}
			if known(set) {
				return set, true
			}
		}
	}
	return nil, false
}
