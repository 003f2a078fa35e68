package snapshot

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Cluster tuning (why: docs/envoy-config.md#clusters).
const (
	apiserverConnectTimeout = 3 * time.Second
	extProcConnectTimeout   = 1 * time.Second
	// circuitBreakerLimit bounds connections, pending and active requests per cluster and
	// priority. Every watch holds one request (one stream; over HTTP/1.1 one connection) for
	// minutes; Envoy's default of 1024 would cap a control plane at about a thousand watchers.
	circuitBreakerLimit = 100_000
	retryLimit          = 10_000
	// apiserverIdleTimeout closes an upstream connection idle this long, before the
	// apiserver does: Go's net/http server (the apiserver's) closes a kept-alive
	// connection after 90s idle (k8s.io/apiserver pkg/server/secure_serving.go: IdleTimeout 90s, HTTP/2 too),
	// Envoy's default upstream idle timeout is 1h. With the apiserver closing first, Envoy
	// can write a request on a connection whose FIN is in flight: a reset after the request
	// was sent, which is a 503 UC that no retry_on we use retries (not connect-failure, not
	// reset-before-request, not refused-stream, no Retry-After). Closing at 50s, well below
	// 90s, leaves the race to Envoy's side, where it is harmless.
	apiserverIdleTimeout = 50 * time.Second
	// apiserverKeepaliveInterval and apiserverKeepaliveTimeout: every HTTP/2 connection to an
	// apiserver is pinged this often, and closed when no answer came this long after a ping
	// (Envoy's connection_keepalive). A frozen (SIGSTOP) or cut-off apiserver keeps its TCP
	// connections open, the kernel acknowledging them; without pings a watch on it would
	// never end and a request would wait for the route timeout. Closed, its streams are
	// reset: reads retry on another apiserver (the read variants retry resets), watches end
	// and client-go resumes them, meanwhile the health checks take it out.
	apiserverKeepaliveInterval = 10 * time.Second
	apiserverKeepaliveTimeout  = 5 * time.Second
)

// HTTP/2 flow control of the apiserver clusters (http2_protocol_options): stream window ×
// streams per connection ≤ connection window, so that no set of stalled streams (clients that
// stopped reading) can starve the others: 100 streams per connection (the apiserver's own
// default), a 1 MiB stream window, a 100 MiB connection window.
// Why: docs/envoy-config.md#http2-flow-control.
const (
	apiserverH2MaxStreams       = 100
	apiserverH2StreamWindow     = 1 << 20
	apiserverH2ConnectionWindow = apiserverH2MaxStreams * apiserverH2StreamWindow
)

// variant holds one thing in the two protocols of the apiserver clusters: HTTP/2 for every
// request but upgrades, HTTP/1.1 for upgrades.
type variant[T any] struct{ http2, http1 T }

// of is v's value for requests of kind k.
func (v variant[T]) of(k plan.RequestKind) T {
	if k.Upgrade {
		return v.http1
	}
	return v.http2
}

// healthCheckSocket is the transport_socket_matches entry (and the health check's
// transport_socket_match_criteria) with which every apiserver cluster's health checks speak
// HTTP/1.1 (ALPN http/1.1, whatever the cluster speaks) and present the proxy client
// certificate where there is one, while a caller cluster's requests present none. No endpoint carries the key in
// its envoy.transport_socket_match metadata, so requests always take the cluster's own
// transport socket.
const healthCheckSocket = "health-check"

// clusters returns every cluster, sorted by name, and the endpoints of the EDS ones. Each
// apiserver cluster (the plan's default or local one, and the serving-sets cluster) is
// emitted once per request kind (requestKinds, plan.RequestKind.Cluster names the variant):
// HTTP/2, or HTTP/1.1 for upgrades; with TLS that presents no client certificate for requests
// that carry the caller's own credentials, or, with a proxy client certificate configured,
// presents it, for requests whose identity the Lua filter set from a client certificate it
// verified.
func (b *builder) clusters() ([]*clusterv3.Cluster, []*endpointv3.ClusterLoadAssignment) {
	what := "apiserver clusters: "
	// The typed configs shared by every apiserver cluster are packed (and validated) once.
	socket := func(label string, withProxyCert bool, alpn string) *corev3.TransportSocket {
		return &corev3.TransportSocket{
			Name:       tlsTransportSocketName,
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: b.pack(what+label, b.upstreamTLS(withProxyCert, alpn))},
		}
	}
	proxyCert := len(b.cfg.Secrets.ProxyClientCert) > 0
	asCaller := variant[*corev3.TransportSocket]{socket("upstream TLS", false, "h2"), socket("upstream TLS, HTTP/1.1", false, "http/1.1")}
	var withProxyCert variant[*corev3.TransportSocket]
	if proxyCert {
		withProxyCert = variant[*corev3.TransportSocket]{socket("upstream TLS with the proxy certificate", true, "h2"), socket("upstream TLS with the proxy certificate, HTTP/1.1", true, "http/1.1")}
	}
	// Health checks speak HTTP/1.1 (the checker's codec) over a socket of their own: the
	// proxy certificate where there is one (the check asks as the health-check user), ALPN
	// http/1.1 whatever the cluster speaks. No endpoint carries the match label, so requests
	// keep the cluster's own socket.
	healthCheckCriteria := &structpb.Struct{Fields: map[string]*structpb.Value{"kube-mvp": structpb.NewStringValue(healthCheckSocket)}}
	hc := asCaller.http1
	if proxyCert {
		hc = withProxyCert.http1
	}
	healthCheckMatch := []*clusterv3.Cluster_TransportSocketMatch{{Name: healthCheckSocket, Match: healthCheckCriteria, TransportSocket: hc}}
	common := &corev3.HttpProtocolOptions{IdleTimeout: durationpb.New(apiserverIdleTimeout)}
	protocols := variant[*anypb.Any]{
		http2: b.pack(what+"HTTP/2 protocol options", &httpv3.HttpProtocolOptions{
			CommonHttpProtocolOptions: common,
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{
					ConnectionKeepalive: &corev3.KeepaliveSettings{
						Interval: durationpb.New(apiserverKeepaliveInterval),
						Timeout:  durationpb.New(apiserverKeepaliveTimeout),
					},
					MaxConcurrentStreams:        wrapperspb.UInt32(apiserverH2MaxStreams),
					InitialStreamWindowSize:     wrapperspb.UInt32(apiserverH2StreamWindow),
					InitialConnectionWindowSize: wrapperspb.UInt32(apiserverH2ConnectionWindow),
				}},
			}},
		}),
		http1: b.pack(what+"HTTP/1.1 protocol options", &httpv3.HttpProtocolOptions{
			CommonHttpProtocolOptions: common,
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &corev3.Http1ProtocolOptions{}},
			}},
		}),
	}
	addrs := b.endpointAddresses()

	var clusters []*clusterv3.Cluster
	var cla []*endpointv3.ClusterLoadAssignment
	// add emits each variant of the cluster named name with endpoints lb (by apiserver ID, in
	// order ids); the front-proxy variants leave out the dangerous apiservers
	// (plan.Plan.ProxyCertExcluded): they take the proxy certificate for an ordinary client's.
	add := func(name string, ids []string, lb map[string]*endpointv3.LbEndpoint, subsets *clusterv3.Cluster_LbSubsetConfig) {
		var all, withCert []*endpointv3.LbEndpoint
		for _, id := range ids {
			if e := lb[id]; e != nil {
				all = append(all, e)
				if !b.p.ProxyCertExcluded.Contains(id) {
					withCert = append(withCert, e)
				}
			}
		}
		emit := func(name string, tls *corev3.TransportSocket, protocol *anypb.Any, lb []*endpointv3.LbEndpoint) {
			c := b.apiserverCluster(name, tls, map[string]*anypb.Any{httpProtocolOptionsKey: protocol})
			c.LbSubsetConfig = subsets
			c.TransportSocketMatches = healthCheckMatch
			c.HealthChecks[0].TransportSocketMatchCriteria = healthCheckCriteria
			assignment := &endpointv3.ClusterLoadAssignment{ClusterName: name}
			if len(lb) > 0 {
				assignment.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lb}}
			}
			clusters, cla = append(clusters, c), append(cla, assignment)
		}
		for _, k := range b.requestKinds() {
			tls, members := asCaller, all
			if k.ProxyCert {
				tls, members = withProxyCert, withCert
			}
			emit(k.Cluster(name).String(), tls.of(k), protocols.of(k), members)
		}
	}
	for _, c := range b.p.Clusters {
		if c.Role == plan.RoleSubset || c.Role == plan.RoleLingering {
			continue // a serving set: a subset of the serving-sets cluster
		}
		add(c.Name, c.Members, addrs, nil)
	}
	add(contract.ClusterServingSets, b.p.Hosts, b.servingSetEndpoints(addrs), servingSetsSubsets)
	clusters = append(clusters, b.extProcCluster())
	slices.SortFunc(clusters, func(a, b *clusterv3.Cluster) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(cla, func(a, b *endpointv3.ClusterLoadAssignment) int {
		return strings.Compare(a.GetClusterName(), b.GetClusterName())
	})
	return clusters, cla
}

