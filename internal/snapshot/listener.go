package snapshot

import (
	"encoding/json"
	"regexp"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlymutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/contract"
)

// extProcErrorStatus is the status Envoy's ext_proc filter answers with when extproc fails
// (stream error, message timeout, a rejected header mutation); the local reply config turns
// exactly this status into a 503 Status. extproc's own deliberate answers are 503s with a
// Status body already, which must pass untouched, so they cannot share the code.
const extProcErrorStatus = 500

// HTTP/2 flow control towards the clients (the HCM's http2_protocol_options), by the same
// rule as the apiserver clusters' (clusters.go): stream window × streams per connection ≤
// connection window, so a client whose one stalled stream (an upload the apiserver does not
// take, Envoy not crediting it: codec_impl.cc ConnectionImpl::onData) cannot stall its
// other streams, e.g. client-go's watches, which share one connection. The stream window is
// also the codec's per-stream buffer limit (ConnectionImpl: per_stream_buffer_limit_), here
// what Envoy buffers towards a client that stopped reading before pushing back on the
// apiserver: 1 MiB rather than 1.36's default 16. 100 streams: what the apiserver itself
// allows a client (k8s.io/apiserver pkg/server/secure_serving.go, its default); a Go client
// opens another connection past it. 100 MiB: 100 × 1 MiB. Request bodies to an apiserver
// are at most 3 MiB; a 1 MiB window takes them in a few round trips.
const (
	downstreamH2MaxStreams       = 100
	downstreamH2StreamWindow     = 1 << 20
	downstreamH2ConnectionWindow = downstreamH2MaxStreams * downstreamH2StreamWindow
)

func (b *builder) listener() *listenerv3.Listener {
	chain := &listenerv3.FilterChain{
		Filters: []*listenerv3.Filter{{
			Name:       hcmFilterName,
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: b.pack("listener "+ListenerName+": http_connection_manager", b.httpConnectionManager())},
		}},
	}
	if len(b.cfg.Secrets.ServingCert) > 0 {
		chain.TransportSocket = &corev3.TransportSocket{
			Name:       tlsTransportSocketName,
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: b.pack("listener "+ListenerName+": downstream TLS", b.downstreamTLS())},
		}
	}
	return &listenerv3.Listener{
		Name:         ListenerName,
		Address:      socketAddress(b.cfg.ListenAddress, b.cfg.ListenPort),
		FilterChains: []*listenerv3.FilterChain{chain},
	}
}

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func (b *builder) httpConnectionManager() *hcmv3.HttpConnectionManager {
	what := "listener " + ListenerName + ": "
	return &hcmv3.HttpConnectionManager{
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		StatPrefix: "kube_apiserver",
		Http2ProtocolOptions: &corev3.Http2ProtocolOptions{
			MaxConcurrentStreams:        wrapperspb.UInt32(downstreamH2MaxStreams),
			InitialStreamWindowSize:     wrapperspb.UInt32(downstreamH2StreamWindow),
			InitialConnectionWindowSize: wrapperspb.UInt32(downstreamH2ConnectionWindow),
		},
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    ads(),
			RouteConfigName: RouteConfigName,
		}},
		EarlyHeaderMutationExtensions: []*corev3.TypedExtensionConfig{{
			Name:        earlyHeaderMutationName,
			TypedConfig: b.pack(what+"early header mutation", b.stripClientHeaders()),
		}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: identityFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: b.pack(what+"Lua filter", identityFilter())}},
			{Name: extProcFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: b.pack(what+"ext_proc filter", b.extProcFilter())}},
			{Name: routerFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: b.pack(what+"router filter", &routerv3.Router{SuppressEnvoyHeaders: true})}},
		},
		ForwardClientCertDetails: hcmv3.HttpConnectionManager_SANITIZE_SET,
		SetCurrentClientCertDetails: &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{
			Subject: wrapperspb.Bool(true),
			Cert:    false,
			Uri:     true,
		},
		UpgradeConfigs: []*hcmv3.HttpConnectionManager_UpgradeConfig{
			{UpgradeType: "websocket"},
			{UpgradeType: "spdy/3.1"},
		},
		StreamIdleTimeout:          durationpb.New(0),
		RequestTimeout:             durationpb.New(0),
		UseRemoteAddress:           wrapperspb.Bool(true),
		ServerHeaderTransformation: hcmv3.HttpConnectionManager_PASS_THROUGH,
		// The path is routed and forwarded as the client sent it: each of these would
		// change the forwarded :path too (docs/envoy-config.md#paths). Set explicitly, so that no
		// runtime default (http_connection_manager.normalize_path,
		// .path_with_escaped_slashes_action) changes them.
		NormalizePath:                wrapperspb.Bool(false),
		MergeSlashes:                 false,
		PathWithEscapedSlashesAction: hcmv3.HttpConnectionManager_KEEP_UNCHANGED,
		LocalReplyConfig:             b.localReplyConfig(),
	}
}

