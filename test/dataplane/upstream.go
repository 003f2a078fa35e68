package dataplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
)

// liveHost is one upstream host and its runtime state.
type liveHost struct {
	address string // host:port, or "unix:" + path: the host's identity across EDS updates
	// desc is the host's hostname and metadata, which an EDS update may change in place, as
	// Envoy's BaseDynamicClusterImpl::updateDynamicHostList (source/common/upstream/
	// upstream_impl.cc) updates an existing host's metadata: the host, with its health and
	// outlier state, stays.
	desc   atomic.Pointer[hostCfg]
	active atomic.Int64 // requests in flight (least request)

	mu            sync.Mutex
	hcPending     bool // no active health check result yet
	failedHC      bool
	hcSuccesses   int
	hcFailures    int
	localFailures int // consecutive local-origin failures
	// pendingRemoval is Envoy's PENDING_DYNAMIC_REMOVAL: the host left EDS but was kept
	// because it passes active health checks (syncClustersLocked); it still takes traffic
	// and is removed once it fails them (removePendingHost).
	pendingRemoval  bool
	ejectedUntil    time.Time
	ejections       int
	rqTotal, rqErrs uint64
	rqSuccess       uint64
}

func newLiveHost(hc hostCfg) *liveHost {
	h := &liveHost{address: hc.address}
	h.desc.Store(&hc)
	return h
}

func (h *liveHost) hostname() string           { return h.desc.Load().hostname }
func (h *liveHost) metadata() *corev3.Metadata { return h.desc.Load().metadata }

func (h *liveHost) usable(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.failedHC && !now.Before(h.ejectedUntil)
}

// liveCluster is a cluster's runtime: hosts with their health, the connection pool, the
// health checker. Its configuration may be replaced by CDS updates.
type liveCluster struct {
	d    *DataPlane
	name string

	mu        sync.Mutex
	cfg       *clusterCfg
	hosts     []*liveHost
	lb        *subsetLB // the subsets of hosts (nil without lb_subset_config): setHostsLocked
	transport *upstreamPool
	// previous is the version of a changed cluster while this one warms up: it
	// serves the requests until every host of the new one has had its first health check
	// (warmedLocked). nil when not warming.
	previous *clusterVersion
	// warm is set once the cluster finished its initial warm-up (warmedLocked): until
	// then a new cluster is not in Envoy's thread-local cluster manager and a route
	// naming it gets "cluster not found" (snapshot returns no configuration).
	warm bool
	// endpointsArrived: the cluster's EDS resource has been received (always true
	// without EDS).
	endpointsArrived bool
	hcCancel         context.CancelFunc
	hcKick           chan struct{} // new hosts: check now (buffered, 1)
	rr               atomic.Uint64
	active           atomic.Int64 // requests in flight (circuit breaker)
	retries          atomic.Int64 // retries in flight
}

// clusterVersion is what a cluster was before a CDS change, kept while the new version warms.
type clusterVersion struct {
	cfg       *clusterCfg
	hosts     []*liveHost
	lb        *subsetLB
	transport *upstreamPool
	// The previous version keeps its health checker and follows EDS while the new one
	// warms: in Envoy the active cluster is untouched by the warming one's
	// initialization and keeps its own EDS subscription and health checker until
	// ClusterManagerImpl::onClusterInit replaces it.
	hcCancel context.CancelFunc
	hcKick   chan struct{}
}

// drop ends the previous version: its health checker stops, its pool drains.
func (p *clusterVersion) drop() {
	if p.hcCancel != nil {
		p.hcCancel()
	}
	p.transport.CloseIdleConnections()
}

func (c *liveCluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hcCancel != nil {
		c.hcCancel()
		c.hcCancel = nil
	}
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
	if c.previous != nil {
		c.previous.drop()
		c.previous = nil
	}
}

