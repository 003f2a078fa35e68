package dataplane

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	luafilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlymutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpoptionsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-multierror"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/test/dataplane/internal/re2"
)

// config is one applied configuration: the raw resources (for /config_dump) and their
// compiled forms. It is immutable; an update makes a new one.
type config struct {
	raw       map[string]map[string]proto.Message // type URL -> name -> resource
	version   map[string]string
	listeners map[string]*listenerCfg
	routes    map[string]*routeConfig
	clusters  map[string]*clusterCfg
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	secrets   map[string]*tlsv3.Secret
}

func emptyConfig() *config {
	c := &config{raw: map[string]map[string]proto.Message{}, version: map[string]string{},
		listeners: map[string]*listenerCfg{}, routes: map[string]*routeConfig{}, clusters: map[string]*clusterCfg{},
		endpoints: map[string]*endpointv3.ClusterLoadAssignment{}, secrets: map[string]*tlsv3.Secret{}}
	for _, t := range typeOrder {
		c.raw[t] = map[string]proto.Message{}
	}
	return c
}

func (c *config) clone() *config {
	n := *c
	n.raw = map[string]map[string]proto.Message{}
	for k, v := range c.raw {
		n.raw[k] = v
	}
	n.version = map[string]string{}
	for k, v := range c.version {
		n.version[k] = v
	}
	return &n
}

// newResource returns an empty message of a type URL's type.
func newResource(typeURL string) (proto.Message, error) {
	switch typeURL {
	case resource.ListenerType:
		return &listenerv3.Listener{}, nil
	case resource.RouteType:
		return &routev3.RouteConfiguration{}, nil
	case resource.ClusterType:
		return &clusterv3.Cluster{}, nil
	case resource.EndpointType:
		return &endpointv3.ClusterLoadAssignment{}, nil
	case resource.SecretType:
		return &tlsv3.Secret{}, nil
	}
	return nil, fmt.Errorf("resource type %s is not implemented", typeURL)
}

