package snapshot

import (
	"iter"
	"slices"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// This file is the route table as data, decided once from the plan and holding no Envoy type:
// each route (routeSpecs) and each Envoy route it becomes (forwards), with its match, its
// cluster, and its timeout and retry policies by name. routes.go renders it;
// testdata/<case>/routespec.yaml shows each case's specs.

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

// A routeSpec is one route of the table as the plan asks for it: what it matches, where it
// goes, what ext_proc does on it and which variants it gets.
type routeSpec struct {
	name     string
	match    routeMatch // the path, and any headers of its own
	to       target
	extProc  extProcUse
	variants variants
	// The route's metadata, on the route itself only (its variants' names extend its name):
	// a published group/version's, saying where each of its resources goes, or an aggregated
	// one's; neither on the other routes.
	published  *plan.GroupVersion
	aggregated *topology.GroupVersion
	// proxied: an apiserver may hand the request to a backend of its own and pass the
	// backend's status and headers back (an aggregated group/version), so no answer proves
	// that nothing was done: its writes are retried only when they never reached an
	// apiserver (forwards), whatever the status.
	proxied bool
}

// A routeMatch is what a route matches: its path, then each of its headers.
type routeMatch struct {
	pathIs  pathTest
	path    string
	headers []headerMatch
}

// pathTest is how a route matches the path (as received: docs/envoy-config.md#paths).
type pathTest uint8

const (
	pathPrefix          pathTest = iota // every path starting with path
	pathSeparatedPrefix                 // path itself, or path then "/" and anything
	pathRegex                           // the whole path matches the RE2 expression path
)

// A headerMatch is one header a route matches.
type headerMatch struct {
	name  string
	is    headerTest
	value string // of headerExact
}

type headerTest uint8

const (
	headerPresent headerTest = iota
	headerAbsent
	headerExact // the header's value is exactly value
)

func prefix(p string, headers ...headerMatch) routeMatch {
	return routeMatch{pathIs: pathPrefix, path: p, headers: headers}
}

func separatedPrefix(p string) routeMatch { return routeMatch{pathIs: pathSeparatedPrefix, path: p} }

func regex(re string) routeMatch { return routeMatch{pathIs: pathRegex, path: re} }

func present(header string) headerMatch { return headerMatch{name: header, is: headerPresent} }

// absent matches a request without header.
func absent(header string) headerMatch { return headerMatch{name: header, is: headerAbsent} }

func exactHeader(name, value string) headerMatch {
	return headerMatch{name: name, is: headerExact, value: value}
}

// A target is where a route sends what it matches: one of the plan's apiserver clusters
// (each of the route's variants picks its variant of it: forward.kind), the cluster extproc
// named in the routing header (clusterHeader), or an answer of Envoy's own (direct).
type target struct {
	cluster       string
	clusterHeader bool
	direct        *refusal
	// proxyCertRefused, where not nil, answers the proxy-cert variants instead: every
	// apiserver of the cluster is dangerous (plan.Cluster.ProxyCertRefused).
	proxyCertRefused *refusal
}

// A refusal is a 503 Status of Envoy's own, for a request no apiserver receives.
type refusal struct {
	message string
	// retryAfter: the Status and the response say Retry-After: 1 (the client may try again
	// soon: the proxy-cert refusal lasts only while its apiservers are dangerous).
	retryAfter bool
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

// timeoutPolicy is a route's timeout (docs/envoy-config.md#timeouts).
type timeoutPolicy uint8

const (
	// noTimeout: as long as the client wants (watches, long-running requests, upgrades, and
	// every request without a class of its own).
	noTimeout timeoutPolicy = iota
	// requestTimeout: Config.UpstreamRequestTimeout, just above the apiserver's own.
	requestTimeout
)

// retryPolicy is what a route retries, each time on another apiserver; routes.go's
// retryOnNeverReached, apiserverRefusals and envoyRetryPolicy have why each is safe.
type retryPolicy uint8

const (
	// retryNeverReached: only what cannot have reached an apiserver; safe for any request.
	retryNeverReached retryPolicy = iota
	// retryReads: also a reset after the request was sent and any answer with Retry-After:
	// for get, list and watch, which may run twice.
	retryReads
	// retryWrites: also 429 and 503, which kube-apiserver answers only before it carries a
	// request out.
	retryWrites
)

// A requestClass is a class the Lua filter writes in contract.HeaderRequestClass
// (request_class.lua) that has a variant of its own, with the request's timeout and what is
// retried. Every other class, and none, takes the route itself, which has no timeout and
// retries only what never reached an apiserver: safe for any request.
type requestClass struct {
	variant       variants
	value, suffix string
	timeout       timeoutPolicy
	retry         retryPolicy // on a proxied route, writes retry only what never reached one
}

// classVariants are the classes with variants, in the order they are matched (any order
// would do: a request has one class).
var classVariants = []requestClass{
	{variantRead, contract.ClassRead, RouteSuffixRead, requestTimeout, retryReads},
	{variantWatch, contract.ClassWatch, RouteSuffixWatch, noTimeout, retryReads},
	{variantWrite, contract.ClassWrite, RouteSuffixWrite, requestTimeout, retryWrites},
}

// routeSpecs is the one route table, as data, decided from the plan; first match wins.
// Which routes, in which order, and why: docs/design.md#the-route-table.
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
		match: prefix("/", absent(contract.HeaderRequestClass)),
		to:    target{direct: &refusal{message: unclassifiedMessage}},
	}, {
		// extproc names the HTTP/1.1 and proxy-cert variants itself.
		name:     RouteRoutingHeader,
		match:    prefix("/", present(contract.HeaderRoutingCluster)),
		to:       target{clusterHeader: true},
		variants: variantClasses,
	}}
	if clientCertificates {
		specs = append(specs, routeSpec{
			name:  RouteIdentityUndecided,
			match: prefix("/", present(contract.HeaderXFCC), absent(contract.HeaderIdentityDecision)),
			to:    target{direct: &refusal{message: identityUndecidedMessage}},
		})
	}
	discovery := routeSpec{name: RouteDiscovery, match: regex(discoveryRegex), to: def, variants: own}
	if b.p.MergesDiscovery() {
		discovery.extProc, discovery.variants = extProcMayDecide, forwards
	}
	specs = append(specs, discovery,
		routeSpec{name: RouteEscapedPath, match: regex(escapedPathRegex), to: def, extProc: extProcDecides})
	// The aggregated group/versions come before the published ones, although no path can be
	// both (an aggregated group is served everywhere, so it has no published route): were
	// one ever both, the route that never resends a forwarded request would win.
	for i := range b.p.Aggregated {
		gv := &b.p.Aggregated[i]
		specs = append(specs, routeSpec{
			name:       gv.String(),
			match:      separatedPrefix(gv.Path()),
			to:         def,
			variants:   own,
			aggregated: gv,
			proxied:    true,
		})
	}
	for i := range b.p.GroupVersions {
		gv := &b.p.GroupVersions[i]
		s := routeSpec{
			name:      gv.GroupVersion.String(),
			match:     separatedPrefix(gv.GroupVersion.Path()),
			to:        def,
			variants:  own,
			published: gv,
		}
		if gv.ExtProc {
			s.extProc, s.variants = extProcDecides, 0
		}
		specs = append(specs, s)
	}
	return append(specs, routeSpec{name: RouteFallback, match: prefix("/"), to: def, variants: own})
}