// warmedLocked ends the warm-up of a new or changed cluster once its endpoints arrived and
// every host has had its first health check (passed or failed), and reports whether it did
// just now. Envoy: a cluster added or updated by CDS goes to the warming clusters
// (ClusterManagerImpl::addOrUpdateCluster, source/common/upstream/cluster_manager_impl.cc)
// and is initialized; ClusterImplBase::onPreInitComplete (source/common/upstream/
// upstream_impl.cc) runs once the first EDS response arrived (EdsClusterImpl::startPreInit
// / onConfigUpdate), and ClusterImplBase::onInitDone then, with a health checker, counts
// the hosts (pending_initialize_health_checks_) and calls finishInitialization only after
// the health checker's completion callback ran once per host, whatever the result. Then
// ClusterManagerImpl::onClusterInit moves the cluster from warming to active and posts it
// to the thread-local cluster managers: only from then on can a route use it. A changed
// cluster's new version replaces the previous one at that point, whose connection pools
// drain (requests in flight finish; idle connections close).
func (c *liveCluster) warmedLocked() bool {
	if c.warm && c.previous == nil {
		return false
	}
	if !c.endpointsArrived {
		return false
	}
	for _, h := range c.hosts {
		h.mu.Lock()
		pending := h.hcPending
		h.mu.Unlock()
		if pending {
			return false
		}
	}
	c.warm = true
	if c.previous != nil {
		c.previous.drop()
		c.previous = nil
	}
	return true
}

// statPrefix is "cluster.<stat name>." of the cluster's current configuration.
func (c *liveCluster) statPrefix() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg == nil {
		return "cluster." + c.name + "."
	}
	return "cluster." + c.cfg.stat + "."
}

// snapshot is the version of the cluster that serves requests: the previous one while a
// changed cluster warms up; none (nil configuration) while a new cluster warms up.
func (c *liveCluster) snapshot() (*clusterCfg, []*liveHost, *upstreamPool) {
	cc, hosts, tr, _ := c.serving()
	return cc, hosts, tr
}

// serving is snapshot with the serving version's subsets.
func (c *liveCluster) serving() (*clusterCfg, []*liveHost, *upstreamPool, *subsetLB) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.previous; p != nil {
		return p.cfg, p.hosts, p.transport, p.lb
	}
	if !c.warm {
		return nil, nil, nil, nil
	}
	return c.cfg, c.hosts, c.transport, c.lb
}

// setHostsLocked makes hosts the newest version's (configuration cc) and recomputes its
// subsets, counting the cluster's lb_subsets_* stats.
func (c *liveCluster) setHostsLocked(cc *clusterCfg, hosts []*liveHost) {
	prev := c.lb
	if c.cfg != cc {
		prev = nil // a new version of the cluster: a new load balancer
	}
	c.hosts, c.lb = hosts, nil
	if cc != nil && cc.subset != nil {
		c.lb = cc.subset.buildSubsets(c.d, hosts, prev, "cluster."+cc.stat+".")
	}
}

// setHosts makes hosts the previous version's and recomputes its subsets.
func (p *clusterVersion) setHosts(d *DataPlane, hosts []*liveHost) {
	p.hosts = hosts
	if p.cfg.subset != nil {
		p.lb = p.cfg.subset.buildSubsets(d, hosts, p.lb, "")
	}
}

// current is the newest version's hosts (those its health checker checks).
func (c *liveCluster) current() []*liveHost {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hosts
}

// hostsOf is the hosts of the version of the cluster whose configuration is cc (the newest,
// or the previous one while the newest warms; none once it is gone): those cc's health
// checker checks.
func (c *liveCluster) hostsOf(cc *clusterCfg) []*liveHost {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.cfg == cc:
		return c.hosts
	case c.previous != nil && c.previous.cfg == cc:
		return c.previous.hosts
	}
	return nil
}