// withType returns a copy of c in which the resources of typeURL are replaced by res, all
// compiled; any error rejects the whole update (state of the world: the response is one unit).
func (c *config) withType(typeURL, version string, res []proto.Message) (*config, []error) {
	var errs []error
	n := c.clone()
	raw := map[string]proto.Message{}
	for _, r := range res {
		nm := cachev3.GetResourceName(r) // a ClusterLoadAssignment's is its cluster_name
		if _, dup := raw[nm]; dup {
			errs = append(errs, fmt.Errorf("duplicate resource %q", nm))
		}
		raw[nm] = r
		fieldErrs := checkFields(r)
		if len(fieldErrs) == 0 {
			fieldErrs = envoyLoadChecks(r) // envoychecks.go
		}
		for _, e := range fieldErrs {
			errs = append(errs, fmt.Errorf("%s %q: %w", shortType(typeURL), nm, e))
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	n.raw[typeURL] = raw
	n.version[typeURL] = version
	fail := func(nm string, err error) {
		errs = append(errs, fmt.Errorf("%s %q: %w", shortType(typeURL), nm, err))
	}
	switch typeURL {
	case resource.ListenerType:
		n.listeners = compileAll(raw, compileListener, fail)
	case resource.RouteType:
		n.routes = compileAll(raw, compileRouteConfig, fail)
	case resource.ClusterType:
		n.clusters = compileAll(raw, compileCluster, fail)
	case resource.EndpointType:
		n.endpoints = compileAll(raw, func(cla *endpointv3.ClusterLoadAssignment) (*endpointv3.ClusterLoadAssignment, error) {
			_, err := compileHosts(cla)
			return cla, err
		}, fail)
	case resource.SecretType:
		n.secrets = compileAll(raw, func(s *tlsv3.Secret) (*tlsv3.Secret, error) {
			s, err := resolveSecret(s)
			if err == nil {
				err = checkSecret(s)
			}
			return s, err
		}, fail)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return n, nil
}

// compileAll compiles every resource of raw (all of type M); one that fails is reported to
// fail by name and left out.
func compileAll[M proto.Message, C any](raw map[string]proto.Message, compile func(M) (C, error), fail func(name string, err error)) map[string]C {
	out := make(map[string]C, len(raw))
	for nm, r := range raw {
		c, err := compile(r.(M))
		if err != nil {
			fail(nm, err)
			continue
		}
		out[nm] = c
	}
	return out
}

func shortType(typeURL string) string {
	return typeURL[strings.LastIndex(typeURL, ".")+1:]
}

// ---------------------------------------------------------------------------------------
// Listener and HTTP connection manager.

type listenerCfg struct {
	name    string
	address string // host:port from the resource
	tls     *downstreamTLS
	hcm     *hcmCfg
}

type downstreamTLS struct {
	certSecret    string
	caSecret      string
	requireClient bool
	alpn          []string
	// tickets is stateless session resumption, on unless
	// disable_stateless_session_resumption (listener.go, downstreamTLSConfig). Stateful
	// resumption (disable_stateful_session_resumption) is TLS 1.2 session IDs, which Go's
	// server cannot resume: either value is accepted and nothing is modelled.
	tickets bool
}

type hcmCfg struct {
	statPrefix       string
	rdsName          string
	early            []headerRemoval
	fcc              hcmv3.HttpConnectionManager_ForwardClientCertDetails
	certSubject      bool
	certURI          bool
	useRemoteAddress bool
	upgrades         map[string]bool
	extProc          *extProcCfg // nil: no ext_proc filter
	// filters are the HTTP filters before the router, in the configured order: each
	// entry is one of lua or extProc.
	filters           []httpFilterCfg
	suppressEnvoy     bool
	passThroughServer bool
	localReply        []*localReplyMapper
	// h2 is http2_protocol_options: what the downstream HTTP/2 server advertises.
	h2 h2Flow
}

type httpFilterCfg struct {
	lua     *luaFilterCfg
	extProc *extProcCfg
}

type headerRemoval struct {
	exact   string
	matcher *stringMatcher
}

func compileListener(l *listenerv3.Listener) (*listenerCfg, error) {
	sa := l.GetAddress().GetSocketAddress()
	if sa == nil {
		return nil, errors.New("address: only socket_address is implemented")
	}
	out := &listenerCfg{name: l.GetName(), address: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))}
	if len(l.GetFilterChains()) != 1 {
		return nil, fmt.Errorf("filter_chains: exactly one filter chain is implemented, got %d", len(l.GetFilterChains()))
	}
	fc := l.GetFilterChains()[0]
	if len(fc.GetFilters()) != 1 {
		return nil, fmt.Errorf("filter_chains[0].filters: exactly one filter (the HTTP connection manager) is implemented, got %d", len(fc.GetFilters()))
	}
	if ts := fc.GetTransportSocket(); ts != nil {
		ctx := &tlsv3.DownstreamTlsContext{}
		if err := ts.GetTypedConfig().UnmarshalTo(ctx); err != nil {
			return nil, fmt.Errorf("filter_chains[0].transport_socket: %w", err)
		}
		ct := ctx.GetCommonTlsContext()
		if len(ct.GetTlsCertificateSdsSecretConfigs()) != 1 {
			return nil, errors.New("filter_chains[0].transport_socket: exactly one tls_certificate_sds_secret_configs is implemented")
		}
		out.tls = &downstreamTLS{
			certSecret:    ct.GetTlsCertificateSdsSecretConfigs()[0].GetName(),
			caSecret:      ct.GetValidationContextSdsSecretConfig().GetName(),
			requireClient: ctx.GetRequireClientCertificate().GetValue(),
			alpn:          ct.GetAlpnProtocols(),
			tickets:       !ctx.GetDisableStatelessSessionResumption(),
		}
	}
	h := &hcmv3.HttpConnectionManager{}
	if err := fc.GetFilters()[0].GetTypedConfig().UnmarshalTo(h); err != nil {
		return nil, fmt.Errorf("filter_chains[0].filters[0]: %w", err)
	}
	hcm, err := compileHCM(h)
	if err != nil {
		return nil, fmt.Errorf("http_connection_manager: %w", err)
	}
	out.hcm = hcm
	return out, nil
}

func compileHCM(h *hcmv3.HttpConnectionManager) (*hcmCfg, error) {
	out := &hcmCfg{
		statPrefix:        h.GetStatPrefix(),
		fcc:               h.GetForwardClientCertDetails(),
		certSubject:       h.GetSetCurrentClientCertDetails().GetSubject().GetValue(),
		certURI:           h.GetSetCurrentClientCertDetails().GetUri(),
		useRemoteAddress:  h.GetUseRemoteAddress().GetValue(),
		upgrades:          map[string]bool{},
		passThroughServer: h.GetServerHeaderTransformation() == hcmv3.HttpConnectionManager_PASS_THROUGH,
		h2:                compileH2Flow(h.GetHttp2ProtocolOptions()),
	}
	if h.GetRds() == nil {
		return nil, errors.New("rds: route configuration by RDS is the only one implemented")
	}
	out.rdsName = h.GetRds().GetRouteConfigName()
	for _, u := range h.GetUpgradeConfigs() {
		// Envoy: an upgrade config applies unless enabled is explicitly false.
		if u.GetEnabled() == nil || u.GetEnabled().GetValue() {
			out.upgrades[strings.ToLower(u.GetUpgradeType())] = true
		}
	}
	for i, e := range h.GetEarlyHeaderMutationExtensions() {
		m := &earlymutationv3.HeaderMutation{}
		if err := e.GetTypedConfig().UnmarshalTo(m); err != nil {
			return nil, err
		}
		for j, mu := range m.GetMutations() {
			switch {
			case mu.GetRemove() != "":
				out.early = append(out.early, headerRemoval{exact: strings.ToLower(mu.GetRemove())})
			case mu.GetRemoveOnMatch() != nil:
				sm, err := compileStringMatcher(mu.GetRemoveOnMatch().GetKeyMatcher())
				if err != nil {
					return nil, fmt.Errorf("early_header_mutation_extensions[%d].mutations[%d]: %w", i, j, err)
				}
				out.early = append(out.early, headerRemoval{matcher: sm})
			default:
				return nil, fmt.Errorf("early_header_mutation_extensions[%d].mutations[%d]: only remove and remove_on_match are implemented", i, j)
			}
		}
	}
	filters := h.GetHttpFilters()
	if len(filters) == 0 {
		return nil, errors.New("http_filters: the router filter is required")
	}
	for i, f := range filters {
		m, err := f.GetTypedConfig().UnmarshalNew()
		if err != nil {
			return nil, fmt.Errorf("http_filters[%d]: %w", i, err)
		}
		switch c := m.(type) {
		case *routerv3.Router:
			if i != len(filters)-1 {
				return nil, errors.New("http_filters: the router must be the last filter")
			}
			out.suppressEnvoy = c.GetSuppressEnvoyHeaders()
		case *extprocfilterv3.ExternalProcessor:
			if out.extProc != nil {
				return nil, errors.New("http_filters: only one ext_proc filter is implemented")
			}
			ep, err := compileExtProc(f.GetName(), c)
			if err != nil {
				return nil, fmt.Errorf("http_filters[%d] (%s): %w", i, f.GetName(), err)
			}
			out.extProc = ep
			out.filters = append(out.filters, httpFilterCfg{extProc: ep})
		case *luafilterv3.Lua:
			lf, err := compileLua(f.GetName(), c)
			if err != nil {
				return nil, fmt.Errorf("http_filters[%d] (%s): %w", i, f.GetName(), err)
			}
			out.filters = append(out.filters, httpFilterCfg{lua: lf})
		}
	}
	if _, ok := mustUnmarshalLast(filters).(*routerv3.Router); !ok {
		return nil, errors.New("http_filters: the last filter must be the router")
	}
	lr, err := compileLocalReply(h.GetLocalReplyConfig())
	if err != nil {
		return nil, fmt.Errorf("local_reply_config: %w", err)
	}
	out.localReply = lr
	return out, nil
}

func mustUnmarshalLast(filters []*hcmv3.HttpFilter) proto.Message {
	m, _ := filters[len(filters)-1].GetTypedConfig().UnmarshalNew()
	return m
}

// ---------------------------------------------------------------------------------------
// ext_proc.

type extProcCfg struct {
	filterName        string
	cluster           string
	sendHeaders       bool // processing_mode.request_header_mode
	sendRespHeaders   bool // processing_mode.response_header_mode
	allowModeOverride bool
	messageTimeout    time.Duration
	failureModeAllow  bool
	statusOnError     int
	routeCache        extprocfilterv3.ExternalProcessor_RouteCacheAction
	statPrefix        string
	allowedHeaders    []*stringMatcher // nil: all
	disallowed        []*stringMatcher
	rules             *mutationRules
	// receivingNamespaces are metadata_options.receiving_namespaces.untyped: the dynamic
	// metadata namespaces accepted from a ProcessingResponse (none when empty).
	receivingNamespaces []string
}

type mutationRules struct {
	allowAllRouting, allowEnvoy, disallowSystem, disallowAll, disallowIsError bool
	allow, disallow                                                           *regexp.Regexp
}

func compileExtProc(filterName string, c *extprocfilterv3.ExternalProcessor) (*extProcCfg, error) {
	out := &extProcCfg{
		filterName:       filterName,
		cluster:          c.GetGrpcService().GetEnvoyGrpc().GetClusterName(),
		messageTimeout:   200 * time.Millisecond, // Envoy's default message_timeout
		failureModeAllow: c.GetFailureModeAllow(),
		statusOnError:    500, // Envoy: status_on_error defaults to 500
		routeCache:       c.GetRouteCacheAction(),
		statPrefix:       c.GetStatPrefix(),
		// Envoy's ExtProcFilterConfig: metadata_options.receiving_namespaces.untyped
		// (typed receiving and forwarding namespaces: the allowlist rejects them).
		receivingNamespaces: c.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(),
	}
	if out.cluster == "" {
		return nil, errors.New("grpc_service: only envoy_grpc is implemented")
	}
	// Envoy: request_header_mode and response_header_mode DEFAULT mean SEND (only trailers
	// are skipped by default). The allowlist admits response_header_mode SKIP only, so the
	// response headers are sent statically only when the mode is left unset.
	out.sendHeaders = c.GetProcessingMode().GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
	out.sendRespHeaders = c.GetProcessingMode().GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
	if out.sendRespHeaders && !out.sendHeaders {
		// The stream is opened by the request-headers step; opening it for the response
		// headers alone is not implemented.
		return nil, errors.New("processing_mode: response headers without request headers are not implemented")
	}
	// allow_mode_override: a processor's mode_override is honoured for the request it
	// answers; without it, Envoy ignores mode_override.
	out.allowModeOverride = c.GetAllowModeOverride()
	if c.GetMessageTimeout() != nil {
		out.messageTimeout = c.GetMessageTimeout().AsDuration()
	}
	if c.GetStatusOnError() != nil && c.GetStatusOnError().GetCode() != 0 {
		out.statusOnError = int(c.GetStatusOnError().GetCode())
	}
	var err error
	if fr := c.GetForwardRules(); fr != nil {
		// Envoy: an empty allowed list allows every header.
		if len(fr.GetAllowedHeaders().GetPatterns()) > 0 {
			out.allowedHeaders = []*stringMatcher{}
			for _, p := range fr.GetAllowedHeaders().GetPatterns() {
				sm, err := compileStringMatcher(p)
				if err != nil {
					return nil, err
				}
				out.allowedHeaders = append(out.allowedHeaders, sm)
			}
		}
		for _, p := range fr.GetDisallowedHeaders().GetPatterns() {
			sm, err := compileStringMatcher(p)
			if err != nil {
				return nil, err
			}
			out.disallowed = append(out.disallowed, sm)
		}
	}
	if mr := c.GetMutationRules(); mr != nil {
		r := &mutationRules{
			allowAllRouting: mr.GetAllowAllRouting().GetValue(),
			allowEnvoy:      mr.GetAllowEnvoy().GetValue(),
			disallowSystem:  mr.GetDisallowSystem().GetValue(),
			disallowAll:     mr.GetDisallowAll().GetValue(),
			disallowIsError: mr.GetDisallowIsError().GetValue(),
		}
		if re := mr.GetAllowExpression().GetRegex(); re != "" {
			if r.allow, err = compileRE2(re); err != nil {
				return nil, fmt.Errorf("mutation_rules.allow_expression: %w", err)
			}
		}
		if re := mr.GetDisallowExpression().GetRegex(); re != "" {
			if r.disallow, err = compileRE2(re); err != nil {
				return nil, fmt.Errorf("mutation_rules.disallow_expression: %w", err)
			}
		}
		out.rules = r
	}
	return out, nil
}

// re2MaxProgramSizeErrorLevel is the default of Envoy's runtime key
// re2.max_program_size.error_level. The stand-in models no runtime: our bootstraps
// (envoy/*.yaml) configure no layered_runtime, so Envoy runs with this default. (The warn
// level, re2.max_program_size.warn_level, only logs and is not modelled.)
const re2MaxProgramSizeErrorLevel = 100

// compileRE2 compiles an Envoy safe_regex (RE2, matched against the whole string).
//
// Envoy compiles every google_re2 RegexMatcher with RE2 and rejects the configuration when
// RE2 rejects the pattern, or when the compiled program's size (RE2::ProgramSize, the
// forward program only) exceeds the error level (source/common/common/regex.cc,
// CompiledGoogleReMatcher's constructor, through Regex::Utility::parseRegex): the
// resource is NACKed with that message. The size is RE2's own (internal/re2, Debian's
// libre2 through cgo); matching stays with Go's regexp, which implements RE2's syntax.
// maxDirectResponseBody is RouteConfiguration.max_direct_response_body_size_bytes's default.
const maxDirectResponseBody = 4096

func compileRE2(re string) (*regexp.Regexp, error) {
	size, err := re2.ProgramSize(re)
	if err != nil {
		return nil, err // RE2's message, as Envoy's NACK carries it
	}
	if size > re2MaxProgramSizeErrorLevel {
		return nil, fmt.Errorf("regex '%s' RE2 program size of %d > max program size of %d set for the error level threshold. Increase configured max program size if necessary.", re, size, re2MaxProgramSizeErrorLevel)
	}
	return regexp.Compile(`^(?:` + re + `)$`)
}

// ---------------------------------------------------------------------------------------
// String matchers (envoy.type.matcher.v3.StringMatcher).

type stringMatcher struct {
	exact, prefix, suffix, contains *string
	re                              *regexp.Regexp
	ignoreCase                      bool
}

func compileStringMatcher(m *matcherv3.StringMatcher) (*stringMatcher, error) {
	if m == nil {
		return nil, errors.New("missing string matcher")
	}
	sm := &stringMatcher{ignoreCase: m.GetIgnoreCase()}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		sm.exact = &p.Exact
	case *matcherv3.StringMatcher_Prefix:
		sm.prefix = &p.Prefix
	case *matcherv3.StringMatcher_Suffix:
		sm.suffix = &p.Suffix
	case *matcherv3.StringMatcher_Contains:
		sm.contains = &p.Contains
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := compileRE2(p.SafeRegex.GetRegex())
		if err != nil {
			return nil, err
		}
		sm.re = re
	default:
		return nil, errors.New("string matcher: unimplemented match pattern")
	}
	return sm, nil
}

