package dataplane

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	luafilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlymutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpoptionsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The allowlist: every field path this data plane implements, per message type that starts a
// path (a top-level resource or a typed_config). A resource in which any populated field is
// not listed is rejected (NACKed) with an error naming the field: Envoy rejects what it does
// not understand, and a stand-in that silently ignored a field would let tests pass on
// configuration it never executed. Paths are field names joined by "."; list and map
// elements add nothing to the path; google.protobuf.* messages (Duration, wrappers, Struct)
// are leaves. Any-typed fields name the @types allowed there, each checked against its own
// rules. Some fields are allowed only with certain values (valueChecks).

func name(m proto.Message) string { return string(m.ProtoReflect().Descriptor().FullName()) }

var (
	tListener     = name(&listenerv3.Listener{})
	tHCM          = name(&hcmv3.HttpConnectionManager{})
	tDownTLS      = name(&tlsv3.DownstreamTlsContext{})
	tUpTLS        = name(&tlsv3.UpstreamTlsContext{})
	tEarly        = name(&earlymutationv3.HeaderMutation{})
	tExtProc      = name(&extprocfilterv3.ExternalProcessor{})
	tExtProcRoute = name(&extprocfilterv3.ExtProcPerRoute{})
	tRouter       = name(&routerv3.Router{})
	tLua          = name(&luafilterv3.Lua{})
	tLuaRoute     = name(&luafilterv3.LuaPerRoute{})
	tRouteConfig  = name(&routev3.RouteConfiguration{})
	tPrevHosts    = name(&previoushostsv3.PreviousHostsPredicate{})
	tCluster      = name(&clusterv3.Cluster{})
	tHTTPOptions  = name(&httpoptionsv3.HttpProtocolOptions{})
	tCLA          = name(&endpointv3.ClusterLoadAssignment{})
	tSecret       = name(&tlsv3.Secret{})
)

func cat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// prefixed returns prefix+"."+each of paths.
func prefixed(prefix string, paths ...string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = prefix + "." + p
	}
	return out
}

var stringMatcherPaths = []string{"exact", "prefix", "suffix", "contains", "safe_regex", "safe_regex.regex", "ignore_case"}

func sdsPaths(prefix string) []string {
	return prefixed(prefix, "name", "sds_config", "sds_config.ads", "sds_config.resource_api_version")
}

func endpointPaths() []string {
	return []string{
		"endpoints", "endpoints.lb_endpoints", "endpoints.lb_endpoints.endpoint",
		"endpoints.lb_endpoints.endpoint.address", "endpoints.lb_endpoints.endpoint.address.socket_address",
		"endpoints.lb_endpoints.endpoint.address.socket_address.address",
		"endpoints.lb_endpoints.endpoint.address.socket_address.port_value",
		"endpoints.lb_endpoints.endpoint.address.pipe", "endpoints.lb_endpoints.endpoint.address.pipe.path",
		"endpoints.lb_endpoints.endpoint.hostname",
		"endpoints.lb_endpoints.metadata", "endpoints.lb_endpoints.metadata.filter_metadata",
		"endpoints.lb_endpoints.health_status",
		"cluster_name"}
}