// syncClustersLocked brings the live clusters in line with the configuration: new clusters
// are created, removed ones stopped; hosts are kept (with their health) by address across
// EDS updates. A cluster whose CDS resource is unchanged is left alone, and a changed one is
// a new cluster, as in Envoy: ClusterManagerImpl::addOrUpdateCluster
// (source/common/upstream/cluster_manager_impl.cc) skips an update whose config hash equals
// the cluster's, and otherwise builds the cluster anew and warms it up: new hosts (no health,
// outlier or pending-removal state, each pending its first health check), a new connection
// pool and health checker, while the previous version keeps serving, with its own health
// checker and following EDS, until the warm-up ends (warmedLocked).
func (d *DataPlane) syncClustersLocked() {
	for name, c := range d.clusters {
		if d.cfg.clusters[name] == nil {
			c.stop()
			delete(d.clusters, name)
		}
	}
	for name, cc := range d.cfg.clusters {
		c := d.clusters[name]
		if c == nil {
			c = &liveCluster{d: d, name: name, hcKick: make(chan struct{}, 1)}
			d.clusters[name] = c
		}
		hosts := cc.staticHosts
		if cc.edsName != "" {
			hosts, _ = compileHosts(d.cfg.endpoints[cc.edsName])
		}
		c.mu.Lock()
		changed := c.cfg == nil || !proto.Equal(c.cfg.raw, cc.raw)
		if changed && c.cfg != nil {
			// A new version of the cluster: nothing of the old hosts carries over.
			if c.previous == nil {
				c.previous = &clusterVersion{cfg: c.cfg, hosts: c.hosts, lb: c.lb, transport: c.transport, hcCancel: c.hcCancel, hcKick: c.hcKick}
				c.hcCancel = nil
				c.hcKick = make(chan struct{}, 1)
			} else {
				// Changed again while warming: the version that serves stays, the
				// one that was warming goes.
				c.transport.CloseIdleConnections()
			}
			c.hosts, c.lb = nil, nil
			c.warm = false
		}
		if !changed {
			cc = c.cfg // the same resource: the compiled one in use stays
		}
		nh := mergeHosts(cc, c.hosts, hosts)
		pending := false
		var prevKick chan struct{}
		if p := c.previous; p != nil && !changed {
			// EDS reaches the serving previous version too.
			ph := p.cfg.staticHosts
			if p.cfg.edsName != "" {
				ph, _ = compileHosts(d.cfg.endpoints[p.cfg.edsName])
			}
			p.setHosts(d, mergeHosts(p.cfg, p.hosts, ph))
			for _, h := range p.hosts {
				h.mu.Lock()
				if h.hcPending {
					prevKick = p.hcKick
				}
				h.mu.Unlock()
			}
		}
		for _, h := range nh {
			h.mu.Lock()
			pending = pending || h.hcPending
			h.mu.Unlock()
		}
		c.endpointsArrived = cc.edsName == "" || d.cfg.endpoints[cc.edsName] != nil
		if changed {
			// The replaced pool, if any, is the previous version's (it drains when the
			// warm-up ends) or was closed above.
			c.lb = nil
			c.cfg = cc
			c.transport = c.newPool(cc)
			if c.hcCancel != nil {
				c.hcCancel()
				c.hcCancel = nil
			}
			if cc.hc != nil {
				ctx, cancel := context.WithCancel(d.ctx)
				c.hcCancel = cancel
				kick := c.hcKick
				d.wg.Add(1)
				go func() {
					defer d.wg.Done()
					c.healthCheckLoop(ctx, cc, kick)
				}()
			}
		}
		// Every EDS update recomputes the subsets (no warming: only a CDS change makes a
		// new cluster).
		c.setHostsLocked(cc, nh)
		c.warmedLocked()
		c.mu.Unlock()
		if pending {
			// Envoy's health checker starts a session, and with it a first check, for
			// each host as it joins the cluster (or once the cluster's secrets arrive),
			// not at the next interval. (We check every host then; Envoy the new ones.)
			select {
			case c.hcKick <- struct{}{}:
			default:
			}
		}
		if prevKick != nil {
			select {
			case prevKick <- struct{}{}:
			default:
			}
		}
	}
}

// connectError marks a failure to establish the upstream connection (TCP or TLS handshake),
// which is Envoy's "connect-failure" retry condition and response flag UF.
type connectError struct{ err error }

