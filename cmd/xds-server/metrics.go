package main

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// Apiserver states of kube_mvp_xds_apiserver_state.
const (
	stateLive       = "live"
	stateUnverified = "unverified"
	stateDeparted   = "departed"
)

var apiserverStates = [...]string{stateLive, stateUnverified, stateDeparted}

// maxUnverifiedSeries bounds the unverified apiservers given series. Live ones proved
// themselves over verified TLS at a distinct address and departed ones come from the memory
// (objects.MaxMemoryEntries), but an unverified one is only a Lease, which anyone who may
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
		"Each apiserver of the topology that is live (its own discovery fetched over verified TLS), unverified (a fresh Lease, its discovery not yet fetched: no part in routing) or departed (remembered: its Lease stale or recently deleted), by ID and hostname: 1 for its state, 0 for the others. At most 16 unverified apiservers, the first by ID, have series.",
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
		case src.Unverified:
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
