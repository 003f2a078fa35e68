package snapshot

import (
	"net/http"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Route names of the fixed routes; the group/version routes are named by
// topology.GroupVersion.String ("core/v1", "batch/v1").
const (
	RouteRoutingHeader       = "extproc-decided"
	RouteIdentityUndecided   = "client-certificate-undecided"
	RouteUnclassified        = "request-unclassified"
	RouteDiscovery           = "discovery"
	RouteEscapedPath         = "escaped-path"
	RouteFallback            = "default"
	RouteSuffixProxyCert     = ":front-proxy"
	identityUndecidedMessage = "kube-mvp: the client certificate could not be mapped to a user (see the Envoy log)"
	unclassifiedMessage      = "kube-mvp: the request filter did not finish with this request (see the Envoy log); refused rather than forwarded unfiltered"
)

// escapedPathRegex matches the paths (without the query) whose route Envoy cannot tell from
// the path as it is on the wire, because the apiserver reads another one: any %-escape (Go's
// server decodes them into req.URL.Path, which kube-apiserver's RequestInfoFactory splits, so
// "/apis/batch%2Fv1/jobs" is batch/v1 jobs to it) and a leading "//" (RequestInfoFactory
// trims every leading slash). Envoy matches safe_regex against the whole path. Its RE2
// program is small and names nothing (34 instructions; Envoy refuses more than 100).
const escapedPathRegex = `//.*|.*%.*`

// discoveryRegex is "/apis" and "/apis/", the same document to an apiserver (11 instructions).
const discoveryRegex = `/apis/?`

// Suffixes of the names of a route's variants, one per request class (classVariants), and of
// the upgrade variant.
const (
	RouteSuffixUpgrade = ":upgrade"
	RouteSuffixRead    = ":read"
	RouteSuffixWatch   = ":watch"
	RouteSuffixWrite   = ":write"
)

// A routeSpec is one route of the table as the plan asks for it, decided once, up front
// (routeSpecs): what it matches, where it goes, what ext_proc does on it and which
// variants it gets. render turns it into Envoy routes, one small constructor per variant;
// nothing else builds one. testdata/<case>/routespec.yaml shows each case's specs.
type routeSpec struct {
	name     string
	match    *routev3.RouteMatch // the path, and any headers of its own
	to       target
	extProc  extProcUse
	variants variants
	metadata *corev3.Metadata // on the route itself: its variants' names extend its name
	// proxied: an apiserver may hand the request to a backend of its own and pass the
	// backend's status and headers back (an aggregated group/version), so no answer proves
	// that nothing was done: its writes are retried only when they never reached an
	// apiserver (routeBuilder.retry), whatever the status.
	proxied bool
}

// A target is where a route sends what it matches: one of the plan's apiserver clusters
// (each variant picks its variant, contract.ClusterName), the cluster extproc named in the
// routing header (clusterHeader), or an answer of Envoy's own (direct).
type target struct {
	cluster       string
	clusterHeader bool
	direct        *routev3.Route_DirectResponse
	// proxyCertRefused, where not nil, answers the proxy-cert variants instead: every
	// apiserver of the cluster is dangerous (plan.Cluster.ProxyCertRefused).
	proxyCertRefused *routev3.Route_DirectResponse
}

// extProcUse is what the ext_proc filter does on a route.
type extProcUse int

const (
	// extProcOff: disabled; the route forwards the request itself.
	extProcOff extProcUse = iota
	// extProcDecides: extproc names the cluster and the request is matched again (to the
	// extproc-decided route), or answers itself; without extproc the request fails. The
	// route forwards nothing itself, so it needs no variants.
	extProcDecides
	// extProcMayDecide: as extProcDecides, but without extproc the request goes on to the
	// route's own cluster (failure_mode_allow): the discovery route when it merges.
	extProcMayDecide
)

// variants is the set of a route's variants: routes of their own, named "<name><suffix>",
// matched before the route itself, which takes what none of them matches.
type variants uint8

const (
	// variantUpgrade, "<name>:upgrade": an Upgrade header, to the HTTP/1.1 variant of the
	// cluster, no timeout. Only where Envoy picks the cluster and ext_proc is off: on the
	// extproc-decided route extproc names that variant itself.
	variantUpgrade variants = 1 << iota
	// The request classes' variants (classVariants).
	variantRead
	variantWatch
	variantWrite
	// variantProxyCert: before the route and each of its other variants, "<…>:front-proxy",
	// the same match and the identity decision "front-proxy", to the proxy-cert variant of its
	// cluster. Only with a client CA, and only where Envoy picks the cluster.
	variantProxyCert

	variantClasses = variantRead | variantWatch | variantWrite
)

// A requestClass is a class the Lua filter writes in contract.HeaderRequestClass
// (request_class.lua) that has a variant of its own: the request's timeout and what is
// retried (see retryPolicy). Every other class, and none, takes the route itself, which has no
// timeout and retries only what never reached an apiserver: safe for any request.
type requestClass struct {
	variant       variants
	value, suffix string
	timeout       bool // the route timeout, Config.UpstreamRequestTimeout; otherwise none
	// read: a get, list or watch (GET, HEAD), retried as routeBuilder.readRetry; otherwise a
	// write, retried as routeBuilder.writeRetry, or as routeBuilder.retry on a proxied route.
	read bool
}

// classVariants are the classes with variants, in the order they are matched (any order
// would do: a request has one class).
var classVariants = []requestClass{
	{variantRead, contract.ClassRead, RouteSuffixRead, true, true},
	{variantWatch, contract.ClassWatch, RouteSuffixWatch, false, true},
	{variantWrite, contract.ClassWrite, RouteSuffixWrite, true, false},
}

// routeConfiguration is the one route table: routeSpecs rendered, in one virtual host that
// gives the Lua filter the header names in its metadata (identityMetadata) and removes
// kube-mvp's own request headers before any apiserver.
func (b *builder) routeConfiguration() *routev3.RouteConfiguration {
	rb := b.newRouteBuilder()
	var routes []*routev3.Route
	for _, s := range b.routeSpecs() {
		routes = rb.render(routes, s)
	}
	return &routev3.RouteConfiguration{
		Name: RouteConfigName,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    VirtualHostName,
			Domains: []string{"*"},
			Routes:  routes,
			// The identity decision and the request class are for Envoy's routes only, and
			// the XFCC header for the Lua filter and the routes; none is anything an
			// apiserver should read.
			RequestHeadersToRemove: []string{contract.HeaderIdentityDecision, contract.HeaderRequestClass, contract.HeaderXFCC},
			Metadata:               &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{identityFilterName: b.identityMetadata()}},
		}},
	}
}

