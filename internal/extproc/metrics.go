package extproc

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Outcome label values beyond topology.Outcome's own names.
const (
	outcomeNoTable       = "no_table"
	outcomeNoLocalPlan   = "no_local_plan"
	outcomeInternalError = "internal_error"
	// outcomePending: an unavailable key that is a new CRD's no apiserver serves yet
	// (plan.Route.Pending), counted apart from the keys whose apiservers are all dead.
	outcomePending = "pending"
)

// Message types that must not arrive (our processing mode sends request headers only).
var unexpectedTypes = [...]string{
	"response_headers", "request_body", "response_body", "request_trailers", "response_trailers", "unknown",
}

const (
	unexpectedResponseHeaders = iota
	unexpectedRequestBody
	unexpectedResponseBody
	unexpectedRequestTrailers
	unexpectedResponseTrailers
	unexpectedUnknown
)

// Client-supplied headers we strip, for kube_mvp_extproc_stripped_headers_total.
var strippedNames = [...]string{
	contract.HeaderRemoteUser, contract.HeaderRemoteGroup, contract.HeaderRemoteUID, "x-remote-extra-*", contract.HeaderPeerProxied, contract.HeaderRoutingCluster,
}

const (
	strippedUser = 1 << iota
	strippedGroup
	strippedUID
	strippedExtra
	strippedPeerProxied
	strippedRouteCluster
)

// Merged-discovery outcomes, for kube_mvp_extproc_merged_discovery_total.
var discoveryResults = [...]string{"served", "not_modified", "passed"}

const (
	discoveryServed = iota
	discoveryNotModified
	discoveryPassed
)

type metrics struct {
	// decisions mirrors upstream's apiserver_rerouted_request_total{code,group,version,resource}
	// (k8s.io/apiserver peerproxy), which counts only requests an apiserver proxied to a peer
	// and labels them with the HTTP code; here every request is decided, so the label is the
	// outcome (default, subset, not_served, unavailable, pending, no_table, no_local_plan, internal_error). The
	// group/version/resource labels name the serving-table key the decision used ("resource"
	// is "pods/log" for a subresource key) and are empty when there is none (non-resource
	// requests, CRD and aggregated groups, resources nobody publishes), so their values come
	// from the table, never from the client: a client cannot grow the label set.
	decisions *prometheus.CounterVec
	// keyed are the label sets of decisions made for a key, so a new table drops those of
	// keys it no longer has: created and deleted CRDs do not grow the series without end.
	keyedMu sync.Mutex
	keyed   map[[4]string]struct{}
	// unexpected counts messages our processing mode should never send (body, trailers,
	// response headers); each is answered with an empty response of its type.
	unexpected [len(unexpectedTypes)]prometheus.Counter
	discovery  [len(discoveryResults)]prometheus.Counter
	stripped   [len(strippedNames)]prometheus.Counter
	version    *prometheus.GaugeVec

	// Routing table updates that failed (TableUpdateFailed), by reason, and the table in use
	// when the last one failed (failedOn; failed says whether any has).
	tableFailures *prometheus.CounterVec
	failedOn      atomic.Pointer[preparedTable]
	failed        atomic.Bool

	// Children for the hot path, resolved once.
	noTable, noPlan, internalError prometheus.Counter

	// decisionSeconds: from a request's headers received to its answer sent.
	decisionSeconds prometheus.Histogram

	// Streams refused past MaxStreams, and ended for want of a first message.
	streamsRefused, firstMessageTimeouts prometheus.Counter
}

// decisionBuckets span what a decision takes: microseconds in memory, milliseconds when the
// process or the machine is starved; Envoy's message timeout (200 ms by default) ends it.
var decisionBuckets = []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25}

func newMetrics(reg prometheus.Registerer, s *Server) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_mvp_extproc_decisions_total",
			Help: "Requests decided by extproc, by outcome and the group/version/resource of the serving-table entry used (empty when none). Mirrors apiserver_rerouted_request_total.",
		}, []string{"outcome", "group", "version", "resource"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kube_mvp_extproc_table_version_info",
			Help: "The version of the routing table in use (value 1).",
		}, []string{"version"}),
	}
	unexpected := counterChildren(m.unexpected[:], "kube_mvp_extproc_unexpected_messages_total",
		"ext_proc messages that the processing mode should never send (bodies, trailers, response headers extproc did not ask for), by type; each got an empty response of its type.",
		"type", unexpectedTypes[:])
	stripped := counterChildren(m.stripped[:], "kube_mvp_extproc_stripped_headers_total",
		"Requests that arrived carrying a client-supplied identity or routing header, which was removed (Envoy's listener should already have removed them).",
		"header", strippedNames[:])
	discovery := counterChildren(m.discovery[:], "kube_mvp_extproc_merged_discovery_total",
		"GET /apis requests for aggregated discovery: served (the merged document "+
			"replaced the apiserver's 200), not_modified (304 to the merged ETag), passed "+
			"(the apiserver's answer went on: not a 200 aggregated document, e.g. 401/403).",
		"result", discoveryResults[:])
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_mvp_extproc_table_age_seconds",
		Help: "Seconds since the routing table in use was loaded; NaN before the first.",
	}, func() float64 {
		t := s.table.Load()
		if t == nil {
			return math.NaN()
		}
		return s.now().Sub(t.loadedAt).Seconds()
	})
	m.noTable = m.decisions.WithLabelValues(outcomeNoTable, "", "", "")
	m.noPlan = m.decisions.WithLabelValues(outcomeNoLocalPlan, "", "", "")
	m.internalError = m.decisions.WithLabelValues(outcomeInternalError, "", "", "")
	reg.MustRegister(m.decisions, m.version, unexpected, stripped, discovery, age)
	m.registerTableUpdates(reg, s)
	m.registerDecisionLatency(reg)
	m.registerStreams(reg, s)
	return m
}

