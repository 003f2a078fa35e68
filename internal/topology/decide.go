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
	// Unavailable: the apiservers that serve the resource are known but none is routable; the
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
	// Pending, with Unavailable: Resource is a new CRD's that no live apiserver lists yet
	// (Topology.Pending): the 503 says Retry-After, as the apiservers serve it in a moment.
	Pending bool
}

// DecideResource is the one routing rule of kube-mvp (docs/design.md): where a request
// on resource r goes, from a front proxy or (t.LocalID) a sidecar. It is Capable, who can
// serve r, and then Decide, where that sends the request; internal/plan applies the two to
// every published resource once per topology change, and everything else reads the plan.
// Requests that are not for a resource go to the default set.
func (t *Topology) DecideResource(r Resource) Decision {
	return t.Capable(r).Decide(t.LocalID, t.Live())
}

// Capability is who can serve a request on one resource.
type Capability struct {
	// Key is the serving-table key: r, or its parent resource when no apiserver publishes
	// the subresource; zero when r is not published, or is of a group/version served
	// everywhere and no live apiserver lists it.
	Key Resource
	// Live are the live, dialable apiservers that serve Key; Known the others that do.
	Live, Known ServerSet
	// Pending: Key is a new CRD's resource (or the document of its group/version) that no
	// apiserver lists yet (Topology.Pending).
	Pending bool
}

// Capable is who can serve a request on resource r. For a group/version's document
// (r.IsDocument, GroupVersion.Document) that is every apiserver that serves some resource of
// the group/version: an apiserver that serves none of it answers the document with 404.
func (t *Topology) Capable(r Resource) Capability {
	c := t.capable(r)
	if c.Pending {
		return c
	}
	if len(c.Live) == 0 && t.ServedEverywhere[r.GroupVersion()] {
		// Every apiserver's own chain serves it (a CRD not yet in any live apiserver's
		// discovery, an aggregated API whose backend discovery failed): never 404 or 503 for
		// want of a listing. A resource some live apiserver lists goes by who lists it, so a
		// CRD or APIService claiming a built-in group/version cannot switch its routing off.
		return Capability{}
	}
	return c
}

func (t *Topology) capable(r Resource) Capability {
	if r.IsDocument() {
		// Whoever serves some resource of the group/version (subresources add nobody, since
		// whoever serves a subresource serves its resource).
		ids := t.servingGroupVersion[r.GroupVersion()]
		if len(ids) == 0 && t.pendingGroupVersion[r.GroupVersion()] {
			return Capability{Key: r, Pending: true}
		}
		return t.capability(r, ids)
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
		if key = r.Parent(); t.Pending[key] {
			return Capability{Key: key, Pending: true}
		}
		return Capability{}
	}
	return t.capability(key, capable)
}

// capability splits the apiservers ids that can serve key into live and known ones; zero
// when there are none.
func (t *Topology) capability(key Resource, ids []string) Capability {
	if len(ids) == 0 {
		return Capability{}
	}
	c := Capability{Key: key}
	for _, id := range ids {
		s, ok := t.Server(id)
		if !ok {
			continue
		}
		if s.Routable() {
			c.Live = append(c.Live, id)
		} else {
			c.Known = append(c.Known, id)
		}
	}
	return c
}

// Decide is where a request with capability c goes from an Envoy beside apiserver local
// ("" for a front proxy), live being every live apiserver: the default set when it can
// serve it (the local apiserver, or every live one), the live capable ones when only they
// can, an immediate 503 when only dead ones can, and the default set (which answers 404
// itself) when no known apiserver can any more.
func (c Capability) Decide(local string, live []string) Decision {
	switch {
	case c.Pending:
		return Decision{Outcome: Unavailable, Resource: c.Key, Pending: true}
	case c.Key == (Resource{}):
		return Decision{Outcome: Default}
	case len(c.Live) == 0 && len(c.Known) == 0:
		return Decision{Outcome: NotServed, Resource: c.Key}
	case len(c.Live) == 0:
		return Decision{Outcome: Unavailable, Resource: c.Key, Servers: c.Known}
	case local != "" && c.Live.Contains(local):
		return Decision{Outcome: Default, Resource: c.Key}
	case local == "" && slices.Equal(c.Live, live):
		return Decision{Outcome: Default, Resource: c.Key}
	}
	return Decision{Outcome: Subset, Resource: c.Key, Servers: c.Live}
}