// routeSpecs is the one route table, as data, decided from the plan. First match wins:
//
//  1. the routing header is present: it can only have come from extproc (the early header
//     mutation strips it from clients), so go to the cluster it names; ext_proc off.
//  2. (with a client CA) x-forwarded-client-cert is present but the identity decision header
//     is not: the client presented a verified certificate and the Lua filter did not decide
//     its identity (the script failed): refused with a 503 Status, never forwarded without
//     the identity the apiserver would have given it.
//  3. path /apis or /apis/ (aggregated discovery): the default cluster; when the live
//     apiservers differ in what they serve (Plan.MergesDiscovery), ext_proc ON, which
//     answers an apiserver's 200 with the merged discovery of every live apiserver. Only here
//     may ext_proc fail open (failure_mode_allow): without extproc the client gets one
//     apiserver's own discovery, which is what it would get without kube-mvp.
//  4. a path with a %-escape or a leading "//" (escapedPathRegex): ext_proc ON, which
//     decides on the path as the apiserver decodes it; the path is forwarded unchanged.
//  5. per published group/version (path_separated_prefix /api/v1, /apis/<g>/<v>: the
//     group/version's document and everything under it): straight to the default cluster
//     with ext_proc off when every resource of the group/version (hence its document) goes
//     there anyway; otherwise ext_proc on (it sets the routing header and the route is
//     matched again).
//  6. prefix / (non-resource paths, unpublished group/versions such as CRDs and aggregated
//     APIs): the default cluster; ext_proc off.
//
// Each route that forwards requests gets the variants of the request classes, and with a
// client CA a proxy-cert variant of each for the requests whose identity the Lua filter set.
// So a request that needs no routing decision never opens an ext_proc stream, whoever the
// client is.
func (b *builder) routeSpecs() []routeSpec {
	def := target{cluster: b.p.DefaultClusterName()}
	def.proxyCertRefused = b.proxyCertRefusal(def.cluster)
	clientCertificates := len(b.cfg.Secrets.ClientCA) > 0
	// Where Envoy picks the cluster, with a client CA, the proxy-cert variant; where it
	// forwards with ext_proc off, the upgrade variant too (ext_proc, where it runs, decides).
	var proxyCert variants
	if clientCertificates {
		proxyCert = variantProxyCert
	}
	forwards := variantClasses | proxyCert
	own := variantUpgrade | forwards
	specs := []routeSpec{{
		// The Lua filter sets the class last, after stripping the configured identity
		// headers and setting the certificate user's: without it, neither is certain.
		name:  RouteUnclassified,
		match: prefix("/", []*routev3.HeaderMatcher{absent(contract.HeaderRequestClass)}),
		to:    target{direct: directStatus(unclassifiedMessage)},
	}, {
		// extproc names the HTTP/1.1 and proxy-cert variants itself.
		name:     RouteRoutingHeader,
		match:    prefix("/", []*routev3.HeaderMatcher{present(contract.HeaderRoutingCluster)}),
		to:       target{clusterHeader: true},
		variants: variantClasses,
	}}
	if clientCertificates {
		specs = append(specs, routeSpec{
			name:  RouteIdentityUndecided,
			match: prefix("/", []*routev3.HeaderMatcher{present(contract.HeaderXFCC), absent(contract.HeaderIdentityDecision)}),
			to:    target{direct: directStatus(identityUndecidedMessage)},
		})
	}
	discovery := routeSpec{name: RouteDiscovery, match: safeRegex(discoveryRegex), to: def, variants: own}
	if b.p.MergesDiscovery() {
		discovery.extProc, discovery.variants = extProcMayDecide, forwards
	}
	specs = append(specs, discovery,
		routeSpec{name: RouteEscapedPath, match: safeRegex(escapedPathRegex), to: def, extProc: extProcDecides})
	// The aggregated group/versions come before the published ones, although no path can be
	// both (an aggregated group is served everywhere, so it has no published route): were
	// one ever both, the route that never resends a forwarded request would win.
	for _, gv := range b.p.Aggregated {
		specs = append(specs, routeSpec{
			name:     gv.String(),
			match:    &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: gv.Path()}},
			to:       def,
			variants: own,
			metadata: aggregatedMetadata(gv),
			proxied:  true,
		})
	}
	for _, gv := range b.p.GroupVersions {
		s := routeSpec{
			name:     gv.GroupVersion.String(),
			match:    &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: gv.GroupVersion.Path()}},
			to:       def,
			variants: own,
			metadata: b.groupVersionMetadata(gv),
		}
		if gv.ExtProc {
			s.extProc, s.variants = extProcDecides, 0
		}
		specs = append(specs, s)
	}
	return append(specs, routeSpec{name: RouteFallback, match: prefix("/", nil), to: def, variants: own})
}