// proxyCertRefusal is the refusal of the proxy-cert variants of the routes to the plan's
// default (or local) cluster def when every apiserver of it is dangerous, or nil: a 503 Status
// naming them (plan.ProxyCertRefusal).
func (b *builder) proxyCertRefusal(def string) *refusal {
	for _, c := range b.p.Clusters {
		if c.Name != def || len(c.ProxyCertRefused) == 0 || (c.Role != plan.RoleDefault && c.Role != plan.RoleLocal) {
			continue
		}
		return &refusal{message: plan.ProxyCertRefusal(b.t.APIServers, c.ProxyCertRefused), retryAfter: true}
	}
	return nil
}

// A forward is one Envoy route of a spec that forwards: the spec's own, or one of its
// variants'.
type forward struct {
	suffix  string           // of the spec's name; "" for the route itself
	headers []headerMatch    // matched besides the spec's own
	kind    plan.RequestKind // which variant of the spec's cluster it goes to
	timeout timeoutPolicy
	retry   retryPolicy
	// refused, on a proxy-cert variant, answers instead of forwarding: every apiserver of
	// its cluster is dangerous (target.proxyCertRefused).
	refused *refusal
}

// Matchers of the variants, shared by every route that uses them (the lists too: a variant
// appends to a copy): never modified.
var (
	// proxyCertDecision matches the Lua filter's decision that it set the identity headers.
	proxyCertDecision = exactHeader(contract.HeaderIdentityDecision, contract.IdentityProxyCert)
	// upgradeRequested matches a request that asks for a protocol upgrade (SPDY or WebSocket
	// exec, attach, port-forward, proxy, a WebSocket watch): it must reach an HTTP/1.1
	// cluster, since an HTTP/1 upgrade cannot be forwarded over the HTTP/2 the clusters as
	// named speak (Envoy would need extended CONNECT, which the apiservers do not offer). The
	// header itself rather than the class: an upgrade works even if the Lua filter failed.
	upgradeRequested = []headerMatch{present("upgrade")}
	// classIs matches each class of classVariants.
	classIs = func() map[string][]headerMatch {
		m := map[string][]headerMatch{}
		for _, c := range classVariants {
			m[c.value] = []headerMatch{exactHeader(contract.HeaderRequestClass, c.value)}
		}
		return m
	}()
)

// forwards are the Envoy routes of s, a spec that forwards (no direct answer), in match
// order: the upgrade variant, the class variants and the route itself, each right after its
// proxy-cert variant when s has it. The route itself takes every other request
// (long-running, unclassified, or without a class: the Lua filter failed), with no timeout
// and retried only where it never reached an apiserver. A route where extproc decides
// forwards nothing itself, but an action it must have: this, the safe one.
func (s *routeSpec) forwards() iter.Seq[forward] {
	return func(yield func(forward) bool) {
		each := func(f forward) bool {
			if s.variants&variantProxyCert != 0 {
				p := f
				p.suffix += RouteSuffixProxyCert
				p.headers = append(slices.Clip(f.headers), proxyCertDecision)
				p.kind.ProxyCert = true
				p.refused = s.to.proxyCertRefused
				if !yield(p) {
					return false
				}
			}
			return yield(f)
		}
		if s.variants&variantUpgrade != 0 {
			if !each(forward{
				suffix: RouteSuffixUpgrade, headers: upgradeRequested,
				kind: plan.RequestKind{Upgrade: true}, timeout: noTimeout, retry: retryNeverReached,
			}) {
				return
			}
		}
		for _, c := range classVariants {
			if s.variants&c.variant == 0 {
				continue
			}
			retry := c.retry
			if s.proxied && retry == retryWrites {
				retry = retryNeverReached
			}
			if !each(forward{suffix: c.suffix, headers: classIs[c.value], timeout: c.timeout, retry: retry}) {
				return
			}
		}
		each(forward{timeout: noTimeout, retry: retryNeverReached})
	}
}
