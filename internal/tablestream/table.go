// Package tablestream carries xds-server's routing plans (a plan.Table: every kind of Envoy's
// Routes and the merged discovery) to extproc over gRPC (proto/kubemvp/table/v1): the server
// side broadcasts every new table, the client side keeps the last one it could use and
// reconnects with backoff when the stream drops.
//
// On the wire a table is its Table message (format 2: the published resources listed once,
// grouped by group/version; per plan its distinct routes listed once and each resource naming
// its route by index), serialized
// deterministically, gzipped once per change and cut into chunks (chunk.go): the size of a
// table is bounded by MaxTableSize, not by gRPC's message size limit.
package tablestream

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// Format is the Table format this package writes and the only one it reads.
const Format = 2

var (
	// ErrUnsupportedFormat: the table is in a format this build cannot read (a newer or older
	// xds-server).
	ErrUnsupportedFormat = errors.New("unsupported table format")
	// ErrMalformed: the table contradicts itself or its format.
	ErrMalformed = errors.New("malformed table")
	// ErrTooLarge: the table is larger than the limit.
	ErrTooLarge = errors.New("table too large")
)

// ToProto converts p; the version is a hash of the content, so equal tables give equal
// versions on every replica.
func ToProto(p *plan.Table, now time.Time) *tablev1.Table {
	tb, _ := build(p, now)
	return tb
}

var outcomes = map[topology.Outcome]tablev1.Outcome{
	topology.Default:     tablev1.Outcome_OUTCOME_DEFAULT,
	topology.Subset:      tablev1.Outcome_OUTCOME_SUBSET,
	topology.NotServed:   tablev1.Outcome_OUTCOME_NOT_SERVED,
	topology.Unavailable: tablev1.Outcome_OUTCOME_UNAVAILABLE,
}

// build converts p and also returns the table's deterministic serialization, the bytes that
// go on the wire.
func build(p *plan.Table, now time.Time) (*tablev1.Table, []byte) {
	tb := content(p)
	content, err := proto.MarshalOptions{Deterministic: true}.Marshal(tb)
	if err != nil {
		// Only invalid UTF-8 in a string field can fail, and every string here comes from
		// Kubernetes object names and Lease labels, which are ASCII.
		panic(fmt.Sprintf("table: marshal: %v", err))
	}
	sum := sha256.Sum256(content)
	tb.Version = hex.EncodeToString(sum[:8])
	tb.GeneratedAt = timestamppb.New(now)
	// Version and generated_at are appended to the content rather than marshalling the whole
	// table again: a protobuf parser takes fields in any order.
	tail, err := proto.MarshalOptions{Deterministic: true}.Marshal(&tablev1.Table{Version: tb.Version, GeneratedAt: tb.GeneratedAt})
	if err != nil {
		panic(fmt.Sprintf("table: marshal: %v", err))
	}
	return tb, append(content, tail...)
}

// versionBytes bounds what the version and generated_at add to a table's content.
const versionBytes = 64

