// Package topology is the pure model at the centre of kube-mvp: which apiservers exist, which
// are routable, and which of them serve each group/version/resource, and the one routing rule
// (DecideResource). internal/plan applies the rule once per topology; the Envoy configuration
// (internal/snapshot) and the per-request choice (internal/extproc) both read that plan, so
// they cannot disagree.
//
// Nothing here talks to Kubernetes or reads a clock: internal/inventory builds a Topology from
// watched objects, and everything downstream is a function of it.
package topology

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// APIServer is one kube-apiserver identity, as published by its identity Lease.
type APIServer struct {
	// ID is the Lease name, "apiserver-<hash of hostname>"; StorageVersions refer to it.
	ID string `json:"id"`
	// Hostname comes from the Lease label kubernetes.io/hostname.
	Hostname string `json:"hostname,omitempty"`
	// Address is host:port that peers (and Envoy) dial; empty when unknown.
	Address string `json:"address,omitempty"`
	// Alive: its identity Lease was renewed within the liveness window
	// (internal/objects/liveness.go).
	Alive bool `json:"alive"`
	// Verified: its own discovery was fetched at its address over verified TLS, or given by
	// a fixture (internal/objects/verified.go). Views print it as the Source's
	// AwaitingDiscovery; the routing table's alive is Alive and Verified together.
	Verified bool `json:"-"`
	// Dangerous, when not empty, says why requests whose identity kube-mvp sets must not go
	// to this apiserver: extproc's check of the proxy certificate (internal/proxycert) found
	// that it takes the certificate for an ordinary client's, not a front proxy's, so such
	// a request would run as the certificate's user. It is set from extproc's reports
	// (xds-server), never from the watched objects; the plan leaves the apiserver out of
	// the front-proxy cluster variants.
	Dangerous string `json:"dangerous,omitempty"`
}

// Routable reports whether requests can go to s: its Lease is fresh, its discovery verified
// and its address known. Nothing else decides it.
func (s APIServer) Routable() bool { return s.Alive && s.Verified && s.Address != "" }

// Resource names a group/version/resource, optionally narrowed to one subresource.
// Core resources have Group "".
type Resource struct {
	Group       string `json:"group"`
	Version     string `json:"version"`
	Resource    string `json:"resource"`
	Subresource string `json:"subresource,omitempty"`
}

// GroupVersion is the group/version part of r.
func (r Resource) GroupVersion() GroupVersion {
	return GroupVersion{Group: r.Group, Version: r.Version}
}

// Parent is r without its subresource.
func (r Resource) Parent() Resource {
	r.Subresource = ""
	return r
}

func (r Resource) String() string {
	gv := r.GroupVersion().String()
	s := gv + "/" + r.Resource
	if r.Subresource != "" {
		s += "/" + r.Subresource
	}
	return s
}

// CompareResources orders resources by group, version, resource and subresource.
func CompareResources(a, b Resource) int {
	return cmp.Or(
		cmp.Compare(a.Group, b.Group),
		cmp.Compare(a.Version, b.Version),
		cmp.Compare(a.Resource, b.Resource),
		cmp.Compare(a.Subresource, b.Subresource),
	)
}

// GroupVersion is an API group and version; the core group is "".
type GroupVersion struct {
	Group   string `json:"group"`
	Version string `json:"version"`
}

// Path is the path of gv's discovery document ("/api/v1" for core, "/apis/<group>/<version>"
// otherwise), under which every request for gv also starts, followed by "/".
func (gv GroupVersion) Path() string {
	if gv.Group == "" {
		return "/api/" + gv.Version
	}
	return "/apis/" + gv.Group + "/" + gv.Version
}

// PathPrefix is Path followed by "/": the prefix of gv's resource requests.
func (gv GroupVersion) PathPrefix() string { return gv.Path() + "/" }

// Document is the serving-table key of gv's discovery document (GET /apis/<group>/<version>,
// an APIResourceList): a Resource with gv and no resource name, which no real resource has.
// Who serves it is who serves any resource of gv (Topology.Capable).
func (gv GroupVersion) Document() Resource {
	return Resource{Group: gv.Group, Version: gv.Version}
}

// IsDocument reports whether r is a group/version's document key (GroupVersion.Document).
func (r Resource) IsDocument() bool {
	return r.Resource == "" && r.Subresource == "" && r.Version != ""
}

// SortedGroupVersions returns gvs sorted by group, then version, without duplicates (nil
// when empty); gvs is not modified.
func SortedGroupVersions(gvs []GroupVersion) []GroupVersion {
	if len(gvs) == 0 {
		return nil
	}
	out := slices.Clone(gvs)
	slices.SortFunc(out, func(a, b GroupVersion) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Version, b.Version))
	})
	return slices.Compact(out)
}

