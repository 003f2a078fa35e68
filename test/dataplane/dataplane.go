// Package dataplane is a test-only stand-in for Envoy: it consumes kube-mvp's xDS (over ADS,
// or from a `xds-server translate -o json` dump) and executes exactly the subset of Envoy that
// our configuration uses, the way Envoy documents it. Anything in a resource it does not
// implement is rejected (NACKed) with an error naming the field (allowlist.go), so a test can
// never pass on configuration that was silently ignored. The Envoy release modelled is
// Options.EnvoyVersion (envoyversion.go). Production always runs real Envoy.
//
// What it models, its bootstrap, and every deviation from Envoy: test/dataplane/README.md.
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