// allowed is root type -> allowed paths. Intermediate message paths are listed too.
var allowed = map[string][]string{
	tListener: {
		"name", "address", "address.socket_address", "address.socket_address.address", "address.socket_address.port_value",
		"filter_chains", "filter_chains.filters", "filter_chains.filters.name", "filter_chains.filters.typed_config",
		"filter_chains.transport_socket", "filter_chains.transport_socket.name", "filter_chains.transport_socket.typed_config",
	},
	tHCM: cat([]string{
		"stat_prefix", "rds", "rds.config_source", "rds.config_source.ads", "rds.config_source.resource_api_version", "rds.route_config_name",
		"http_filters", "http_filters.name", "http_filters.typed_config",
		"early_header_mutation_extensions", "early_header_mutation_extensions.name", "early_header_mutation_extensions.typed_config",
		"forward_client_cert_details", "set_current_client_cert_details", "set_current_client_cert_details.subject", "set_current_client_cert_details.uri",
		"use_remote_address", "upgrade_configs", "upgrade_configs.upgrade_type", "upgrade_configs.enabled",
		"request_timeout", "stream_idle_timeout", "server_header_transformation",
		// The downstream HTTP/2 stream limit and windows (listener.go serveH2).
		"http2_protocol_options", "http2_protocol_options.max_concurrent_streams",
		"http2_protocol_options.initial_stream_window_size", "http2_protocol_options.initial_connection_window_size",
		// Allowed only with the values that leave the path alone: see valueChecks.
		"normalize_path", "path_with_escaped_slashes_action",
		"local_reply_config", "local_reply_config.mappers", "local_reply_config.mappers.filter",
		"local_reply_config.mappers.filter.response_flag_filter", "local_reply_config.mappers.filter.response_flag_filter.flags",
		"local_reply_config.mappers.filter.status_code_filter", "local_reply_config.mappers.filter.status_code_filter.comparison",
		"local_reply_config.mappers.filter.status_code_filter.comparison.op", "local_reply_config.mappers.filter.status_code_filter.comparison.value",
		"local_reply_config.mappers.filter.status_code_filter.comparison.value.default_value",
		"local_reply_config.mappers.filter.status_code_filter.comparison.value.runtime_key",
		"local_reply_config.mappers.status_code",
		"local_reply_config.mappers.headers_to_add", "local_reply_config.mappers.headers_to_add.header",
		"local_reply_config.mappers.headers_to_add.header.key", "local_reply_config.mappers.headers_to_add.header.value",
		"local_reply_config.mappers.headers_to_add.append_action",
		"local_reply_config.mappers.body_format_override", "local_reply_config.mappers.body_format_override.json_format",
		"local_reply_config.mappers.body_format_override.text_format", "local_reply_config.mappers.body_format_override.content_type",
	}),
	tRouter: {"suppress_envoy_headers"},
	// The Lua filter (lua.go): scripts inline only; no filter-level filter_context, no
	// clear_route_cache set explicitly (its default, true, is what is implemented), no
	// package paths, no shared VMs, no deprecated inline_code.
	tLua: {"stat_prefix", "source_codes", "source_codes.inline_string", "default_source_code", "default_source_code.inline_string"},
	// LuaPerRoute: no per-route source_code, no filter_context (not in Envoy 1.36).
	tLuaRoute:     {"disabled", "name"},
	tExtProcRoute: {"disabled", "overrides", "overrides.grpc_initial_metadata", "overrides.grpc_initial_metadata.key", "overrides.grpc_initial_metadata.value", "overrides.failure_mode_allow"},
	tEarly: cat([]string{"mutations", "mutations.remove", "mutations.remove_on_match", "mutations.remove_on_match.key_matcher"},
		prefixed("mutations.remove_on_match.key_matcher", stringMatcherPaths...)),
	tExtProc: cat([]string{
		"grpc_service", "grpc_service.envoy_grpc", "grpc_service.envoy_grpc.cluster_name",
		"processing_mode", "processing_mode.request_header_mode", "processing_mode.response_header_mode",
		"processing_mode.request_trailer_mode", "processing_mode.response_trailer_mode",
		"message_timeout", "failure_mode_allow", "status_on_error", "status_on_error.code", "route_cache_action", "stat_prefix",
		"allow_mode_override",
		"forward_rules", "forward_rules.allowed_headers", "forward_rules.allowed_headers.patterns",
		"forward_rules.disallowed_headers", "forward_rules.disallowed_headers.patterns",
		"mutation_rules", "mutation_rules.allow_all_routing", "mutation_rules.allow_envoy", "mutation_rules.disallow_system",
		"mutation_rules.disallow_all", "mutation_rules.allow_expression", "mutation_rules.allow_expression.regex",
		"mutation_rules.disallow_expression", "mutation_rules.disallow_expression.regex", "mutation_rules.disallow_is_error",
		// Dynamic metadata accepted from the processor (extProcDynamicMetadata); typed
		// receiving namespaces and forwarding namespaces are not implemented.
		"metadata_options", "metadata_options.receiving_namespaces", "metadata_options.receiving_namespaces.untyped",
	}, prefixed("forward_rules.allowed_headers.patterns", stringMatcherPaths...),
		prefixed("forward_rules.disallowed_headers.patterns", stringMatcherPaths...)),
	tDownTLS: cat([]string{
		"require_client_certificate", "common_tls_context", "common_tls_context.alpn_protocols",
		// Session resumption on or off (config.go, downstreamTLS; listener.go); not
		// session_ticket_keys* nor session_timeout.
		"disable_stateless_session_resumption", "disable_stateful_session_resumption",
		"common_tls_context.tls_certificate_sds_secret_configs", "common_tls_context.validation_context_sds_secret_config",
	}, sdsPaths("common_tls_context.tls_certificate_sds_secret_configs"), sdsPaths("common_tls_context.validation_context_sds_secret_config")),
	tUpTLS: cat([]string{
		"sni", "common_tls_context", "common_tls_context.alpn_protocols",
		"common_tls_context.tls_certificate_sds_secret_configs", "common_tls_context.validation_context_sds_secret_config",
		"common_tls_context.combined_validation_context", "common_tls_context.combined_validation_context.validation_context_sds_secret_config",
		"common_tls_context.combined_validation_context.default_validation_context",
		"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names",
		"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.san_type",
		"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.matcher",
	}, prefixed("common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.matcher", stringMatcherPaths...),
		sdsPaths("common_tls_context.tls_certificate_sds_secret_configs"),
		sdsPaths("common_tls_context.validation_context_sds_secret_config"),
		sdsPaths("common_tls_context.combined_validation_context.validation_context_sds_secret_config")),
	tRouteConfig: cat([]string{
		"name", "virtual_hosts", "virtual_hosts.name", "virtual_hosts.domains", "virtual_hosts.routes", "virtual_hosts.routes.name",
		"virtual_hosts.routes.match", "virtual_hosts.routes.match.prefix", "virtual_hosts.routes.match.path",
		"virtual_hosts.routes.match.path_separated_prefix",
		"virtual_hosts.routes.match.safe_regex", "virtual_hosts.routes.match.safe_regex.regex",
		"virtual_hosts.routes.match.headers", "virtual_hosts.routes.match.headers.name", "virtual_hosts.routes.match.headers.present_match",
		"virtual_hosts.routes.match.headers.invert_match", "virtual_hosts.routes.match.headers.string_match",
		"virtual_hosts.routes.match.query_parameters", "virtual_hosts.routes.match.query_parameters.name",
		"virtual_hosts.routes.match.query_parameters.present_match", "virtual_hosts.routes.match.query_parameters.string_match",
		"virtual_hosts.routes.route", "virtual_hosts.routes.route.cluster", "virtual_hosts.routes.route.cluster_header",
		"virtual_hosts.routes.route.timeout", "virtual_hosts.routes.route.idle_timeout",
		"virtual_hosts.routes.route.metadata_match", "virtual_hosts.routes.route.metadata_match.filter_metadata",
		"virtual_hosts.routes.route.retry_policy", "virtual_hosts.routes.route.retry_policy.retry_on",
		"virtual_hosts.routes.route.retry_policy.num_retries", "virtual_hosts.routes.route.retry_policy.retry_host_predicate",
		"virtual_hosts.routes.route.retry_policy.retry_host_predicate.name", "virtual_hosts.routes.route.retry_policy.retry_host_predicate.typed_config",
		"virtual_hosts.routes.route.retry_policy.host_selection_retry_max_attempts",
		"virtual_hosts.routes.route.retry_policy.retriable_headers", "virtual_hosts.routes.route.retry_policy.retriable_headers.name",
		"virtual_hosts.routes.route.retry_policy.retriable_headers.present_match", "virtual_hosts.routes.route.retry_policy.retriable_headers.invert_match",
		"virtual_hosts.routes.route.retry_policy.retriable_headers.string_match",
		"virtual_hosts.routes.route.retry_policy.retriable_status_codes",
		"virtual_hosts.routes.metadata", "virtual_hosts.routes.metadata.filter_metadata",
		"virtual_hosts.routes.typed_per_filter_config", "virtual_hosts.typed_per_filter_config",
		"virtual_hosts.request_headers_to_remove", "virtual_hosts.metadata", "virtual_hosts.metadata.filter_metadata",
		"virtual_hosts.routes.direct_response", "virtual_hosts.routes.direct_response.status",
		"virtual_hosts.routes.direct_response.body", "virtual_hosts.routes.direct_response.body.inline_string",
		"virtual_hosts.routes.response_headers_to_add", "virtual_hosts.routes.response_headers_to_add.header",
		"virtual_hosts.routes.response_headers_to_add.header.key", "virtual_hosts.routes.response_headers_to_add.header.value",
		"virtual_hosts.routes.response_headers_to_add.append_action",
	}, prefixed("virtual_hosts.routes.match.headers.string_match", stringMatcherPaths...),
		prefixed("virtual_hosts.routes.match.query_parameters.string_match", stringMatcherPaths...),
		prefixed("virtual_hosts.routes.route.retry_policy.retriable_headers.string_match", stringMatcherPaths...)),
	tPrevHosts: {},
	tHTTPOptions: {"explicit_http_config", "explicit_http_config.http_protocol_options", "explicit_http_config.http2_protocol_options",
		// connection_keepalive (h2pool.go keepalive), the stream limit and windows (h2Flow;
		// h2pool.go); nothing else of http2_protocol_options (connection_idle_interval
		// included) is implemented.
		"explicit_http_config.http2_protocol_options.max_concurrent_streams",
		"explicit_http_config.http2_protocol_options.initial_stream_window_size",
		"explicit_http_config.http2_protocol_options.initial_connection_window_size",
		"explicit_http_config.http2_protocol_options.connection_keepalive",
		"explicit_http_config.http2_protocol_options.connection_keepalive.interval",
		"explicit_http_config.http2_protocol_options.connection_keepalive.timeout",
		"explicit_http_config.http2_protocol_options.connection_keepalive.interval_jitter",
		"explicit_http_config.http2_protocol_options.connection_keepalive.interval_jitter.value",
		"common_http_protocol_options", "common_http_protocol_options.idle_timeout"},
	tCluster: cat([]string{
		"name", "alt_stat_name", "type", "eds_cluster_config", "eds_cluster_config.eds_config", "eds_cluster_config.eds_config.ads",
		"eds_cluster_config.eds_config.resource_api_version", "eds_cluster_config.service_name",
		"connect_timeout", "lb_policy", "common_lb_config", "common_lb_config.healthy_panic_threshold", "common_lb_config.healthy_panic_threshold.value",
		"upstream_connection_options", "upstream_connection_options.tcp_keepalive",
		"upstream_connection_options.tcp_keepalive.keepalive_probes", "upstream_connection_options.tcp_keepalive.keepalive_probes.value",
		"upstream_connection_options.tcp_keepalive.keepalive_time", "upstream_connection_options.tcp_keepalive.keepalive_time.value",
		"upstream_connection_options.tcp_keepalive.keepalive_interval", "upstream_connection_options.tcp_keepalive.keepalive_interval.value",
		"circuit_breakers", "circuit_breakers.thresholds", "circuit_breakers.thresholds.max_connections",
		"circuit_breakers.thresholds.max_pending_requests", "circuit_breakers.thresholds.max_requests",
		"circuit_breakers.thresholds.max_retries", "circuit_breakers.thresholds.track_remaining",
		"health_checks", "health_checks.timeout", "health_checks.interval", "health_checks.no_traffic_interval",
		"health_checks.healthy_threshold", "health_checks.unhealthy_threshold",
		"health_checks.unhealthy_interval", "health_checks.unhealthy_edge_interval", "health_checks.healthy_edge_interval",
		"health_checks.no_traffic_healthy_interval",
		"health_checks.http_health_check", "health_checks.http_health_check.path", "health_checks.http_health_check.host",
		"health_checks.http_health_check.request_headers_to_add", "health_checks.http_health_check.request_headers_to_add.header",
		"health_checks.http_health_check.request_headers_to_add.header.key", "health_checks.http_health_check.request_headers_to_add.header.value",
		"health_checks.http_health_check.request_headers_to_add.append_action",
		"health_checks.transport_socket_match_criteria",
		"health_checks.tls_options", "health_checks.tls_options.alpn_protocols",
		"transport_socket_matches", "transport_socket_matches.name", "transport_socket_matches.match",
		"transport_socket_matches.transport_socket", "transport_socket_matches.transport_socket.name",
		"transport_socket_matches.transport_socket.typed_config",
		"outlier_detection", "outlier_detection.interval", "outlier_detection.base_ejection_time", "outlier_detection.max_ejection_time",
		"outlier_detection.max_ejection_percent", "outlier_detection.consecutive_local_origin_failure",
		"outlier_detection.enforcing_consecutive_local_origin_failure", "outlier_detection.split_external_local_origin_errors",
		"outlier_detection.successful_active_health_check_uneject_host",
		// Allowed only as 0 (disabled): see valueChecks.
		"outlier_detection.enforcing_consecutive_5xx", "outlier_detection.enforcing_consecutive_gateway_failure",
		"outlier_detection.enforcing_local_origin_success_rate", "outlier_detection.enforcing_success_rate",
		"transport_socket", "transport_socket.name", "transport_socket.typed_config",
		"typed_extension_protocol_options", "metadata", "metadata.filter_metadata",
		"load_assignment", "ignore_health_on_host_removal",
		// Subset load balancing (subset.go): fallback policies NO_FALLBACK and ANY_ENDPOINT
		// only (see valueChecks), selectors of keys with a fallback policy, list_as_any.
		"lb_subset_config", "lb_subset_config.fallback_policy", "lb_subset_config.subset_selectors",
		"lb_subset_config.subset_selectors.keys", "lb_subset_config.subset_selectors.fallback_policy",
		"lb_subset_config.list_as_any",
	}, prefixed("load_assignment", endpointPaths()...)),
	tCLA: endpointPaths(),
	tSecret: {
		"name", "tls_certificate", "tls_certificate.certificate_chain", "tls_certificate.certificate_chain.inline_bytes",
		"tls_certificate.certificate_chain.inline_string", "tls_certificate.certificate_chain.filename",
		"tls_certificate.private_key", "tls_certificate.private_key.inline_bytes",
		"tls_certificate.private_key.inline_string", "tls_certificate.private_key.filename",
		"tls_certificate.watched_directory", "tls_certificate.watched_directory.path",
		"validation_context", "validation_context.trusted_ca",
		"validation_context.trusted_ca.inline_bytes", "validation_context.trusted_ca.inline_string", "validation_context.trusted_ca.filename",
		"validation_context.watched_directory", "validation_context.watched_directory.path",
	},
}

