package pipeline

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// metrics are what the pipeline exports of its work: the topologies it was given, the
// translations, the plans and tables held, the dangerous apiservers, and of the ADS server
// its refusals, nodes, NACKs and certificates. The inventory's own metrics are xds-server's.
type metrics struct {
	apiservers   *prometheus.GaugeVec
	builds       *prometheus.CounterVec
	buildSeconds prometheus.Histogram
	updates      prometheus.Counter
	states       *apiserverStateCollector
	refused      *prometheus.CounterVec
	dangerous    prometheus.Gauge
	// planHeld: the newest plan could not be built; the last good one stays in force.
	planHeld prometheus.Gauge
	// tableHeld: an Envoy refused the newest configuration; new routing tables wait.
	tableHeld prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		apiservers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kube_mvp_xds_apiservers", Help: "Apiservers known from identity Leases, by state (live, dead).",
		}, []string{"state"}),
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_mvp_xds_translations_total", Help: "Translations of the topology into Envoy config, by result.",
		}, []string{"result"}),
		buildSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kube_mvp_xds_translation_duration_seconds", Help: "Time to translate the topology into Envoy config.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
		}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kube_mvp_xds_topology_updates_total", Help: "Topologies built from the watched objects.",
		}),
	}
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_mvp_xds_refused_total",
		Help: "gRPC calls and xDS streams refused, by reason (role: no or wrong control-plane certificate " +
			"role; node: a node that does not fit its certificate; envoy-version: an Envoy older " +
			"than kube-mvp needs; max-nodes, max-streams: a limit reached; fetch: unary xDS fetch).",
	}, []string{"reason"})
	// Every reason internal/xds refuses for starts at 0, so that increase() sees the first
	// refusal (the chart's KubeMVPXDSStreamsRefused alert).
	for _, reason := range []string{"role", "node", "envoy-version", "max-nodes", "max-streams", "fetch"} {
		m.refused.WithLabelValues(reason)
	}
	m.planHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_mvp_xds_plan_held",
		Help: "1 while the newest routing plan cannot be built into Envoy's configuration: every Envoy keeps its snapshot and extproc its routing table, the last good pair (the log says why).",
	})
	m.dangerous = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_mvp_xds_dangerous_apiservers",
		Help: "Apiservers that an extproc's proxy certificate check found taking the proxy certificate for an ordinary client's: left out of the front-proxy clusters (see the log and /debug/topology).",
	})
	m.states = newAPIServerStateCollector()
	m.tableHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_mvp_xds_routing_table_held",
		Help: "1 while a connected Envoy refuses the newest configuration (a NACK): routing " +
			"tables that name a serving set, cluster or apiserver extproc does not know yet wait " +
			"(narrowed ones go out), so that extproc never routes to what that Envoy lacks.",
	})
	reg.MustRegister(m.states, m.apiservers, m.builds, m.buildSeconds, m.updates, m.refused, m.planHeld, m.tableHeld, m.dangerous)
	return m
}

// registerServing registers what is read from the ADS server and the proxy certificate
// reports when scraped; with creds, the expiry of the control plane's certificates.
func (m *metrics) registerServing(reg prometheus.Registerer, x *xds.Server, checks *tablestream.ProxyChecks, creds *cptls.Credentials) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_mvp_xds_connected_nodes", Help: "Envoy nodes with at least one open xDS stream.",
	}, func() float64 {
		n := 0
		for _, s := range x.Status() {
			if s.Streams > 0 {
				n++
			}
		}
		return float64(n)
	}))
	if creds != nil {
		// Its own certificate, and each Envoy role's as the connected Envoys present it.
		reg.MustRegister(cptls.NewExpiryCollector(
			cptls.Expiry{Certificate: cptls.CertificateControlPlane, Role: cptls.RoleXDSServer, NotAfter: creds.NotAfterOf()},
			cptls.Expiry{Certificate: cptls.CertificateControlPlane, Role: cptls.RoleEnvoyFront, NotAfter: envoyNotAfter(x, cptls.RoleEnvoyFront)},
			cptls.Expiry{Certificate: cptls.CertificateControlPlane, Role: cptls.RoleEnvoySidecar, NotAfter: envoyNotAfter(x, cptls.RoleEnvoySidecar)},
		))
	}
	reg.MustRegister(newNACKCollector(x))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_mvp_xds_proxy_check_reports",
		Help: "extprocs whose proxy certificate report xds-server keeps (connected now, or whose stream ended within the grace period).",
	}, func() float64 { c, e := checks.Reporters(); return float64(c + e) }))
}