func (gv GroupVersion) String() string {
	if gv.Group == "" {
		return "core/" + gv.Version
	}
	return gv.Group + "/" + gv.Version
}

// Topology is a complete, self-consistent picture of the control plane at one moment.
// Build it with New; the zero value is an empty control plane.
type Topology struct {
	// APIServers is sorted by ID.
	APIServers []APIServer `json:"apiservers"`
	// Served maps each published resource (and subresource, where discovery told) to the IDs of
	// the apiservers that serve it, sorted. IDs may name apiservers that are dead or unknown:
	// StorageVersions keep stale IDs until they are garbage collected.
	Served map[Resource][]string `json:"-"`
	// ServedEverywhere lists the group/versions every apiserver serves through its own
	// handler chain (CRDs, aggregated APIs behind an APIService). It is a claim anyone who
	// may create a CRD or an APIService can make, so it is per group/version (one CRD in a
	// built-in group changes nothing for the group's other versions) and it never overrides
	// what the apiservers' own discovery says: a resource some live apiserver lists is
	// routed by who lists it; only one no live apiserver lists goes to the default set
	// (Capable).
	ServedEverywhere map[GroupVersion]bool `json:"-"`
	// Aggregated are the group/versions an APIService sends to a service of its own
	// (spec.service set; never the core group, whose legacy APIService has none), sorted:
	// every apiserver proxies their requests there and passes the backend's status and
	// headers back, so an answer of theirs says nothing about whether the backend acted.
	// They are in ServedEverywhere too.
	Aggregated []GroupVersion `json:"-"`
	// LocalID, in sidecar mode, is the apiserver this Envoy sits beside; empty for a front
	// load balancer.
	LocalID string `json:"localID,omitempty"`
	// Sources say, by apiserver ID, where what it serves was learnt from (for people: the
	// rule does not read it).
	Sources map[string]Source `json:"-"`
	// RequestHeaders are the identity headers the apiservers read; zero means their
	// defaults (RequestHeaders.OrDefault).
	RequestHeaders RequestHeaders `json:"-"`
	// Discovery is the merged /apis discovery of the live apiservers; nil when it cannot be
	// built (none live).
	Discovery *Discovery `json:"-"`
	// Refused are the identity Leases and remembered apiservers not believed, and the
	// apiservers left out because another holds their address (for people: the rule does
	// not read it).
	Refused []Refusal `json:"-"`
	// RefusedNames are the group, version and resource names left out because Kubernetes
	// would not accept them (internal/objects: names.go), and where each came from.
	RefusedNames []NameRefusal `json:"-"`

	// Pending are the resources of CustomResourceDefinitions created a moment ago that no
	// live apiserver lists yet (internal/objects, pending.go), set with SetPending: a request
	// for one gets a 503 with Retry-After (Decision.Pending) instead of going to an apiserver
	// that may not serve it yet and answer 404. pendingGroupVersion are their group/versions.
	Pending             map[Resource]bool `json:"-"`
	pendingGroupVersion map[GroupVersion]bool

	byID map[string]int
	// servingGroupVersion is, per group/version, every apiserver ID that serves one of its
	// resources (sorted, distinct): the capability of its document, built once by New.
	servingGroupVersion map[GroupVersion][]string
}

// Source is where what an apiserver serves was learnt from.
type Source struct {
	// From is "discovery" (its own aggregated discovery, resources and subresources),
	// "remembered" (its last verified discovery, kept after it departed: its Lease stale,
	// or deleted within the grace period), "storageVersions" (StorageVersion entries naming
	// it, which know no subresources) or "none".
	From string `json:"capabilitiesFrom,omitempty"`
	// Since is when that discovery was fetched (for "remembered": when the apiserver was
	// last seen live with it); zero when unknown.
	Since time.Time `json:"capabilitiesSince,omitzero"`
	// LeaseDeleted, for "remembered": when its identity Lease was seen deleted (its grace
	// period runs from then); zero while the Lease exists.
	LeaseDeleted time.Time `json:"leaseDeletedAt,omitzero"`
	// AwaitingDiscovery: its Lease is fresh and names an address, but its own discovery has
	// not (yet) been fetched there over verified TLS: not Verified, so it takes no part in
	// routing.
	AwaitingDiscovery bool `json:"awaitingVerifiedDiscovery,omitempty"`
	// Version is its own /version (gitVersion), read with its discovery; for people only.
	Version string `json:"version,omitempty"`
}

// Refusal is an apiserver identity kube-mvp does not route to, and why.
type Refusal struct {
	// Object names what claimed it: "Lease kube-system/<name>", "memory entry <ID>".
	Object   string `json:"object"`
	ID       string `json:"id"`
	Hostname string `json:"hostname,omitempty"`
	Address  string `json:"address,omitempty"`
	Reason   string `json:"reason"`
}