// anyTypes is root type -> Any-typed path -> allowed @types.
var anyTypes = map[string]map[string][]string{
	tListener: {
		"filter_chains.filters.typed_config":          {tHCM},
		"filter_chains.transport_socket.typed_config": {tDownTLS},
	},
	tHCM: {
		"http_filters.typed_config":                     {tLua, tExtProc, tRouter},
		"early_header_mutation_extensions.typed_config": {tEarly},
	},
	tRouteConfig: {
		"virtual_hosts.routes.route.retry_policy.retry_host_predicate.typed_config": {tPrevHosts},
		"virtual_hosts.routes.typed_per_filter_config":                              {tExtProcRoute, tLuaRoute},
		"virtual_hosts.typed_per_filter_config":                                     {tLuaRoute},
	},
	tCluster: {
		"transport_socket.typed_config":                          {tUpTLS},
		"transport_socket_matches.transport_socket.typed_config": {tUpTLS},
		"typed_extension_protocol_options":                       {tHTTPOptions},
	},
}

type valueCheck func(fd protoreflect.FieldDescriptor, v protoreflect.Value) error

func enumIn(names ...string) valueCheck {
	return func(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
		ev := fd.Enum().Values().ByNumber(v.Enum())
		n := fmt.Sprint(v.Enum())
		if ev != nil {
			n = string(ev.Name())
		}
		if !slices.Contains(names, n) {
			return fmt.Errorf("value %s is not implemented (only %s)", n, strings.Join(names, ", "))
		}
		return nil
	}
}