// directStatus is a direct 503 Status with message.
func directStatus(message string) *routev3.Route_DirectResponse {
	return &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
		Status: 503,
		Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: statusJSON(message, "ServiceUnavailable", 503)}},
	}}
}

// routeBuilder holds what every route shares: per-filter configurations and retry policies
// (built once, never modified after: routes share them rather than copy).
type routeBuilder struct {
	timeout   *durationpb.Duration
	noTimeout *durationpb.Duration
	// The retry policies (retryPolicy): retry what never reached an apiserver; readRetry
	// and writeRetry, that and more for the read and write variants.
	retry, readRetry, writeRetry *routev3.RetryPolicy
	// extProc is the ext_proc per-route configuration by extProcUse (nil: the filter's own).
	extProc [3]map[string]*anypb.Any
}

func (b *builder) newRouteBuilder() *routeBuilder {
	what := "route configuration " + RouteConfigName + ": "
	perRoute := func(o *extprocv3.ExtProcPerRoute) map[string]*anypb.Any {
		return map[string]*anypb.Any{extProcFilterName: b.pack(what+"ext_proc per-route config", o)}
	}
	// A sidecar's routes that ask extproc name its local apiserver in the stream's gRPC
	// metadata, so that extproc decides by that sidecar's plan; a front proxy's need nothing.
	var local []*corev3.HeaderValue
	if b.p.LocalID != "" {
		local = []*corev3.HeaderValue{{Key: contract.MetadataLocalAPIServer, Value: b.p.LocalID}}
	}
	rb := &routeBuilder{
		timeout:    durationpb.New(b.cfg.UpstreamRequestTimeout),
		noTimeout:  durationpb.New(0),
		retry:      b.retryPolicy(what, retryNeverReached, nil, false),
		readRetry:  b.retryPolicy(what, retryNeverReached+",retriable-headers,reset", nil, true),
		writeRetry: b.retryPolicy(what, retryNeverReached+",retriable-status-codes", apiserverRefusals, false),
	}
	rb.extProc[extProcOff] = perRoute(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true}})
	rb.extProc[extProcMayDecide] = perRoute(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{GrpcInitialMetadata: local, FailureModeAllow: wrapperspb.Bool(true)}}})
	if len(local) > 0 {
		rb.extProc[extProcDecides] = perRoute(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{GrpcInitialMetadata: local}}})
	}
	return rb
}