// match follows StringMatcher: ignore_case applies to exact, prefix, suffix and contains,
// not to safe_regex.
func (m *stringMatcher) match(s string) bool {
	fold := func(x string) string {
		if m.ignoreCase {
			return strings.ToLower(x)
		}
		return x
	}
	switch {
	case m.exact != nil:
		return fold(s) == fold(*m.exact)
	case m.prefix != nil:
		return strings.HasPrefix(fold(s), fold(*m.prefix))
	case m.suffix != nil:
		return strings.HasSuffix(fold(s), fold(*m.suffix))
	case m.contains != nil:
		return strings.Contains(fold(s), fold(*m.contains))
	case m.re != nil:
		return m.re.MatchString(s)
	}
	return false
}

// ---------------------------------------------------------------------------------------
// Routes.

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

// ---------------------------------------------------------------------------------------
// Clusters.

type clusterCfg struct {
	raw  *clusterv3.Cluster
	name string
	// stat is the name in the cluster's stats (cluster.<stat>.*): Envoy uses alt_stat_name
	// when set, else the name, with every ':' turned into '_' (Cluster.alt_stat_name doc).
	stat           string
	kind           clusterv3.Cluster_DiscoveryType
	edsName        string
	connectTimeout time.Duration
	// tcpKeepalive is upstream_connection_options.tcp_keepalive; nil: Envoy sets no
	// SO_KEEPALIVE on upstream connections unless configured (Go's dialer would, by default).
	tcpKeepalive   *net.KeepAliveConfig
	leastRequest   bool
	panicThreshold float64 // percent
	tls            *upstreamTLS
	// socketMatches are transport_socket_matches, in order.
	socketMatches []socketMatch
	http2         bool
	// h2 is http2_protocol_options' stream limit and windows (h2Flow).
	h2 h2Flow
	// h2Keepalive is http2_protocol_options.connection_keepalive (nil: none).
	h2Keepalive *h2Keepalive
	hc          *healthCheckCfg
	outlier     *outlierCfg
	maxRequests int64
	maxRetries  int64
	staticHosts []hostCfg
	// ignoreHealthOnHostRemoval: a host that leaves EDS goes at once, even while it passes
	// active health checks (syncClustersLocked).
	ignoreHealthOnHostRemoval bool
	// idleTimeout closes an upstream connection without requests for this long (0: never).
	idleTimeout time.Duration
	// subset is lb_subset_config (nil: none, or no selector: Envoy's subset load balancer
	// is enabled only with subset_selectors).
	subset *subsetCfg
}