func (e *connectError) Error() string { return "upstream connect error: " + e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// upstreamPool is a cluster version's connection pool: HTTP/1.1 (h1, Go's transport) or,
// with explicit http2_protocol_options, HTTP/2 (h2).
type upstreamPool struct {
	h1 *http.Transport
	h2 *h2Pool
}

func (c *liveCluster) newPool(cc *clusterCfg) *upstreamPool {
	if cc.http2 {
		return &upstreamPool{h2: newH2Pool(c, cc, cc.tls, true)}
	}
	return &upstreamPool{h1: c.newTransport(cc, cc.tls, true)}
}

// CloseIdleConnections drains the pool: idle connections close, busy ones once their
// requests ended.
func (p *upstreamPool) CloseIdleConnections() {
	if p.h1 != nil {
		p.h1.CloseIdleConnections()
	}
	if p.h2 != nil {
		p.h2.closeIdle()
	}
}

// newTransport is an HTTP/1.1 connection pool (or the health checker's connections): connections within connect_timeout, TLS
// per the UpstreamTlsContext with the current SDS secrets, HTTP/1.1 or HTTP/2 as the
// cluster's explicit_http_config says. Responses are never decompressed.
func (c *liveCluster) newTransport(cc *clusterCfg, socket *upstreamTLS, pool bool) *http.Transport {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if pool {
			c.d.stats.inc(c.statPrefix() + "upstream_cx_total") // Envoy: connections the pools opened
		}
		nd := cc.dialer()
		conn, err := nd.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, &connectError{err}
		}
		if socket == nil {
			return conn, nil
		}
		tc, err := c.d.upstreamTLSConfig(socket)
		if err != nil {
			conn.Close()
			return nil, &connectError{err}
		}
		tconn := tls.Client(conn, tc)
		hctx, cancel := context.WithTimeout(ctx, cc.connectTimeout)
		defer cancel()
		if err := tconn.HandshakeContext(hctx); err != nil {
			conn.Close()
			return nil, &connectError{err}
		}
		return tconn, nil
	}
	t := &http.Transport{
		DialContext:         dial,
		DialTLSContext:      dial,
		DisableCompression:  true,
		MaxIdleConnsPerHost: 64,
		// Envoy's CodecClient (source/common/http/codec_client.cc) takes the cluster's
		// idle timeout (idle_timeout_(host_->cluster().idleTimeout())), for the request
		// pool's connections and the health checker's alike, and closes the connection
		// once it has had no active request for that long; Go's IdleConnTimeout is the
		// same rule (0: never).
		IdleConnTimeout: cc.idleTimeout,
	}
	// HTTP/1.1 only, whatever ALPN negotiated: an HTTP/1.1 cluster's pool, and the health
	// checker, whose codec is HttpHealthCheck.codec_client_type, HTTP1 by default (the
	// allowlist admits no other), also for an HTTP/2 cluster (HttpHealthCheckerImpl,
	// source/extensions/health_checkers/http/health_checker_impl.cc). Go's transport, with
	// HTTP/2 off, speaks HTTP/1.1 over a connection that negotiated h2 just as Envoy's
	// HTTP/1 codec would; the server then fails it.
	p := new(http.Protocols)
	p.SetHTTP1(true)
	t.Protocols = p
	return t
}

