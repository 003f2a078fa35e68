package dataplane

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	luafilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Route configurations, virtual hosts and routes, compiled.

// maxDirectResponseBody is RouteConfiguration.max_direct_response_body_size_bytes's default.
const maxDirectResponseBody = 4096

type routeConfig struct {
	name   string
	vhosts []*virtualHost
}

type virtualHost struct {
	name    string
	domains []string
	routes  []*route
	// requestHeadersToRemove: removed from the request before it is forwarded (the router's
	// finalizeRequestHeaders, after every filter).
	requestHeadersToRemove []string
	lua                    map[string]*luaRouteCfg // filter name -> typed_per_filter_config LuaPerRoute
	filterMetadata         map[string]*structpb.Struct
}

type route struct {
	name          string
	prefix, path  *string
	sepPrefix     *string // path_separated_prefix
	re            *regexp.Regexp
	headers       []*headerMatcher
	query         []*queryMatcher
	cluster       string
	clusterHeader string
	// metadataMatch is the route action's metadata_match.filter_metadata["envoy.lb"] (nil
	// when absent): the subset load balancer's criteria, before the request's dynamic
	// metadata is merged in (stream.subsetCriteria).
	metadataMatch   *structpb.Struct
	timeout         time.Duration // 0: none
	retry           *retryPolicy
	extProcDisabled map[string]bool // filter name -> disabled
	// extProcMetadata: filter name -> overrides.grpc_initial_metadata, added to the
	// ext_proc stream's gRPC metadata for requests on this route.
	extProcMetadata map[string][]kv
	// extProcFailOpen: filter name -> overrides.failure_mode_allow, replacing the filter's
	// failure_mode_allow for requests on this route.
	extProcFailOpen map[string]bool
	// direct is a direct_response action (nil for a route action).
	direct *directResponse
	// responseHeadersToAdd are the route's response_headers_to_add (every one
	// OVERWRITE_IF_EXISTS_OR_ADD; the allowlist admits nothing else).
	responseHeadersToAdd []kv
	lua                  map[string]*luaRouteCfg // filter name -> typed_per_filter_config LuaPerRoute
	vh                   *virtualHost
}

type directResponse struct {
	status int
	body   string
}

type headerMatcher struct {
	name    string
	present *bool
	str     *stringMatcher
	invert  bool
}

// queryMatcher is a QueryParameterMatcher: string_match, or present_match (str nil).
type queryMatcher struct {
	name string
	str  *stringMatcher
}

type retryPolicy struct {
	on               map[string]bool
	numRetries       int
	previousHosts    bool
	hostSelectionMax int
	retriableHeaders []*headerMatcher // retry_on retriable-headers: any match retries the response
	// retriableStatusCodes: retry_on retriable-status-codes retries a response with one of
	// these statuses.
	retriableStatusCodes []uint32
}

func compileRouteConfig(rc *routev3.RouteConfiguration) (*routeConfig, error) {
	out := &routeConfig{name: rc.GetName()}
	for i, vh := range rc.GetVirtualHosts() {
		v := &virtualHost{name: vh.GetName(), lua: map[string]*luaRouteCfg{}}
		for k, a := range vh.GetTypedPerFilterConfig() {
			pr := &luafilterv3.LuaPerRoute{}
			if err := a.UnmarshalTo(pr); err != nil {
				return nil, fmt.Errorf("virtual_hosts[%d].typed_per_filter_config[%s]: %w", i, k, err)
			}
			c, err := compileLuaPerRoute(pr)
			if err != nil {
				return nil, fmt.Errorf("virtual_hosts[%d].typed_per_filter_config[%s]: %w", i, k, err)
			}
			v.lua[k] = c
		}
		for _, d := range vh.GetDomains() {
			v.domains = append(v.domains, strings.ToLower(d))
		}
		v.filterMetadata = vh.GetMetadata().GetFilterMetadata()
		for _, h := range vh.GetRequestHeadersToRemove() {
			v.requestHeadersToRemove = append(v.requestHeadersToRemove, strings.ToLower(h))
		}
		for j, r := range vh.GetRoutes() {
			cr, err := compileRoute(r)
			if err != nil {
				return nil, fmt.Errorf("virtual_hosts[%d].routes[%d] (%s): %w", i, j, r.GetName(), err)
			}
			cr.vh = v
			v.routes = append(v.routes, cr)
		}
		out.vhosts = append(out.vhosts, v)
	}
	return out, nil
}