// registerStreams adds the metrics of the stream bounds (Options.MaxStreams,
// Options.FirstMessageTimeout).
func (m *metrics) registerStreams(reg prometheus.Registerer, s *Server) {
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_mvp_extproc_streams_open",
		Help: "ext_proc streams open now, across connections.",
	}, func() float64 { return float64(s.open.Load()) })
	limit := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_mvp_extproc_streams_limit",
		Help: "The most ext_proc streams open at once across connections (--max-streams); more are refused.",
	})
	limit.Set(float64(s.maxStreams))
	// The limit is named by its flag, as in kube_mvp_xds_refused_total's reason. Only
	// --max-streams is counted: past --max-streams-per-connection (HTTP/2's) a conforming
	// client waits, and the transport refuses any other before extproc sees it.
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_mvp_extproc_streams_refused_total",
		Help: "ext_proc streams refused (ResourceExhausted) because a limit was reached, named by its flag: " +
			"max-streams (open streams across connections). Envoy answers such a request 503 with Retry-After.",
	}, []string{"limit"})
	m.streamsRefused = refused.WithLabelValues("max-streams")
	m.firstMessageTimeouts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kube_mvp_extproc_streams_first_message_timeouts_total",
		Help: "ext_proc streams ended (DeadlineExceeded) because no message arrived within --first-message-timeout of their start.",
	})
	reg.MustRegister(open, limit, refused, m.firstMessageTimeouts)
}

func (m *metrics) registerDecisionLatency(reg prometheus.Registerer) {
	m.decisionSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kube_mvp_extproc_decision_duration_seconds",
		Help:    "Time from receiving a request's headers to sending its routing answer (every request_headers message, whatever the outcome).",
		Buckets: decisionBuckets,
	})
	reg.MustRegister(m.decisionSeconds)
}

// counterChildren is the counter vector name of one label, with its child for each of
// values resolved into children, in order.
func counterChildren(children []prometheus.Counter, name, help, label string, values []string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	for i, x := range values {
		children[i] = v.WithLabelValues(x)
	}
	return v
}

// registerTableUpdates adds the metrics that say whether the routing table can be updated:
// a table that cannot be (too large, malformed, of an unknown format, or no stream) leaves the
// last good one in use and readiness alone (extproc stays in the Envoy pod's Service), so
// these are where it shows.
func (m *metrics) registerTableUpdates(reg prometheus.Registerer, s *Server) {
	m.tableFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_mvp_extproc_table_update_failures_total",
		Help: "Routing table updates that failed, by reason: too_large (over the size limit), malformed, " +
			"unsupported_format (xds-server and extproc of incompatible versions), stream (xds-server " +
			"unreachable or the stream broke). The last good table stays in use; the log says why and what to do.",
	}, []string{"reason"})
	for _, r := range tablestream.Reasons {
		m.tableFailures.WithLabelValues(r)
	}
	failing := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_mvp_extproc_table_update_failing",
		Help: "1 while the last routing table update failed: no table was loaded since (see kube_mvp_extproc_table_update_failures_total and the log), 0 otherwise.",
	}, func() float64 {
		if m.failed.Load() && m.failedOn.Load() == s.table.Load() {
			return 1
		}
		return 0
	})
	updated := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_mvp_extproc_table_last_update_timestamp_seconds",
		Help: "Unix time at which the routing table in use was loaded; 0 before the first. Its version is kube_mvp_extproc_table_version_info's.",
	}, func() float64 {
		t := s.table.Load()
		if t == nil {
			return 0
		}
		return float64(t.loadedAt.UnixNano()) / 1e9
	})
	reg.MustRegister(m.tableFailures, failing, updated)
}

// TableUpdateFailed records that a routing table update failed for reason (one of
// internal/tablestream's Reasons): the table in use stays. Its signature fits tablestream.OnReject; the
// error is for the log, which tablestream.Follow has written.
func (s *Server) TableUpdateFailed(reason string, _ error) {
	s.m.tableFailures.WithLabelValues(reason).Inc()
	s.m.failedOn.Store(s.table.Load())
	s.m.failed.Store(true)
}

func (m *metrics) countStripped(mask int) {
	for i := range m.stripped {
		if mask&(1<<i) != 0 {
			m.stripped[i].Inc()
		}
	}
}

// decision is the counter of decisions with labels (outcome, group, version, resource).
func (m *metrics) decision(labels [4]string) prometheus.Counter {
	if labels[2] == "" { // no key: kept for good
		return m.decisions.WithLabelValues(labels[:]...)
	}
	m.keyedMu.Lock()
	defer m.keyedMu.Unlock()
	if m.keyed == nil {
		m.keyed = map[[4]string]struct{}{}
	}
	m.keyed[labels] = struct{}{}
	return m.decisions.WithLabelValues(labels[:]...)
}

// forgetKeys deletes the decision series of keys that has not.
func (m *metrics) forgetKeys(has func(topology.Resource) bool) {
	m.keyedMu.Lock()
	defer m.keyedMu.Unlock()
	for labels := range m.keyed {
		r := topology.Resource{Group: labels[1], Version: labels[2]}
		r.Resource, r.Subresource, _ = strings.Cut(labels[3], "/")
		if !has(r) {
			m.decisions.DeleteLabelValues(labels[:]...)
			delete(m.keyed, labels)
		}
	}
}

// setVersion makes version the only series of the version info gauge.
func (m *metrics) setVersion(old, version string) {
	if old != version {
		m.version.DeleteLabelValues(old)
	}
	m.version.WithLabelValues(version).Set(1)
}