func stringIn(values ...string) valueCheck {
	return func(_ protoreflect.FieldDescriptor, v protoreflect.Value) error {
		if !slices.Contains(values, strings.ToLower(v.String())) {
			return fmt.Errorf("value %q is not implemented (only %s)", v.String(), strings.Join(values, ", "))
		}
		return nil
	}
}

func zeroDuration(_ protoreflect.FieldDescriptor, v protoreflect.Value) error {
	d, ok := v.Message().Interface().(*durationpb.Duration)
	if ok && d.AsDuration() != 0 {
		return fmt.Errorf("value %s is not implemented (only 0s, which disables it)", d.AsDuration())
	}
	return nil
}

// retryOn refuses the retry conditions Envoy knows but this data plane does not implement.
// Envoy ignores a token it does not know, and empty ones (RetryPolicyImpl: parseRetryOn and
// parseRetryGrpcOn, whose "all valid" result it discards): so does this data plane.
func retryOn(_ protoreflect.FieldDescriptor, v protoreflect.Value) error {
	for _, tok := range strings.Split(v.String(), ",") {
		tok = strings.TrimSpace(tok)
		switch tok {
		case "connect-failure", "refused-stream", "reset-before-request", "reset", "retriable-headers", "retriable-status-codes":
		case "5xx", "gateway-error", "envoy-ratelimited", "retriable-4xx",
			"http3-post-connect-failure", "cancelled", "deadline-exceeded", "resource-exhausted",
			"unavailable", "internal":
			return fmt.Errorf("retry condition %q is not implemented", tok)
		}
	}
	return nil
}