type upstreamTLS struct {
	certSecret string
	caSecret   string
	sans       []*stringMatcher
	sni        string
	alpn       []string
}

type socketMatch struct {
	labels *structpb.Struct
	tls    *upstreamTLS
}

type healthCheckCfg struct {
	// tls is the transport socket of the checks' connections (nil: plain TCP).
	tls                          *upstreamTLS
	path, host                   string
	headers                      [][2]string // request_headers_to_add, in order
	interval, timeout, noTraffic time.Duration
	// The per-host intervals of HealthCheckerImplBase::interval, defaulted as its
	// constructor does (source/extensions/health_checkers/common/health_checker_base_impl.cc):
	// unhealthy_interval to interval, unhealthy_edge_interval to unhealthy_interval,
	// healthy_edge_interval to interval, no_traffic_healthy_interval to no_traffic_interval.
	unhealthyInterval, unhealthyEdge, healthyEdge, noTrafficHealthy time.Duration
	healthy, unhealthy                                              int
}

type outlierCfg struct {
	consecutiveLocal          int
	enforcingLocal            int
	base, max                 time.Duration
	maxPercent                int
	unejectOnHealthyActiveHC  bool
	splitExternalLocalOrigins bool
}

type hostCfg struct {
	address  string // host:port, or "unix:" + path
	hostname string
	metadata *corev3.Metadata
}