// upstreamTLSConfig is the client side of an UpstreamTlsContext: the client certificate,
// SNI, ALPN, and validation against the trusted CA (the chain only: Envoy does not compare
// the host name with the certificate) plus, when match_typed_subject_alt_names is given, a
// DNS SAN that matches one of them. Without a validation context nothing is verified.
func (d *DataPlane) upstreamTLSConfig(t *upstreamTLS) (*tls.Config, error) {
	cfg := d.config()
	tc := &tls.Config{ServerName: t.sni, NextProtos: t.alpn, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	if t.certSecret != "" {
		cert, err := secretKeyPair(cfg.secrets[t.certSecret])
		if err != nil {
			return nil, fmt.Errorf("secret %q: %w", t.certSecret, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if t.caSecret != "" {
		pool, err := secretCAPool(cfg.secrets[t.caSecret])
		if err != nil {
			return nil, fmt.Errorf("secret %q: %w", t.caSecret, err)
		}
		sans := t.sans
		tc.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no server certificate")
			}
			certs := make([]*x509.Certificate, len(raw))
			for i, r := range raw {
				c, err := x509.ParseCertificate(r)
				if err != nil {
					return err
				}
				certs[i] = c
			}
			inter := x509.NewCertPool()
			for _, c := range certs[1:] {
				inter.AddCert(c)
			}
			if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return err
			}
			if len(sans) == 0 {
				return nil
			}
			for _, n := range certs[0].DNSNames {
				if anyMatch(sans, n) {
					return nil
				}
			}
			return fmt.Errorf("no DNS SAN of the server certificate %v matches", certs[0].DNSNames)
		}
	}
	return tc, nil
}

// pickFrom chooses a host as Envoy's load balancer does: among the healthy hosts (active health
// check passed or pending, not ejected by outlier detection), unless their share is below
// healthy_panic_threshold, when all hosts are used (panic mode; a threshold of 0 disables
// it). LEAST_REQUEST with equal weights is "power of two choices": two random hosts, the one
// with fewer active requests. ROUND_ROBIN goes in order. With the previous_hosts retry
// predicate, a host already tried is rejected and another selection made, up to
// host_selection_retry_max_attempts times; the last selection is used even if rejected.
// rr is the round-robin position: each load balancer has its own (a subset's is the subset's: SubsetLoadBalancer gives every subset a load balancer of the
// cluster's lb_policy over the subset's hosts).
func (c *liveCluster) pickFrom(cc *clusterCfg, hosts []*liveHost, rr *atomic.Uint64, tried map[*liveHost]bool, maxSelections int) *liveHost {
	if len(hosts) == 0 {
		return nil
	}
	now := time.Now()
	var healthy []*liveHost
	for _, h := range hosts {
		if h.usable(now) {
			healthy = append(healthy, h)
		}
	}
	cand := healthy
	if 100*float64(len(healthy))/float64(len(hosts)) < cc.panicThreshold {
		cand = hosts
	}
	if len(cand) == 0 {
		return nil
	}
	var h *liveHost
	for i := 0; i < max(1, maxSelections); i++ {
		if cc.leastRequest {
			a, b := cand[rand.IntN(len(cand))], cand[rand.IntN(len(cand))]
			h = a
			if b.active.Load() < a.active.Load() {
				h = b
			}
		} else {
			h = cand[int(rr.Add(1)-1)%len(cand)]
		}
		if !tried[h] {
			break
		}
	}
	return h
}

// localOriginResult feeds outlier detection with split_external_local_origin_errors:
// consecutive local-origin failures (connect failures, resets before the request was sent,
// timeouts) eject the host when they reach consecutive_local_origin_failure (enforced with
// probability enforcing_consecutive_local_origin_failure %), unless max_ejection_percent of
// the cluster's hosts are ejected already. The ejection lasts base_ejection_time times the
// number of times the host was ejected, at most max_ejection_time.
func (c *liveCluster) localOriginResult(cc *clusterCfg, hosts []*liveHost, h *liveHost, failed bool) {
	o := cc.outlier
	if o == nil {
		return
	}
	h.mu.Lock()
	if !failed {
		h.localFailures = 0
		h.mu.Unlock()
		return
	}
	h.localFailures++
	trip := h.localFailures >= o.consecutiveLocal
	h.mu.Unlock()
	if !trip || rand.IntN(100) >= o.enforcingLocal {
		return
	}
	now := time.Now()
	ejected := 0
	for _, x := range hosts {
		x.mu.Lock()
		if now.Before(x.ejectedUntil) {
			ejected++
		}
		x.mu.Unlock()
	}
	if 100*(ejected+1) > o.maxPercent*len(hosts) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ejections++
	d := min(time.Duration(h.ejections)*o.base, max(o.base, o.max))
	h.ejectedUntil = now.Add(d)
	h.localFailures = 0
	c.d.stats.inc(c.statPrefix() + "outlier_detection.ejections_enforced_total")
}

// healthCheckLoop is the active HTTP health checker of cluster version cc: one session per
// host, as Envoy's HealthCheckerImplBase (source/extensions/health_checkers/common/
// health_checker_base_impl.cc) keeps an ActiveHealthCheckSession per host, each with its own
// interval timer. A host's session starts with a first check at once (addHosts: start, no
// initial_jitter) and schedules each next check when a check ends, by that check's result
// (hostSession). The loop starts the sessions of the hosts that joined (kick), ends those of
// the hosts that left, and ends them all when the cluster version goes (ctx).
//
// A check is a GET of the path with the configured host header over the cluster's transport
// socket; 200 is healthy. Its connections are the health checker's own, not the cluster's
// connection pool: they do not count in upstream_cx_total.
func (c *liveCluster) healthCheckLoop(ctx context.Context, cc *clusterCfg, kick chan struct{}) {
	tr := c.newTransport(cc, cc.hc.tls, false)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: cc.hc.timeout}
	type session struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	sessions := map[*liveHost]*session{}
	// ended receives a host whose session ended on its own: it left the cluster, or the
	// cluster's secrets are missing (the session starts again once they are there).
	ended := make(chan *liveHost)
	stop := func(h *liveHost) {
		s := sessions[h]
		s.cancel()
		<-s.done
		delete(sessions, h)
	}
	defer func() {
		for h := range sessions {
			stop(h)
		}
	}()
	for {
		hosts := c.hostsOf(cc)
		for h := range sessions {
			if !slices.Contains(hosts, h) {
				stop(h)
			}
		}
		if c.socketsReady(cc) {
			for _, h := range hosts {
				if sessions[h] != nil {
					continue
				}
				sctx, cancel := context.WithCancel(ctx)
				s := &session{cancel: cancel, done: make(chan struct{})}
				sessions[h] = s
				go func() {
					defer close(s.done)
					if !c.hostSession(sctx, cc, client, h) {
						select {
						case ended <- h:
						case <-sctx.Done():
						}
					}
				}()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case h := <-ended:
			if s := sessions[h]; s != nil {
				<-s.done
				s.cancel()
				delete(sessions, h)
			}
		}
	}
}

// hostSession checks h until its session ends: false when it ended on its own (h left the
// cluster version, or its secrets are missing), true when cancelled. After each check the
// next waits HealthCheckerImplBase::interval of the check's result and transition
// (healthCheckCfg.next).
func (c *liveCluster) hostSession(ctx context.Context, cc *clusterCfg, client *http.Client, h *liveHost) bool {
	for {
		if !slices.Contains(c.hostsOf(cc), h) {
			return ctx.Err() != nil
		}
		ok, changed, checked := c.checkHost(ctx, cc, client, h)
		if ctx.Err() != nil {
			return true
		}
		if !checked {
			return false
		}
		// Envoy: the cluster "has had traffic" once its connection pools opened a
		// connection (upstream_cx_total used; health check connections are not from the
		// pools).
		traffic := c.d.stats.get(c.statPrefix()+"upstream_cx_total") > 0
		t := time.NewTimer(cc.hc.next(traffic, ok, changed))
		select {
		case <-ctx.Done():
			t.Stop()
			return true
		case <-t.C:
		}
	}
}

// hcTransition is Envoy's HealthTransition of a check result.
type hcTransition int

const (
	hcUnchanged hcTransition = iota
	hcChanged
	hcChangePending // a threshold is not reached yet
)

// next is HealthCheckerImplBase::interval for a check that ended healthy (ok) or not, with
// transition t: once the cluster has had traffic, interval after a success and
// unhealthy_interval after a failure, or healthy_edge_interval / unhealthy_edge_interval while
// the transition is pending; before, no_traffic_healthy_interval after a success that leaves
// no transition pending, no_traffic_interval otherwise. (No jitter: the allowlist admits
// none.)
func (hc *healthCheckCfg) next(traffic, ok bool, t hcTransition) time.Duration {
	var d time.Duration
	switch {
	case !traffic && ok && t != hcChangePending:
		d = hc.noTrafficHealthy
	case !traffic:
		d = hc.noTraffic
	case !ok && t == hcChangePending:
		d = hc.unhealthyEdge
	case !ok:
		d = hc.unhealthyInterval
	case t == hcChangePending:
		d = hc.healthyEdge
	default:
		d = hc.interval
	}
	// intervalWithJitter: never less than 1ms.
	return max(d, time.Millisecond)
}

// socketsReady reports whether the secrets of every transport socket of cc are there. Envoy
// (cluster warming) waits for the secrets of every transport socket of the cluster,
// transport_socket_matches included: a cluster whose SDS secrets have not arrived is still
// warming, with no health checks, and its hosts stay pending until they do.
func (c *liveCluster) socketsReady(cc *clusterCfg) bool {
	sockets := []*upstreamTLS{cc.tls, cc.hc.tls}
	for _, m := range cc.socketMatches {
		sockets = append(sockets, m.tls)
	}
	for _, t := range sockets {
		if t == nil {
			continue
		}
		if _, err := c.d.upstreamTLSConfig(t); err != nil {
			return false
		}
	}
	return true
}

// checkHost runs one health check of h and applies its result: ok (healthy) and the
// transition it made; checked is false when no check ran (missing secrets, or cancelled).
func (c *liveCluster) checkHost(ctx context.Context, cc *clusterCfg, client *http.Client, h *liveHost) (ok bool, t hcTransition, checked bool) {
	scheme := "http"
	if cc.hc.tls != nil {
		scheme = "https"
	}
	if !c.socketsReady(cc) {
		return false, hcUnchanged, false
	}
	// network: the check failed without a response (connection failure, timeout): Envoy's
	// NETWORK / NETWORK_TIMEOUT failure types, which count towards unhealthy_threshold.
	network := true
	if !strings.HasPrefix(h.address, "unix:") {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+h.address+cc.hc.path, nil)
		if err == nil {
			req.Host = cc.hc.host
			req.Header.Set("User-Agent", "Envoy/HC")
			for _, kv := range cc.hc.headers { // every append_action adds: the request has none of its own
				req.Header.Add(kv[0], kv[1])
			}
			resp, err := client.Do(req)
			if err == nil {
				ok, network = resp.StatusCode == http.StatusOK, false
				resp.Body.Close()
			}
		}
	}
	if ctx.Err() != nil {
		return false, hcUnchanged, false
	}
	c.d.stats.inc(c.statPrefix() + "health_check.attempt")
	if !ok {
		c.d.stats.inc(c.statPrefix() + "health_check.failure")
		if network {
			c.d.stats.inc(c.statPrefix() + "health_check.network_failure")
		}
	} else {
		c.d.stats.inc(c.statPrefix() + "health_check.success")
	}
	t, remove := c.recordCheck(cc, h, ok, network)
	if remove {
		c.removePendingHost(h)
	}
	c.mu.Lock()
	warmed := c.warmedLocked()
	c.mu.Unlock()
	if warmed {
		// The initial configuration is ready once its clusters warmed.
		c.d.mu.Lock()
		c.d.checkReadyLocked()
		c.d.mu.Unlock()
	}
	return ok, t, true
}