// apiserverCluster is the EDS cluster name of an apiserver cluster of the plan, with
// transport socket tls: the same resource whoever is inside it.
func (b *builder) apiserverCluster(name string, tls *corev3.TransportSocket, protocol map[string]*anypb.Any) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                          name,
		ClusterDiscoveryType:          &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:              &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()},
		ConnectTimeout:                durationpb.New(apiserverConnectTimeout),
		LbPolicy:                      clusterv3.Cluster_LEAST_REQUEST,
		TransportSocket:               tls,
		TypedExtensionProtocolOptions: protocol,
		CircuitBreakers:               circuitBreakers(),
		// TCP keepalive on every connection (Envoy sets none by default): a host that
		// vanished or a cut network closes an HTTP/1.1 upgrade (exec, attach, port-forward)
		// within about a minute instead of never; HTTP/2 connections have their pings too.
		UpstreamConnectionOptions: &clusterv3.UpstreamConnectionOptions{TcpKeepalive: &corev3.TcpKeepalive{
			KeepaliveTime:     wrapperspb.UInt32(30),
			KeepaliveInterval: wrapperspb.UInt32(10),
			KeepaliveProbes:   wrapperspb.UInt32(3),
		}},
		OutlierDetection: &clusterv3.OutlierDetection{
			SplitExternalLocalOriginErrors: true,
			// Two refused connections in a row: the process is not listening (a stopping
			// apiserver closes its listener before its Lease goes), so the request's
			// last retry already avoids it.
			ConsecutiveLocalOriginFailure:          wrapperspb.UInt32(2),
			EnforcingConsecutiveLocalOriginFailure: wrapperspb.UInt32(100),
			EnforcingLocalOriginSuccessRate:        wrapperspb.UInt32(0),
			EnforcingConsecutive_5Xx:               wrapperspb.UInt32(0),
			EnforcingConsecutiveGatewayFailure:     wrapperspb.UInt32(0),
			EnforcingSuccessRate:                   wrapperspb.UInt32(0),
			Interval:                               durationpb.New(5 * time.Second),
			BaseEjectionTime:                       durationpb.New(10 * time.Second),
			MaxEjectionTime:                        durationpb.New(60 * time.Second),
			MaxEjectionPercent:                     wrapperspb.UInt32(100),
			SuccessfulActiveHealthCheckUnejectHost: wrapperspb.Bool(true),
		},
		HealthChecks: []*corev3.HealthCheck{{
			// The checker speaks HTTP/1.1 (its codec_client_type default) even on an HTTP/2
			// cluster, and its connections offer the ALPN of the socket they use unless told
			// otherwise (source/common/upstream/health_checker_impl.cc,
			// initTransportSocketOptions): an apiserver offered h2 would take its HTTP/1.1
			// request for a broken HTTP/2 preface. The health-check socket
			// (transport_socket_matches) offers http/1.1 too; this holds where it is not used.
			TlsOptions: &corev3.HealthCheck_TlsOptions{AlpnProtocols: []string{"http/1.1"}},
			Timeout:    durationpb.New(2 * time.Second),
			Interval:   durationpb.New(5 * time.Second),
			// An unhealthy host is checked every second (Envoy: HealthCheckerImplBase::interval
			// takes unhealthy_interval, or no_traffic_interval for a cluster that never had a
			// connection): a restarted apiserver takes requests about a second after it is
			// ready, not a whole interval later. Healthy hosts of an idle cluster are checked
			// every 10s (no_traffic_healthy_interval).
			UnhealthyInterval:        durationpb.New(time.Second),
			NoTrafficInterval:        durationpb.New(time.Second),
			NoTrafficHealthyInterval: durationpb.New(10 * time.Second),
			UnhealthyThreshold:       wrapperspb.UInt32(2),
			HealthyThreshold:         wrapperspb.UInt32(1),
			HealthChecker: &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{
				Host: b.cfg.UpstreamServerName,
				Path: "/readyz",
				// The check presents the proxy client certificate (the front-proxy TLS; a
				// caller cluster's health checks take it by transport_socket_match_criteria),
				// and an apiserver answers 401 to that certificate without a user header. So
				// it asks as a user of its own, allowed /readyz by Kubernetes' default
				// system:public-info-viewer and by the chart's own role where a hardened
				// cluster removed that: anonymous requests may be off.
				RequestHeadersToAdd: healthCheckIdentityHeaders(b.p.RequestHeaders),
			}},
		}},
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}},
		// EDS (the identity Leases) decides membership: an apiserver whose Lease is gone,
		// or that left the all-apiservers set, leaves the cluster with the EDS update.
		// Without this, Envoy keeps a removed host that still passes active health checks
		// (PENDING_DYNAMIC_REMOVAL, BaseDynamicClusterImpl::updateDynamicHostList in
		// source/common/upstream/upstream_impl.cc), sending it traffic for as long as its
		// /readyz answers: the default cluster would keep a joining apiserver it holds out,
		// or a forgotten one.
		IgnoreHealthOnHostRemoval: true,
		// No metadata, nor anything else that changes with membership or role: Envoy
		// treats any change of a cluster's CDS resource as a new cluster
		// (ClusterManagerImpl::addOrUpdateCluster compares the config's hash; a different
		// one is warmed up from scratch: hosts with no health or outlier state, new
		// connection pools). Who is inside is in the endpoints (EDS: apiserverID and
		// hostname); a cluster's name says its role, and xds-server's /debug/topology
		// which ones linger.
	}
}

