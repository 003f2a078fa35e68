// Package plan is every routing decision kube-mvp makes for one topology, made once per
// topology change and read by everything downstream:
//
//   - which apiserver clusters Envoy needs, each with its role and members;
//   - for each published group/version, whether its requests need extproc, and for each
//     resource (and subresource) its outcome and cluster;
//   - the per-request lookup extproc uses (Routes), shipped to it in the routing table.
//
// internal/snapshot only translates a Plan into Envoy resources; internal/tablestream ships its
// Routes to extproc; /debug/topology prints it; the make-before-break logic reads its
// cluster names. topology's rule (Capable, then Capability.Decide) is applied here and
// nowhere else. A Plan is for one kind of Envoy: a front load balancer (LocalID "") or a
// sidecar beside one apiserver (LocalID its ID); ForEveryEnvoy makes all of them for a topology.
package plan

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Role says why an apiserver cluster or serving set exists.
type Role string

const (
	// RoleDefault: every live apiserver (less those still joining), for a front proxy.
	RoleDefault Role = "default"
	// RoleLocal: the one apiserver a sidecar runs beside.
	RoleLocal Role = "local"
	// RoleSubset: a serving set, exactly the live apiservers that serve some resource. It is
	// no Envoy cluster of its own but a subset of the serving-sets cluster
	// (contract.ClusterServingSets): its members list its name in their endpoint metadata.
	RoleSubset Role = "subset"
	// RoleLingering: a serving set no decision names any more, kept for routing tables still
	// in use (make before break).
	RoleLingering Role = "lingering"
)

// Cluster is one apiserver cluster Envoy must have (RoleDefault, RoleLocal), or one serving
// set inside the serving-sets cluster (RoleSubset, RoleLingering).
type Cluster struct {
	Name    string             `json:"name"`
	Role    Role               `json:"role"`
	Members topology.ServerSet `json:"members"`
	// ProxyCertRefused are its members when every one of them is dangerous
	// (topology.APIServer.Dangerous): its front-proxy variant has no endpoint, and the requests
	// whose identity kube-mvp sets that would go to it get a 503 naming them instead.
	ProxyCertRefused topology.ServerSet `json:"frontProxyRefused,omitempty"`
}

// Route is where the requests for one resource go.
type Route struct {
	// Resource is the serving-table key decided on; zero for requests that are not for a
	// published resource.
	Resource topology.Resource `json:"-"`
	Outcome  topology.Outcome  `json:"-"`
	// Cluster is the Envoy cluster, or for Subset the serving set's name (a subset of
	// contract.ClusterServingSets, which extproc names instead, with the set in the
	// request's load-balancer metadata); empty for Unavailable (an immediate 503).
	Cluster string `json:"cluster,omitempty"`
	// Servers are, for Subset, the live apiservers that serve Resource (the cluster's
	// members); for Unavailable, the known but dead ones that would.
	Servers topology.ServerSet `json:"-"`
	// ProxyCertRefused, for a route that forwards, are the members of its cluster (the
	// serving set for Subset, the default cluster otherwise) when every one of them is
	// dangerous: a request whose identity kube-mvp sets gets a 503 naming them
	// (ProxyCertRefusal) rather than going to any of them. Empty otherwise: such requests go
	// to the cluster's front-proxy variant, whose endpoints leave the dangerous apiservers out.
	ProxyCertRefused topology.ServerSet `json:"-"`
	// Pending, for Unavailable: a new CRD's resource no apiserver lists yet
	// (topology.Decision.Pending); its 503 says Retry-After.
	Pending bool `json:"-"`
}

// GroupVersion is the plan of one published group/version.
type GroupVersion struct {
	GroupVersion topology.GroupVersion
	// ExtProc: some resource of it goes elsewhere than the default cluster (a subset, or an
	// immediate 503), so its requests need a per-request decision. NotServed resources go to
	// the default cluster, whose apiservers answer 404 themselves.
	ExtProc bool
	// Routes of its resources and subresources, sorted.
	Routes []Route
	// Document is the route of its discovery document (GET /apis/<group>/<version>, or
	// /api/v1), keyed topology.GroupVersion.Document: the apiservers that serve any resource
	// of it, decided by the same rule as every resource.
	Document Route
}

