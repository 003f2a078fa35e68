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

// This file renders the route table that routespec.go decides: each spec and its forwards as
// Envoy routes, each policy once, shared by the routes that use it.

// routeConfiguration is the one route table: routeSpecs rendered, in one virtual host that
// gives the Lua filter the header names in its metadata (identityMetadata) and removes
// kube-mvp's own request headers before any apiserver.
func (b *builder) routeConfiguration() *routev3.RouteConfiguration {
	rb := b.newRouteBuilder()
	var routes []*routev3.Route
	specs := b.routeSpecs()
	for i := range specs {
		routes = rb.render(routes, &specs[i])
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

// routeBuilder holds what every route shares: per-filter configurations, timeouts, retry
// policies, header matchers and refusals (each built once and never modified after: routes
// share them rather than copy).
type routeBuilder struct {
	b        *builder
	timeouts [2]*durationpb.Duration // by timeoutPolicy
	retries  [3]*routev3.RetryPolicy // by retryPolicy
	// extProc is the ext_proc per-route configuration by extProcUse (nil: the filter's own).
	extProc [3]map[string]*anypb.Any
	headers map[headerMatch]*routev3.HeaderMatcher
	// refusals are the direct responses rendered so far (specs share a target's).
	refusals map[*refusal]*routev3.Route_DirectResponse
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
		b:        b,
		headers:  map[headerMatch]*routev3.HeaderMatcher{},
		refusals: map[*refusal]*routev3.Route_DirectResponse{},
	}
	rb.timeouts[noTimeout] = durationpb.New(0)
	rb.timeouts[requestTimeout] = durationpb.New(b.cfg.UpstreamRequestTimeout)
	rb.retries[retryNeverReached] = b.envoyRetryPolicy(what, retryOnNeverReached, nil, false)
	rb.retries[retryReads] = b.envoyRetryPolicy(what, retryOnNeverReached+",retriable-headers,reset", nil, true)
	rb.retries[retryWrites] = b.envoyRetryPolicy(what, retryOnNeverReached+",retriable-status-codes", apiserverRefusals, false)
	rb.extProc[extProcOff] = perRoute(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true}})
	rb.extProc[extProcMayDecide] = perRoute(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Overrides{
		Overrides: &extprocv3.ExtProcOverrides{GrpcInitialMetadata: local, FailureModeAllow: wrapperspb.Bool(true)},
	}})
	if len(local) > 0 {
		rb.extProc[extProcDecides] = perRoute(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Overrides{Overrides: &extprocv3.ExtProcOverrides{GrpcInitialMetadata: local}}})
	}
	return rb
}

// render appends the Envoy routes of s to routes, in match order: a direct response alone,
// otherwise s's forwards. The route itself alone carries s's metadata (repeating it on the
// variants made marshalling the route configuration cost twice as much).
func (rb *routeBuilder) render(routes []*routev3.Route, s *routeSpec) []*routev3.Route {
	match := rb.match(s.match)
	if s.to.direct != nil {
		return append(routes, rb.direct(s, match))
	}
	for f := range s.forwards() {
		r := rb.route(s, match, f)
		if f.suffix == "" {
			r.Metadata = rb.metadata(s)
		}
		routes = append(routes, r)
	}
	return routes
}

// route is the Envoy route of f, a forward of s, whose own match is match.
func (rb *routeBuilder) route(s *routeSpec, match *routev3.RouteMatch, f forward) *routev3.Route {
	if len(f.headers) > 0 {
		headers := slices.Grow(slices.Clip(match.Headers), len(f.headers))
		for _, h := range f.headers {
			headers = append(headers, rb.header(h))
		}
		match = &routev3.RouteMatch{PathSpecifier: match.PathSpecifier, Headers: headers}
	}
	name := s.name + f.suffix
	if f.refused != nil {
		return &routev3.Route{Name: name, Match: match, Action: rb.refusal(f.refused), TypedPerFilterConfig: rb.extProc[extProcOff], ResponseHeadersToAdd: refusalHeaders}
	}
	a := &routev3.RouteAction{Timeout: rb.timeouts[f.timeout], IdleTimeout: rb.timeouts[noTimeout], RetryPolicy: rb.retries[f.retry]}
	if s.to.clusterHeader {
		a.ClusterSpecifier = &routev3.RouteAction_ClusterHeader{ClusterHeader: contract.HeaderRoutingCluster}
	} else {
		a.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: f.kind.Cluster(s.to.cluster).String()}
	}
	return &routev3.Route{Name: name, Match: match, Action: &routev3.Route_Route{Route: a}, TypedPerFilterConfig: rb.extProc[s.extProc]}
}