// A forward is one Envoy route that forwards: a spec's own, or one of its variants'.
type forward struct {
	suffix  string                   // of the spec's name
	headers []*routev3.HeaderMatcher // matched besides the spec's own
	cluster contract.ClusterName
	timeout *durationpb.Duration
	retry   *routev3.RetryPolicy
}

// render appends the Envoy routes of s to routes, in match order: a direct response alone;
// otherwise the upgrade variant, the class variants and the route itself, each right after
// its proxy-cert variant when s has it. The route itself takes every other request
// (long-running, unclassified, or without a class: the Lua filter failed), with no timeout
// and no retry after a reset; it alone carries s's metadata (repeating it on the variants
// made marshalling the route configuration cost twice as much).
func (rb *routeBuilder) render(routes []*routev3.Route, s routeSpec) []*routev3.Route {
	if s.to.direct != nil {
		return append(routes, rb.direct(s))
	}
	add := func(f forward) *routev3.Route {
		if s.variants&variantProxyCert != 0 {
			routes = append(routes, rb.proxyCert(s, f))
		}
		r := rb.route(s, f)
		routes = append(routes, r)
		return r
	}
	if s.variants&variantUpgrade != 0 {
		add(rb.upgrade(s))
	}
	for _, c := range classVariants {
		if s.variants&c.variant != 0 {
			add(rb.class(s, c))
		}
	}
	add(rb.itself(s)).Metadata = s.metadata
	return routes
}

// itself is the route s itself: no timeout, retried only where the request never reached
// an apiserver. A route where extproc decides forwards nothing itself, but an action it
// must have: this, the safe one.
func (rb *routeBuilder) itself(s routeSpec) forward {
	return forward{cluster: contract.ClusterName{Base: s.to.cluster}, timeout: rb.noTimeout, retry: rb.retry}
}

// upgrade is s's upgrade variant (variantUpgrade).
func (rb *routeBuilder) upgrade(s routeSpec) forward {
	return forward{
		suffix: RouteSuffixUpgrade, headers: upgradeRequested,
		cluster: contract.ClusterName{Base: s.to.cluster, HTTP1: true}, timeout: rb.noTimeout, retry: rb.retry,
	}
}

// class is s's variant for requests of class c.
func (rb *routeBuilder) class(s routeSpec, c requestClass) forward {
	f := forward{suffix: c.suffix, headers: classIs[c.value], cluster: contract.ClusterName{Base: s.to.cluster}, timeout: rb.noTimeout, retry: rb.writeRetry}
	if c.timeout {
		f.timeout = rb.timeout
	}
	switch {
	case c.read:
		f.retry = rb.readRetry
	case s.proxied:
		f.retry = rb.retry
	}
	return f
}