func durOr(d *durationpb.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.AsDuration()
}

// dialer dials an upstream connection as Envoy does for the cluster: within connect_timeout,
// with TCP keepalive only as upstream_connection_options says.
func (cc *clusterCfg) dialer() net.Dialer {
	d := net.Dialer{Timeout: cc.connectTimeout, KeepAlive: -1}
	if cc.tcpKeepalive != nil {
		d.KeepAliveConfig = *cc.tcpKeepalive
	}
	return d
}

func compileCluster(c *clusterv3.Cluster) (*clusterCfg, error) {
	stat := c.GetAltStatName()
	if stat == "" {
		stat = c.GetName()
	}
	out := &clusterCfg{raw: c, name: c.GetName(), stat: strings.ReplaceAll(stat, ":", "_"), kind: c.GetType(),
		// Envoy: connect_timeout defaults to 5s; healthy_panic_threshold to 50%.
		connectTimeout: durOr(c.GetConnectTimeout(), 5*time.Second), panicThreshold: 50,
		h2:           compileH2Flow(nil),
		leastRequest: c.GetLbPolicy() == clusterv3.Cluster_LEAST_REQUEST,
		// Envoy's default circuit breaker thresholds.
		maxRequests: 1024, maxRetries: 3,
		idleTimeout:               time.Hour,
		ignoreHealthOnHostRemoval: c.GetIgnoreHealthOnHostRemoval(),
	}
	if p := c.GetCommonLbConfig().GetHealthyPanicThreshold(); p != nil {
		out.panicThreshold = p.GetValue()
	}
	if ka := c.GetUpstreamConnectionOptions().GetTcpKeepalive(); ka != nil {
		// Envoy (Network::SocketOptionFactory::buildTcpKeepaliveOptions): SO_KEEPALIVE on,
		// and each of TCP_KEEPCNT, TCP_KEEPIDLE, TCP_KEEPINTVL set when given (seconds),
		// else the system's; -1 leaves Go's dialer at the system's too.
		secs := func(v interface{ GetValue() uint32 }, set bool) time.Duration {
			if !set {
				return -1
			}
			return time.Duration(v.GetValue()) * time.Second
		}
		count := -1
		if ka.GetKeepaliveProbes() != nil {
			count = int(ka.GetKeepaliveProbes().GetValue())
		}
		out.tcpKeepalive = &net.KeepAliveConfig{Enable: true,
			Idle:     secs(ka.GetKeepaliveTime(), ka.GetKeepaliveTime() != nil),
			Interval: secs(ka.GetKeepaliveInterval(), ka.GetKeepaliveInterval() != nil),
			Count:    count}
	}
	switch out.kind {
	case clusterv3.Cluster_EDS:
		out.edsName = c.GetEdsClusterConfig().GetServiceName()
		if out.edsName == "" {
			out.edsName = c.GetName() // Envoy: service_name defaults to the cluster name
		}
		if c.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil {
			return nil, errors.New("eds_cluster_config: only ads is implemented")
		}
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS:
		hosts, err := compileHosts(c.GetLoadAssignment())
		if err != nil {
			return nil, fmt.Errorf("load_assignment: %w", err)
		}
		out.staticHosts = hosts
	}
	for _, t := range c.GetCircuitBreakers().GetThresholds() {
		if t.GetMaxRequests() != nil {
			out.maxRequests = int64(t.GetMaxRequests().GetValue())
		}
		if t.GetMaxRetries() != nil {
			out.maxRetries = int64(t.GetMaxRetries().GetValue())
		}
	}
	if ts := c.GetTransportSocket(); ts != nil {
		t, err := compileUpstreamTLS(ts)
		if err != nil {
			return nil, fmt.Errorf("transport_socket: %w", err)
		}
		out.tls = t
	}
	for i, m := range c.GetTransportSocketMatches() {
		t, err := compileUpstreamTLS(m.GetTransportSocket())
		if err != nil {
			return nil, fmt.Errorf("transport_socket_matches[%d] (%s): %w", i, m.GetName(), err)
		}
		out.socketMatches = append(out.socketMatches, socketMatch{labels: m.GetMatch(), tls: t})
	}
	for k, v := range c.GetTypedExtensionProtocolOptions() {
		if k != "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" {
			return nil, fmt.Errorf("typed_extension_protocol_options[%s] is not implemented", k)
		}
		o := &httpoptionsv3.HttpProtocolOptions{}
		if err := v.UnmarshalTo(o); err != nil {
			return nil, err
		}
		h2 := o.GetExplicitHttpConfig().GetHttp2ProtocolOptions()
		out.http2 = h2 != nil
		out.h2 = compileH2Flow(h2)
		if ka := h2.GetConnectionKeepalive(); ka != nil {
			// Envoy's ConnectionImpl constructor (source/common/http/http2/codec_impl.cc):
			// interval defaults to 0 (no PINGs), timeout is required (the proto requires it
			// to be at least 1ms), interval_jitter defaults to 15%.
			k := &h2Keepalive{interval: durOr(ka.GetInterval(), 0), timeout: durOr(ka.GetTimeout(), 0), jitterPercent: 15}
			if ka.GetTimeout() == nil || k.timeout < time.Millisecond {
				return nil, errors.New("http2_protocol_options.connection_keepalive.timeout: required, at least 1ms")
			}
			if k.interval != 0 && k.interval < time.Millisecond {
				return nil, errors.New("http2_protocol_options.connection_keepalive.interval: at least 1ms")
			}
			if j := ka.GetIntervalJitter(); j != nil {
				k.jitterPercent = j.GetValue()
			}
			if k.interval > 0 {
				out.h2Keepalive = k
			}
		}
		// Envoy's ClusterInfoImpl (source/common/upstream/upstream_impl.cc): the
		// common_http_protocol_options.idle_timeout, 0 for none, else 1h.
		if d := o.GetCommonHttpProtocolOptions().GetIdleTimeout(); d != nil {
			out.idleTimeout = d.AsDuration()
		}
	}
	if n := len(c.GetHealthChecks()); n > 1 {
		return nil, errors.New("health_checks: at most one is implemented")
	} else if n == 1 {
		h := c.GetHealthChecks()[0]
		if h.GetHttpHealthCheck() == nil {
			return nil, errors.New("health_checks: only http_health_check is implemented")
		}
		out.hc = &healthCheckCfg{
			path: h.GetHttpHealthCheck().GetPath(), host: h.GetHttpHealthCheck().GetHost(),
			interval: durOr(h.GetInterval(), 0), timeout: durOr(h.GetTimeout(), 0),
			noTraffic: durOr(h.GetNoTrafficInterval(), 60*time.Second), // Envoy: default 60s
			healthy:   int(h.GetHealthyThreshold().GetValue()), unhealthy: int(h.GetUnhealthyThreshold().GetValue()),
		}
		out.hc.unhealthyInterval = durOr(h.GetUnhealthyInterval(), out.hc.interval)
		out.hc.unhealthyEdge = durOr(h.GetUnhealthyEdgeInterval(), out.hc.unhealthyInterval)
		out.hc.healthyEdge = durOr(h.GetHealthyEdgeInterval(), out.hc.interval)
		out.hc.noTrafficHealthy = durOr(h.GetNoTrafficHealthyInterval(), out.hc.noTraffic)
		if out.hc.host == "" {
			out.hc.host = c.GetName() // Envoy: the host header defaults to the cluster name
		}
		// Envoy (HostImpl::createHealthCheckConnection): with transport_socket_match_criteria
		// the check's connections take the transport socket those criteria resolve to; without,
		// the host's own, which here is always the cluster's (no endpoint carries match labels).
		out.hc.tls = out.tls
		if crit := h.GetTransportSocketMatchCriteria(); crit != nil {
			out.hc.tls = out.resolveTransportSocket(crit)
		}
		// tls_options.alpn_protocols replaces the transport socket's ALPN on the checks'
		// connections (HealthCheckerImplBase::initTransportSocketOptions: an ALPN override
		// in the transport socket options; an empty list overrides nothing). Without it they
		// offer the transport socket's alpn_protocols.
		if alpn := h.GetTlsOptions().GetAlpnProtocols(); len(alpn) > 0 && out.hc.tls != nil {
			t := *out.hc.tls
			t.alpn = alpn
			out.hc.tls = &t
		}
		for _, o := range h.GetHttpHealthCheck().GetRequestHeadersToAdd() {
			k, v := o.GetHeader().GetKey(), o.GetHeader().GetValue()
			// Envoy's header parser would expand %COMMAND% in the value; not implemented.
			if k == "" || strings.Contains(v, "%") || len(o.GetHeader().GetRawValue()) > 0 {
				return nil, fmt.Errorf("health_checks.http_health_check.request_headers_to_add %q: only a key with a plain value is implemented", k)
			}
			if o.GetAppendAction() == corev3.HeaderValueOption_OVERWRITE_IF_EXISTS {
				continue // a health check request never has the header already
			}
			out.hc.headers = append(out.hc.headers, [2]string{k, v})
		}
		if out.hc.interval <= 0 || out.hc.timeout <= 0 {
			return nil, errors.New("health_checks: interval and timeout are required")
		}
		// health_check.proto: each of these, when set, must be greater than 0.
		for n, d := range map[string]*durationpb.Duration{"no_traffic_interval": h.GetNoTrafficInterval(),
			"no_traffic_healthy_interval": h.GetNoTrafficHealthyInterval(), "unhealthy_interval": h.GetUnhealthyInterval(),
			"unhealthy_edge_interval": h.GetUnhealthyEdgeInterval(), "healthy_edge_interval": h.GetHealthyEdgeInterval()} {
			if d != nil && d.AsDuration() <= 0 {
				return nil, fmt.Errorf("health_checks.%s: must be greater than 0", n)
			}
		}
	}
	if sc := c.GetLbSubsetConfig(); sc != nil {
		out.subset = compileSubset(sc)
	}
	if od := c.GetOutlierDetection(); od != nil {
		o := &outlierCfg{
			// Envoy defaults: consecutive_local_origin_failure 5, enforcing 100%,
			// base_ejection_time 30s, max_ejection_time 300s, max_ejection_percent 10%.
			consecutiveLocal: 5, enforcingLocal: 100, base: durOr(od.GetBaseEjectionTime(), 30*time.Second),
			max: durOr(od.GetMaxEjectionTime(), 300*time.Second), maxPercent: 10,
			unejectOnHealthyActiveHC:  od.GetSuccessfulActiveHealthCheckUnejectHost() == nil || od.GetSuccessfulActiveHealthCheckUnejectHost().GetValue(),
			splitExternalLocalOrigins: od.GetSplitExternalLocalOriginErrors(),
		}
		if v := od.GetConsecutiveLocalOriginFailure(); v != nil {
			o.consecutiveLocal = int(v.GetValue())
		}
		if v := od.GetEnforcingConsecutiveLocalOriginFailure(); v != nil {
			o.enforcingLocal = int(v.GetValue())
		}
		if v := od.GetMaxEjectionPercent(); v != nil {
			o.maxPercent = int(v.GetValue())
		}
		if !o.splitExternalLocalOrigins {
			// Without the split, local-origin failures feed the consecutive_5xx detector,
			// which this data plane does not implement.
			return nil, errors.New("outlier_detection: only split_external_local_origin_errors: true is implemented")
		}
		out.outlier = o
	}
	return out, nil
}

