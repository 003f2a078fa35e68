package snapshot

import (
	"regexp"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
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
	RouteDiscovery           = "discovery"
	RouteEscapedPath         = "escaped-path"
	RouteFallback            = "default"
	RouteSuffixFrontProxy    = ":front-proxy"
	identityUndecidedMessage = "kube-mvp: the client certificate could not be mapped to a user (see the Envoy log)"
)

// escapedPathRegex matches the paths (without the query) whose route Envoy cannot tell from
// the path as it is on the wire, because the apiserver reads another one: any %-escape (Go's
// server decodes them into req.URL.Path, which kube-apiserver's RequestInfoFactory splits, so
// "/apis/batch%2Fv1/jobs" is batch/v1 jobs to it) and a leading "//" (RequestInfoFactory
// trims every leading slash). Envoy matches safe_regex against the whole path.
const escapedPathRegex = `//.*|.*%.*`

// escapedTargetRegex matches a :path (the request-target, query included) whose path has
// what escapedPathRegex looks for: a leading "//", or a '%' before the query.
const escapedTargetRegex = `//.*|[^?]*%.*`

// routeConfiguration is the one route table. First match wins:
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
//  4. a path with a %-escape or a leading "//" (escapedPathRegex): the default cluster,
//     ext_proc ON, which decides on the path as the apiserver decodes it; the path is
//     forwarded unchanged.
//  5. per published group/version (path_separated_prefix /api/v1, /apis/<g>/<v>: the
//     group/version's document and everything under it): straight to the default cluster
//     with ext_proc off when every resource of the group/version (hence its document) goes
//     there anyway; otherwise ext_proc on (it sets the routing header and the route is
//     matched again).
//  6. prefix / (non-resource paths, unpublished group/versions such as CRDs and aggregated
//     APIs): the default cluster; ext_proc off.
//
// Every forwarding route has twins: long-running ones without timeout (longRunningRoutes),
// GET/HEAD ones that also retry resets (readRoute), for route 1 an escaped-path one without
// timeout, and from route 3 on, with a client CA, a front-proxy twin of each (frontProxyRoute)
// for the requests whose identity the Lua filter set. So a request that needs no routing
// decision never opens an ext_proc stream, whoever the client is; the virtual host gives the
// Lua filter the identity header names in its metadata (identityMetadata) and removes
// kube-mvp's own request headers before any apiserver.
func (b *builder) routeConfiguration() *routev3.RouteConfiguration {
	def := b.p.DefaultClusterName()
	what := "route configuration " + RouteConfigName + ": "
	// extProcOn is the per-route config of routes that need extproc: none for a front proxy;
	// a sidecar's routes name its local apiserver in the stream's gRPC metadata, so that
	// extproc decides by that sidecar's plan.
	var local []*corev3.HeaderValue
	if b.p.LocalID != "" {
		local = []*corev3.HeaderValue{{Key: contract.MetadataLocalAPIServer, Value: b.p.LocalID}}
	}
	extProcOn := func() map[string]*anypb.Any {
		if len(local) == 0 {
			return nil
		}
		return map[string]*anypb.Any{extProcFilterName: b.pack(what+"ext_proc per-route config", &extprocv3.ExtProcPerRoute{
			Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{GrpcInitialMetadata: local}},
		})}
	}
	// extProcFailOpen is extProcOn that lets the request go on to its route's cluster when
	// extproc cannot be reached or fails (the discovery route).
	extProcFailOpen := func() map[string]*anypb.Any {
		return map[string]*anypb.Any{extProcFilterName: b.pack(what+"ext_proc per-route config", &extprocv3.ExtProcPerRoute{
			Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{
				GrpcInitialMetadata: local,
				FailureModeAllow:    wrapperspb.Bool(true),
			}},
		})}
	}
	extProcOff := map[string]*anypb.Any{
		extProcFilterName: b.pack(what+"ext_proc per-route config", &extprocv3.ExtProcPerRoute{
			Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true},
		}),
	}
	retry := b.retryPolicy(what)
	action := func(cluster string) *routev3.Route_Route {
		return &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			Timeout:          durationpb.New(b.cfg.UpstreamRequestTimeout),
			IdleTimeout:      durationpb.New(0),
			RetryPolicy:      retry,
		}}
	}
	present := func(header string) []*routev3.HeaderMatcher {
		return []*routev3.HeaderMatcher{{
			Name:                 header,
			HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
		}}
	}
	prefix := func(p string, headers []*routev3.HeaderMatcher) *routev3.RouteMatch {
		return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: p}, Headers: headers}
	}

	routes := []*routev3.Route{{
		Name:  RouteRoutingHeader,
		Match: prefix("/", present(contract.HeaderRoutingCluster)),
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_ClusterHeader{ClusterHeader: contract.HeaderRoutingCluster},
			Timeout:          durationpb.New(b.cfg.UpstreamRequestTimeout),
			IdleTimeout:      durationpb.New(0),
			RetryPolicy:      retry,
		}},
		TypedPerFilterConfig: extProcOff,
	}}
	clientCertificates := len(b.cfg.Secrets.ClientCA) > 0
	if clientCertificates {
		routes = append(routes, &routev3.Route{
			Name: RouteIdentityUndecided,
			Match: prefix("/", append(present(contract.HeaderXFCC), &routev3.HeaderMatcher{
				Name:                 contract.HeaderIdentityDecision,
				HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
				InvertMatch:          true,
			})),
			Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
				Status: 503,
				Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: statusJSON(identityUndecidedMessage, "ServiceUnavailable", 503)}},
			}},
			// A direct response's headers come from the route (DirectResponseAction.body).
			ResponseHeadersToAdd: []*corev3.HeaderValueOption{{
				Header:       &corev3.HeaderValue{Key: "content-type", Value: "application/json"},
				AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
			}},
			TypedPerFilterConfig: extProcOff,
		})
	}
	// "/apis/" is the same document to an apiserver as "/apis", so it is merged too. A
	// route's safe_regex matches the whole path, without the query.
	discovery := extProcOff
	if b.p.MergesDiscovery() {
		discovery = extProcFailOpen()
	}
	routes = append(routes, &routev3.Route{
		Name:                 RouteDiscovery,
		Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "/apis/?"}}},
		Action:               action(def),
		TypedPerFilterConfig: discovery,
	})
	routes = append(routes, &routev3.Route{
		Name:                 RouteEscapedPath,
		Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: escapedPathRegex}}},
		Action:               action(def),
		TypedPerFilterConfig: extProcOn(),
	})
	for _, gv := range b.p.GroupVersions {
		r := &routev3.Route{
			Name:                 gv.GroupVersion.String(),
			Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: gv.GroupVersion.Path()}},
			Action:               action(def),
			Metadata:             b.groupVersionMetadata(gv),
			TypedPerFilterConfig: extProcOff,
		}
		if gv.ExtProc {
			r.TypedPerFilterConfig = extProcOn()
		}
		routes = append(routes, r)
	}
	routes = append(routes, &routev3.Route{
		Name:                 RouteFallback,
		Match:                prefix("/", nil),
		Action:               action(def),
		TypedPerFilterConfig: extProcOff,
	})
	// readRetry is retry plus "reset", for the read twins (readRoute).
	readRetry := proto.Clone(retry).(*routev3.RetryPolicy)
	readRetry.RetryOn += ",reset"
	var all []*routev3.Route
	for _, r := range routes {
		// forwarding: r and its twins, in the order they must be matched.
		var forwarding []*routev3.Route
		switch r.GetName() {
		case RouteIdentityUndecided:
			all = append(all, r)
			continue
		case RouteDiscovery: // never long-running
			forwarding = []*routev3.Route{readRoute(r, readRetry), r}
		case RouteEscapedPath:
			// Its regex cannot be intersected with the long-running paths', and such paths
			// are rare: no timeout, as every request had before. No read twin either: the
			// path may be an exec or a proxy in disguise.
			r.GetRoute().Timeout = durationpb.New(0)
			forwarding = []*routev3.Route{r}
		default:
			if r.GetName() == RouteRoutingHeader {
				// A path extproc decoded (escapedPathRegex) cannot be classified by the
				// long-running regexes, which read it as sent: as on the escaped-path route,
				// no timeout.
				esc := twin(r, RouteSuffixEscapedPath)
				esc.Match.Headers = append(slices.Clip(esc.Match.Headers), headerRegex(":path", escapedTargetRegex, false))
				esc.GetRoute().Timeout = durationpb.New(0)
				forwarding = append(forwarding, esc)
			}
			watch, lr := longRunningRoutes(r)
			if lr != nil {
				forwarding = append(forwarding, lr, readRoute(watch, readRetry), watch)
			}
			forwarding = append(forwarding, readRoute(r, readRetry), r)
		}
		// Upgrades first: whatever else the request is, it must reach an HTTP/1.1 cluster. A
		// route that asks extproc forwards nothing itself: extproc names the cluster (the
		// HTTP/1.1 twin for an upgrade) and the request is matched again, to the
		// extproc-decided route, or fails (the discovery route alone may go on without
		// extproc, and /apis is never upgraded); so it needs no upgrade twin.
		if !askExtProc(r) {
			forwarding = append([]*routev3.Route{upgradeRoute(r)}, forwarding...)
		}
		for _, f := range forwarding {
			// extproc names the front-proxy twin itself on the extproc-decided routes.
			if clientCertificates && r.GetName() != RouteRoutingHeader {
				all = append(all, frontProxyRoute(f))
			}
			all = append(all, f)
		}
	}
	return &routev3.RouteConfiguration{
		Name: RouteConfigName,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    VirtualHostName,
			Domains: []string{"*"},
			Routes:  all,
			// The identity decision is for Envoy's routes only, and the XFCC header for the
			// Lua filter and the routes; neither is anything an apiserver should read.
			RequestHeadersToRemove: []string{contract.HeaderIdentityDecision, contract.HeaderXFCC},
			Metadata:               &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{identityFilterName: b.identityMetadata()}},
		}},
	}
}