// proxyCert is the proxy-cert variant of f (variantProxyCert): to the variant of f's cluster
// that presents the proxy certificate, or s's refusal where every apiserver of it is
// dangerous.
func (rb *routeBuilder) proxyCert(s routeSpec, f forward) *routev3.Route {
	f.suffix += RouteSuffixProxyCert
	f.headers = append(slices.Clip(f.headers), proxyCertDecision)
	f.cluster.ProxyCert = true
	r := rb.route(s, f)
	if refused := s.to.proxyCertRefused; refused != nil {
		return &routev3.Route{Name: r.Name, Match: r.Match, Action: refused, TypedPerFilterConfig: rb.extProc[extProcOff], ResponseHeadersToAdd: refusalHeaders}
	}
	return r
}

// route is the Envoy route of f, a forward of s.
func (rb *routeBuilder) route(s routeSpec, f forward) *routev3.Route {
	a := &routev3.RouteAction{Timeout: f.timeout, IdleTimeout: rb.noTimeout, RetryPolicy: f.retry}
	if s.to.clusterHeader {
		a.ClusterSpecifier = &routev3.RouteAction_ClusterHeader{ClusterHeader: contract.HeaderRoutingCluster}
	} else {
		a.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: f.cluster.String()}
	}
	m := s.match
	if len(f.headers) > 0 {
		m = &routev3.RouteMatch{PathSpecifier: s.match.GetPathSpecifier(), Headers: append(slices.Clip(s.match.GetHeaders()), f.headers...)}
	}
	return &routev3.Route{Name: s.name + f.suffix, Match: m, Action: &routev3.Route_Route{Route: a}, TypedPerFilterConfig: rb.extProc[s.extProc]}
}

// direct is s's direct response; its headers come from the route
// (DirectResponseAction.body).
func (rb *routeBuilder) direct(s routeSpec) *routev3.Route {
	return &routev3.Route{
		Name: s.name, Match: s.match, Action: s.to.direct, TypedPerFilterConfig: rb.extProc[s.extProc],
		ResponseHeadersToAdd: []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: "content-type", Value: "application/json"},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}
}

// refusalHeaders are the response headers of proxyCertRefusal's 503s: a Status, and
// Retry-After, as kube-mvp's other 503s for requests no apiserver received.
var refusalHeaders = []*corev3.HeaderValueOption{
	{Header: &corev3.HeaderValue{Key: "content-type", Value: "application/json"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
	retryAfter,
}

// proxyCertRefusal is the direct response of the proxy-cert variants of the routes to the
// plan's default (or local) cluster def when every apiserver of it is dangerous, or nil: a 503
// Status naming them (plan.ProxyCertRefusal). Envoy refuses a direct response body over
// 4 KiB; a message that would make one is cut.
func (b *builder) proxyCertRefusal(def string) *routev3.Route_DirectResponse {
	for _, c := range b.p.Clusters {
		if c.Name != def || len(c.ProxyCertRefused) == 0 || (c.Role != plan.RoleDefault && c.Role != plan.RoleLocal) {
			continue
		}
		msg := plan.ProxyCertRefusal(b.t.APIServers, c.ProxyCertRefused)
		body := statusJSONRetry(msg)
		for len(body) > maxDirectResponseBody {
			msg = strings.ToValidUTF8(msg[:len(msg)*3/4], "") + "…"
			body = statusJSONRetry(msg)
		}
		return &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
			Status: 503,
			Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body}},
		}}
	}
	return nil
}

// maxDirectResponseBody is the largest direct response body Envoy accepts (its route
// configuration's max_direct_response_body_size_bytes default, 4 KiB), with room.
const maxDirectResponseBody = 4000

func present(header string) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: header, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}
}

// absent matches a request without header.
func absent(header string) *routev3.HeaderMatcher {
	m := present(header)
	m.InvertMatch = true
	return m
}

func prefix(p string, headers []*routev3.HeaderMatcher) *routev3.RouteMatch {
	return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: p}, Headers: headers}
}

func safeRegex(re string) *routev3.RouteMatch {
	return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}
}

// exactHeader matches a header's exact value.
func exactHeader(name, value string) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
		MatchPattern: &matcherv3.StringMatcher_Exact{Exact: value}}}}
}