// servingSetsSubsets makes the serving-sets cluster choose among the members of the serving
// set a request's dynamic metadata names (contract.LBSetKey in contract.MetadataNamespaceLB,
// set by extproc; the router merges it into the route's metadata_match). Each host lists
// every set it is in (list_as_any). No set named, or one no host lists: no host, a 503 UH
// (NO_FALLBACK) — never an apiserver that may not serve the request.
var servingSetsSubsets = &clusterv3.Cluster_LbSubsetConfig{
	FallbackPolicy:  clusterv3.Cluster_LbSubsetConfig_NO_FALLBACK,
	SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{{Keys: []string{contract.LBSetKey}}},
	ListAsAny:       true,
}

// servingSetEndpoints are the hosts of the serving-sets cluster (plan.Plan.Hosts), by ID, each
// with the serving sets it is in: its own one-member set, and every set of the plan (current
// or lingering) that has it as a member.
func (b *builder) servingSetEndpoints(addrs map[string]*endpointv3.LbEndpoint) map[string]*endpointv3.LbEndpoint {
	setsOf := map[string][]string{}
	for _, id := range b.p.Hosts {
		setsOf[id] = []string{plan.SubsetClusterName(b.t, topology.ServerSet{id})}
	}
	for _, c := range b.p.Clusters {
		if c.Role != plan.RoleSubset && c.Role != plan.RoleLingering {
			continue
		}
		for _, id := range c.Members {
			if _, ok := setsOf[id]; !ok {
				b.errorf("serving set %s: member %s is no host of %s", c.Name, id, contract.ClusterServingSets)
				continue
			}
			setsOf[id] = append(setsOf[id], c.Name)
		}
	}
	lb := map[string]*endpointv3.LbEndpoint{}
	for _, id := range b.p.Hosts {
		e := addrs[id]
		if e == nil {
			continue
		}
		sets := slices.Compact(slices.Sorted(slices.Values(setsOf[id])))
		values := make([]*structpb.Value, len(sets))
		for i, name := range sets {
			values[i] = structpb.NewStringValue(name)
		}
		withSets := &endpointv3.LbEndpoint{HostIdentifier: e.HostIdentifier, Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			MetadataNamespace:            e.GetMetadata().GetFilterMetadata()[MetadataNamespace],
			contract.MetadataNamespaceLB: {Fields: map[string]*structpb.Value{contract.LBSetKey: structpb.NewListValue(&structpb.ListValue{Values: values})}},
		}}}
		lb[id] = withSets
	}
	return lb
}