// content is the table of p without its version and generation time.
func content(p *plan.Table) *tablev1.Table {
	tb := &tablev1.Table{Format: Format}
	for _, s := range p.APIServers {
		// The wire's alive is Alive and Verified together: what every release of extproc reads
		// (routable with an address), so an unverified Lease never reaches one.
		tb.Apiservers = append(tb.Apiservers, &tablev1.APIServer{Id: s.ID, Hostname: s.Hostname, Address: s.Address, Alive: s.Alive && s.Verified, Dangerous: s.Dangerous})
	}
	// Every plan of one table routes the same keys (one topology's published resources).
	// The group/versions' documents travel apart (Plan.document_routes), so that a reader
	// that does not know them still reads every resource key.
	var keys, docs []topology.Resource
	if front := p.Routes[""]; front != nil {
		for _, r := range front.All() { // sorted by group, version, resource, subresource
			if r.Resource.IsDocument() {
				docs = append(docs, r.Resource)
			} else {
				keys = append(keys, r.Resource)
			}
		}
	}
	var gv *tablev1.GroupVersion
	var gvs []topology.GroupVersion
	for _, r := range keys {
		if gv == nil || gv.Group != r.Group || gv.Version != r.Version {
			gv = &tablev1.GroupVersion{Group: r.Group, Version: r.Version}
			tb.GroupVersions = append(tb.GroupVersions, gv)
			gvs = append(gvs, r.GroupVersion())
		}
		gv.Resources = append(gv.Resources, &tablev1.PublishedResource{Resource: r.Resource, Subresource: r.Subresource})
	}
	if len(docs) == 0 {
		gvs = nil // plans made without documents (routes assembled by hand): none sent
	}
	locals := slices.Sorted(maps.Keys(p.Routes)) // "" (the front proxy) first
	for _, local := range locals {
		rs := p.Routes[local]
		pp := &tablev1.Plan{LocalApiserver: local, ResourceRoutes: make([]uint32, len(keys)), DefaultFrontProxyRefused: rs.Default.ProxyCertRefused}
		type wire struct { // what goes on the wire of a route
			outcome topology.Outcome
			cluster string
			refused string // ProxyCertRefused's Key
			pending bool
		}
		index := map[wire]uint32{}
		add := func(route plan.Route) uint32 { // route's index in pp.Routes
			r := wire{route.Outcome, route.Cluster, route.ProxyCertRefused.Key(), route.Pending}
			n, ok := index[r]
			if !ok {
				n = uint32(len(pp.Routes))
				index[r] = n
				pp.Routes = append(pp.Routes, &tablev1.Route{Outcome: outcomes[r.outcome], Cluster: r.cluster, FrontProxyRefused: route.ProxyCertRefused, Pending: r.pending})
			}
			return n
		}
		routes := rs.All() // normally the same keys in the same order: one topology's
		for i, key := range keys {
			route := rs.Default
			if i < len(routes) && routes[i].Resource == key {
				route = routes[i]
			} else if r, ok := rs.Route(key); ok {
				route = r
			}
			pp.ResourceRoutes[i] = add(route)
		}
		for _, g := range gvs {
			route, ok := rs.Route(g.Document())
			if !ok {
				route = rs.Default
			}
			pp.DocumentRoutes = append(pp.DocumentRoutes, add(route))
		}
		tb.Plans = append(tb.Plans, pp)
	}
	if p.Discovery != nil {
		tb.ApisDiscovery = p.Discovery.JSON
	}
	h := p.RequestHeaders
	tb.RequestHeaders = &tablev1.RequestHeaders{User: h.User, Uid: h.UID, Group: h.Group, ExtraPrefix: h.ExtraPrefix}
	return tb
}