// Matchers shared by every route that uses them (the lists too: a route appends them to a
// copy): never modified.
var (
	// proxyCertDecision matches the Lua filter's decision that it set the identity headers.
	proxyCertDecision = exactHeader(contract.HeaderIdentityDecision, contract.IdentityProxyCert)
	// upgradeRequested matches a request that asks for a protocol upgrade (SPDY or WebSocket
	// exec, attach, port-forward, proxy, a WebSocket watch): it must reach an HTTP/1.1
	// cluster, since an HTTP/1 upgrade cannot be forwarded over the HTTP/2 the clusters as
	// named speak (Envoy would need extended CONNECT, which the apiservers do not offer). The
	// header itself rather than the class: an upgrade works even if the Lua filter failed.
	upgradeRequested = []*routev3.HeaderMatcher{present("upgrade")}
	// classIs matches each class of classVariants.
	classIs = func() map[string][]*routev3.HeaderMatcher {
		m := map[string][]*routev3.HeaderMatcher{}
		for _, c := range classVariants {
			m[c.value] = []*routev3.HeaderMatcher{exactHeader(contract.HeaderRequestClass, c.value)}
		}
		return m
	}()
)

// identityMetadata gives the Lua filter (LuaScript) the names of the headers it strips and
// sets: the request class header, kube-mvp's decision header, the apiservers' request-header
// names, each kind as a comma-separated list ("x-remote-user,x-login"), and what every client
// loses (strip_names, strip_prefixes: the defaults, the names in use and every name read
// before; topology.RequestHeaders.StripNames). The identity is written under every name of
// its kind: an apiserver takes the user from the first of its own names that is set, and
// reads groups and extras from each of its own, which may be any of them (the ConfigMap is
// a union over apiservers, and anyone who may write it can put names first). The virtual
// host's metadata under the filter's name carries them (the script reads them with
// handle:virtualHost():metadata(), Envoy 1.36), so a change of names is a route update, not
// a listener one. user_header and the other single names are the first of each list, for
// scripts of earlier versions during an upgrade.
func (b *builder) identityMetadata() *structpb.Struct {
	h := b.p.RequestHeaders.OrDefault()
	lower := func(names []string, suffix string) string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = strings.ToLower(n) + suffix
		}
		return strings.Join(out, ",")
	}
	var prefixes []string // x-remote- is the listener's
	for _, p := range h.StripPrefixes() {
		if !strings.HasPrefix(p, contract.HeaderRemotePrefix) {
			prefixes = append(prefixes, p)
		}
	}
	var names []string
	for _, n := range h.StripNames() {
		if !strings.HasPrefix(n, contract.HeaderRemotePrefix) {
			names = append(names, n)
		}
	}
	ctx, err := structpb.NewStruct(map[string]any{
		"class_header":          contract.HeaderRequestClass,
		"decision_header":       contract.HeaderIdentityDecision,
		"user_headers":          lower(h.User, ""),
		"uid_headers":           lower(h.UID, ""),
		"group_headers":         lower(h.Group, ""),
		"credential_id_headers": lower(h.ExtraPrefix, contract.CredentialIDExtraKey),
		"strip_names":           strings.Join(names, ","),
		"strip_prefixes":        strings.Join(prefixes, ","),
		"user_header":           strings.ToLower(h.User[0]),
		"uid_header":            strings.ToLower(h.UID[0]),
		"group_header":          strings.ToLower(h.Group[0]),
		"credential_id_header":  strings.ToLower(h.ExtraPrefix[0]) + contract.CredentialIDExtraKey,
	})
	if err != nil {
		panic(err) // a fixed map of strings always converts
	}
	return ctx
}

// retryNeverReached are the retry conditions under which the request cannot have reached an
// apiserver: the connection failed (connect-failure), the apiserver refused the stream
// before reading it (refused-stream: an HTTP/2 REFUSED_STREAM, or a stream past a GOAWAY's
// last stream ID), or the connection was reset before any byte of this request was written
// (reset-before-request: Envoy's router retries it only while upstream_request_started_ is
// false). Every route retries them, whatever the method: the apiserver never saw the request.
const retryNeverReached = "connect-failure,refused-stream,reset-before-request"

