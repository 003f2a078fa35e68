package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpoptionsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"sigs.k8s.io/yaml"
)

// CommandLine is what the stand-in takes of Envoy's command line (source/server/options_impl.cc).
type CommandLine struct {
	ConfigPath                 string     // -c, --config-path
	ConfigYAML                 string     // --config-yaml
	ServiceNode                string     // --service-node: overrides node.id
	ServiceCluster             string     // --service-cluster: overrides node.cluster
	RejectUnknownDynamicFields bool       // --reject-unknown-dynamic-fields
	LogLevel                   slog.Level // -l, --log-level
	Version                    bool       // --version
	// DrainTime is --drain-time-s (default 600 s), DrainStrategy --drain-strategy (gradual or
	// immediate; default gradual): the server's drain manager (drain.go).
	DrainTime     time.Duration
	DrainStrategy DrainStrategy
	// EnvoyVersion is --envoy-version, the stand-in's own flag (Envoy has none): the release
	// modelled (Options.EnvoyVersion).
	EnvoyVersion string
}

// LoadBootstrap reads a bootstrap as Envoy's InstanceUtil::loadBootstrapConfig
// (source/server/server.cc): the --config-path file, then the --config-yaml document decoded
// on its own and merged into it with MergeFrom (a set scalar replaces, a message merges,
// repeated fields append, map entries replace), then validated. At least one of the two is
// needed. Unknown fields are errors in either: the bootstrap is always read strictly (Envoy's
// static validation visitor; --reject-unknown-dynamic-fields is about xDS resources).
func LoadBootstrap(configPath, configYAML string) (*bootstrapv3.Bootstrap, error) {
	if configPath == "" && configYAML == "" {
		return nil, errors.New("At least one of --config-path or --config-yaml should be non-empty")
	}
	b := &bootstrapv3.Bootstrap{}
	if configPath != "" {
		if err := loadFromFile(configPath, b); err != nil {
			return nil, err
		}
	}
	if configYAML != "" {
		override := &bootstrapv3.Bootstrap{}
		if err := loadFromYAML([]byte(configYAML), override); err != nil {
			return nil, fmt.Errorf("--config-yaml: %w", err)
		}
		proto.Merge(b, override)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return b, nil
}

// loadFromFile decodes a file as Envoy's MessageUtil::loadFromFile
// (source/common/protobuf/utility.cc) chooses by its name: .pb binary and .pb_text text
// protos (which the stand-in does not read: our bootstraps are YAML), .yaml or .yml (any
// case) YAML, anything else JSON.
func loadFromFile(path string, m proto.Message) error {
	lower := strings.ToLower(path)
	if strings.HasSuffix(lower, ".pb") || strings.HasSuffix(lower, ".pb_text") {
		return fmt.Errorf("%s: a binary or text protobuf file: Envoy reads those, the test stand-in only YAML (.yaml, .yml) and JSON", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if strings.HasSuffix(lower, ".yaml") || strings.HasSuffix(lower, ".yml") {
		err = loadFromYAML(b, m)
	} else {
		err = loadFromJSON(b, m)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// loadFromYAML is Envoy's MessageUtil::loadFromYaml: YAML to JSON, then loadFromJSON.
func loadFromYAML(b []byte, m proto.Message) error {
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		return fmt.Errorf("Unable to parse YAML: %w", err)
	}
	return loadFromJSON(js, m)
}

// loadFromJSON decodes proto JSON strictly: an unknown field, or an Any of a type this
// binary does not have, is an error (Envoy: "Protobuf message (type … reason
// INVALID_ARGUMENT:…) has unknown fields").
func loadFromJSON(js []byte, m proto.Message) error {
	err := protojson.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}.Unmarshal(js, m)
	if err != nil {
		return fmt.Errorf("Protobuf message (type %s): %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// BootstrapOptions loads the bootstrap of cl and turns it into the data plane's options:
// exactly what our bootstraps (the chart's ConfigMap, envoy/*.yaml) use, and an error naming
// any field it does not implement (bootstrapRules). Logger and the test-only overrides
// (ListenerAddress, LookupHost) are the caller's.
func BootstrapOptions(cl CommandLine) (Options, error) {
	b, err := LoadBootstrap(cl.ConfigPath, cl.ConfigYAML)
	if err != nil {
		return Options{}, err
	}
	return optionsFromBootstrap(b, cl)
}

func optionsFromBootstrap(b *bootstrapv3.Bootstrap, cl CommandLine) (Options, error) {
	if errs := bootstrapRules.check(b); len(errs) > 0 {
		return Options{}, fmt.Errorf("bootstrap: %w", errors.Join(errs...))
	}
	if err := validateTypedConfigs(b); err != nil {
		return Options{}, err
	}
	o := Options{RejectUnknownDynamicFields: cl.RejectUnknownDynamicFields, Drain: &DrainOptions{Time: cl.DrainTime, Strategy: cl.DrainStrategy}, EnvoyVersion: cl.EnvoyVersion}

	// The command line overrides the bootstrap's node id and cluster (LocalInfoImpl,
	// source/common/local_info/local_info_impl.h), and ADS needs both
	// (Config::Utility::checkLocalInfo, source/common/config/utility.cc).
	node := b.GetNode()
	o.NodeID, o.NodeCluster = node.GetId(), node.GetCluster()
	if cl.ServiceNode != "" {
		o.NodeID = cl.ServiceNode
	}
	if cl.ServiceCluster != "" {
		o.NodeCluster = cl.ServiceCluster
	}
	if o.NodeID == "" || o.NodeCluster == "" {
		return Options{}, errors.New("ads: node 'id' and 'cluster' are required. Set it either in 'node' config or via --service-node and --service-cluster options.")
	}
	if md := node.GetMetadata(); md != nil {
		o.NodeMetadata = md.AsMap()
		if v, ok := o.NodeMetadata[localAPIServerKey]; ok {
			s, isString := v.(string)
			if !isString {
				return Options{}, fmt.Errorf("node.metadata %q: a string, not %T", localAPIServerKey, v)
			}
			o.LocalAPIServer = s
			delete(o.NodeMetadata, localAPIServerKey)
		}
	}

	// The stand-in always serves its admin; Envoy runs none without admin.address.
	sa := b.GetAdmin().GetAddress().GetSocketAddress()
	if sa == nil {
		return Options{}, errors.New("bootstrap: admin.address.socket_address is required by the test stand-in (it always runs its admin)")
	}
	o.AdminAddress = net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		if clusters[c.GetName()] != nil {
			return Options{}, fmt.Errorf("cluster manager: duplicate cluster '%s' found", c.GetName())
		}
		clusters[c.GetName()] = c
	}

	// ADS: one gRPC service, to a static cluster (Config::Utility::checkApiConfigSourceNames
	// and checkCluster, source/common/config/utility.cc); listeners and clusters over it.
	dr := b.GetDynamicResources()
	ads := dr.GetAdsConfig()
	if ads == nil {
		return Options{}, errors.New("bootstrap: dynamic_resources.ads_config is required by the test stand-in (it takes its configuration over ADS)")
	}
	if !ads.GetSetNodeOnFirstMessageOnly() {
		return Options{}, errors.New("bootstrap: dynamic_resources.ads_config.set_node_on_first_message_only: false is not implemented (the stand-in sends the node on a stream's first request only)")
	}
	if n := len(ads.GetGrpcServices()); n != 1 {
		return Options{}, fmt.Errorf("bootstrap: dynamic_resources.ads_config.grpc_services: API configs must have a single gRPC service, found %d", n)
	}
	for field, cs := range map[string]*corev3.ConfigSource{"lds_config": dr.GetLdsConfig(), "cds_config": dr.GetCdsConfig()} {
		if cs.GetAds() == nil {
			return Options{}, fmt.Errorf("bootstrap: dynamic_resources.%s: only ads is implemented by the test stand-in", field)
		}
	}
	xdsName := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	xc := clusters[xdsName]
	if xc == nil {
		return Options{}, fmt.Errorf("envoy::config::core::v3::ConfigSource must have a statically defined non-EDS cluster: '%s' does not exist, was added via api, or is an EDS cluster", xdsName)
	}
	var err error
	if o.XDSCluster, o.XDSTLS, err = xdsCluster(xc); err != nil {
		return Options{}, fmt.Errorf("bootstrap: cluster %s: %w", xdsName, err)
	}

	listeners := b.GetStaticResources().GetListeners()
	if len(listeners) > 1 {
		return Options{}, fmt.Errorf("bootstrap: static_resources.listeners: %d listeners; the test stand-in implements one (envoy-health)", len(listeners))
	}
	for _, l := range listeners {
		h, err := healthListener(l, clusters)
		if err != nil {
			return Options{}, fmt.Errorf("bootstrap: listener %s: %w", l.GetName(), err)
		}
		o.HealthListener = h
	}
	return o, nil
}

// oneEndpoint is a cluster's single endpoint's socket address.
func oneEndpoint(c *clusterv3.Cluster) (*corev3.SocketAddress, error) {
	var out []*corev3.SocketAddress
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			out = append(out, lb.GetEndpoint().GetAddress().GetSocketAddress())
		}
	}
	if len(out) != 1 || out[0] == nil {
		return nil, fmt.Errorf("load_assignment: %d endpoints; the test stand-in implements one socket address", len(out))
	}
	return out[0], nil
}

func xdsCluster(c *clusterv3.Cluster) (*XDSCluster, *XDSTLS, error) {
	if t := c.GetType(); t != clusterv3.Cluster_STRICT_DNS && t != clusterv3.Cluster_STATIC {
		return nil, nil, fmt.Errorf("type %s: the xDS cluster must be STRICT_DNS or STATIC in the test stand-in", t)
	}
	ep, err := oneEndpoint(c)
	if err != nil {
		return nil, nil, err
	}
	if c.GetType() == clusterv3.Cluster_STATIC && net.ParseIP(ep.GetAddress()) == nil {
		// Envoy: a STATIC cluster's address must be an IP address.
		return nil, nil, fmt.Errorf("malformed IP address: %s", ep.GetAddress())
	}
	xc := &XDSCluster{Name: c.GetName(), Host: ep.GetAddress(), Port: int(ep.GetPortValue()),
		DNSRefreshRate: 5 * time.Second, ConnectTimeout: 5 * time.Second}
	if d := c.GetDnsRefreshRate(); d != nil {
		xc.DNSRefreshRate = d.AsDuration()
	}
	if d := c.GetConnectTimeout(); d != nil {
		xc.ConnectTimeout = d.AsDuration()
	}
	// gRPC needs HTTP/2: the cluster must say so (explicit_http_config.http2_protocol_options).
	var h2 bool
	for _, a := range c.GetTypedExtensionProtocolOptions() {
		po := &httpoptionsv3.HttpProtocolOptions{}
		if err := a.UnmarshalTo(po); err != nil {
			return nil, nil, err
		}
		if p := po.GetExplicitHttpConfig().GetHttp2ProtocolOptions(); p != nil {
			h2 = true
			if ka := p.GetConnectionKeepalive(); ka != nil {
				xc.KeepaliveInterval = ka.GetInterval().AsDuration()
				xc.KeepaliveTimeout = ka.GetTimeout().AsDuration()
			}
		}
	}
	if !h2 {
		return nil, nil, errors.New("typed_extension_protocol_options: the cluster of a gRPC service needs explicit_http_config.http2_protocol_options")
	}
	ts := c.GetTransportSocket()
	if ts == nil {
		return xc, nil, nil
	}
	up := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(up); err != nil {
		return nil, nil, fmt.Errorf("transport_socket: %w", err)
	}
	x, err := xdsTLS(up)
	if err != nil {
		return nil, nil, fmt.Errorf("transport_socket: %w", err)
	}
	return xc, x, nil
}

// xdsTLS reads the UpstreamTlsContext's SDS secrets from their files (path_config_source).
func xdsTLS(up *tlsv3.UpstreamTlsContext) (*XDSTLS, error) {
	ctc := up.GetCommonTlsContext()
	if len(ctc.GetTlsCertificateSdsSecretConfigs()) != 1 {
		return nil, errors.New("common_tls_context.tls_certificate_sds_secret_configs: the test stand-in implements exactly one")
	}
	certCfg := ctc.GetTlsCertificateSdsSecretConfigs()[0]
	cvc := ctc.GetCombinedValidationContext()
	if cvc == nil {
		return nil, errors.New("common_tls_context.combined_validation_context is required by the test stand-in (xds-server must be verified)")
	}
	sans := cvc.GetDefaultValidationContext().GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetMatcher().GetExact() == "" {
		return nil, errors.New("combined_validation_context.default_validation_context.match_typed_subject_alt_names: the test stand-in implements exactly one URI SAN matched exactly")
	}
	cert, err := sdsSecretFile(certCfg)
	if err != nil {
		return nil, err
	}
	ca, err := sdsSecretFile(cvc.GetValidationContextSdsSecretConfig())
	if err != nil {
		return nil, err
	}
	tc, vc := cert.GetTlsCertificate(), ca.GetValidationContext()
	if tc == nil {
		return nil, fmt.Errorf("SDS secret %s: not a tls_certificate", cert.GetName())
	}
	if vc == nil {
		return nil, fmt.Errorf("SDS secret %s: not a validation_context", ca.GetName())
	}
	return &XDSTLS{
		CertFile: tc.GetCertificateChain().GetFilename(), KeyFile: tc.GetPrivateKey().GetFilename(),
		CAFile:               vc.GetTrustedCa().GetFilename(),
		ServerURISAN:         sans[0].GetMatcher().GetExact(),
		CertWatchedDirectory: tc.GetWatchedDirectory().GetPath(),
		CAWatchedDirectory:   vc.GetWatchedDirectory().GetPath(),
		CertSecret:           cert.GetName(),
	}, nil
}

// sdsSecretFile reads one SDS secret from its path_config_source file as Envoy's filesystem
// subscription does (source/extensions/config_subscription/filesystem/
// filesystem_subscription_impl.cc: the file, which must exist at load time, holds a
// DiscoveryResponse), and takes the one resource of the configured name as SdsApi does
// (source/common/secret/sds_api.cc: "Unexpected SDS secrets length", "Unexpected SDS
// secret"). The file is read once: the stand-in does not watch it (our files come from a
// ConfigMap, which changes only with a new pod); the files it names are watched
// (watched_directory).
func sdsSecretFile(cfg *tlsv3.SdsSecretConfig) (*tlsv3.Secret, error) {
	path := cfg.GetSdsConfig().GetPathConfigSource().GetPath()
	if path == "" {
		return nil, fmt.Errorf("SDS secret %s: only sds_config.path_config_source is implemented by the test stand-in", cfg.GetName())
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("paths must refer to an existing path in the system: '%s' does not exist", path)
	}
	resp := &discovery.DiscoveryResponse{}
	if err := loadFromFile(path, resp); err != nil {
		return nil, err
	}
	if errs := sdsFileRules.check(resp); len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", path, errors.Join(errs...))
	}
	if len(resp.GetResources()) != 1 {
		return nil, fmt.Errorf("%s: Unexpected SDS secrets length: %d", path, len(resp.GetResources()))
	}
	s := &tlsv3.Secret{}
	if err := resp.GetResources()[0].UnmarshalTo(s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := s.ValidateAll(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if s.GetName() != cfg.GetName() {
		return nil, fmt.Errorf("%s: Unexpected SDS secret (expecting %s): %s", path, cfg.GetName(), s.GetName())
	}
	for _, f := range []string{s.GetTlsCertificate().GetCertificateChain().GetFilename(), s.GetTlsCertificate().GetPrivateKey().GetFilename(), s.GetValidationContext().GetTrustedCa().GetFilename()} {
		if f != "" && !filepath.IsAbs(f) {
			return nil, fmt.Errorf("%s: %s: the test stand-in needs absolute file names", path, f)
		}
	}
	return s, nil
}

// healthListener turns the static listener into a HealthListener: one filter chain, one HTTP
// connection manager with an inline route configuration whose routes go to STATIC clusters.
func healthListener(l *listenerv3.Listener, clusters map[string]*clusterv3.Cluster) (*HealthListener, error) {
	if len(l.GetFilterChains()) != 1 || len(l.GetFilterChains()[0].GetFilters()) != 1 {
		return nil, errors.New("filter_chains: the test stand-in implements one chain with one filter (the HTTP connection manager)")
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		return nil, err
	}
	sa := l.GetAddress().GetSocketAddress()
	h := &HealthListener{Name: l.GetName(), Address: net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue())), StatPrefix: hcm.GetStatPrefix()}
	if n := len(hcm.GetHttpFilters()); n != 1 {
		return nil, fmt.Errorf("http_filters: %d filters; the test stand-in implements the router alone here", n)
	}
	vhs := hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhs) != 1 {
		return nil, errors.New("route_config.virtual_hosts: the test stand-in implements one virtual host (domains [\"*\"])")
	}
	for _, r := range vhs[0].GetRoutes() {
		sr := StaticRoute{Path: r.GetMatch().GetPath(), Headers: map[string]string{}, Cluster: r.GetRoute().GetCluster()}
		for _, hm := range r.GetMatch().GetHeaders() {
			sr.Headers[hm.GetName()] = hm.GetStringMatch().GetExact()
		}
		c := clusters[sr.Cluster]
		if c == nil {
			return nil, fmt.Errorf("route %s: unknown cluster '%s'", sr.Path, sr.Cluster)
		}
		if c.GetType() != clusterv3.Cluster_STATIC || c.GetTransportSocket() != nil || len(c.GetTypedExtensionProtocolOptions()) > 0 {
			return nil, fmt.Errorf("route %s: cluster %s: the test stand-in routes a static listener only to a STATIC plaintext HTTP/1.1 cluster", sr.Path, sr.Cluster)
		}
		ep, err := oneEndpoint(c)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", sr.Cluster, err)
		}
		if net.ParseIP(ep.GetAddress()) == nil {
			return nil, fmt.Errorf("cluster %s: malformed IP address: %s", sr.Cluster, ep.GetAddress())
		}
		sr.Upstream = net.JoinHostPort(ep.GetAddress(), fmt.Sprint(ep.GetPortValue()))
		sr.ConnectTimeout = 5 * time.Second
		if d := c.GetConnectTimeout(); d != nil {
			sr.ConnectTimeout = d.AsDuration()
		}
		h.Routes = append(h.Routes, sr)
	}
	return h, nil
}

