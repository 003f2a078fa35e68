package topology

import (
	"slices"
)

// Outcome is where a request goes; see DecideResource.
type Outcome int

const (
	// Default: the default apiserver set (all live apiservers; in sidecar mode the local one).
	// Non-resource requests, resources every live apiserver serves, and resources nobody
	// publishes (CRDs, aggregated APIs) go here.
	Default Outcome = iota
	// Subset: only the live apiservers in Decision.Servers serve the resource.
	Subset
	// NotServed: the resource is published but no known apiserver serves it any more (only
	// stale IDs remain). It goes to the default set, whose handler chain answers 404.
	NotServed
	// Unavailable: the apiservers that serve the resource are known but none is alive; the
	// answer is an immediate 503, as upstream gives when its chosen peer does not answer.
	Unavailable
)

func (o Outcome) String() string {
	switch o {
	case Default:
		return "default"
	case Subset:
		return "subset"
	case NotServed:
		return "not_served"
	case Unavailable:
		return "unavailable"
	}
	return "unknown"
}

// Decision is the outcome for one request, with what it was decided on.
type Decision struct {
	Outcome Outcome
	// Resource is the serving-table key the decision used: with the subresource when some
	// apiserver publishes that subresource, otherwise the parent resource. Zero for
	// non-resource requests.
	Resource Resource
	// Servers, for Subset, are the live apiservers that serve Resource; for Unavailable, the
	// known (dead) ones that would.
	Servers ServerSet
}

// DecideResource is the one routing rule of kube-mvp (README, "Design"): where a request
// on resource r goes. internal/plan applies it to every published resource once per topology
// change; everything else reads the plan. Requests that are not for a resource go to the
// default set.
func (t *Topology) DecideResource(r Resource) Decision {
	if t.ServedEverywhere[r.Group] {
		return Decision{Outcome: Default}
	}
	key := r
	capable, published := t.Served[key]
	if !published && r.Subresource != "" {
		// Nobody lists this subresource in discovery (or only StorageVersions, which know no
		// subresources, were available): whoever serves the resource is the best guess.
		key = r.Parent()
		capable, published = t.Served[key]
	}
	if !published {
		return Decision{Outcome: Default}
	}
	var live, known ServerSet
	for _, id := range capable {
		s, ok := t.Server(id)
		if !ok {
			continue
		}
		if s.Alive && s.Address != "" {
			live = append(live, id)
		} else {
			known = append(known, id)
		}
	}
	switch {
	case len(live) == 0 && len(known) == 0:
		return Decision{Outcome: NotServed, Resource: key}
	case len(live) == 0:
		return Decision{Outcome: Unavailable, Resource: key, Servers: known}
	case t.LocalID != "" && live.Contains(t.LocalID):
		return Decision{Outcome: Default, Resource: key}
	case t.LocalID == "" && slices.Equal(live, t.Live()):
		return Decision{Outcome: Default, Resource: key}
	}
	return Decision{Outcome: Subset, Resource: key, Servers: live}
}