func compileHeaderMatcher(h *routev3.HeaderMatcher) (*headerMatcher, error) {
	hm := &headerMatcher{name: strings.ToLower(h.GetName()), invert: h.GetInvertMatch()}
	switch s := h.GetHeaderMatchSpecifier().(type) {
	case *routev3.HeaderMatcher_PresentMatch:
		hm.present = &s.PresentMatch
	case *routev3.HeaderMatcher_StringMatch:
		sm, err := compileStringMatcher(s.StringMatch)
		if err != nil {
			return nil, err
		}
		hm.str = sm
	default:
		return nil, errors.New("only present_match and string_match are implemented")
	}
	return hm, nil
}

func compileRoute(r *routev3.Route) (*route, error) {
	out := &route{name: r.GetName(), extProcDisabled: map[string]bool{}, extProcMetadata: map[string][]kv{}, extProcFailOpen: map[string]bool{}, lua: map[string]*luaRouteCfg{}}
	for _, h := range r.GetResponseHeadersToAdd() {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD || len(h.GetHeader().GetRawValue()) > 0 {
			return nil, errors.New("response_headers_to_add: only append_action OVERWRITE_IF_EXISTS_OR_ADD with a value is implemented")
		}
		out.responseHeadersToAdd = append(out.responseHeadersToAdd, kv{strings.ToLower(h.GetHeader().GetKey()), h.GetHeader().GetValue()})
	}
	m := r.GetMatch()
	switch p := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		out.prefix = &p.Prefix
	case *routev3.RouteMatch_Path:
		out.path = &p.Path
	case *routev3.RouteMatch_PathSeparatedPrefix:
		// Envoy's validation (route_components.proto): no '?' or '#', not ending in '/'.
		if err := m.Validate(); err != nil {
			return nil, err
		}
		out.sepPrefix = &p.PathSeparatedPrefix
	case *routev3.RouteMatch_SafeRegex:
		re, err := compileRE2(p.SafeRegex.GetRegex())
		if err != nil {
			return nil, err
		}
		out.re = re
	default:
		return nil, errors.New("match: only prefix, path, path_separated_prefix and safe_regex are implemented")
	}
	for _, h := range m.GetHeaders() {
		hm, err := compileHeaderMatcher(h)
		if err != nil {
			return nil, fmt.Errorf("match.headers: %w", err)
		}
		out.headers = append(out.headers, hm)
	}
	for _, q := range m.GetQueryParameters() {
		qm := &queryMatcher{name: q.GetName()}
		switch s := q.GetQueryParameterMatchSpecifier().(type) {
		case *routev3.QueryParameterMatcher_PresentMatch:
			if !s.PresentMatch {
				return nil, errors.New("match.query_parameters: present_match false is not implemented")
			}
		case *routev3.QueryParameterMatcher_StringMatch:
			sm, err := compileStringMatcher(s.StringMatch)
			if err != nil {
				return nil, fmt.Errorf("match.query_parameters: %w", err)
			}
			qm.str = sm
		default:
			return nil, errors.New("match.query_parameters: only present_match and string_match are implemented")
		}
		out.query = append(out.query, qm)
	}
	if dr := r.GetDirectResponse(); dr != nil {
		// DirectResponseAction: status (validated 200..599) and an inline body; the router
		// answers with a local reply (Router::Filter::decodeHeaders, sendLocalReply with
		// details "direct_response"), to which the route's response_headers_to_add apply.
		if err := dr.Validate(); err != nil {
			return nil, err
		}
		if dr.GetBody() != nil && dr.GetBody().GetInlineString() == "" {
			return nil, errors.New("direct_response.body: only inline_string is implemented")
		}
		// The body is read with the route configuration's max_direct_response_body_size_bytes
		// as its limit, 4096 when unset (RouteEntryImplBase's constructor, through
		// Config::DataSource; RouteConfiguration's field, not implemented here, is unset).
		if n := len(dr.GetBody().GetInlineString()); n > maxDirectResponseBody {
			return nil, fmt.Errorf("response body size is %d bytes; maximum is %d", n, maxDirectResponseBody)
		}
		out.direct = &directResponse{status: int(dr.GetStatus()), body: dr.GetBody().GetInlineString()}
		if err := compilePerFilter(r, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	a := r.GetRoute()
	if a == nil {
		return nil, errors.New("only route actions (route:) and direct_response are implemented")
	}
	out.cluster, out.clusterHeader = a.GetCluster(), strings.ToLower(a.GetClusterHeader())
	// Envoy's RouteEntryImplBase: only the envoy.lb namespace of metadata_match makes the
	// route's MetadataMatchCriteria; other namespaces are not used for load balancing.
	out.metadataMatch = a.GetMetadataMatch().GetFilterMetadata()[envoyLB]
	if out.cluster == "" && out.clusterHeader == "" {
		return nil, errors.New("route: only cluster and cluster_header are implemented")
	}
	// Envoy: the route timeout defaults to 15s; 0 disables it.
	out.timeout = 15 * time.Second
	if a.GetTimeout() != nil {
		out.timeout = a.GetTimeout().AsDuration()
	}
	if rp := a.GetRetryPolicy(); rp != nil {
		p := &retryPolicy{on: map[string]bool{}, numRetries: 1, hostSelectionMax: 1}
		for _, t := range strings.Split(rp.GetRetryOn(), ",") {
			if t = strings.TrimSpace(t); t != "" {
				p.on[t] = true
			}
		}
		// Envoy: num_retries defaults to 1.
		if rp.GetNumRetries() != nil {
			p.numRetries = int(rp.GetNumRetries().GetValue())
		}
		for _, hp := range rp.GetRetryHostPredicate() {
			if hp.GetName() != "envoy.retry_host_predicates.previous_hosts" && !strings.HasSuffix(hp.GetTypedConfig().GetTypeUrl(), "PreviousHostsPredicate") {
				return nil, fmt.Errorf("retry_host_predicate %s is not implemented", hp.GetName())
			}
			p.previousHosts = true
		}
		for _, h := range rp.GetRetriableHeaders() {
			hm, err := compileHeaderMatcher(h)
			if err != nil {
				return nil, fmt.Errorf("retry_policy.retriable_headers: %w", err)
			}
			p.retriableHeaders = append(p.retriableHeaders, hm)
		}
		p.retriableStatusCodes = slices.Clone(rp.GetRetriableStatusCodes())
		if rp.GetHostSelectionRetryMaxAttempts() > 0 {
			p.hostSelectionMax = int(rp.GetHostSelectionRetryMaxAttempts())
		}
		out.retry = p
	}
	if err := compilePerFilter(r, out); err != nil {
		return nil, err
	}
	return out, nil
}

// compilePerFilter reads a route's typed_per_filter_config (ext_proc's; the allowlist admits
// no other).
func compilePerFilter(r *routev3.Route, out *route) error {
	for k, v := range r.GetTypedPerFilterConfig() {
		if v.MessageIs(&luafilterv3.LuaPerRoute{}) {
			lp := &luafilterv3.LuaPerRoute{}
			if err := v.UnmarshalTo(lp); err != nil {
				return fmt.Errorf("typed_per_filter_config[%s]: %w", k, err)
			}
			c, err := compileLuaPerRoute(lp)
			if err != nil {
				return fmt.Errorf("typed_per_filter_config[%s]: %w", k, err)
			}
			out.lua[k] = c
			continue
		}
		pr := &extprocfilterv3.ExtProcPerRoute{}
		if err := v.UnmarshalTo(pr); err != nil {
			return fmt.Errorf("typed_per_filter_config[%s]: %w", k, err)
		}
		if o := pr.GetOverrides(); o != nil {
			// ExtProcOverrides.grpc_initial_metadata: sent on the streams this route opens
			// (the allowlist admits no other override).
			if fm := o.GetFailureModeAllow(); fm != nil {
				out.extProcFailOpen[k] = fm.GetValue()
			}
			for _, m := range o.GetGrpcInitialMetadata() {
				if m.GetKey() == "" || len(m.GetRawValue()) > 0 {
					return fmt.Errorf("typed_per_filter_config[%s]: grpc_initial_metadata needs a key and a value (raw_value is not implemented)", k)
				}
				out.extProcMetadata[k] = append(out.extProcMetadata[k], kv{strings.ToLower(m.GetKey()), m.GetValue()})
			}
			continue
		}
		if !pr.GetDisabled() {
			return fmt.Errorf("typed_per_filter_config[%s]: disabled: false is not implemented", k)
		}
		out.extProcDisabled[k] = true
	}
	return nil
}
