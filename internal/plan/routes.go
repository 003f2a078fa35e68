package plan

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Routes is the per-request side of a plan: the route of every published serving-table key.
// extproc receives it in the routing table and looks requests up in it, so it names only
// clusters that xds-server planned, whatever version either binary is.
type Routes struct {
	// LocalID is the apiserver of a sidecar's plan; "" for a front proxy.
	LocalID string
	// Default is the route of everything that is not a published resource.
	Default Route
	// all are the routes sorted by resource; the plan's group/versions share its memory.
	all []Route
	// index finds a resource's route in all; made on the first lookup, since only extproc
	// looks up (xds-server translates and ships all in order).
	indexOnce sync.Once
	index     map[topology.Resource]int
}

func newRoutes(local string, sorted []Route, defaultRefused topology.ServerSet) *Routes {
	return &Routes{LocalID: local, Default: Route{Outcome: topology.Default, Cluster: DefaultCluster(local), ProxyCertRefused: defaultRefused}, all: sorted}
}

// NewRoutes assembles routes received from elsewhere (the routing table). Every route must
// name a cluster unless it is Unavailable, its key must be a resource or a group/version's
// document (topology.GroupVersion.Document), and no key may come twice; only a route that
// names a cluster may refuse requests whose identity kube-mvp sets. defaultRefused is the
// default route's Route.ProxyCertRefused.
func NewRoutes(local string, routes []Route, defaultRefused topology.ServerSet) (*Routes, error) {
	sorted := slices.Clone(routes)
	slices.SortFunc(sorted, compareRoutes)
	for i, r := range sorted {
		if r.Resource.Version == "" || (r.Resource.Resource == "" && !r.Resource.IsDocument()) {
			return nil, fmt.Errorf("route for %q lacks a version or resource", r.Resource)
		}
		if (r.Cluster == "") != (r.Outcome == topology.Unavailable) {
			return nil, fmt.Errorf("route for %s: outcome %s with cluster %q", r.Resource, r.Outcome, r.Cluster)
		}
		if r.Cluster == "" && len(r.ProxyCertRefused) > 0 {
			return nil, fmt.Errorf("route for %s: outcome %s refuses front-proxy requests", r.Resource, r.Outcome)
		}
		if i > 0 && sorted[i-1].Resource == r.Resource {
			return nil, fmt.Errorf("route for %s listed twice", r.Resource)
		}
	}
	rs := newRoutes(local, sorted, defaultRefused)
	rs.makeIndex()
	return rs, nil
}

func (rs *Routes) makeIndex() {
	rs.indexOnce.Do(func() {
		rs.index = make(map[topology.Resource]int, len(rs.all))
		for i, r := range rs.all {
			rs.index[r.Resource] = i
		}
	})
}

// Decide is the route of one request: what topology.DecideResource gives on the plan's
// topology (the default route for requests that are not for a resource), looked up instead
// of computed.
func (rs *Routes) Decide(req topology.RequestInfo) Route {
	if req.GroupVersionDocument {
		gv := topology.GroupVersion{Group: req.APIGroup, Version: req.APIVersion}
		if route, ok := rs.Route(gv.Document()); ok {
			return route
		}
		return rs.Default
	}
	if !req.IsResourceRequest {
		return rs.Default
	}
	return rs.Lookup(topology.Resource{Group: req.APIGroup, Version: req.APIVersion, Resource: req.Resource, Subresource: req.Subresource})
}

// Lookup is the route of resource r. A subresource nobody publishes goes where its
// resource goes (StorageVersions know no subresources); an unpublished resource goes to the
// default cluster, whose apiservers answer for themselves.
func (rs *Routes) Lookup(r topology.Resource) Route {
	if route, ok := rs.Route(r); ok {
		return route
	}
	if r.Subresource != "" {
		if route, ok := rs.Route(r.Parent()); ok {
			return route
		}
	}
	return rs.Default
}

// Route is the route of exactly key r, if r is a published key.
func (rs *Routes) Route(r topology.Resource) (Route, bool) {
	rs.makeIndex()
	if i, ok := rs.index[r]; ok {
		return rs.all[i], true
	}
	return Route{}, false
}

// All returns every route, sorted by resource. The slice is shared: do not modify it.
func (rs *Routes) All() []Route { return rs.all }

// Len is the number of published keys.
func (rs *Routes) Len() int {
	if rs == nil {
		return 0
	}
	return len(rs.all)
}

// Table is what extproc decides from, for every kind of Envoy: each plan's Routes and the
// merged discovery. xds-server sends it as the routing table (internal/tablestream).
type Table struct {
	// APIServers are the apiservers the plans were made for (for logs and metrics).
	APIServers []topology.APIServer
	// Routes holds each Envoy's routes by local apiserver ID; "" is the front proxy's.
	Routes map[string]*Routes
	// Discovery is the merged /apis discovery of the live apiservers; nil when it cannot
	// be built.
	Discovery *topology.Discovery
	// RequestHeaders are the identity headers the apiservers read (defaults filled in).
	RequestHeaders topology.RequestHeaders
}

// Server is the apiserver id of the table, if it lists it.
func (t *Table) Server(id string) (topology.APIServer, bool) {
	for _, s := range t.APIServers {
		if s.ID == id {
			return s, true
		}
	}
	return topology.APIServer{}, false
}

// TableOf is the routing table of t: the routes of every kind of Envoy's plan.
func TableOf(t *topology.Topology) (*Table, error) {
	e, err := ForEveryEnvoy(t)
	if err != nil {
		return nil, err
	}
	return e.Table(), nil
}

// Table is the routing table of e.
func (e *Envoys) Table() *Table {
	tb := &Table{APIServers: e.Front.Topology.APIServers, Routes: make(map[string]*Routes, len(e.Local)+1), Discovery: e.Front.Topology.Discovery, RequestHeaders: e.Front.RequestHeaders}
	tb.Routes[""] = e.Front.Routes
	for id, p := range e.Local {
		tb.Routes[id] = p.Routes
	}
	return tb
}

// Live counts the live apiservers of t.
func (t *Table) Live() int {
	n := 0
	for _, s := range t.APIServers {
		if s.Routable() {
			n++
		}
	}
	return n
}
