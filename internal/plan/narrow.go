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
// largest subset of its members that known has — a known host's set of one always is — or,
// when none of its members is known, to Unavailable (a 503 with Retry-After, as while nobody
// can serve it). Every member of the narrowed set serves the resource, so no request reaches
// an apiserver that would answer 404; the make-before-break publisher sends this table at
// once while the whole one waits for Envoy (makebeforebreak.Publisher.Narrow). Only the
// routes change: e's other parts are shared.
func (e *Envoys) NarrowTo(known map[string]bool) *Envoys {
	n := &narrower{t: e.Front.Topology, known: known, memo: map[string]Route{}}
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
	}
	if routes == nil {
		return p
	}
	c := *p
	c.Routes = newRoutes(p.LocalID, routes)
	return &c
}

// narrow is the route to the largest known subset of r's serving set.
func (n *narrower) narrow(r Route) Route {
	if got, ok := n.memo[r.Cluster]; ok {
		return got
	}
	members := r.Servers
	best := Route{Outcome: topology.Unavailable, Servers: members}
	consider := func(set topology.ServerSet) bool {
		name := SubsetClusterName(n.t, set)
		if !n.known["cluster "+name] {
			return false
		}
		best = Route{Outcome: topology.Subset, Cluster: name, Servers: set}
		return true
	}
	if len(members) <= maxNarrowSearch {
		// Every proper subset, largest first; among equals the first in bit order.
		for size := len(members) - 1; size > 0 && best.Outcome == topology.Unavailable; size-- {
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
				if consider(set) {
					break
				}
			}
		}
	} else {
		for _, id := range members {
			if consider(topology.ServerSet{id}) {
				break
			}
		}
	}
	n.memo[r.Cluster] = best
	return best
}