// retriableStatusCode refuses 425 (Too Early) in retriable_status_codes: Envoy retries it only
// for a request that did not arrive as early data, at once and without early data
// (RetryStateImpl::wouldRetryFromHeaders), which is not implemented. Envoy checks no value at
// load time (RetryPolicyImpl copies the list), so any other status is accepted, as there.
func retriableStatusCode(_ protoreflect.FieldDescriptor, v protoreflect.Value) error {
	if v.Uint() == 425 {
		return errors.New("retriable status 425 (Too Early) is not implemented")
	}
	return nil
}

// valueChecks is root type -> path -> check of the field's value (for a list, each element).
var valueChecks = map[string]map[string]valueCheck{
	tHCM: {
		"forward_client_cert_details":  enumIn("SANITIZE", "SANITIZE_SET"),
		"upgrade_configs.upgrade_type": stringIn("websocket", "spdy/3.1"),
		"request_timeout":              zeroDuration,
		"stream_idle_timeout":          zeroDuration,
		"server_header_transformation": enumIn("OVERWRITE", "PASS_THROUGH"),
		// Normalisation, slash merging and unescaping are not implemented: only the values
		// under which Envoy routes and forwards the :path as received.
		"normalize_path":                                                     falseBool,
		"path_with_escaped_slashes_action":                                   enumIn("KEEP_UNCHANGED"),
		"rds.config_source.resource_api_version":                             enumIn("V3"),
		"local_reply_config.mappers.filter.status_code_filter.comparison.op": enumIn("EQ", "GE", "LE"),
	},
	tExtProc: {
		"processing_mode.request_header_mode":   enumIn("DEFAULT", "SEND", "SKIP"),
		"processing_mode.response_header_mode":  enumIn("SKIP"),
		"processing_mode.request_trailer_mode":  enumIn("DEFAULT", "SKIP"),
		"processing_mode.response_trailer_mode": enumIn("DEFAULT", "SKIP"),
		"route_cache_action":                    enumIn("DEFAULT", "CLEAR", "RETAIN"),
	},
	tRouteConfig: {
		"virtual_hosts.routes.route.idle_timeout":                        zeroDuration,
		"virtual_hosts.routes.route.retry_policy.retry_on":               retryOn,
		"virtual_hosts.routes.route.retry_policy.retriable_status_codes": retriableStatusCode,
	},
	tUpTLS: {
		"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.san_type": enumIn("DNS"),
	},
	tCluster: {
		"type":      enumIn("EDS", "STATIC", "STRICT_DNS"),
		"lb_policy": enumIn("ROUND_ROBIN", "LEAST_REQUEST"),
		"outlier_detection.enforcing_consecutive_5xx":             zeroPercentU32,
		"outlier_detection.enforcing_consecutive_gateway_failure": zeroPercentU32,
		"outlier_detection.enforcing_local_origin_success_rate":   zeroPercentU32,
		"outlier_detection.enforcing_success_rate":                zeroPercentU32,
		"eds_cluster_config.eds_config.resource_api_version":      enumIn("V3"),
		"lb_subset_config.fallback_policy":                        enumIn("NO_FALLBACK", "ANY_ENDPOINT"),
		"lb_subset_config.subset_selectors.fallback_policy":       enumIn("NOT_DEFINED", "NO_FALLBACK", "ANY_ENDPOINT"),
	},
}