// frontProxyRoute is the twin of r, to go right before it, for requests whose identity the
// Lua filter set (identity decision "front-proxy"): the same match and filter configuration,
// to the front-proxy twin of r's cluster, whose connections present the proxy certificate.
// extproc, on the routes that ask it, names the twin itself for such requests.
func frontProxyRoute(r *routev3.Route) *routev3.Route {
	c := twin(r, RouteSuffixFrontProxy)
	c.Match.Headers = append(slices.Clip(c.Match.Headers), frontProxyDecision)
	if cs, ok := r.GetRoute().GetClusterSpecifier().(*routev3.RouteAction_Cluster); ok {
		c.GetRoute().ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: contract.FrontProxyCluster(cs.Cluster)}
	}
	return c
}

// frontProxyDecision matches the Lua filter's decision that it set the identity headers.
// Shared by every front-proxy route: never modified.
var frontProxyDecision = &routev3.HeaderMatcher{
	Name: contract.HeaderIdentityDecision,
	HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
		MatchPattern: &matcherv3.StringMatcher_Exact{Exact: contract.IdentityFrontProxy}}},
}

// twin is a copy of the forwarding route r named r's name + suffix, with a Match and a
// RouteAction of its own to change; everything below them (matchers, retry policy, per-filter
// configuration) is shared with r, which nothing modifies once built: a deep copy of every
// route's twins was most of what translation allocated. A twin has no metadata: r's (where a
// group/version's resources go) is read on r, the route the twin's name starts with, and
// repeating it on every twin made marshalling the route configuration cost twice as much.
func twin(r *routev3.Route, suffix string) *routev3.Route {
	m, a := r.GetMatch(), r.GetRoute()
	return &routev3.Route{
		Name: r.GetName() + suffix,
		Match: &routev3.RouteMatch{
			PathSpecifier:   m.GetPathSpecifier(),
			Headers:         m.GetHeaders(),
			QueryParameters: m.GetQueryParameters(),
		},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: a.GetClusterSpecifier(),
			Timeout:          a.GetTimeout(),
			IdleTimeout:      a.GetIdleTimeout(),
			RetryPolicy:      a.GetRetryPolicy(),
		}},
		TypedPerFilterConfig: r.GetTypedPerFilterConfig(),
	}
}