// compileUpstreamTLS reads an UpstreamTlsContext transport socket.
func compileUpstreamTLS(ts *corev3.TransportSocket) (*upstreamTLS, error) {
	ctx := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(ctx); err != nil {
		return nil, err
	}
	ct := ctx.GetCommonTlsContext()
	t := &upstreamTLS{sni: ctx.GetSni(), alpn: ct.GetAlpnProtocols()}
	if n := len(ct.GetTlsCertificateSdsSecretConfigs()); n > 1 {
		return nil, errors.New("at most one tls_certificate_sds_secret_configs is implemented")
	} else if n == 1 {
		t.certSecret = ct.GetTlsCertificateSdsSecretConfigs()[0].GetName()
	}
	t.caSecret = ct.GetValidationContextSdsSecretConfig().GetName()
	if cv := ct.GetCombinedValidationContext(); cv != nil {
		t.caSecret = cv.GetValidationContextSdsSecretConfig().GetName()
		for _, san := range cv.GetDefaultValidationContext().GetMatchTypedSubjectAltNames() {
			sm, err := compileStringMatcher(san.GetMatcher())
			if err != nil {
				return nil, err
			}
			t.sans = append(t.sans, sm)
		}
	}
	return t, nil
}

// transportSocketMatchKey is the metadata namespace in which Envoy looks up transport socket
// match labels (Config::MetadataFilters::ENVOY_TRANSPORT_SOCKET_MATCH).
const transportSocketMatchKey = "envoy.transport_socket_match"

