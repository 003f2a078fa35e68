package plan

import (
	"math/bits"
	"slices"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// maxNarrowSearch bounds the serving sets whose every subset NarrowTo tries (2^n names);
// a larger one is narrowed to one known member.
const maxNarrowSearch = 10

// NarrowTo returns e with every route to a serving set that known (the names of the last
// routing table Envoy has had time to learn, in the form of Names) lacks narrowed to the
// largest subset of its members that known has — a known host's set of one always is —
// preferring members that were live then (a returning apiserver may not pass Envoy's health
// checks yet), or, when none of its members is known, to Unavailable (a 503 with Retry-After, as while nobody
// can serve it). Every member of the narrowed set serves the resource, so no request reaches
// an apiserver that would answer 404; the make-before-break publisher sends this table at
// once while the whole one waits for Envoy (makebeforebreak.Publisher.Narrow). Only the
// routes change: e's other parts are shared.
func (e *Envoys) NarrowTo(known map[string]bool) *Envoys {
	n := &narrower{t: e.Front.Topology, known: known, memo: map[string]Route{}, dangerous: e.Front.FrontProxyExcluded}
	out := &Envoys{Front: n.plan(e.Front), Local: make(map[string]*Plan, len(e.Local))}
	for id, p := range e.Local {
		out.Local[id] = n.plan(p)
	}
	return out
}

type narrower struct {
	t     *topology.Topology
	known map[string]bool
	// memo holds the narrowed route (cluster, outcome, servers) of each unknown set by name.
	memo map[string]Route
	// dangerous are the apiservers requests whose identity kube-mvp sets must not reach: a
	// narrowed set of only those refuses them (Route.FrontProxyRefused).
	dangerous topology.ServerSet
}

func (n *narrower) plan(p *Plan) *Plan {
	all := p.Routes.All()
	var routes []Route
	for i, r := range all {
		if r.Outcome != topology.Subset || n.known["cluster "+r.Cluster] {
			continue
		}
		if routes == nil {
			routes = slices.Clone(all)
		}
		narrowed := n.narrow(r)
		routes[i].Outcome, routes[i].Cluster, routes[i].Servers = narrowed.Outcome, narrowed.Cluster, narrowed.Servers
		routes[i].FrontProxyRefused = narrowed.FrontProxyRefused
	}
	if routes == nil {
		return p
	}
	c := *p
	c.Routes = newRoutes(p.LocalID, routes, p.Routes.Default.FrontProxyRefused)
	return &c
}

// narrow is the route to the largest known subset of r's serving set.
func (n *narrower) narrow(r Route) Route {
	if got, ok := n.memo[r.Cluster]; ok {
		return got
	}
	best := Route{Outcome: topology.Unavailable, Servers: r.Servers}
	// Members live in the last table first, then all of them.
	var established topology.ServerSet
	for _, id := range r.Servers {
		if n.known["live "+id] {
			established = append(established, id)
		}
	}
	for _, members := range []topology.ServerSet{established, r.Servers} {
		if set, ok := n.largestKnown(members, len(members) < len(r.Servers)); ok {
			best = Route{Outcome: topology.Subset, Cluster: SubsetClusterName(n.t, set), Servers: set, FrontProxyRefused: refusedIfAll(set, n.dangerous)}
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
	known := func(set topology.ServerSet) bool { return n.known["cluster "+SubsetClusterName(n.t, set)] }
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
