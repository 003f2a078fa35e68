// Package dataplane is a test-only stand-in for Envoy: it consumes kube-mvp's xDS (over ADS,
// or from a `xds-server translate -o json` dump) and executes exactly the subset of Envoy that
// our configuration uses, the way Envoy documents it: the listener with downstream TLS from
// SDS, the HTTP connection manager (early header mutation, x-forwarded-client-cert,
// x-forwarded-for, upgrades, local replies), the HTTP filters in their configured order —
// Envoy's Lua filter (lua.go: the subset of its API internal/snapshot/identity.lua uses, on an
// embedded Lua 5.1 VM) and the ext_proc filter —, route matching (again after a filter
// clears the route cache) and the
// router (cluster / cluster_header, retries), and clusters with EDS, upstream TLS, health
// checks, outlier detection and least-request balancing.
//
// The Envoy release modelled is Options.EnvoyVersion (1.36 to 1.40, default 1.40;
// envoyversion.go lists where they differ and cites each difference). The node reports it as
// its build version.
//
// Among the modelled behaviours:
//   - x-forwarded-for (use_remote_address): the downstream address is appended, except that a
//     loopback peer is replaced by the server's own address, as Envoy does (localAddress).
//   - RE2 program size: a safe_regex whose RE2 program is larger than Envoy's error level
//     (re2.max_program_size.error_level, default 100; no runtime is modelled) is a NACK with
//     Envoy's message (config.go, compileRE2). The size is measured by libre2 through cgo
//     (internal/re2); matching uses Go's regexp.
//   - Subset load balancing (subset.go, Envoy's SubsetLoadBalancer): lb_subset_config with
//     fallback_policy NO_FALLBACK or ANY_ENDPOINT, subset_selectors (keys, fallback_policy
//     NOT_DEFINED, NO_FALLBACK or ANY_ENDPOINT) and list_as_any, over the endpoints'
//     filter_metadata["envoy.lb"], recomputed on every EDS update (a host's metadata changes
//     in place: it keeps its health and outlier state). The criteria are the route's
//     metadata_match["envoy.lb"] with the request's "envoy.lb" dynamic metadata merged over
//     it, once per request (retries keep them). No host is a 503 with flag UH. Stats:
//     cluster.<name>.lb_subsets_active (gauge), lb_subsets_created, lb_subsets_removed,
//     lb_subsets_selected, lb_subsets_fallback (Envoy's names; Envoy has no lb_subsets_none:
//     a request that got no host counts in upstream_cx_none_healthy).
//   - ext_proc dynamic metadata: the namespaces of a ProcessingResponse's dynamic_metadata
//     listed in metadata_options.receiving_namespaces.untyped become the request's dynamic
//     metadata; others are dropped.
//   - Active health checks per host (HealthCheckerImplBase): each host's session schedules
//     its next check by its last result: interval / unhealthy_interval, or
//     healthy_edge_interval / unhealthy_edge_interval while a threshold is pending, once the
//     cluster's pool made a connection (upstream_cx_total; health-check connections do not
//     count); no_traffic_healthy_interval / no_traffic_interval before. A failed response
//     (not 200) marks a host unhealthy at once; only network failures and timeouts count
//     towards unhealthy_threshold.
//   - HTTP/2 upstreams (h2pool.go): a cluster with explicit_http_config.http2_protocol_options
//     gets Envoy's multiplexed pool: per host, connections (TLS with the cluster's ALPN; the
//     HTTP/2 codec whatever ALPN negotiated, as Envoy's explicit HTTP/2 pool) carrying
//     concurrent streams up to the lower of the server's SETTINGS_MAX_CONCURRENT_STREAMS
//     and max_concurrent_streams (default 1024), another connection only when none has
//     room; common_http_protocol_options.idle_timeout closes a
//     connection without streams. Each connection is one http2.ClientConn used through
//     ClientConn.RoundTrip, which never re-sends a request by itself. A stream the server
//     refused (REFUSED_STREAM, or above a GOAWAY's last-stream-id) is Envoy's
//     RemoteRefusedStreamReset, another RST_STREAM RemoteReset (both UR; retried by
//     refused-stream resp. reset); the connection closing under a stream is
//     ConnectionTermination (UC) as for HTTP/1.1.
//   - HTTP/2 flow control, upstream (initial_stream_window_size, initial_connection_window_size;
//     Envoy 1.36's defaults 16 MiB and 24 MiB) and downstream (the HCM's
//     http2_protocol_options, max_concurrent_streams too): the windows are advertised as
//     configured and data is credited back, stream and connection window alike, only as it
//     is passed on (a response body as the router writes it to the client, a request body as
//     it is forwarded upstream), so a stream whose reader stopped holds up to its stream
//     window of the connection window, as in Envoy (TestH2SlowReaders).
//   - connection_keepalive (interval, timeout, interval_jitter): a PING every interval plus
//     up to interval_jitter percent (default 15), the connection closed (no flush) when its
//     ACK has not come within timeout, any bytes received meanwhile extending the wait;
//     counted in cluster.<name>.http2.keepalive_timeout. Streams on it are reset (UC), a
//     response already streaming is cut off.
//   - An HTTP/1 upgrade routed to an HTTP/2 cluster goes out as an RFC 8441 extended CONNECT,
//     as Envoy's HTTP/2 client codec always sends it; a server without extended CONNECT
//     resets the stream (503 UR).
//   - Downstream TLS session resumption (listener.go, downstreamTLSConfig): session tickets
//     unless disable_stateless_session_resumption, TLS 1.2 and 1.3, with one key per bound
//     listener; a resumed connection's certificate is presented (XFCC, subject, digest) but
//     not validated (the Lua API's peerCertificateValidated() is false), as BoringSSL runs no
//     verification callback on resumption.
//   - The HTTP health checker speaks HTTP/1.1 (codec_client_type's default), for HTTP/2
//     clusters too, over a connection offering the transport socket's ALPN unless
//     health_checks.tls_options.alpn_protocols overrides it: with ALPN h2 and no override an
//     apiserver negotiates h2 and every check fails.
//   - Graceful drain, Envoy 1.36 and 1.37 (drain.go, DRAIN.md): --drain-time-s and --drain-strategy,
//     the admin's POST /drain_listeners (graceful, skip_exit), the connection managers'
//     drain on each response (HTTP/1.1 Connection: close, HTTP/2 GOAWAY), deliberately no
//     notification to a connection that sends no response, the listeners' stop after the
//     drain time; the gauges downstream_rq_active and downstream_cx_active, /stats with
//     filter and format.
//
// Production always runs real Envoy. This package exists so that our tests execute our
// configuration rather than only validate it. Anything in a resource that this data plane
// does not implement is rejected (NACKed) with an error naming the field, so a test can never
// pass on configuration that was silently ignored (see allowlist.go). Beyond that, it refuses
// what Envoy refuses when it loads a resource (envoychecks.go); ENVOY_CHECKS.md lists every
// such check of the resources and extensions we use and how this data plane stands to it.
//
// The bootstrap (bootstrap.go, BootstrapOptions; test/cmd/envoy-stand-in takes Envoy's
// command line): the -c file (YAML or JSON by its name, as Envoy) with --config-yaml merged in,
// read strictly (unknown fields refused, any field not implemented named, bootstrapRules);
// --service-node and --service-cluster override node.id and node.cluster; ADS to the static
// STRICT_DNS cluster, its name resolved at every (re)connect and every dns_refresh_rate
// (xdscluster.go); mutual TLS from the SDS files (path_config_source), the certificate files
// re-read when a file is moved into their watched_directory (inotify, as Envoy: a kubelet
// ..data swap), the server's URI SAN matched; the static listener envoy-health with exact
// path and header routes to the admin's STATIC cluster; the admin's /ready (Envoy's body and
// status) and /stats/prometheus.
//
// Documented deviations from Envoy, all test conveniences:
//   - Options.ListenerAddress overrides a listener's socket address (tests need free ports),
//     the static health listener's too; Options.LookupHost replaces the resolver of the
//     STRICT_DNS cluster (the chart's Service name resolves only in a cluster).
//   - Bootstrap: an SDS path_config_source file is read once (Envoy also watches it for
//     moves); the static health listener speaks HTTP/1.1 only (codec AUTO also takes
//     HTTP/2 with prior knowledge); /stats/prometheus has counters and gauges only (no
//     histograms: the stand-in keeps none of Envoy's), named with Envoy's default tag
//     extractors (tags.go).
//   - Listeners accept connections before the initial configuration's clusters warmed (a
//     request then gets "cluster not found"); Envoy starts its workers only once the
//     cluster manager initialized. WaitReady waits for the warm-up.
//   - The router ignores the request headers with which a client Envoy treats as internal
//     (its connection manager removes them only from external requests) can widen the
//     route's retry policy: x-envoy-retry-on, x-envoy-max-retries,
//     x-envoy-retriable-status-codes, x-envoy-retriable-header-names. A gap only for a
//     configuration that lets them through: kube-mvp's listener strips every x-envoy-*
//     request header (early header mutation) before any filter or route.
//   - The router buffers request bodies of up to 1 MiB so that retries can replay them (Envoy
//     buffers while streaming); larger bodies are streamed and not retried, as in Envoy.
//   - The Lua filter runs envoy_on_request only (no envoy_on_response, body or trailers), opens
//     only Lua's base, string, table and math libraries, and cannot modify pseudo-headers; any
//     other API is a script runtime error here.
//   - The ext_proc response-headers step (processing_mode or mode_override
//     response_header_mode SEND) runs for upstream responses only; in Envoy a local reply
//     the router sends after the request-headers step also passes through it.
//   - HTTP/2 pool: a host's connections are established one at a time (Envoy may connect
//     several at once when pending streams exceed what the connecting ones can take). Before
//     the server's SETTINGS a new connection takes up to 100 streams (x/net's assumption;
//     Envoy assumes its own max_concurrent_streams, 1024 by default since 1.36); a server refuses
//     the excess in both (REFUSED_STREAM, retried by refused-stream). A replaced cluster
//     version's connections get a GOAWAY and close when their streams ended.
//   - Downstream TLS is Go's server, which resumes by ticket only: the TLS 1.2 session-ID
//     cache (disable_stateful_session_resumption unset, Envoy's default) is not modelled, and
//     such a client gets a full handshake where Envoy would resume it (BoringSSL has no
//     stateful resumption in TLS 1.3, so there is nothing more to model). Tickets are Go's
//     format, their key lives as long as the bound listener (Envoy's BoringSSL keys live as
//     long as the SSL_CTX, rebuilt on a listener or secret update), and Go refuses a ticket
//     whose certificate expired or no longer verifies against the client CA (Envoy refuses
//     it on a client CA change, by the session ID context). session_ticket_keys* and
//     session_timeout are not implemented.
//   - connection_keepalive: "a frame received extends the PING ACK timeout" is "bytes read
//     from the connection" here.
//   - A client certificate Go's crypto/x509 cannot parse (a PrintableString with "é", a
//     VisibleString or UniversalString value, an OID arc of 32 bits) fails the handshake:
//     Go's TLS server parses every certificate. BoringSSL parses such a certificate, and
//     Envoy runs the Lua filter, whose identity script answers 401 for it (it reads the
//     certificate as Go does, as the apiserver would refuse it): refused in both, by the
//     handshake here. Of the names Go parses, the handshake refuses what BoringSSL refuses
//     (x509name.go: a noncharacter in a UTF8String, data after an attribute's value); the
//     rest of the certificate is Go's to refuse. Subjects are printed as BoringSSL prints
//     them (x509name.go: its object names, string decoding and escapes).
//   - HTTP/2 flow control: Envoy credits data on arrival until its buffers towards the
//     reader pass their watermarks (then read-disables the stream and keeps the rest
//     unconsumed, codec_impl.cc ConnectionImpl::onData); Go's HTTP/2 client and server
//     credit it as it is read, buffering up to the stream window meanwhile. What holds the
//     connection window is the same; where the bytes wait, and how much beyond the window
//     (Envoy's per_connection_buffer_limit_bytes watermarks), is not. An upstream connection
//     window below 131070 bytes is advertised as 131070 (x/net's client raises the window by
//     a configured amount, 0 meaning its 1 GiB default). The downstream HTTP/2 server is
//     x/net/http2's, configured per connection at accept.
//   - An upgrade over an HTTP/2 cluster that the server accepts (2xx to the extended
//     CONNECT; Envoy answers 101 and tunnels over the stream) is not tunnelled: the
//     downstream stream is reset. A server that ignores ALPN and speaks HTTP/1.1 to the
//     HTTP/2 preface fails the stream as a connection termination (UC); Envoy's codec would
//     report a protocol error (UPE).
package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Options configure a DataPlane.
type Options struct {
	XDSAddress string // ADS server host:port; or
	ConfigJSON []byte // a `xds-server translate -o json` dump instead of ADS
	// XDSTLS is the bootstrap's TLS to xds-server; nil speaks plaintext gRPC.
	XDSTLS *XDSTLS
	NodeID string // Envoy node id
	// LocalAPIServer, if set, is sent as node metadata kube-mvp.io/local-apiserver (sidecar).
	LocalAPIServer string
	// ListenerAddress maps a listener name to a "host:port" that replaces the listener's
	// socket address (e.g. "127.0.0.1:0"). A documented test-only deviation: tests need free
	// ports.
	ListenerAddress map[string]string
	AdminAddress    string // default "127.0.0.1:0"
	Logger          *slog.Logger
	// EnvoyVersion is the Envoy release modelled where releases differ in what kube-mvp's
	// configuration uses (envoyversion.go), "1.N" or "1.N.P"; default the newest modelled.
	EnvoyVersion string

	// The rest is what a bootstrap sets (BootstrapOptions, bootstrap.go); tests that start
	// the data plane directly leave it alone.

	// XDSCluster is the bootstrap's STRICT_DNS cluster to xds-server, instead of XDSAddress:
	// its host name is resolved at every (re)connect and every DNS refresh (xdscluster.go).
	XDSCluster *XDSCluster
	// NodeCluster is the node's cluster (node.cluster, --service-cluster); default "kube-mvp".
	NodeCluster string
	// NodeMetadata is the node's metadata (node.metadata); LocalAPIServer is set over it.
	NodeMetadata map[string]any
	// RejectUnknownDynamicFields refuses (NACKs) a resource with fields this data plane's
	// protos do not know, as Envoy's --reject-unknown-dynamic-fields; without it such a
	// resource is accepted with a warning and counted in server.dynamic_unknown_fields.
	RejectUnknownDynamicFields bool
	// HealthListener is the bootstrap's static listener to the admin (envoy-health).
	HealthListener *HealthListener
	// LookupHost resolves XDSCluster's host name; nil is the system resolver. A test-only
	// deviation, as ListenerAddress: the chart's Service name resolves only in a cluster.
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// Drain is --drain-time-s and --drain-strategy (drain.go, DRAIN.md); nil is Envoy's
	// defaults, 600 s and gradual.
	Drain *DrainOptions
}