// stripClientHeaders removes, before routing and before any filter, every header a client
// could use to claim an identity or steer routing whose name is fixed: the default
// front-proxy identity headers (every x-remote-* header), upstream's loop guard, kube-mvp's
// own headers (routing, identity decision, request class) and Envoy's x-envoy-* request
// headers (a client Envoy deems internal could otherwise set its own retry policy:
// x-envoy-retry-on, x-envoy-max-retries).
// The names the apiservers' --requestheader-* flags give are not here: they come from a
// ConfigMap, and a listener change drains every client connection, so the Lua filter strips
// them, first thing, from the names in the route configuration (identityMetadata); a request
// the script did not finish has no request class and is refused (RouteUnclassified).
// x-forwarded-client-cert is left to forward_client_cert_details: SANITIZE_SET, which runs
// after this and replaces it.
func (b *builder) stripClientHeaders() *earlymutationv3.HeaderMutation {
	remove := func(name string) *mutationrulesv3.HeaderMutation {
		return &mutationrulesv3.HeaderMutation{Action: &mutationrulesv3.HeaderMutation_Remove{Remove: name}}
	}
	removePrefix := func(prefix string) *mutationrulesv3.HeaderMutation {
		return &mutationrulesv3.HeaderMutation{Action: &mutationrulesv3.HeaderMutation_RemoveOnMatch_{RemoveOnMatch: &mutationrulesv3.HeaderMutation_RemoveOnMatch{
			KeyMatcher: &matcherv3.StringMatcher{
				MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix},
				IgnoreCase:   true,
			},
		}}}
	}
	return &earlymutationv3.HeaderMutation{Mutations: []*mutationrulesv3.HeaderMutation{
		removePrefix(contract.HeaderRemotePrefix), removePrefix(envoyHeaderPrefix),
		remove(contract.HeaderPeerProxied), remove(contract.HeaderRoutingCluster), remove(contract.HeaderIdentityDecision), remove(contract.HeaderRequestClass),
	}}
}

// envoyHeaderPrefix starts Envoy's own request headers (x-envoy-retry-on and the like).
const envoyHeaderPrefix = "x-envoy-"

func (b *builder) extProcFilter() *extprocv3.ExternalProcessor {
	// extproc may set only the headers it owns, and remove none; anything else fails the
	// request (disallow_is_error) rather than being silently dropped. Its immediate responses
	// (the 503 Status, the merged discovery) are checked with the same rules (Envoy ≥ 1.32),
	// so their content-type, content-encoding, etag, vary and retry-after are allowed too.
	// The expression names no configurable header, so its RE2 program has a fixed size (80
	// instructions with Debian's RE2; Envoy refuses more than 100,
	// re2.max_program_size.error_level).
	allowed := "^(" + regexp.QuoteMeta(contract.HeaderRoutingCluster) + "|" + regexp.QuoteMeta(contract.HeaderPeerProxied) + "|content-type|content-encoding|etag|vary|retry-after)$"
	exact := func(s string) *matcherv3.StringMatcher {
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}
	}
	return &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
			EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: ExtProcClusterName},
		}},
		FailureModeAllow: false,
		StatusOnError:    &typev3.HttpStatus{Code: typev3.StatusCode_InternalServerError},
		ProcessingMode: &extprocv3.ProcessingMode{
			RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
			ResponseHeaderMode:  extprocv3.ProcessingMode_SKIP,
			RequestBodyMode:     extprocv3.ProcessingMode_NONE,
			ResponseBodyMode:    extprocv3.ProcessingMode_NONE,
			RequestTrailerMode:  extprocv3.ProcessingMode_SKIP,
			ResponseTrailerMode: extprocv3.ProcessingMode_SKIP,
		},
		// extproc asks for the response headers of GET /apis only (merged discovery).
		AllowModeOverride: true,
		MessageTimeout:    durationpb.New(b.cfg.ExtProcMessageTimeout),
		StatPrefix:        "kube_mvp",
		RouteCacheAction:  extprocv3.ExternalProcessor_CLEAR,
		// extproc names a serving set in the load balancer's namespace; Envoy accepts
		// dynamic metadata from ext_proc only in the namespaces listed here.
		MetadataOptions: &extprocv3.MetadataOptions{ReceivingNamespaces: &extprocv3.MetadataOptions_MetadataNamespaces{
			Untyped: []string{contract.MetadataNamespaceLB},
		}},
		MutationRules: &mutationrulesv3.HeaderMutationRules{
			DisallowAll:     wrapperspb.Bool(true),
			AllowExpression: &matcherv3.RegexMatcher{Regex: allowed},
			DisallowIsError: wrapperspb.Bool(true),
		},
		// extproc decides on the path, the method and the client certificate; credentials
		// never need to leave Envoy. WebSocket clients put their bearer token in
		// Sec-WebSocket-Protocol.
		ForwardRules: &extprocv3.HeaderForwardingRules{DisallowedHeaders: &matcherv3.ListStringMatcher{
			Patterns: []*matcherv3.StringMatcher{exact("authorization"), exact("cookie"), exact("proxy-authorization"), exact("sec-websocket-protocol")},
		}},
	}
}