// resolveTransportSocket is Envoy's TransportSocketMatcherImpl::resolve: the first of the
// cluster's transport_socket_matches whose every label is in criteria with an equal value
// (Config::Metadata::metadataLabelMatch; an empty match matches anything), else the
// cluster's own transport socket.
func (cc *clusterCfg) resolveTransportSocket(criteria *structpb.Struct) *upstreamTLS {
	for _, m := range cc.socketMatches {
		ok := true
		for k, v := range m.labels.GetFields() {
			got, present := criteria.GetFields()[k]
			if !present || !proto.Equal(got, v) {
				ok = false
				break
			}
		}
		if ok {
			return m.tls
		}
	}
	return cc.tls
}

func compileHosts(cla *endpointv3.ClusterLoadAssignment) ([]hostCfg, error) {
	var out []hostCfg
	// EdsClusterImpl::BatchUpdateHelper::updateLocalityEndpoints: of endpoints with the
	// same address anywhere in the assignment only the first is kept, whatever its health.
	seen := map[string]bool{}
	for _, loc := range cla.GetEndpoints() {
		for _, ep := range loc.GetLbEndpoints() {
			if k := endpointKey(ep.GetEndpoint().GetAddress()); k != "" {
				if seen[k] {
					continue
				}
				seen[k] = true
			}
			if _, ok := ep.GetMetadata().GetFilterMetadata()[transportSocketMatchKey]; ok {
				// Envoy would pick this host's transport socket from
				// transport_socket_matches; this data plane uses the cluster's for data.
				return nil, errors.New("endpoint metadata " + transportSocketMatchKey + " is not implemented")
			}
			switch ep.GetHealthStatus() {
			case corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY:
			default:
				// Envoy excludes such hosts from balancing; we simply leave them out.
				continue
			}
			e := ep.GetEndpoint()
			h := hostCfg{hostname: e.GetHostname(), metadata: ep.GetMetadata()}
			switch a := e.GetAddress().GetAddress().(type) {
			case *corev3.Address_SocketAddress:
				h.address = net.JoinHostPort(a.SocketAddress.GetAddress(), strconv.Itoa(int(a.SocketAddress.GetPortValue())))
			case *corev3.Address_Pipe:
				h.address = "unix:" + a.Pipe.GetPath()
			default:
				return nil, errors.New("endpoint address: only socket_address and pipe are implemented")
			}
			out = append(out, h)
		}
	}
	return out, nil
}