// recordCheck applies a health check result to h, as ActiveHealthCheckSession::handleSuccess
// and setUnhealthy do: an unhealthy host becomes healthy at its first check ever or after
// healthy_threshold consecutive successes; a healthy host becomes unhealthy at once on a
// failed response (a status other than 200: failure type ACTIVE, not retriable), or after
// unhealthy_threshold consecutive network failures (no response: NETWORK, NETWORK_TIMEOUT).
// It returns the transition, and remove when h, pending removal, now fails active health
// checks and must go. A success unejects an ejected host when
// successful_active_health_check_uneject_host is set.
func (c *liveCluster) recordCheck(cc *clusterCfg, h *liveHost, ok, network bool) (t hcTransition, remove bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	first := h.hcPending
	h.hcPending = false
	if ok {
		h.hcFailures = 0
		if h.failedHC {
			h.hcSuccesses++
			if first || h.hcSuccesses >= max(1, cc.hc.healthy) {
				h.failedHC = false
				t = hcChanged
			} else {
				t = hcChangePending
			}
		}
		if cc.outlier != nil && cc.outlier.unejectOnHealthyActiveHC && time.Now().Before(h.ejectedUntil) {
			h.ejectedUntil = time.Time{}
		}
		return t, false
	}
	h.hcSuccesses = 0
	if h.failedHC {
		return hcUnchanged, false
	}
	h.hcFailures++
	if !network || h.hcFailures >= max(1, cc.hc.unhealthy) {
		h.failedHC = true
		if h.pendingRemoval {
			// Envoy: the health transition reloads the hosts, and
			// EdsClusterImpl::reloadHealthyHostsHelper (source/common/upstream/eds.cc)
			// removes a host with both FAILED_ACTIVE_HC and PENDING_DYNAMIC_REMOVAL.
			return hcChanged, true
		}
		return hcChanged, false
	}
	return hcChangePending, false
}