// localReplyConfig turns the failures Envoy answers itself into a Kubernetes Status, which
// every Kubernetes client understands, instead of Envoy's text/plain body. Only these
// mappers rewrite anything: there is no top-level body_format, so other local replies (in
// particular extproc's own immediate 503s, which carry a Status already) pass untouched.
func (b *builder) localReplyConfig() *hcmv3.LocalReplyConfig {
	return &hcmv3.LocalReplyConfig{Mappers: []*hcmv3.ResponseMapper{
		{
			// The upstream may have received the request before it failed: connection
			// termination or reset before the response (UC, UR). First, so that a response
			// with one of these flags among others never gets the Retry-After below: a
			// stream's response flags accumulate over its attempts (each failed attempt sets
			// its own, StreamInfo::setResponseFlag), so retries exhausted (URX) after an
			// attempt that may have reached an apiserver carry UC or UR too, while URX
			// with UF alone means no attempt connected.
			Filter: &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_ResponseFlagFilter{
				ResponseFlagFilter: &accesslogv3.ResponseFlagFilter{Flags: []string{"UC", "UR"}},
			}},
			StatusCode:         wrapperspb.UInt32(503),
			BodyFormatOverride: statusBody("kube-mvp: no apiserver that can serve this request is available (%RESPONSE_CODE_DETAILS%)"),
		},
		{
			// No apiserver received the request: no healthy host (UH, e.g. a restarted
			// apiserver whose next health check has not passed yet), connection failure
			// (UF), circuit breaker overflow (UO), a cluster name that does not exist (NC)
			// and no route (NR, impossible with our catch-all route: it could only mean an
			// inconsistent configuration, which a 404 would misreport as an absent
			// resource). Nothing was executed, so the answer says when to try again, as an
			// apiserver's own 503s and 429s do, and client-go retries it, whatever the verb.
			Filter: &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_ResponseFlagFilter{
				ResponseFlagFilter: &accesslogv3.ResponseFlagFilter{Flags: []string{"UH", "UF", "UO", "NC", "NR"}},
			}},
			StatusCode:         wrapperspb.UInt32(503),
			BodyFormatOverride: statusBody("kube-mvp: no apiserver that can serve this request is available (%RESPONSE_CODE_DETAILS%)"),
			HeadersToAdd:       []*corev3.HeaderValueOption{retryAfter},
		},
		{
			// The route timeout (UT, Envoy's 504 "upstream request timeout"): the apiserver
			// did not answer within Config.UpstreamRequestTimeout, longer than its own
			// --request-timeout, so it has stopped answering. It stays a 504, as the
			// apiserver's own timeout Status (reason Timeout): the request may have been
			// processed (a write may be committed), which a 503 would deny and which
			// client-go does not retry.
			Filter: &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_ResponseFlagFilter{
				ResponseFlagFilter: &accesslogv3.ResponseFlagFilter{Flags: []string{"UT"}},
			}},
			StatusCode:         wrapperspb.UInt32(504),
			BodyFormatOverride: kubeStatus("kube-mvp: the apiserver did not answer in time (%RESPONSE_CODE_DETAILS%)", "Timeout", 504),
		},
		{
			// The ext_proc filter failed (status_on_error): extproc unreachable, too slow, or
			// it asked for a forbidden header mutation.
			Filter: &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_StatusCodeFilter{
				StatusCodeFilter: &accesslogv3.StatusCodeFilter{Comparison: &accesslogv3.ComparisonFilter{
					Op:    accesslogv3.ComparisonFilter_EQ,
					Value: &corev3.RuntimeUInt32{DefaultValue: extProcErrorStatus, RuntimeKey: "kube_mvp.local_reply.extproc_error_status"},
				}},
			}},
			StatusCode:         wrapperspb.UInt32(503),
			BodyFormatOverride: statusBody("kube-mvp: the routing decision failed (%RESPONSE_CODE_DETAILS%)"),
			// Before any apiserver saw the request (or, for merged discovery's response step,
			// after a GET): client-go retries it, so a restarting extproc goes unnoticed.
			HeadersToAdd: []*corev3.HeaderValueOption{retryAfter},
		},
		{
			// extproc did not answer within message_timeout: Envoy 1.35+ answers 504
			// (envoyproxy/envoy#39217). Envoy's only other 504, a route timeout, has flag
			// UT and was mapped above.
			Filter: &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_StatusCodeFilter{
				StatusCodeFilter: &accesslogv3.StatusCodeFilter{Comparison: &accesslogv3.ComparisonFilter{
					Op:    accesslogv3.ComparisonFilter_EQ,
					Value: &corev3.RuntimeUInt32{DefaultValue: 504, RuntimeKey: "kube_mvp.local_reply.extproc_timeout_status"},
				}},
			}},
			StatusCode:         wrapperspb.UInt32(503),
			BodyFormatOverride: statusBody("kube-mvp: the routing decision failed (%RESPONSE_CODE_DETAILS%)"),
			// Before any apiserver saw the request (or, for merged discovery's response step,
			// after a GET): client-go retries it, so a restarting extproc goes unnoticed.
			HeadersToAdd: []*corev3.HeaderValueOption{retryAfter},
		},
	}}
}

