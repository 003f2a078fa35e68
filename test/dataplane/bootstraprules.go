package dataplane

import (
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

var (
	tBootstrap         = name(&bootstrapv3.Bootstrap{})
	tDiscoveryResponse = name(&discovery.DiscoveryResponse{})
)

// bootstrapRules is the allowlist of the bootstrap (the --config-path file merged with
// --config-yaml): every field the stand-in implements, in the shape of the chart's
// templates/envoy-bootstrap.yaml and envoy/*.yaml. Anything else is an error at start naming
// the field. Its typed configs have rules of their own here: the static listener's HTTP
// connection manager has an inline route_config where the dynamic one has rds.
var bootstrapRules = fieldRules{
	allowed: map[string][]string{
		tBootstrap: cat(
			[]string{"node", "node.id", "node.cluster", "node.metadata"},
			[]string{"admin", "admin.address", "admin.address.socket_address",
				"admin.address.socket_address.address", "admin.address.socket_address.port_value"},
			[]string{"dynamic_resources", "dynamic_resources.ads_config", "dynamic_resources.ads_config.api_type",
				"dynamic_resources.ads_config.transport_api_version", "dynamic_resources.ads_config.set_node_on_first_message_only",
				"dynamic_resources.ads_config.grpc_services", "dynamic_resources.ads_config.grpc_services.envoy_grpc",
				"dynamic_resources.ads_config.grpc_services.envoy_grpc.cluster_name",
				"dynamic_resources.lds_config", "dynamic_resources.lds_config.ads", "dynamic_resources.lds_config.resource_api_version",
				"dynamic_resources.cds_config", "dynamic_resources.cds_config.ads", "dynamic_resources.cds_config.resource_api_version"},
			[]string{"static_resources", "static_resources.listeners"},
			prefixed("static_resources.listeners", "name", "address", "address.socket_address",
				"address.socket_address.address", "address.socket_address.port_value",
				"filter_chains", "filter_chains.filters", "filter_chains.filters.name", "filter_chains.filters.typed_config"),
			[]string{"static_resources.clusters"},
			prefixed("static_resources.clusters", "name", "type", "connect_timeout", "dns_refresh_rate",
				"load_assignment", "load_assignment.cluster_name", "load_assignment.endpoints",
				"load_assignment.endpoints.lb_endpoints", "load_assignment.endpoints.lb_endpoints.endpoint",
				"load_assignment.endpoints.lb_endpoints.endpoint.address",
				"load_assignment.endpoints.lb_endpoints.endpoint.address.socket_address",
				"load_assignment.endpoints.lb_endpoints.endpoint.address.socket_address.address",
				"load_assignment.endpoints.lb_endpoints.endpoint.address.socket_address.port_value",
				"typed_extension_protocol_options",
				"transport_socket", "transport_socket.name", "transport_socket.typed_config"),
		),
		tHCM: {
			"stat_prefix", "route_config", "route_config.name", "route_config.virtual_hosts",
			"route_config.virtual_hosts.name", "route_config.virtual_hosts.domains", "route_config.virtual_hosts.routes",
			"route_config.virtual_hosts.routes.match", "route_config.virtual_hosts.routes.match.path",
			"route_config.virtual_hosts.routes.match.headers", "route_config.virtual_hosts.routes.match.headers.name",
			"route_config.virtual_hosts.routes.match.headers.string_match",
			"route_config.virtual_hosts.routes.match.headers.string_match.exact",
			"route_config.virtual_hosts.routes.route", "route_config.virtual_hosts.routes.route.cluster",
			"http_filters", "http_filters.name", "http_filters.typed_config",
		},
		tRouter: {},
		tHTTPOptions: {
			"explicit_http_config", "explicit_http_config.http2_protocol_options",
			"explicit_http_config.http2_protocol_options.connection_keepalive",
			"explicit_http_config.http2_protocol_options.connection_keepalive.interval",
			"explicit_http_config.http2_protocol_options.connection_keepalive.timeout",
		},
		tUpTLS: cat(
			[]string{"common_tls_context", "common_tls_context.alpn_protocols"},
			prefixed("common_tls_context.tls_certificate_sds_secret_configs", pathSDS...),
			[]string{"common_tls_context.tls_certificate_sds_secret_configs"},
			[]string{"common_tls_context.combined_validation_context",
				"common_tls_context.combined_validation_context.default_validation_context",
				"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names",
				"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.san_type",
				"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.matcher",
				"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.matcher.exact",
				"common_tls_context.combined_validation_context.validation_context_sds_secret_config"},
			prefixed("common_tls_context.combined_validation_context.validation_context_sds_secret_config", pathSDS...),
		),
	},
	anyTypes: map[string]map[string][]string{
		tBootstrap: {
			"static_resources.listeners.filter_chains.filters.typed_config": {tHCM},
			"static_resources.clusters.typed_extension_protocol_options":    {tHTTPOptions},
			"static_resources.clusters.transport_socket.typed_config":       {tUpTLS},
		},
		tHCM: {"http_filters.typed_config": {tRouter}},
	},
	valueChecks: map[string]map[string]valueCheck{
		tBootstrap: {
			"dynamic_resources.ads_config.api_type":              enumIn("GRPC"),
			"dynamic_resources.ads_config.transport_api_version": enumIn("V3"),
			"dynamic_resources.lds_config.resource_api_version":  enumIn("V3"),
			"dynamic_resources.cds_config.resource_api_version":  enumIn("V3"),
			"static_resources.clusters.type":                     enumIn("STRICT_DNS", "STATIC"),
		},
		tHCM: {"route_config.virtual_hosts.domains": stringIn("*")},
		tUpTLS: {
			"common_tls_context.alpn_protocols": stringIn("h2"),
			"common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names.san_type":    enumIn("URI"),
			"common_tls_context.tls_certificate_sds_secret_configs.sds_config.resource_api_version":                               enumIn("V3"),
			"common_tls_context.combined_validation_context.validation_context_sds_secret_config.sds_config.resource_api_version": enumIn("V3"),
		},
	},
}

// pathSDS are the fields of an SdsSecretConfig read from a file (path_config_source).
var pathSDS = []string{"name", "sds_config", "sds_config.path_config_source", "sds_config.path_config_source.path", "sds_config.resource_api_version"}

// sdsFileRules is the allowlist of an SDS file (a DiscoveryResponse of Secrets with file
// names and watched directories, as envoy/sds/ and the chart's).
var sdsFileRules = fieldRules{
	allowed: map[string][]string{
		tDiscoveryResponse: {"version_info", "resources"},
		tSecret: {
			"name", "tls_certificate", "tls_certificate.certificate_chain", "tls_certificate.certificate_chain.filename",
			"tls_certificate.private_key", "tls_certificate.private_key.filename",
			"tls_certificate.watched_directory", "tls_certificate.watched_directory.path",
			"validation_context", "validation_context.trusted_ca", "validation_context.trusted_ca.filename",
			"validation_context.watched_directory", "validation_context.watched_directory.path",
		},
	},
	anyTypes: map[string]map[string][]string{tDiscoveryResponse: {"resources": {tSecret}}},
}