// identityMetadata gives the Lua filter (identity.lua) the names of the headers it sets: the
// first of each of the apiservers' request-header names, and kube-mvp's decision header. The
// virtual host's metadata under the filter's name carries them (the script reads them with
// handle:virtualHost():metadata(), Envoy 1.36), so a change of names is a route update, not a
// listener one.
func (b *builder) identityMetadata() *structpb.Struct {
	h := b.p.RequestHeaders.OrDefault()
	ctx, err := structpb.NewStruct(map[string]any{
		"decision_header":      contract.HeaderIdentityDecision,
		"user_header":          strings.ToLower(h.User[0]),
		"uid_header":           strings.ToLower(h.UID[0]),
		"group_header":         strings.ToLower(h.Group[0]),
		"credential_id_header": strings.ToLower(h.ExtraPrefix[0]) + contract.CredentialIDExtraKey,
	})
	if err != nil {
		panic(err) // a fixed map of strings always converts
	}
	return ctx
}

// Suffixes of the names of the long-running twins of a route (longRunningRoutes).
const (
	RouteSuffixWatch       = ":watch"
	RouteSuffixLongRunning = ":long-running"
)

// longRunningTail matches, after a group/version prefix ("/api/v1/", "/apis/<g>/<v>/"), the
// paths the apiserver treats as long-running by themselves. kube-apiserver's LongRunningFunc
// is BasicLongRunningRequestCheck(verbs watch and proxy; subresources attach, exec, proxy,
// log, portforward) plus non-resource paths under /debug/pprof/ (k8s.io/apiserver
// pkg/server/filters/longrunning.go); RequestInfo (k8s.io/apiserver pkg/endpoints/request
// requestinfo.go) takes the verb from a first path segment "watch" or "proxy", and the
// subresource from the segment after the name, namespaces/<ns>/ aside. The regex matches a
// little more than that (e.g. a ConfigMap named "log"), which only leaves such a request
// without a timeout, as every request was before.
const longRunningTail = `((watch|proxy)(/.*)?|(namespaces/[^/]+/)?[^/]+/[^/]+/(exec|attach|portforward|log|proxy)(/.*)?)`