// typeOrder is the order in which types are reported and dumped.
var typeOrder = []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType, resource.SecretType}

// DataPlane is a running test data plane.
type DataPlane struct {
	opts    Options
	log     *slog.Logger
	stats   *stats
	version envoyVersion // the release modelled

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.RWMutex
	cfg       *config                  // applied configuration (immutable snapshot, replaced on apply)
	versions  map[string]string        // type URL -> last ACKed version
	nacks     []string                 // every NACK error detail
	listeners map[string]*liveListener // by name
	clusters  map[string]*liveCluster  // by name (runtime state survives updates)
	readyCh   chan struct{}            // closed when ready
	ready     bool
	closed    bool
	// listenersStopped: /drain_listeners stopped the listeners (stopListeners).
	listenersStopped bool
	extproc          map[string]*extProcClient // gRPC clients by cluster+address

	admin     *http.Server
	adminAddr string
	health    *http.Server
	healthAdr string
	healthLn  net.Listener

	drain *drainManager // the server's drain manager (drain.go)
}

// Start starts the data plane: the admin server, then ADS (or the static configuration).
// It returns once the configuration source is set up; use WaitReady to wait for the first
// complete configuration.
func Start(ctx context.Context, opts Options) (*DataPlane, error) {
	sources := 0
	for _, set := range []bool{opts.XDSAddress != "", opts.XDSCluster != nil, opts.ConfigJSON != nil} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return nil, errors.New("dataplane: exactly one of XDSAddress, XDSCluster and ConfigJSON must be set")
	}
	if opts.NodeID == "" {
		opts.NodeID = "kube-mvp-test-dataplane"
	}
	if opts.AdminAddress == "" {
		opts.AdminAddress = "127.0.0.1:0"
	}
	version, err := parseEnvoyVersion(opts.EnvoyVersion)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &DataPlane{
		opts:      opts,
		log:       log,
		stats:     newStats(),
		cfg:       emptyConfig(),
		versions:  map[string]string{},
		listeners: map[string]*liveListener{},
		clusters:  map[string]*liveCluster{},
		readyCh:   make(chan struct{}),
		extproc:   map[string]*extProcClient{},
		version:   version,
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	drain := DrainOptions{Time: defaultDrainTime, Strategy: DrainGradual}
	if opts.Drain != nil {
		drain = *opts.Drain
	}
	d.drain = newDrainManager(drain)

	lis, err := net.Listen("tcp", opts.AdminAddress)
	if err != nil {
		return nil, fmt.Errorf("dataplane: admin listener: %w", err)
	}
	d.adminAddr = lis.Addr().String()
	// The admin's own connection manager, stats under http.admin. as Envoy's
	// (AdminImpl), takes its drain decision from the server's drain manager, as Envoy's
	// (AdminImpl::createNetworkFilterChain passes server_.drainManager()).
	adminHandler := d.adminHandler()
	d.admin = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d.stats.inc("http.admin.downstream_rq_total")
			w, end := d.beginStream("http.admin.", w, r)
			defer end()
			adminHandler.ServeHTTP(w, r)
		}),
		ConnContext: connContext,
		ConnState:   d.countConns(func() string { return "http.admin." }),
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		_ = d.admin.Serve(lis)
	}()

	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.watchSecretFiles()
	}()
	if opts.HealthListener != nil {
		if err := d.startHealthListener(*opts.HealthListener); err != nil {
			d.Close()
			return nil, err
		}
	}
	if opts.ConfigJSON != nil {
		if err := d.loadStatic(opts.ConfigJSON); err != nil {
			d.Close()
			return nil, err
		}
		return d, nil
	}
	if err := d.startADS(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// ListenerAddr is the bound host:port of a listener, "" until it is applied.
func (d *DataPlane) ListenerAddr(name string) string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if l := d.listeners[name]; l != nil {
		return l.addr
	}
	return ""
}