// removePendingHost drops h, pending removal and now failing active health checks, from the
// cluster's hosts (unless EDS brought it back meanwhile). Called without h.mu held: syncClustersLocked
// takes c.mu before a host's mu.
func (c *liveCluster) removePendingHost(h *liveHost) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.mu.Lock()
	gone := h.pendingRemoval
	h.mu.Unlock()
	if !gone {
		return
	}
	c.setHostsLocked(c.cfg, slices.DeleteFunc(slices.Clone(c.hosts), func(x *liveHost) bool { return x == h }))
	if p := c.previous; p != nil {
		p.setHosts(c.d, slices.DeleteFunc(slices.Clone(p.hosts), func(x *liveHost) bool { return x == h }))
	}
}

// mergeHosts is the host list of cluster version cc after an update of its endpoints to
// hosts, from its current hosts cur: hosts are kept (with their health) by address; new
// ones start pending their first check; those that left are dropped or kept pending removal.
func mergeHosts(cc *clusterCfg, cur []*liveHost, hosts []hostCfg) []*liveHost {
	old := map[string]*liveHost{}
	for _, h := range cur {
		old[h.address] = h
	}
	var nh []*liveHost
	kept := map[string]bool{}
	for _, hc := range hosts {
		if h := old[hc.address]; h != nil {
			kept[hc.address] = true
			// Back in EDS: no longer pending removal (Envoy clears
			// PENDING_DYNAMIC_REMOVAL of a host matched by address).
			h.mu.Lock()
			h.pendingRemoval = false
			h.mu.Unlock()
			if h.hostname() != hc.hostname || !proto.Equal(h.metadata(), hc.metadata) {
				h.desc.Store(&hc)
			}
			nh = append(nh, h)
			continue
		}
		// A new host of a cluster with active health checking starts unhealthy
		// (FAILED_ACTIVE_HC) until its first check passes: Envoy's
		// BaseDynamicClusterImpl::updateDynamicHostList (source/common/upstream/
		// upstream_impl.cc) sets the flag on every added host when the cluster has a
		// health checker, during warm-up and after it alike. Only with
		// common_lb_config.ignore_new_hosts_until_first_hc (info_->warmHosts(), not
		// in our configuration: the allowlist rejects it) is it additionally
		// PENDING_ACTIVE_HC, excluded from the panic threshold's count; without it
		// the host counts as an unhealthy host there, as here.
		h := newLiveHost(hc)
		h.hcPending, h.failedHC = cc.hc != nil, cc.hc != nil
		nh = append(nh, h)
	}
	if cc.edsName != "" && cc.hc != nil && !cc.ignoreHealthOnHostRemoval {
		// A host that left EDS stays while it passes active health checks, unless the
		// cluster sets ignore_health_on_host_removal: Envoy's
		// BaseDynamicClusterImpl::updateDynamicHostList
		// (source/common/upstream/upstream_impl.cc) keeps every removed host that has
		// neither FAILED_ACTIVE_HC nor FAILED_EDS_HEALTH, marked
		// PENDING_DYNAMIC_REMOVAL, when the cluster has a health checker and
		// drainConnectionsOnHostRemoval() (ignore_health_on_host_removal) is false. A
		// host with no check result yet still carries the FAILED_ACTIVE_HC every new
		// host starts with there, so it goes. The kept host stays healthy and takes
		// traffic (PENDING_DYNAMIC_REMOVAL is not in excludeBasedOnHealthFlag).
		for _, h := range cur {
			if kept[h.address] {
				continue
			}
			h.mu.Lock()
			keep := !h.failedHC && !h.hcPending
			h.pendingRemoval = keep
			h.mu.Unlock()
			if keep {
				nh = append(nh, h)
			}
		}
	}
	return nh
}