// longRunningAnyRegex is longRunningTail after any group/version, or /debug/pprof/, for the
// routes whose prefix is "/".
const longRunningAnyRegex = `(/api/[^/]+|/apis/[^/]+/[^/]+)/` + longRunningTail + `|/debug/pprof/.*`

// longRunningRoutes are the two twins of r, to go before it (long-running first: a request
// matching both must not take the watch twin's read twin, readRoute), that match what r matches when
// the apiserver would treat the request as long-running, with r's action and filter
// configuration but no timeout:
//
//   - "<name>:watch": the query has a watch parameter. The apiserver decodes it into
//     ListOptions.Watch (runtime.Convert_Slice_string_To_bool: the first value, anything but
//     "0" and "false" in any case is true, "" too) and a collection GET with Watch is verb
//     watch. Envoy's QueryParameterMatcher also looks at the first value only; present_match
//     is used, so watch=false (which no client sends) gets no timeout either.
//   - "<name>:long-running": the path is long-running (longRunningTail).
//
// Every other request gets r's timeout, Config.UpstreamRequestTimeout: just above the
// apiserver's --request-timeout, after which a live apiserver has answered 504 itself, so
// only an apiserver that stopped answering meets it.
func longRunningRoutes(r *routev3.Route) (watch, longRunning *routev3.Route) {
	noTimeout := func(name string) *routev3.Route {
		c := twin(r, name)
		c.GetRoute().Timeout = durationpb.New(0)
		return c
	}
	watch = noTimeout(RouteSuffixWatch)
	watch.Match.QueryParameters = []*routev3.QueryParameterMatcher{{
		Name:                         "watch",
		QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true},
	}}
	lr := noTimeout(RouteSuffixLongRunning)
	var regex string
	switch m := r.GetMatch().GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		regex = longRunningAnyRegex
		if m.Prefix != "/" {
			regex = regexp.QuoteMeta(m.Prefix) + longRunningTail
		}
	case *routev3.RouteMatch_PathSeparatedPrefix:
		regex = regexp.QuoteMeta(m.PathSeparatedPrefix+"/") + longRunningTail
	default:
		// No long-running paths can be told apart: no timeout at all, as before.
		r.GetRoute().Timeout = durationpb.New(0)
		return nil, nil
	}
	lr.Match.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: regex}}
	return watch, lr
}

// askExtProc reports whether route r runs the ext_proc filter (a per-route config that does
// not disable it).
func askExtProc(r *routev3.Route) bool {
	a := r.GetTypedPerFilterConfig()[extProcFilterName]
	if a == nil {
		return true // the filter's own config: on
	}
	var pr extprocv3.ExtProcPerRoute
	return a.UnmarshalTo(&pr) != nil || !pr.GetDisabled()
}

// RouteSuffixUpgrade is the suffix of the name of a route's upgrade twin (upgradeRoute).
const RouteSuffixUpgrade = ":upgrade"

// upgradeRoute is the twin of r, to go before all of r's other twins, for requests that ask
// for a protocol upgrade (an Upgrade header: SPDY or WebSocket exec, attach, port-forward,
// proxy, a WebSocket watch): to the HTTP/1.1 twin of r's cluster (contract.HTTP1Cluster),
// since an HTTP/1 upgrade cannot be forwarded over the HTTP/2 the clusters as named speak
// (Envoy would need extended CONNECT, which the apiservers do not offer), with no timeout (the
// apiserver treats every upgrade as long-running). On the extproc-decided route the cluster
// comes from the routing header, in which extproc names the HTTP/1.1 twin for an upgrade.
func upgradeRoute(r *routev3.Route) *routev3.Route {
	c := twin(r, RouteSuffixUpgrade)
	c.Match.Headers = append(slices.Clip(c.Match.Headers), upgradeRequested)
	c.GetRoute().Timeout = durationpb.New(0)
	if cs, ok := r.GetRoute().GetClusterSpecifier().(*routev3.RouteAction_Cluster); ok {
		c.GetRoute().ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: contract.HTTP1Cluster(cs.Cluster)}
	}
	return c
}

