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
//
// It has one of two forms. A plan made here holds every route in all (the plan's
// group/versions share that memory). A plan read from a routing table (NewTableRoutes) holds
// its few distinct routes and, per key, the index of its route: the keys themselves are the
// table's, shared by its plans, so extproc's memory grows with the keys, not keys × plans.
type Routes struct {
	// LocalID is the apiserver of a sidecar's plan; "" for a front proxy.
	LocalID string
	// Default is the route of everything that is not a published resource.
	Default Route
	// all are the routes sorted by resource (the first form).
	all []Route
	// index finds a resource's route in all; made on the first lookup, since only extproc
	// looks up (xds-server translates and ships all in order).
	indexOnce sync.Once
	index     map[topology.Resource]int
	// The second form: keys' i-th key goes to distinct[of[i]] (whose Resource is zero).
	keys     *Keys
	of       []uint32
	distinct []Route
}

func newRoutes(local string, sorted []Route, defaultRefused topology.ServerSet) *Routes {
	return &Routes{LocalID: local, Default: Route{Outcome: topology.Default, Cluster: DefaultCluster(local), ProxyCertRefused: defaultRefused}, all: sorted}
}

// Keys are the published keys of a routing table, sorted as a plan's routes are, and shared
// by the table's plans (NewTableRoutes).
type Keys struct {
	list  []topology.Resource
	index map[topology.Resource]int32
}

// NewKeys checks keys (each a resource or a group/version's document, topology.GroupVersion.
// Document, none twice) and returns them sorted, with order[i] the position in keys of the
// i-th sorted key.
func NewKeys(keys []topology.Resource) (sorted *Keys, order []int, err error) {
	order = make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareResources(keys[a], keys[b]) })
	k := &Keys{list: make([]topology.Resource, len(keys)), index: make(map[topology.Resource]int32, len(keys))}
	for i, at := range order {
		r := keys[at]
		if r.Version == "" || (r.Resource == "" && !r.IsDocument()) {
			return nil, nil, fmt.Errorf("key %q lacks a version or resource", r)
		}
		if i > 0 && k.list[i-1] == r {
			return nil, nil, fmt.Errorf("key %s listed twice", r)
		}
		k.list[i] = r
		k.index[r] = int32(i)
	}
	return k, order, nil
}

// Len is the number of keys.
func (k *Keys) Len() int { return len(k.list) }

func (k *Keys) find(r topology.Resource) (int, bool) {
	i, ok := k.index[r]
	return int(i), ok
}

// NewTableRoutes assembles a plan received in a routing table: the i-th of keys goes to
// routes[of[i]]. Every route must name a cluster unless it is Unavailable, and only a route
// that names a cluster may refuse requests whose identity kube-mvp sets. defaultRefused is
// the default route's Route.ProxyCertRefused. routes is kept; their Resource is cleared.
func NewTableRoutes(local string, keys *Keys, of []uint32, routes []Route, defaultRefused topology.ServerSet) (*Routes, error) {
	if len(of) != keys.Len() {
		return nil, fmt.Errorf("%d routes for %d keys", len(of), keys.Len())
	}
	for i := range routes {
		r := &routes[i]
		r.Resource = topology.Resource{}
		if (r.Cluster == "") != (r.Outcome == topology.Unavailable) {
			return nil, fmt.Errorf("route %d: outcome %s with cluster %q", i, r.Outcome, r.Cluster)
		}
		if r.Cluster == "" && len(r.ProxyCertRefused) > 0 {
			return nil, fmt.Errorf("route %d: outcome %s refuses front-proxy requests", i, r.Outcome)
		}
	}
	for i, n := range of {
		if uint64(n) >= uint64(len(routes)) {
			return nil, fmt.Errorf("%s names route %d of %d", keys.list[i], n, len(routes))
		}
	}
	rs := newRoutes(local, nil, defaultRefused)
	rs.keys, rs.of, rs.distinct = keys, of, routes
	return rs, nil
}

// find is the position of key r among the keys, if it is one.
func (rs *Routes) find(r topology.Resource) (int, bool) {
	if rs.keys != nil {
		return rs.keys.find(r)
	}
	rs.indexOnce.Do(func() {
		rs.index = make(map[topology.Resource]int, len(rs.all))
		for i, r := range rs.all {
			rs.index[r.Resource] = i
		}
	})
	i, ok := rs.index[r]
	return i, ok
}

// at is the route of the i-th key.
func (rs *Routes) at(i int) Route {
	if rs.keys != nil {
		route := rs.distinct[rs.of[i]]
		route.Resource = rs.keys.list[i]
		return route
	}
	return rs.all[i]
}

// Decide is the route of one request: what topology.DecideResource gives on the plan's
// topology (the default route for requests that are not for a resource), looked up instead
// of computed.
func (rs *Routes) Decide(req topology.RequestInfo) Route {
	route, _ := rs.DecideKey(req)
	return route
}

// DecideKey is Decide, and the position of the key decided on (-1 for the default route).
func (rs *Routes) DecideKey(req topology.RequestInfo) (Route, int) {
	if req.GroupVersionDocument {
		gv := topology.GroupVersion{Group: req.APIGroup, Version: req.APIVersion}
		if i, ok := rs.find(gv.Document()); ok {
			return rs.at(i), i
		}
		return rs.Default, -1
	}
	if !req.IsResourceRequest {
		return rs.Default, -1
	}
	return rs.lookup(topology.Resource{Group: req.APIGroup, Version: req.APIVersion, Resource: req.Resource, Subresource: req.Subresource})
}

// Lookup is the route of resource r. A subresource nobody publishes goes where its
// resource goes (StorageVersions know no subresources); an unpublished resource goes to the
// default cluster, whose apiservers answer for themselves.
func (rs *Routes) Lookup(r topology.Resource) Route {
	route, _ := rs.lookup(r)
	return route
}

func (rs *Routes) lookup(r topology.Resource) (Route, int) {
	if i, ok := rs.find(r); ok {
		return rs.at(i), i
	}
	if r.Subresource != "" {
		if i, ok := rs.find(r.Parent()); ok {
			return rs.at(i), i
		}
	}
	return rs.Default, -1
}

// Route is the route of exactly key r, if r is a published key.
func (rs *Routes) Route(r topology.Resource) (Route, bool) {
	if i, ok := rs.find(r); ok {
		return rs.at(i), true
	}
	return Route{}, false
}

// All returns every route, sorted by resource. A plan made here shares the slice (do not
// modify it); one read from a routing table makes it.
func (rs *Routes) All() []Route {
	if rs.keys == nil {
		return rs.all
	}
	out := make([]Route, rs.keys.Len())
	for i := range out {
		out[i] = rs.at(i)
	}
	return out
}

// Distinct are the routes the keys go to, without their Resource where several keys share
// one (a plan read from a routing table), and DistinctOf(i) is the i-th key's among them:
// what depends only on the route is prepared once per distinct route.
func (rs *Routes) Distinct() []Route {
	if rs.keys == nil {
		return rs.all
	}
	return rs.distinct
}

// DistinctOf is the index in Distinct of the i-th key's route.
func (rs *Routes) DistinctOf(i int) int {
	if rs.keys == nil {
		return i
	}
	return int(rs.of[i])
}

// Len is the number of published keys.
func (rs *Routes) Len() int {
	switch {
	case rs == nil:
		return 0
	case rs.keys != nil:
		return rs.keys.Len()
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