// apiserverRefusals are the statuses a write is retried on (retriable-status-codes), on the
// write variants of every route but the aggregated ones. For a request the apiserver serves
// itself (a built-in resource, a CRD, a non-resource path), kube-apiserver answers 429 and
// 503 only before the request was carried out (k8s.io/apiserver v0.37.1, k8s.io/kubernetes
// v1.37.1):
//
//   - 429 from max-in-flight (pkg/server/filters/maxinflight.go) and from priority and
//     fairness (priority-and-fairness.go: only when the handler never ran), and while a
//     stopping apiserver refuses new requests (with_retry_after.go): before the handler;
//   - 503 "apiserver is shutting down" (waitgroup.go), before the handler; 503 while the
//     handlers and discovery are still being installed (pkg/util/notfoundhandler: a CRD not
//     served yet) and while a resource's storage version is not registered
//     (pkg/endpoints/filters/storageversion.go), both instead of the handler;
//   - 503 "error calling webhook" (admission webhooks) and MutatingAdmissionPolicy's 503,
//     and EventRateLimit's 429: admission, which runs before anything is stored (webhooks
//     must tolerate being called again: sideEffects None or NoneOnDryRun); an eviction's
//     429 (pkg/registry/core/pod/storage/eviction.go), which refuses before the disruption
//     budget is touched.
//
// So retrying them on another apiserver (previous_hosts) does what client-go does later: it
// retries 429 and 5xx answers with Retry-After for every verb. Not retried: the other
// answers with Retry-After, which are not refusals. ErrorNegotiated
// (pkg/endpoints/handlers/responsewriters/writers.go) sets Retry-After on any Status with
// details.retryAfterSeconds, so a storage ServerTimeout (500, pkg/storage/errors: a create,
// update or delete that may have reached etcd) and a 504 timeout carry it too. Nor are 429
// and 503 on an aggregated group/version (routeSpec.proxied), where the apiserver passes a
// backend's answer through (kube-aggregator's handler_proxy.go, also its own 503 when
// forwarding failed, perhaps after the backend had the request), nor on the route itself
// (long-running: node, service and pod proxy, the proxy verb, exec, attach, port-forward
// and log, which reach past the apiserver; unclassified; no class) or its upgrade variant.
// One 503 of an apiserver's own can follow a write done elsewhere: upstream's peer proxy
// (pkg/util/peerproxy, only with --peer-ca-file) answers 503 when forwarding to a peer
// failed, perhaps after the peer had it; kube-mvp routes each request to an apiserver that
// serves it, so that proxy is not needed behind it.
var apiserverRefusals = []uint32{http.StatusTooManyRequests, http.StatusServiceUnavailable}

// retryPolicy makes a retry policy on the conditions on (retryNeverReached and more), the
// status codes (with retriable-status-codes) and, with retryAfter, any answer carrying
// Retry-After (with retriable-headers). The policies (routeBuilder):
//
//   - retry, on the route itself (long-running, unclassified, no class) and its upgrade
//     variant, and on the write variant of an aggregated group/version: retryNeverReached only.
//   - writeRetry, on every other write variant: also 429 and 503 (apiserverRefusals).
//   - readRetry, on the read and watch variants (get, list, watch: GET and HEAD the apiserver
//     runs itself, any number of times without effect): also "reset" and any answer with
//     Retry-After (a 429 or 503 refusal, a 504 "Too large resource version" another
//     apiserver may not give, a timeout). A reset after the request was sent is what an
//     apiserver closing a kept-alive connection (idle close, or the idle connections a
//     stopping apiserver closes in http.Server.Shutdown), or the keepalive pings closing one
//     to a frozen apiserver, does to a request Envoy just wrote on it: only "reset" retries
//     it (RetryStateImpl::wouldRetryFromReset, source/common/router/retry_state_impl.cc),
//     safe only for a request that may run twice. Replaying it on another apiserver is what
//     the client would do. Reads of aggregated group/versions too: the backend's get, list
//     or watch is a read as well.
//
// retriable_request_headers was weighed: it would restrict every retry condition of the
// route to GET, losing the retries of writes that never reached an apiserver. Each retry goes
// to another host (previous_hosts) when the cluster has one; at most two.
func (b *builder) retryPolicy(what, on string, codes []uint32, retryAfter bool) *routev3.RetryPolicy {
	p := &routev3.RetryPolicy{
		RetryOn:              on,
		NumRetries:           wrapperspb.UInt32(2),
		RetriableStatusCodes: codes,
		RetryHostPredicate: []*routev3.RetryPolicy_RetryHostPredicate{{
			Name: previousHostsPredicateNm,
			ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{
				TypedConfig: b.pack(what+"retry host predicate", &previoushostsv3.PreviousHostsPredicate{}),
			},
		}},
		// Least request prefers the host that just refused (it has no requests in flight),
		// so with two hosts five selections can all land on it; 20 make that negligible.
		HostSelectionRetryMaxAttempts: 20,
	}
	if retryAfter {
		p.RetriableHeaders = []*routev3.HeaderMatcher{{
			Name:                 "retry-after",
			HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
		}}
	}
	return p
}