func checkSecret(s *tlsv3.Secret) error {
	switch {
	case s.GetTlsCertificate() != nil:
		if len(dataSource(s.GetTlsCertificate().GetCertificateChain())) == 0 || len(dataSource(s.GetTlsCertificate().GetPrivateKey())) == 0 {
			return errors.New("tls_certificate: certificate_chain and private_key are required")
		}
	case s.GetValidationContext() != nil:
		if len(dataSource(s.GetValidationContext().GetTrustedCa())) == 0 {
			return errors.New("validation_context: trusted_ca is required")
		}
	default:
		return errors.New("only tls_certificate and validation_context secrets are implemented")
	}
	return nil
}

// resolveSecret reads the files a secret refers to and returns it with their contents
// inline (the original, with its paths, stays in raw for /config_dump). Envoy reads
// file-based secrets delivered by SDS when the update arrives and rejects the update when a
// file cannot be read or a key does not match its certificate (SdsApi; the TLS context
// refuses the pair); afterwards it watches the files (see watchSecretFiles).
func resolveSecret(s *tlsv3.Secret) (*tlsv3.Secret, error) {
	out := proto.Clone(s).(*tlsv3.Secret)
	var errs []error
	read := func(d *corev3.DataSource) {
		if d == nil || d.GetFilename() == "" {
			return
		}
		b, err := os.ReadFile(d.GetFilename())
		if err != nil {
			errs = append(errs, err)
			return
		}
		d.Specifier = &corev3.DataSource_InlineBytes{InlineBytes: b}
	}
	if tc := out.GetTlsCertificate(); tc != nil {
		read(tc.GetCertificateChain())
		read(tc.GetPrivateKey())
		if len(errs) == 0 {
			if _, err := tls.X509KeyPair(dataSource(tc.GetCertificateChain()), dataSource(tc.GetPrivateKey())); err != nil {
				errs = append(errs, fmt.Errorf("tls_certificate: %w", err))
			}
		}
	}
	if vc := out.GetValidationContext(); vc != nil {
		read(vc.GetTrustedCa())
	}
	return out, multierror.Append(&multierror.Error{ErrorFormat: cli.Lines}, errs...).ErrorOrNil()
}

// hasFiles reports whether a secret refers to any file.
func hasFiles(s *tlsv3.Secret) bool {
	tc, vc := s.GetTlsCertificate(), s.GetValidationContext()
	return tc.GetCertificateChain().GetFilename() != "" || tc.GetPrivateKey().GetFilename() != "" || vc.GetTrustedCa().GetFilename() != ""
}

func dataSource(d *corev3.DataSource) []byte {
	if d == nil {
		return nil
	}
	if b := d.GetInlineBytes(); b != nil {
		return b
	}
	return []byte(d.GetInlineString())
}

// structJSON is a helper for metadata rendering.
func structJSON(s *structpb.Struct) any {
	if s == nil {
		return nil
	}
	return s.AsMap()
}

// h2Flow is the flow control of an HTTP/2 connection, from http2_protocol_options:
// max_concurrent_streams, initial_stream_window_size, initial_connection_window_size.
type h2Flow struct {
	maxStreams   uint32
	streamWindow uint32
	connWindow   uint32
}

// Envoy's defaults since 1.36 (api/envoy/config/core/v3/protocol.proto; changelog 1.36.0,
// "safe_http2_options"), the oldest Envoy kube-mvp supports.
const (
	envoyH2DefaultMaxStreams   = 1024
	envoyH2DefaultStreamWindow = 16 << 20
	envoyH2DefaultConnWindow   = 24 << 20
)

// compileH2Flow reads the options' stream limit and windows, Envoy's defaults where unset
// (o may be nil). Their ranges (1.., 65535..2^31-1) are the proto's validation rules,
// which every resource passed already.
func compileH2Flow(o *corev3.Http2ProtocolOptions) h2Flow {
	f := h2Flow{maxStreams: envoyH2DefaultMaxStreams, streamWindow: envoyH2DefaultStreamWindow, connWindow: envoyH2DefaultConnWindow}
	if v := o.GetMaxConcurrentStreams(); v != nil {
		f.maxStreams = v.GetValue()
	}
	if v := o.GetInitialStreamWindowSize(); v != nil {
		f.streamWindow = v.GetValue()
	}
	if v := o.GetInitialConnectionWindowSize(); v != nil {
		f.connWindow = v.GetValue()
	}
	return f
}

// transportConfig is f for Go's HTTP/2 client (http.HTTP2Config, which x/net/http2's
// Transport reads through ConfigureTransports). Its MaxReceiveBufferPerConnection is what
// the connection window is raised by beyond the protocol's initial 65535 (x/net/http2's
// newClientConn sends a WINDOW_UPDATE of exactly that), whereas Envoy's
// initial_connection_window_size is the whole window (ConnectionImpl::sendSettings submits
// a WINDOW_UPDATE of the size minus 65535); Go reads 0 as its own default (1 GiB), so the
// client cannot advertise less than 2 × 65535: a smaller window is raised to that.
// MaxConcurrentStreams is a server setting to Go; the pool enforces the client's limit
// (h2HostPool.reserve).
func (f h2Flow) transportConfig() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxReceiveBufferPerStream:     int(f.streamWindow),
		MaxReceiveBufferPerConnection: max(int(f.connWindow)-65535, 65535),
	}
}

// server is f for Go's HTTP/2 server: its MaxUploadBufferPerConnection is the whole
// connection window, as Envoy's (the server sends a WINDOW_UPDATE of it minus 65535).
func (f h2Flow) server() *http2.Server {
	return &http2.Server{
		MaxConcurrentStreams:         f.maxStreams,
		MaxUploadBufferPerStream:     int32(f.streamWindow),
		MaxUploadBufferPerConnection: int32(f.connWindow),
	}
}