// upgradeRequested matches a request that asks for a protocol upgrade. Shared by every
// upgrade route: never modified.
var upgradeRequested = &routev3.HeaderMatcher{
	Name:                 "upgrade",
	HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
}

// RouteSuffixEscapedPath is the suffix of the extproc-decided route's twin for escaped paths,
// which has no timeout.
const RouteSuffixEscapedPath = ":escaped-path"

// RouteSuffixRead is the suffix of the name of a route's read twin (readRoute).
const RouteSuffixRead = ":read"

// readRoute is the twin of r, to go right before it, for GET and HEAD (a :method header
// match): r's match, action and filter configuration, and its retry policy with "reset"
// added. A long-running twin comes before it, so exec, attach, portforward and proxy (which
// run something, or reach past the apiserver, even as a GET: WebSocket exec is one) never
// match it, nor does the escaped-path route, which gets no read twin, nor any request whose
// path has an escape or a leading "//" (an inverted :path match): the long-running twins'
// regexes read the path as received, so "/api/v1/namespaces/n/pods/p/%65xec", an exec to
// the apiserver, which decodes it, would otherwise reach a read twin once extproc routed it.
//
// Why: an apiserver closing a kept-alive connection (idle close, or the idle connections a
// stopping apiserver closes in http.Server.Shutdown), or the keepalive pings closing one to a
// frozen apiserver, can meet a request Envoy just wrote on it. That is a reset after the request was sent, and none of the conditions
// retryPolicy uses covers it: reset-before-request only while nothing was sent
// (Router::Filter's upstream_request_started_), connect-failure and refused-stream not at
// all. "reset" retries any reset before the response began
// (RetryStateImpl::wouldRetryFromReset, source/common/router/retry_state_impl.cc), which is
// safe only for a request the apiserver may run twice: in Kubernetes a GET or HEAD other
// than those connect subresources is a read (get, list, watch), and replaying it on another
// apiserver is what the client would do. Everything else keeps the verb-independent policy,
// which never retries a request an apiserver may have executed.
//
// The alternatives Envoy offers were weighed: retriable_request_headers would restrict every
// retry condition of the route to GET, losing the POST retries of connect failures and
// Retry-After answers; HTTP/2 to the apiservers (which the clusters now speak, clusters.go)
// makes a graceful shutdown's GOAWAY turn unprocessed streams into refused-stream resets,
// retried, but not a connection that ends under a stream the apiserver received; the
// upstream idle_timeout below the apiservers' (clusters.go) removes the idle-close race but
// not a stopping apiserver's. The twin is the smallest change that is correct for all.
func readRoute(r *routev3.Route, readRetry *routev3.RetryPolicy) *routev3.Route {
	c := twin(r, RouteSuffixRead)
	c.Match.Headers = append(slices.Clip(c.Match.Headers), readMethods, notEscapedTarget)
	c.GetRoute().RetryPolicy = readRetry
	return c
}

// readMethods and notEscapedTarget are the read twins' own matchers (readRoute). Shared by
// every read route: never modified.
var (
	readMethods      = headerRegex(":method", "GET|HEAD", false)
	notEscapedTarget = headerRegex(":path", escapedTargetRegex, true)
)

func headerRegex(name, re string, invert bool) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: name, InvertMatch: invert,
		HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}}}
}

// retryPolicy retries only what is safe to retry whatever the verb: the request never
// reached an apiserver (connect failure, refused stream, reset before the request was sent),
// or an apiserver answered with Retry-After. The apiserver sends Retry-After only for requests
// it did not process: 503 "apiserver is shutting down" (once a stopping apiserver refuses new
// requests), 429 from max-in-flight / priority and fairness or a cache still initialising;
// client-go retries such answers for every verb too. Retrying them at once on another
// apiserver is what keeps an upgrade's restarts invisible; a 429 costs an overloaded control
// plane at most two more attempts, each on another apiserver, which is also what client-go
// would send after its back-off. Each retry goes to another host (previous_hosts) when the
// cluster has one.
func (b *builder) retryPolicy(what string) *routev3.RetryPolicy {
	return &routev3.RetryPolicy{
		RetryOn:    "connect-failure,refused-stream,reset-before-request,retriable-headers",
		NumRetries: wrapperspb.UInt32(2),
		RetriableHeaders: []*routev3.HeaderMatcher{{
			Name:                 "retry-after",
			HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
		}},
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