// WaitReady waits until listeners, routes, clusters, endpoints and secrets have all been
// applied (ACKed) at least once, as far as the configuration needs them (a configuration
// without TLS refers to no secret and gets none), every listener is bound and every cluster warmed.
func (d *DataPlane) WaitReady(ctx context.Context) error {
	select {
	case <-d.readyCh:
		return nil
	case <-ctx.Done():
		d.mu.RLock()
		defer d.mu.RUnlock()
		return fmt.Errorf("dataplane not ready (acked %v, nacks %q): %w", d.versions, d.nacks, ctx.Err())
	}
}

// Stat returns one counter of the admin's /stats (0 if it does not exist).
func (d *DataPlane) Stat(name string) uint64 { return d.stats.get(name) }

// Gauge returns one gauge of the admin's /stats (0 if it does not exist).
func (d *DataPlane) Gauge(name string) int64 { return d.stats.getGauge(name) }

// AdminURL is the admin server's base URL, http://host:port.
func (d *DataPlane) AdminURL() string { return "http://" + d.adminAddr }

// Versions returns type URL -> last ACKed version.
func (d *DataPlane) Versions() map[string]string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make(map[string]string, len(d.versions))
	for k, v := range d.versions {
		out[k] = v
	}
	return out
}

// NACKs returns every NACK error detail sent so far.
func (d *DataPlane) NACKs() []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return slices.Clone(d.nacks)
}

// Close stops everything: ADS, listeners, health checks, the admin server.
func (d *DataPlane) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	listeners := d.listeners
	d.listeners = map[string]*liveListener{}
	clusters := d.clusters
	d.clusters = map[string]*liveCluster{}
	ep := d.extproc
	d.extproc = map[string]*extProcClient{}
	d.mu.Unlock()

	d.cancel()
	d.drain.stop()
	for _, l := range listeners {
		l.close()
	}
	for _, c := range clusters {
		c.stop()
	}
	for _, c := range ep {
		c.conn.Close()
	}
	if d.admin != nil {
		d.admin.Close()
	}
	if d.health != nil {
		d.health.Close()
	}
	d.wg.Wait()
	return nil
}

func (d *DataPlane) config() *config {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.cfg
}

func (d *DataPlane) cluster(name string) *liveCluster {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.clusters[name]
}

// Listeners returns the names of the bound listeners, sorted.
func (d *DataPlane) Listeners() []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return sortedNames(d.listeners)
}