// statusBody is a metav1.Status for a 503, as JSON.
// identityFilter is the Lua filter that maps a verified client certificate to its identity
// (LuaScript), on every request; the header names come from the virtual host's metadata
// (identityMetadata).
func identityFilter() *luav3.Lua {
	return &luav3.Lua{
		DefaultSourceCode: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: LuaScript}},
		StatPrefix:        "kube_mvp_identity",
	}
}

// statusJSON is a Kubernetes Status as an apiserver writes it.
func statusJSON(message, reason string, code int32) string {
	b, err := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  message,
		Reason:   metav1.StatusReason(reason),
		Code:     code,
	})
	if err != nil {
		panic(err) // a fixed struct of strings always marshals
	}
	return string(b)
}

// statusJSONRetry is a 503 Status as an apiserver writes it with Retry-After: 1, whose
// details say so too.
func statusJSONRetry(message string) string {
	b, err := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  message,
		Reason:   metav1.StatusReasonServiceUnavailable,
		Code:     503,
		Details:  &metav1.StatusDetails{RetryAfterSeconds: 1},
	})
	if err != nil {
		panic(err) // a fixed struct of strings always marshals
	}
	return string(b)
}

// retryAfter is the Retry-After of the local replies for requests no apiserver received (or
// only as a GET /apis): one second, what extproc's own 503s say.
var retryAfter = &corev3.HeaderValueOption{
	Header:       &corev3.HeaderValue{Key: "retry-after", Value: "1"},
	AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
}

func statusBody(message string) *corev3.SubstitutionFormatString {
	return kubeStatus(message, "ServiceUnavailable", 503)
}

// kubeStatus is a metav1.Status failure, as JSON. Envoy's JSON formatter keeps numbers as
// numbers and nested (also empty) objects as objects; message may use format commands.
func kubeStatus(message, reason string, code int) *corev3.SubstitutionFormatString {
	s, err := structpb.NewStruct(map[string]any{
		"kind":       "Status",
		"apiVersion": "v1",
		"metadata":   map[string]any{},
		"status":     "Failure",
		"message":    message,
		"reason":     reason,
		"code":       code,
	})
	if err != nil {
		panic(err) // a fixed map of strings and numbers always converts
	}
	return &corev3.SubstitutionFormatString{
		Format:      &corev3.SubstitutionFormatString_JsonFormat{JsonFormat: s},
		ContentType: "application/json",
	}
}