// falseBool accepts a BoolValue of false.
func falseBool(_ protoreflect.FieldDescriptor, v protoreflect.Value) error {
	m := v.Message()
	if m.Get(m.Descriptor().Fields().ByName("value")).Bool() {
		return fmt.Errorf("true is not implemented (only false)")
	}
	return nil
}

// zeroPercentU32 accepts a UInt32Value of 0: the detector is disabled, which is implemented.
func zeroPercentU32(_ protoreflect.FieldDescriptor, v protoreflect.Value) error {
	m := v.Message()
	if u := m.Get(m.Descriptor().Fields().ByName("value")).Uint(); u != 0 {
		return fmt.Errorf("value %d is not implemented (only 0: this outlier detector is not implemented)", u)
	}
	return nil
}

// fieldRules is one allowlist: allowed paths, Any types and value checks, each by root type.
type fieldRules struct {
	allowed     map[string][]string
	anyTypes    map[string]map[string][]string
	valueChecks map[string]map[string]valueCheck
}

// dynamicRules are the rules of the resources that come over xDS.
var dynamicRules = fieldRules{allowed: allowed, anyTypes: anyTypes, valueChecks: valueChecks}

// checkFields walks m (of root type root) and returns one error per populated field that is
// not implemented, each naming the field path.
func checkFields(m proto.Message) []error { return dynamicRules.check(m) }