// FromProto converts a received table back. It is strict: a table of another format, or one
// that contradicts itself (a route index out of range, a resource listed twice, a plan
// without the front proxy's, a route without a cluster), is an error wrapping
// ErrUnsupportedFormat or ErrMalformed, never a panic.
func FromProto(tb *tablev1.Table) (*plan.Table, error) {
	if tb == nil {
		return nil, fmt.Errorf("%w: no table", ErrMalformed)
	}
	if f := tb.GetFormat(); f != Format {
		return nil, fmt.Errorf("table %s: %w %d (this build reads format %d)", tb.GetVersion(), ErrUnsupportedFormat, f, Format)
	}
	malformed := func(format string, args ...any) error {
		return fmt.Errorf("table %s: %w: %s", tb.GetVersion(), ErrMalformed, fmt.Sprintf(format, args...))
	}
	h := tb.GetRequestHeaders()
	out := &plan.Table{
		Routes:    make(map[string]*plan.Routes, len(tb.GetPlans())),
		Discovery: topology.NewDiscovery(tb.GetApisDiscovery()),
		RequestHeaders: topology.RequestHeaders{
			User: h.GetUser(), UID: h.GetUid(), Group: h.GetGroup(), ExtraPrefix: h.GetExtraPrefix(),
		}.OrDefault(),
	}
	for _, s := range tb.GetApiservers() {
		alive := s.GetAlive() // Alive and Verified (content)
		out.APIServers = append(out.APIServers, topology.APIServer{ID: s.GetId(), Hostname: s.GetHostname(), Address: s.GetAddress(), Alive: alive, Verified: alive, Dangerous: s.GetDangerous()})
	}
	if n, rows := tableRows(tb); n > MaxTableKeys || rows > MaxTableRows {
		return nil, fmt.Errorf("table %s: %w: %d keys, %d routes in %d plans, "+
			"over the limits of %d keys and %d routes",
			tb.GetVersion(), ErrTooLarge, n, rows, len(tb.GetPlans()), MaxTableKeys, MaxTableRows)
	}
	// Every plan routes the same keys: the resources, then (when the plans carry them) each
	// group/version's document. They are kept once, for all plans.
	var keys []topology.Resource
	for _, gv := range tb.GetGroupVersions() {
		for _, r := range gv.GetResources() {
			k := topology.Resource{Group: gv.GetGroup(), Version: gv.GetVersion(), Resource: r.GetResource(), Subresource: r.GetSubresource()}
			if k.Resource == "" {
				return nil, malformed("resource %q without a name", k)
			}
			keys = append(keys, k)
		}
	}
	resources, docs := len(keys), 0
	if plans := tb.GetPlans(); len(plans) > 0 {
		docs = len(plans[0].GetDocumentRoutes())
	}
	if docs > 0 && docs != len(tb.GetGroupVersions()) {
		return nil, malformed("plans route %d documents of %d group/versions", docs, len(tb.GetGroupVersions()))
	}
	if docs > 0 {
		for _, gv := range tb.GetGroupVersions() {
			keys = append(keys, topology.GroupVersion{Group: gv.GetGroup(), Version: gv.GetVersion()}.Document())
		}
	}
	shared, order, err := plan.NewKeys(keys)
	if err != nil {
		return nil, malformed("%v", err)
	}
	for _, pp := range tb.GetPlans() {
		local := pp.GetLocalApiserver()
		if _, dup := out.Routes[local]; dup {
			return nil, malformed("two plans for local apiserver %q", local)
		}
		if len(pp.GetResourceRoutes()) != resources || len(pp.GetDocumentRoutes()) != docs {
			return nil, malformed("plan %q routes %d resources and %d documents of %d and %d", local, len(pp.GetResourceRoutes()), len(pp.GetDocumentRoutes()), resources, docs)
		}
		routes := make([]plan.Route, len(pp.GetRoutes()))
		for i, r := range pp.GetRoutes() {
			o, ok := outcomeOf(r.GetOutcome())
			if !ok {
				return nil, malformed("plan %q: route %d has outcome %v", local, i, r.GetOutcome())
			}
			refused, err := serverSet(r.GetFrontProxyRefused())
			if err != nil {
				return nil, malformed("plan %q: route %d: front_proxy_refused: %v", local, i, err)
			}
			if r.GetPending() && o != topology.Unavailable {
				return nil, malformed("plan %q: route %d is pending but %s", local, i, o)
			}
			routes[i] = plan.Route{Outcome: o, Cluster: r.GetCluster(), ProxyCertRefused: refused, Pending: r.GetPending()}
		}
		of := make([]uint32, len(keys))
		for i, at := range order {
			if at < resources {
				of[i] = pp.GetResourceRoutes()[at]
			} else {
				of[i] = pp.GetDocumentRoutes()[at-resources]
			}
		}
		defRefused, err := serverSet(pp.GetDefaultFrontProxyRefused())
		if err != nil {
			return nil, malformed("plan %q: default_front_proxy_refused: %v", local, err)
		}
		rs, err := plan.NewTableRoutes(local, shared, of, routes, defRefused)
		if err != nil {
			return nil, malformed("plan %q: %v", local, err)
		}
		out.Routes[local] = rs
	}
	if out.Routes[""] == nil {
		return nil, malformed("no plan for the front proxy")
	}
	return out, nil
}

// Fits reports whether pt's table is within the limits (MaxTableKeys, MaxTableRows,
// MaxTableSize), so that xds-server can hold back plans whose table extproc would refuse
// rather than give Envoy configuration that extproc's table does not follow.
func Fits(pt *plan.Table) error {
	tb := content(pt)
	if keys, rows := tableRows(tb); keys > MaxTableKeys || rows > MaxTableRows {
		return fmt.Errorf("routing table of %d keys and %d routes in %d plans, over the limits of %d keys and %d routes", keys, rows, len(tb.Plans), MaxTableKeys, MaxTableRows)
	}
	if size := proto.Size(tb) + versionBytes; size > MaxTableSize {
		return fmt.Errorf("routing table of %d bytes (%d bytes of merged discovery), over the limit of %d bytes", size, len(tb.ApisDiscovery), MaxTableSize)
	}
	return nil
}

// tableRows counts a table's keys (its resources, and the group/versions' documents when
// its plans route them) and its routes, keys × plans: what extproc's memory grows with.
func tableRows(tb *tablev1.Table) (keys, rows int) {
	for _, gv := range tb.GetGroupVersions() {
		keys += len(gv.GetResources())
	}
	if plans := tb.GetPlans(); len(plans) > 0 && len(plans[0].GetDocumentRoutes()) > 0 {
		keys += len(tb.GetGroupVersions())
	}
	return keys, keys * len(tb.GetPlans())
}

// serverSet is ids as a topology.ServerSet, which must be sorted and distinct.
func serverSet(ids []string) (topology.ServerSet, error) {
	for i := 1; i < len(ids); i++ {
		if ids[i-1] >= ids[i] {
			return nil, fmt.Errorf("apiserver IDs not sorted and distinct: %q", ids)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	return topology.ServerSet(ids), nil
}

func outcomeOf(o tablev1.Outcome) (topology.Outcome, bool) {
	for t, w := range outcomes {
		if w == o {
			return t, true
		}
	}
	return 0, false
}