func circuitBreakers() *clusterv3.CircuitBreakers {
	return &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
		Priority:           corev3.RoutingPriority_DEFAULT,
		MaxConnections:     wrapperspb.UInt32(circuitBreakerLimit),
		MaxPendingRequests: wrapperspb.UInt32(circuitBreakerLimit),
		MaxRequests:        wrapperspb.UInt32(circuitBreakerLimit),
		MaxRetries:         wrapperspb.UInt32(retryLimit),
		TrackRemaining:     true,
	}}}
}

// endpointAddresses makes the endpoint of every host (plan.Plan.Hosts: the live apiservers and
// the remembered ones), by ID. EDS endpoints must be
// IP:port (Envoy does not resolve names in EDS); an apiserver with another address is
// reported and left out.
func (b *builder) endpointAddresses() map[string]*endpointv3.LbEndpoint {
	out := map[string]*endpointv3.LbEndpoint{}
	for _, id := range b.p.Hosts {
		s, _ := b.t.Server(id)
		host, portStr, err := net.SplitHostPort(s.Address)
		if err != nil {
			b.errs = append(b.errs, &AddressError{APIServer: s.ID, Hostname: s.Hostname, Address: s.Address, Reason: "is not host:port"})
			continue
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || port == 0 {
			b.errs = append(b.errs, &AddressError{APIServer: s.ID, Hostname: s.Hostname, Address: s.Address, Reason: "has no valid port"})
			continue
		}
		if net.ParseIP(host) == nil {
			b.errs = append(b.errs, &AddressError{APIServer: s.ID, Hostname: s.Hostname, Address: s.Address, Reason: "is not an IP address (EDS endpoints cannot be DNS names)"})
			continue
		}
		md, err := structpb.NewStruct(map[string]any{"apiserverID": s.ID, "hostname": s.Hostname})
		if err != nil {
			b.errorf("endpoint of apiserver %s: metadata: %w", s.ID, err)
			continue
		}
		out[id] = &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address:  socketAddress(host, uint32(port)),
				Hostname: s.Hostname,
			}},
			Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespace: md}},
		}
	}
	return out
}