func (r fieldRules) check(m proto.Message) []error {
	var errs []error
	root := name(m)
	r.walkMessage(root, m.ProtoReflect(), "", &errs)
	return errs
}

func (r fieldRules) walkMessage(root string, m protoreflect.Message, prefix string, errs *[]error) {
	rules, known := r.allowed[root]
	if !known {
		*errs = append(*errs, fmt.Errorf("%s is not implemented", root))
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := string(fd.Name())
		if prefix != "" {
			path = prefix + "." + path
		}
		if !slices.Contains(rules, path) {
			*errs = append(*errs, fmt.Errorf("%s: field %s is not implemented by the test data plane", root, path))
			return true
		}
		check := r.valueChecks[root][path]
		each := func(v protoreflect.Value) {
			if check != nil {
				if err := check(fd, v); err != nil {
					*errs = append(*errs, fmt.Errorf("%s: field %s: %w", root, path, err))
				}
			}
			if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
				r.walkValue(root, v.Message(), path, errs)
			}
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				each(l.Get(i))
			}
		case fd.IsMap():
			vd := fd.MapValue()
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				if vd.Kind() == protoreflect.MessageKind {
					r.walkValue(root, mv.Message(), path, errs)
				}
				return true
			})
		default:
			each(v)
		}
		return true
	})
}

func (r fieldRules) walkValue(root string, m protoreflect.Message, path string, errs *[]error) {
	full := string(m.Descriptor().FullName())
	switch {
	case full == "google.protobuf.Any":
		a := m.Interface().(*anypb.Any)
		types := r.anyTypes[root][path]
		t := strings.TrimPrefix(a.GetTypeUrl(), "type.googleapis.com/")
		if !slices.Contains(types, t) {
			*errs = append(*errs, fmt.Errorf("%s: field %s: typed_config @type %s is not implemented by the test data plane", root, path, a.GetTypeUrl()))
			return
		}
		inner, err := a.UnmarshalNew()
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s: field %s: %w", root, path, err))
			return
		}
		r.walkMessage(t, inner.ProtoReflect(), "", errs)
	case strings.HasPrefix(full, "google.protobuf."):
		// Duration, wrappers, Struct: leaves.
	default:
		r.walkMessage(root, m, path, errs)
	}
}