// validateTypedConfigs checks the typed configs of the bootstrap against their proto rules,
// as Envoy does when a factory translates one (MessageUtil::validate); the bootstrap's own
// ValidateAll does not look inside an Any.
func validateTypedConfigs(b *bootstrapv3.Bootstrap) error {
	var errs []error
	check := func(where string, m proto.Message) {
		if v, ok := m.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
		}
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if m, err := f.GetTypedConfig().UnmarshalNew(); err == nil {
					check("listener "+l.GetName()+" filter "+f.GetName(), m)
					if hcm, ok := m.(*hcmv3.HttpConnectionManager); ok {
						for _, hf := range hcm.GetHttpFilters() {
							if hm, err := hf.GetTypedConfig().UnmarshalNew(); err == nil {
								check("listener "+l.GetName()+" http filter "+hf.GetName(), hm)
							}
						}
					}
				}
			}
		}
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if ts := c.GetTransportSocket(); ts != nil {
			if m, err := ts.GetTypedConfig().UnmarshalNew(); err == nil {
				check("cluster "+c.GetName()+" transport_socket", m)
			}
		}
		for k, a := range c.GetTypedExtensionProtocolOptions() {
			if m, err := a.UnmarshalNew(); err == nil {
				check("cluster "+c.GetName()+" "+k, m)
			}
		}
	}
	return errors.Join(errs...)
}