func (m *metrics) observeBuild(d time.Duration, err error) {
	m.buildSeconds.Observe(d.Seconds())
	if err != nil {
		m.builds.WithLabelValues("error").Inc()
		return
	}
	m.builds.WithLabelValues("ok").Inc()
}

func (m *metrics) observeTopology(t *topology.Topology) {
	m.updates.Inc()
	m.states.t.Store(t)
	live := len(t.Live())
	m.apiservers.WithLabelValues("live").Set(float64(live))
	m.apiservers.WithLabelValues("dead").Set(float64(len(t.APIServers) - live))
}

// Apiserver states of kube_mvp_xds_apiserver_state.
const (
	stateLive       = "live"
	stateUnverified = "unverified"
	stateDeparted   = "departed"
)

var apiserverStates = [...]string{stateLive, stateUnverified, stateDeparted}

// maxUnverifiedSeries bounds the unverified apiservers given series. Live ones proved
// themselves over verified TLS at a distinct address and departed ones come from the memory
// (memory.MaxEntries), but an unverified one is only a Lease, which anyone who may
// write Leases in kube-system can make; the first ones by ID get series, all are counted in
// kube_mvp_xds_apiservers.
const maxUnverifiedSeries = 16

// apiserverStateCollector exports each apiserver of the last topology that is live,
// unverified or departed, one series per state (1 for its state, 0 for the others); an
// apiserver that leaves the topology, or is dead and forgotten, loses its series.
type apiserverStateCollector struct {
	desc *prometheus.Desc
	t    atomic.Pointer[topology.Topology]
}

func newAPIServerStateCollector() *apiserverStateCollector {
	return &apiserverStateCollector{desc: prometheus.NewDesc("kube_mvp_xds_apiserver_state",
		"Each apiserver of the topology that is live (its own discovery fetched over verified "+
			"TLS), unverified (a fresh Lease, its discovery not yet fetched: no part in routing) or "+
			"departed (remembered: its Lease stale or recently deleted), by ID and hostname: 1 for its "+
			"state, 0 for the others. At most 16 unverified apiservers, the first by ID, have series.",
		[]string{"apiserver", "hostname", "state"}, nil)}
}

func (c *apiserverStateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *apiserverStateCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.t.Load()
	if t == nil {
		return
	}
	unverified := 0
	for _, s := range t.APIServers { // sorted by ID
		src := t.Sources[s.ID]
		var state string
		switch {
		case s.Routable():
			state = stateLive
		case src.AwaitingDiscovery:
			if unverified++; unverified > maxUnverifiedSeries {
				continue
			}
			state = stateUnverified
		case src.From == topology.SourceRemembered:
			state = stateDeparted
		default:
			continue
		}
		for _, st := range apiserverStates {
			v := 0.0
			if st == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, s.ID, s.Hostname, st)
		}
	}
}

// nackCollector exports the NACKs of each connected Envoy node. Node IDs are the clients'
// own, so only connected nodes have series (at most --max-nodes, and those need an Envoy
// role's certificate); a node's series goes with its last stream, and starts again at 0 if
// it comes back.
type nackCollector struct {
	desc *prometheus.Desc
	x    *xds.Server
}

func newNACKCollector(x *xds.Server) *nackCollector {
	return &nackCollector{x: x, desc: prometheus.NewDesc("kube_mvp_xds_nacks_total",
		"Configurations an Envoy node rejected (NACKs) since its state was created (its first open stream), by node ID; only connected nodes. /debug/syncz and the log say why.",
		[]string{"node"}, nil)}
}

func (c *nackCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *nackCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.x.Status() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n.Nacks), n.NodeID)
	}
}

// envoyNotAfter is when the earliest client certificate of the connected Envoys of role
// expires, as presented on their latest streams (a renewal shows once an Envoy reconnects).
func envoyNotAfter(x *xds.Server, role cptls.Role) func() (time.Time, bool) {
	return func() (time.Time, bool) {
		var earliest time.Time
		for _, n := range x.Status() {
			if n.Role == role && n.Certificate != nil && (earliest.IsZero() || n.Certificate.NotAfter.Before(earliest)) {
				earliest = n.Certificate.NotAfter
			}
		}
		return earliest, !earliest.IsZero()
	}
}