// NameRefusal is a group, version or resource name left out of the topology.
type NameRefusal struct {
	// Source is where it came from: "discovery of apiserver <ID>", "APIService <name>", …
	Source string `json:"source"`
	// Kind is group, version (Name is group/version), resource or subresource (Name is
	// resource/subresource).
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Source values.
const (
	SourceDiscovery       = "discovery"
	SourceStorageVersions = "storageVersions"
	SourceRemembered      = "remembered"
	SourceNone            = "none"
)

// Discovery is an aggregated discovery document (apidiscovery.k8s.io/v2
// APIGroupDiscoveryList, JSON) and its ETag header value.
type Discovery struct {
	JSON []byte
	ETag string
}

// NewDiscovery wraps a document, its ETag the quoted hex SHA-256 of its bytes (nil for none).
func NewDiscovery(doc []byte) *Discovery {
	if len(doc) == 0 {
		return nil
	}
	sum := sha256.Sum256(doc)
	return &Discovery{JSON: doc, ETag: `"` + hex.EncodeToString(sum[:]) + `"`}
}

// pruneServedEverywhere drops the resources of group/versions served everywhere that every
// live apiserver lists, or none does: both go to the default set (Capable), so they need no
// route, and 200 CRDs cost no routes. What remains of such a group/version is what only
// some live apiservers list, routed by who lists them: a built-in resource in a group/version
// a CRD or an APIService claims, or a CRD some apiservers have not listed yet.
func (t *Topology) pruneServedEverywhere() {
	if len(t.ServedEverywhere) == 0 {
		return
	}
	live := 0
	for _, s := range t.APIServers {
		if s.Routable() {
			live++
		}
	}
	for r, ids := range t.Served {
		if !t.ServedEverywhere[r.GroupVersion()] {
			continue
		}
		n := 0
		for _, id := range ids {
			if s, ok := t.Server(id); ok && s.Routable() {
				n++
			}
		}
		if n == 0 || n == live {
			delete(t.Served, r)
		}
	}
}

// New builds a Topology, normalising its input: servers sorted and de-duplicated by ID, every
// serving list sorted and de-duplicated, empty serving lists dropped. The result shares no
// memory with the arguments.
func New(servers []APIServer, served map[Resource][]string, everywhere []GroupVersion) (*Topology, error) {
	t := &Topology{
		Served:           make(map[Resource][]string, len(served)),
		ServedEverywhere: make(map[GroupVersion]bool, len(everywhere)),
		byID:             make(map[string]int, len(servers)),
	}
	t.APIServers = slices.Clone(servers)
	slices.SortFunc(t.APIServers, func(a, b APIServer) int { return cmp.Compare(a.ID, b.ID) })
	for i, s := range t.APIServers {
		if s.ID == "" {
			return nil, fmt.Errorf("apiserver with hostname %q has no ID", s.Hostname)
		}
		if i > 0 && t.APIServers[i-1].ID == s.ID {
			return nil, fmt.Errorf("apiserver %s listed twice", s.ID)
		}
		t.byID[s.ID] = i
	}
	for r, ids := range served {
		if r.Version == "" || r.Resource == "" {
			return nil, fmt.Errorf("served resource %q lacks a version or resource name", r)
		}
		ids = slices.Compact(slices.Sorted(slices.Values(ids)))
		ids = slices.DeleteFunc(ids, func(id string) bool { return id == "" })
		if len(ids) > 0 {
			t.Served[r] = ids
		}
	}
	for _, gv := range everywhere {
		t.ServedEverywhere[gv] = true
	}
	t.pruneServedEverywhere()
	t.servingGroupVersion = map[GroupVersion][]string{}
	for r, ids := range t.Served {
		gv := r.GroupVersion()
		t.servingGroupVersion[gv] = append(t.servingGroupVersion[gv], ids...)
	}
	for gv, ids := range t.servingGroupVersion {
		t.servingGroupVersion[gv] = slices.Compact(slices.Sorted(slices.Values(ids)))
	}
	return t, nil
}

// SetPending sets t.Pending to keys (resources, no subresource), before t is shared. A key
// some apiserver lists is not pending: it goes by who lists it.
func (t *Topology) SetPending(keys []Resource) {
	t.Pending, t.pendingGroupVersion = nil, nil
	for _, k := range keys {
		if _, listed := t.Served[k]; listed || k.Subresource != "" {
			continue
		}
		if t.Pending == nil {
			t.Pending, t.pendingGroupVersion = map[Resource]bool{}, map[GroupVersion]bool{}
		}
		t.Pending[k] = true
		t.pendingGroupVersion[k.GroupVersion()] = true
	}
}

// WithLocal returns a copy of t for an Envoy running beside apiserver id (sidecar mode).
func (t *Topology) WithLocal(id string) *Topology {
	c := *t
	c.LocalID = id
	return &c
}

// WithDangerous returns a copy of t in which each apiserver's Dangerous is dangerous[its ID]
// (empty for an ID it does not list); t itself is not modified. IDs of no apiserver of t are
// ignored.
func (t *Topology) WithDangerous(dangerous map[string]string) *Topology {
	c := *t
	c.APIServers = slices.Clone(t.APIServers)
	for i := range c.APIServers {
		c.APIServers[i].Dangerous = dangerous[c.APIServers[i].ID]
	}
	return &c
}

// Dangerous lists the apiservers of t whose Dangerous is set, by ID (sorted).
func (t *Topology) Dangerous() ServerSet {
	var out ServerSet
	for _, s := range t.APIServers {
		if s.Dangerous != "" {
			out = append(out, s.ID)
		}
	}
	return out
}

// ResolveLocal returns the ID of the apiserver a sidecar names (node metadata): its ID, or a
// hostname (the identity Lease's kubernetes.io/hostname label, which a DaemonSet knows as
// its node name) that exactly one live apiserver carries, or, when none of them is live,
// exactly one apiserver. Anything else is an error saying why: a second Lease carrying the
// node's hostname (anyone who may write Leases can make one) must not decide where a
// sidecar's local requests go.
func (t *Topology) ResolveLocal(idOrHostname string) (string, error) {
	if _, ok := t.byID[idOrHostname]; ok {
		return idOrHostname, nil
	}
	var live, all []string
	for _, a := range t.APIServers {
		if a.Hostname != idOrHostname {
			continue
		}
		all = append(all, a.ID)
		if a.Routable() {
			live = append(live, a.ID)
		}
	}
	switch {
	case len(live) == 1:
		return live[0], nil
	case len(live) > 1:
		return "", fmt.Errorf("%d live apiservers carry hostname %q (%s): name the local one by ID", len(live), idOrHostname, strings.Join(live, ", "))
	case len(all) == 1:
		return all[0], nil
	case len(all) > 1:
		return "", fmt.Errorf("%d apiservers, none live, carry hostname %q (%s): name the local one by ID", len(all), idOrHostname, strings.Join(all, ", "))
	}
	return "", fmt.Errorf("no apiserver has ID or hostname %q", idOrHostname)
}

// Server returns the apiserver with the given ID.
func (t *Topology) Server(id string) (APIServer, bool) {
	if i, ok := t.byID[id]; ok {
		return t.APIServers[i], true
	}
	return APIServer{}, false
}

// Live returns the IDs of the routable apiservers (APIServer.Routable), sorted.
func (t *Topology) Live() []string {
	var ids []string
	for _, s := range t.APIServers {
		if s.Routable() {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

// Hosts returns the IDs, sorted, of the apiservers Envoy keeps as hosts of the serving-sets
// cluster (contract.ClusterServingSets): the live ones, and the departed ones remembered at
// an address (Sources: From SourceRemembered; the address they were last verified at). A
// departed apiserver that comes back (a restart, an upgrade) is then a host Envoy already
// health-checks: routable as soon as its checks pass, with no new host or cluster to wait for.
// Health checks keep it out while it is gone.
func (t *Topology) Hosts() []string {
	var ids []string
	for _, s := range t.APIServers {
		if s.Routable() || (s.Address != "" && t.Sources[s.ID].From == SourceRemembered) {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

// Resources returns every published resource and every pending one, sorted.
func (t *Topology) Resources() []Resource {
	rs := make([]Resource, 0, len(t.Served)+len(t.Pending))
	for r := range t.Served {
		rs = append(rs, r)
	}
	for r := range t.Pending {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, CompareResources)
	return rs
}

// GroupVersions returns every group/version that has at least one published or pending
// resource, sorted.
func (t *Topology) GroupVersions() []GroupVersion {
	seen := map[GroupVersion]bool{}
	var gvs []GroupVersion
	for r := range t.Served {
		if gv := r.GroupVersion(); !seen[gv] {
			seen[gv] = true
			gvs = append(gvs, gv)
		}
	}
	for gv := range t.pendingGroupVersion {
		if !seen[gv] {
			seen[gv] = true
			gvs = append(gvs, gv)
		}
	}
	slices.SortFunc(gvs, func(a, b GroupVersion) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Version, b.Version))
	})
	return gvs
}

// ServerSet is a sorted list of apiserver IDs, used as a value (map key) via its Key.
type ServerSet []string

// Key is a stable string form of the set, usable as a map key.
func (s ServerSet) Key() string { return strings.Join(s, ",") }

// Contains reports whether id is in the set.
func (s ServerSet) Contains(id string) bool {
	_, ok := slices.BinarySearch(s, id)
	return ok
}