// Plan is every decision for one topology and one kind of Envoy.
type Plan struct {
	// Topology is what the plan was made from (apiserver names and addresses, merged
	// discovery).
	Topology *topology.Topology
	// LocalID is the apiserver a sidecar runs beside; "" for a front proxy.
	LocalID string
	// Clusters are the apiserver clusters and serving sets, sorted by name; the first role is
	// default or local.
	Clusters []Cluster
	// Hosts are the apiservers of the serving-sets cluster (topology.Topology.Hosts): every
	// live one and the departed ones remembered at an address. Each is also a serving set of
	// its own (SubsetClusterName of just it), so a set of one known apiserver never waits
	// for Envoy.
	Hosts topology.ServerSet
	// GroupVersions are the published group/versions, sorted.
	GroupVersions []GroupVersion
	// Aggregated are the group/versions an APIService sends to a service
	// (topology.Topology.Aggregated), sorted. Their groups are served everywhere, so they go
	// to the default cluster at line rate like any unpublished path; each has a route of its
	// own only because an apiserver's answer to them may be the backend's, whatever the
	// status, so a request the apiserver forwarded is never sent again.
	Aggregated []topology.GroupVersion
	// Routes is the per-request view of the same decisions.
	Routes *Routes
	// RequestHeaders are the identity headers the apiservers read (defaults filled in):
	// the listener strips them, extproc sets them.
	RequestHeaders topology.RequestHeaders
	// ProxyCertExcluded are the dangerous apiservers (topology.APIServer.Dangerous), sorted:
	// they take the proxy certificate for an ordinary client's, so the front-proxy variant of
	// every cluster (contract.ClusterName.ProxyCert) leaves them out of its endpoints. The
	// clusters as named keep them: a request with the caller's own credentials is
	// authenticated there as the caller.
	ProxyCertExcluded topology.ServerSet
}

// Build makes the plan of t for a front proxy, or, when t.LocalID is set, for a sidecar
// beside that apiserver. The one error is two serving sets whose cluster names collide
// (two apiservers that share a hostname).
func Build(t *topology.Topology) (*Plan, error) { return newShared(t).plan(t.LocalID) }

// shared is what every plan of one topology has in common: who can serve each published
// resource, and the names of the clusters of those sets, worked out once for all of them.
type shared struct {
	t         *topology.Topology
	resources []topology.Resource // sorted
	caps      []topology.Capability
	live      []string
	hosts     []string
	// names are the serving-set names of caps[i].Live, made when first needed.
	names   []string
	byNames map[string]string // ServerSet.Key → cluster name
	// docs and docCaps are the group/versions' document keys and who can serve each, sorted.
	docs    []topology.Resource
	docCaps []topology.Capability
	// dangerous are the apiservers requests whose identity kube-mvp sets must not reach.
	dangerous topology.ServerSet
}

func newShared(t *topology.Topology) *shared {
	s := &shared{t: t, resources: t.Resources(), live: t.Live(), hosts: t.Hosts(), byNames: map[string]string{}, dangerous: t.Dangerous()}
	s.caps = make([]topology.Capability, len(s.resources))
	s.names = make([]string, len(s.resources))
	for i, r := range s.resources {
		s.caps[i] = t.Capable(r)
	}
	for _, gv := range t.GroupVersions() {
		s.docs = append(s.docs, gv.Document())
		s.docCaps = append(s.docCaps, t.Capable(gv.Document()))
	}
	return s
}

// nameOf is the serving-set name of the live apiservers set.
func (s *shared) nameOf(set topology.ServerSet) string {
	key := set.Key()
	name := s.byNames[key]
	if name == "" {
		name = SubsetClusterName(s.t, set)
		s.byNames[key] = name
	}
	return name
}

// subsetName is the cluster name of resource i's live capable apiservers.
func (s *shared) subsetName(i int) string {
	if s.names[i] == "" {
		s.names[i] = s.nameOf(s.caps[i].Live)
	}
	return s.names[i]
}