// extProcCluster is the static cluster of cmd/extproc: gRPC, so HTTP/2, over a unix socket or
// TCP (STRICT_DNS when the host is a name).
func (b *builder) extProcCluster() *clusterv3.Cluster {
	a := b.cfg.extProc
	var addr *corev3.Address
	discovery := clusterv3.Cluster_STATIC
	if a.pipe != "" {
		addr = &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: a.pipe}}}
	} else {
		addr = socketAddress(a.host, a.port)
		if !a.isIP {
			discovery = clusterv3.Cluster_STRICT_DNS
		}
	}
	return &clusterv3.Cluster{
		Name:                 ExtProcClusterName,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: discovery},
		ConnectTimeout:       durationpb.New(extProcConnectTimeout),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{httpProtocolOptionsKey: b.pack("cluster "+ExtProcClusterName+": HTTP protocol options", &httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
			}},
		})},
		// One ext_proc stream per request in flight; watches keep theirs open.
		CircuitBreakers: circuitBreakers(),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: ExtProcClusterName,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}},
			}}}},
		},
	}
}

// healthCheckIdentityHeaders name the health-check user (contract.HealthCheckUser), in the
// header the apiservers read; it gets no group beyond the system:authenticated every
// authenticated user gets.
func healthCheckIdentityHeaders(h topology.RequestHeaders) []*corev3.HeaderValueOption {
	// Under every user name: each apiserver takes the first of its own names that is set.
	var out []*corev3.HeaderValueOption
	for _, name := range h.User {
		out = append(out, &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: name, Value: contract.HealthCheckUser},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
	}
	return out
}