// direct is s's direct response; its headers come from the route
// (DirectResponseAction.body).
func (rb *routeBuilder) direct(s *routeSpec, match *routev3.RouteMatch) *routev3.Route {
	return &routev3.Route{
		Name: s.name, Match: match, Action: rb.refusal(s.to.direct), TypedPerFilterConfig: rb.extProc[s.extProc],
		ResponseHeadersToAdd: []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: "content-type", Value: "application/json"},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}},
	}
}

// refusal is r as a direct 503 Status. Envoy refuses a direct response body over 4 KiB; a
// message that would make one is cut.
func (rb *routeBuilder) refusal(r *refusal) *routev3.Route_DirectResponse {
	if d, ok := rb.refusals[r]; ok {
		return d
	}
	body := statusJSON(r.message, "ServiceUnavailable", 503)
	if r.retryAfter {
		msg := r.message
		body = statusJSONRetry(msg)
		for len(body) > maxDirectResponseBody {
			msg = strings.ToValidUTF8(msg[:len(msg)*3/4], "") + "…"
			body = statusJSONRetry(msg)
		}
	}
	d := &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{
		Status: 503,
		Body:   &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body}},
	}}
	rb.refusals[r] = d
	return d
}

// refusalHeaders are the response headers of the proxy-cert refusals' 503s: a Status, and
// Retry-After, as kube-mvp's other 503s for requests no apiserver received.
var refusalHeaders = []*corev3.HeaderValueOption{
	{Header: &corev3.HeaderValue{Key: "content-type", Value: "application/json"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
	retryAfter,
}

// maxDirectResponseBody is the largest direct response body Envoy accepts (its route
// configuration's max_direct_response_body_size_bytes default, 4 KiB), with room.
const maxDirectResponseBody = 4000

// match is m as Envoy's.
func (rb *routeBuilder) match(m routeMatch) *routev3.RouteMatch {
	r := &routev3.RouteMatch{}
	switch m.pathIs {
	case pathPrefix:
		r.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: m.path}
	case pathSeparatedPrefix:
		r.PathSpecifier = &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: m.path}
	case pathRegex:
		r.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: m.path}}
	}
	if len(m.headers) > 0 {
		r.Headers = make([]*routev3.HeaderMatcher, len(m.headers))
		for i, h := range m.headers {
			r.Headers[i] = rb.header(h)
		}
	}
	return r
}

// header is h as Envoy's, one per distinct h (routes share them).
func (rb *routeBuilder) header(h headerMatch) *routev3.HeaderMatcher {
	if m, ok := rb.headers[h]; ok {
		return m
	}
	m := &routev3.HeaderMatcher{Name: h.name}
	switch h.is {
	case headerPresent, headerAbsent:
		m.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
		m.InvertMatch = h.is == headerAbsent
	case headerExact:
		m.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Exact{Exact: h.value}}}
	}
	rb.headers[h] = m
	return m
}

// metadata is what s's route itself says in its metadata, if anything.
func (rb *routeBuilder) metadata(s *routeSpec) *corev3.Metadata {
	switch {
	case s.published != nil:
		return rb.b.groupVersionMetadata(*s.published)
	case s.aggregated != nil:
		return aggregatedMetadata(*s.aggregated)
	}
	return nil
}

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

// retryOnNeverReached are the retry conditions under which the request cannot have reached an
// apiserver: the connection failed (connect-failure), the apiserver refused the stream
// before reading it (refused-stream: an HTTP/2 REFUSED_STREAM, or a stream past a GOAWAY's
// last stream ID), or the connection was reset before any byte of this request was written
// (reset-before-request: Envoy's router retries it only while upstream_request_started_ is
// false). Every route retries them, whatever the method: the apiserver never saw the request.
const retryOnNeverReached = "connect-failure,refused-stream,reset-before-request"

// apiserverRefusals are the statuses a write is retried on (retriable-status-codes), on the
// write variants of every route but the aggregated ones: kube-apiserver answers 429 and 503
// for a request it serves itself only before carrying it out.
// Why, source by source: docs/envoy-config.md#writes-retried-on-429-and-503.
var apiserverRefusals = []uint32{http.StatusTooManyRequests, http.StatusServiceUnavailable}

// envoyRetryPolicy makes a retry policy on the conditions on (retryOnNeverReached and more),
// the status codes (with retriable-status-codes) and, with retryAfter, any answer carrying
// Retry-After (with retriable-headers). At most two retries, each to another host
// (previous_hosts) when the cluster has one. The policies and why each is safe:
// docs/envoy-config.md#the-retry-policies.
func (b *builder) envoyRetryPolicy(what, on string, codes []uint32, retryAfter bool) *routev3.RetryPolicy {
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
