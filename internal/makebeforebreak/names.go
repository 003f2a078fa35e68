package makebeforebreak

import (
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Kind says what a Name names.
type Kind uint8

const (
	// KindCluster: a cluster or serving set, by name.
	KindCluster Kind = iota + 1
	// KindHost: an apiserver of the serving-sets cluster (live, or departed and remembered
	// at its address), by ID.
	KindHost
	// KindLive: an apiserver live in the table, by ID (narrowing prefers these).
	KindLive
)

func (k Kind) String() string {
	switch k {
	case KindCluster:
		return "cluster"
	case KindHost:
		return "apiserver"
	case KindLive:
		return "live"
	}
	return "unknown"
}

// A Name is one thing a routing table lets extproc route to. A table whose names Envoy
// already had goes out at once; one with a new name waits (rule 1).
type Name struct {
	Kind Kind
	ID   string
}

// String is how the log shows it: "cluster NAME", "apiserver ID" or "live ID".
func (n Name) String() string { return n.Kind.String() + " " + n.ID }

// Names is a set of names.
type Names map[Name]bool

// Cluster reports whether names has the cluster or serving set called name.
func (names Names) Cluster(name string) bool { return names[Name{KindCluster, name}] }

// Live reports whether the apiserver id was live in the table names came from.
func (names Names) Live(id string) bool { return names[Name{KindLive, id}] }

// namesOf are the names of the routing table built from e: every cluster and serving set
// of every plan, every host of the serving-sets cluster (which covers the live ones, the
// members of the default cluster) with the serving set of just it, and which apiservers are
// live. An apiserver that departed and came back is no new host while it is remembered:
// Envoy kept it.
func namesOf(e *plan.Envoys) Names {
	names := Names{}
	add := func(k Kind, id string) { names[Name{k, id}] = true }
	addClusters := func(p *plan.Plan) {
		for _, c := range p.Clusters {
			add(KindCluster, c.Name)
		}
	}
	addClusters(e.Front)
	for _, p := range e.Local {
		addClusters(p)
	}
	for _, id := range e.Front.Hosts {
		add(KindHost, id)
		add(KindCluster, plan.SubsetClusterName(e.Front.Topology, topology.ServerSet{id}))
	}
	for _, id := range e.Front.Topology.Live() {
		add(KindLive, id)
	}
	return names
}