// aggregatedMetadata is an aggregated group/version's route metadata:
//
//	groupVersion: metrics.k8s.io/v1beta1
//	extProc: false
//	aggregated: true  # its APIService names a service: a forwarded request is never resent
func aggregatedMetadata(gv topology.GroupVersion) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespace: {Fields: map[string]*structpb.Value{
		"groupVersion": structpb.NewStringValue(gv.String()),
		"extProc":      structpb.NewBoolValue(false),
		"aggregated":   structpb.NewBoolValue(true),
	}}}}
}

// groupVersionMetadata says where each resource (and subresource) of a group/version goes,
// as the plan decided:
//
//	groupVersion: batch/v1
//	extProc: true
//	document: kube-apiservers-only-cp-a+cp-c  # GET /apis/batch/v1: who serves any of it
//	clusters: {kube-apiservers-only-cp-a+cp-c: [cronjobs, jobs, jobs/status]}
//	unavailable: {storageversionmigrations: [apiserver-…]}  # serving apiservers all dead: 503
//	notServed: [podsecuritypolicies]  # only stale IDs: the default apiservers answer 404
//
// A name under clusters is an Envoy cluster or, for kube-apiservers-only-*, a serving set of
// the serving-sets cluster (contract.ClusterServingSets), whose endpoints list the sets they
// are in.
func (b *builder) groupVersionMetadata(gv plan.GroupVersion) *corev3.Metadata {
	clusters := map[string]*structpb.ListValue{}
	var unavailable map[string]*structpb.Value
	var notServed []*structpb.Value
	for _, r := range gv.Routes {
		name := r.Resource.Resource
		if r.Resource.Subresource != "" {
			name += "/" + r.Resource.Subresource
		}
		switch r.Outcome {
		case topology.Unavailable:
			if unavailable == nil {
				unavailable = map[string]*structpb.Value{}
			}
			unavailable[name] = structpb.NewListValue(stringList(r.Servers))
			continue
		case topology.NotServed:
			notServed = append(notServed, structpb.NewStringValue(name))
			continue
		}
		l := clusters[r.Cluster]
		if l == nil {
			l = &structpb.ListValue{}
			clusters[r.Cluster] = l
		}
		l.Values = append(l.Values, structpb.NewStringValue(name))
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		"groupVersion": structpb.NewStringValue(gv.GroupVersion.String()),
		"extProc":      structpb.NewBoolValue(gv.ExtProc),
	}}
	// Where its document goes: a cluster, or "unavailable" (an immediate 503).
	if doc := gv.Document.Cluster; doc != "" {
		md.Fields["document"] = structpb.NewStringValue(doc)
	} else {
		md.Fields["document"] = structpb.NewStringValue("unavailable")
	}
	if len(clusters) > 0 {
		cs := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(clusters))}
		for c, l := range clusters {
			cs.Fields[c] = structpb.NewListValue(l)
		}
		md.Fields["clusters"] = structpb.NewStructValue(cs)
	}
	if unavailable != nil {
		md.Fields["unavailable"] = structpb.NewStructValue(&structpb.Struct{Fields: unavailable})
	}
	if notServed != nil {
		md.Fields["notServed"] = structpb.NewListValue(&structpb.ListValue{Values: notServed})
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespace: md}}
}

func stringList(ss []string) *structpb.ListValue {
	l := &structpb.ListValue{Values: make([]*structpb.Value, len(ss))}
	for i, s := range ss {
		l.Values[i] = structpb.NewStringValue(s)
	}
	return l
}