// plan is the plan for an Envoy beside local ("" for a front proxy).
func (s *shared) plan(local string) (*Plan, error) {
	t := s.t.WithLocal(local)
	p := &Plan{Topology: t, LocalID: local, RequestHeaders: t.RequestHeaders.OrDefault(), Hosts: s.hosts, Aggregated: t.Aggregated, ProxyCertExcluded: s.dangerous}
	def := DefaultCluster(local)
	defMembers := s.live
	if local != "" {
		defMembers = nil
		if slices.Contains(s.live, local) {
			defMembers = topology.ServerSet{local}
		}
	}
	defRefused := refusedIfAll(defMembers, s.dangerous)
	subsets := map[string]topology.ServerSet{}
	route := func(r topology.Resource, c topology.Capability, name func() string) (Route, error) {
		d := c.Decide(local, s.live)
		route := Route{Resource: r, Outcome: d.Outcome, Servers: d.Servers, Pending: d.Pending}
		switch d.Outcome {
		case topology.Subset: // d.Servers are c.Live
			route.Cluster = name()
			if prev, ok := subsets[route.Cluster]; ok && !slices.Equal(prev, d.Servers) {
				return Route{}, fmt.Errorf("cluster name %s stands for two serving sets, [%s] and [%s] (two apiservers share a hostname?)", route.Cluster, prev.Key(), d.Servers.Key())
			}
			subsets[route.Cluster] = d.Servers
			route.ProxyCertRefused = refusedIfAll(d.Servers, s.dangerous)
		case topology.Default, topology.NotServed:
			route.Cluster = def
			route.ProxyCertRefused = defRefused
		}
		return route, nil
	}
	// all holds, per group/version in order, its document's route and then its resources'
	// (sorted: a document key has no resource name, so it sorts first).
	all := make([]Route, 0, len(s.docs)+len(s.resources))
	for i, r := range s.resources { // sorted: group/versions come in order
		if n := len(p.GroupVersions); n == 0 || p.GroupVersions[n-1].GroupVersion != r.GroupVersion() {
			j := len(p.GroupVersions) // s.docs has every group/version of s.resources, in order
			doc, err := route(s.docs[j], s.docCaps[j], func() string { return s.nameOf(s.docCaps[j].Live) })
			if err != nil {
				return nil, err
			}
			all = append(all, doc)
			p.GroupVersions = append(p.GroupVersions, GroupVersion{GroupVersion: r.GroupVersion(), Document: doc, ExtProc: doc.Cluster != def})
		}
		rt, err := route(r, s.caps[i], func() string { return s.subsetName(i) })
		if err != nil {
			return nil, err
		}
		all = append(all, rt)
		if rt.Cluster != def {
			p.GroupVersions[len(p.GroupVersions)-1].ExtProc = true
		}
	}
	// Each group/version's routes are its part of all, after its document's.
	for i, at := 0, 0; i < len(p.GroupVersions); i++ {
		at++ // the document
		end := at
		for end < len(all) && !all[end].Resource.IsDocument() {
			end++
		}
		p.GroupVersions[i].Routes = all[at:end:end] // an append must not run into the next
		at = end
	}
	p.Routes = newRoutes(local, all, defRefused)
	role := RoleDefault
	if local != "" {
		role = RoleLocal
	}
	p.Clusters = append(p.Clusters, Cluster{Name: def, Role: role, Members: defMembers, ProxyCertRefused: defRefused})
	for _, name := range slices.Sorted(maps.Keys(subsets)) {
		p.Clusters = append(p.Clusters, Cluster{Name: name, Role: RoleSubset, Members: subsets[name], ProxyCertRefused: refusedIfAll(subsets[name], s.dangerous)})
	}
	sortClusters(p.Clusters)
	return p, nil
}

func sortClusters(cs []Cluster) {
	slices.SortFunc(cs, func(a, b Cluster) int { return strings.Compare(a.Name, b.Name) })
}

// DefaultClusterName is the cluster of outcomes Default and NotServed.
func (p *Plan) DefaultClusterName() string { return DefaultCluster(p.LocalID) }

