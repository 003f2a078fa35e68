package dataplane

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpoptionsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Clusters, compiled: load balancing, health checks, outlier detection, upstream TLS.

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