// MergesDiscovery reports whether the apiservers of the default set differ in what they
// serve, i.e. some resource goes to a strict subset of the live apiservers: only then is the
// merged discovery (/apis) anything but what each of them answers itself, and worth an
// ext_proc round trip.
func (p *Plan) MergesDiscovery() bool {
	for _, gv := range p.GroupVersions {
		if gv.Document.Outcome == topology.Subset {
			return true
		}
		for _, r := range gv.Routes {
			if r.Outcome == topology.Subset {
				return true
			}
		}
	}
	return false
}

// SubsetClusters are the serving sets the plan's decisions name, by name.
func (p *Plan) SubsetClusters() map[string]topology.ServerSet {
	out := map[string]topology.ServerSet{}
	for _, c := range p.Clusters {
		if c.Role == RoleSubset {
			out[c.Name] = c.Members
		}
	}
	return out
}

// DefaultCluster names the cluster of Default outcomes: every live apiserver, or in sidecar
// mode (local != "") the local one.
func DefaultCluster(local string) string {
	if local != "" {
		return contract.ClusterLocal
	}
	return contract.ClusterDefault
}

// SubsetRoute is the route to the serving set of the live apiservers set: its cluster name,
// and its members when every one is dangerous (Route.ProxyCertRefused). Make before break
// narrows a route to such a set.
func (p *Plan) SubsetRoute(set topology.ServerSet) Route {
	return Route{Outcome: topology.Subset, Cluster: SubsetClusterName(p.Topology, set), Servers: set, ProxyCertRefused: refusedIfAll(set, p.ProxyCertExcluded)}
}

// WithRoutes returns a copy of p whose per-request Routes are routes, which are p.Routes.All()
// with some outcomes, clusters and servers changed (make before break narrows them). The rest
// of p, GroupVersions included, is shared.
func (p *Plan) WithRoutes(routes []Route) *Plan {
	c := *p
	c.Routes = newRoutes(p.LocalID, routes, p.Routes.Default.ProxyCertRefused)
	return &c
}

// SubsetClusterName names the cluster that holds exactly the given apiservers: their
// hostnames (or IDs, where a hostname is unknown) sorted and joined by "+", e.g.
// "kube-apiservers-only-cp-a+cp-c", so an operator reading Envoy's /clusters sees who is
// inside. Dots become contract.ClusterNameDot ("cp-a~example~com"): Envoy's stats would
// split a cluster name at them.
func SubsetClusterName(t *topology.Topology, set topology.ServerSet) string {
	names := make([]string, 0, len(set))
	for _, id := range set {
		name := id
		if s, ok := t.Server(id); ok && s.Hostname != "" {
			name = s.Hostname
		}
		names = append(names, contract.ClusterNamePart(name))
	}
	slices.Sort(names)
	return contract.ClusterSubsetPrefix + strings.Join(names, "+")
}

// Envoys are the plans of every kind of Envoy one topology serves: the front proxy's and,
// for every apiserver a sidecar may run beside, that sidecar's.
type Envoys struct {
	Front *Plan
	// Local holds the sidecar plans by apiserver ID.
	Local map[string]*Plan
}

// ForEveryEnvoy makes the front plan of t and a sidecar plan for each of its apiservers.
func ForEveryEnvoy(t *topology.Topology) (*Envoys, error) {
	s := newShared(t)
	front, err := s.plan("")
	if err != nil {
		return nil, err
	}
	e := &Envoys{Front: front, Local: make(map[string]*Plan, len(t.APIServers))}
	for _, a := range t.APIServers {
		p, err := s.plan(a.ID)
		if err != nil {
			return nil, fmt.Errorf("sidecar beside %s: %w", a.ID, err)
		}
		e.Local[a.ID] = p
	}
	return e, nil
}

// For returns the plan of an Envoy beside local ("" for a front proxy); nil when local is
// no known apiserver.
func (e *Envoys) For(local string) *Plan {
	if local == "" {
		return e.Front
	}
	return e.Local[local]
}

// compareResources orders keys by group, version, resource and subresource.
func compareResources(a, b topology.Resource) int {
	return cmp.Or(
		cmp.Compare(a.Group, b.Group),
		cmp.Compare(a.Version, b.Version),
		cmp.Compare(a.Resource, b.Resource),
		cmp.Compare(a.Subresource, b.Subresource),
	)
}
