package proxycert

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-mvp/kube-mvp/internal/plan"
)

// Target is one apiserver to check: a live apiserver of the routing table.
type Target struct {
	ID, Hostname, Address string
}

func (t Target) String() string {
	return fmt.Sprintf("%s (hostname %s, address %s)", t.ID, cmp.Or(t.Hostname, "unknown"), t.Address)
}

// CheckFunc checks the apiserver at address, asking as contract.HealthCheckUser under every
// one of userHeaders (Checker.Check).
type CheckFunc func(ctx context.Context, address string, userHeaders []string) Result

// DefaultInterval is how often a Monitor checks when nothing changed.
const DefaultInterval = 60 * time.Second

// MonitorOptions configure a Monitor.
type MonitorOptions struct {
	// NewCheck is called before each round of checks, so renewed certificates are used
	// (e.g. Files.Load, then Checker.Check). An error skips the round; it is logged and
	// reported, and the last results stay.
	NewCheck func() (CheckFunc, error)
	// Interval between rounds when the live apiservers do not change; default
	// DefaultInterval.
	Interval time.Duration
	// Timeout bounds the check of one apiserver; default 10 s.
	Timeout time.Duration
	// Logger receives each apiserver's changes of state, once each; nil discards.
	Logger *slog.Logger
	// Registerer receives kube_mvp_extproc_proxy_certificate_accepted; nil registers nothing.
	Registerer prometheus.Registerer
}

// Monitor checks every live apiserver of the routing table (SetTable) when the set of
// live apiservers, their addresses or the user header names change, and every Interval; Report
// says what it found.
//
// Readiness (Report's ready) fails only when every apiserver that answered refuses the
// proxy certificate: kube-mvp then cannot work at all. When only some refuse, it stays ready
// and Report lists them as warnings: an apiserver that answers Envoy's health checks with
// 401 gets no requests anyway, and failing the readiness of every Envoy pod for one
// misconfigured apiserver would take all of them out of service. Unreachable apiservers
// and inconclusive answers count neither way.
type Monitor struct {
	opts  MonitorOptions
	log   *slog.Logger
	wake  chan struct{}
	gauge *prometheus.GaugeVec

	mu      sync.Mutex
	targets []Target          // sorted by ID
	headers []string          // the user header names, as Envoy's health checks send them
	key     string            // targets and headers, to notice changes
	states  map[string]*state // by ID, for current targets only
	loadErr error             // NewCheck's error in the last round, if any
	// findingsKey is Findings' content when changed was last replaced; changed is closed
	// and replaced whenever it changes.
	findingsKey string
	changed     chan struct{}
}

type state struct {
	target Target
	result Result
	// conclusive is the last conclusive (accepted or refused) result; zero (Inconclusive)
	// until there is one. An inconclusive check does not clear it: an apiserver that once
	// took the proxy certificate for a client's stays dangerous until a check says
	// otherwise.
	conclusive Result
}

// Finding is an apiserver's last conclusive check (Monitor.Findings).
type Finding struct {
	Target
	Result
}

// NewMonitor returns a Monitor with no routing table yet; Run runs its checks.
func NewMonitor(opts MonitorOptions) *Monitor {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	m := &Monitor{opts: opts, log: opts.Logger, wake: make(chan struct{}, 1), states: map[string]*state{}, changed: make(chan struct{})}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kube_mvp_extproc_proxy_certificate_accepted",
		Help: "Whether the apiserver accepted the proxy certificate as a front proxy at its last conclusive check (1) or refused it (0). " +
			"No series for an apiserver not yet checked conclusively; removed when it leaves the routing table's live apiservers.",
	}, []string{"apiserver"})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(m.gauge)
	}
	return m
}

// SetTable makes t's live apiservers (with an address) the ones checked, with t's user
// header; a change starts a round at once. It never blocks; a nil t is ignored.
func (m *Monitor) SetTable(t *plan.Table) {
	if t == nil {
		return
	}
	var targets []Target
	for _, s := range t.APIServers {
		if s.Routable() {
			targets = append(targets, Target{ID: s.ID, Hostname: s.Hostname, Address: s.Address})
		}
	}
	slices.SortFunc(targets, func(a, b Target) int { return strings.Compare(a.ID, b.ID) })
	headers := slices.Clone(t.RequestHeaders.OrDefault().User)
	var key strings.Builder
	key.WriteString(strings.Join(headers, ","))
	for _, tg := range targets {
		fmt.Fprintf(&key, "\n%s=%s", tg.ID, tg.Address)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if key.String() == m.key {
		return
	}
	m.targets, m.headers, m.key = targets, headers, key.String()
	current := map[string]Target{}
	for _, tg := range targets {
		current[tg.ID] = tg
	}
	for id, st := range m.states {
		if tg, ok := current[id]; !ok || tg.Address != st.target.Address {
			delete(m.states, id)
			m.gauge.DeleteLabelValues(id)
		} else {
			st.target = tg // the hostname may have changed
		}
	}
	m.notify()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run checks until ctx ends: at once when SetTable changed the apiservers, and every
// Interval.
func (m *Monitor) Run(ctx context.Context) {
	timer := time.NewTimer(m.opts.Interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-timer.C:
		}
		m.round(ctx)
		timer.Reset(m.opts.Interval)
	}
}

// maxParallel bounds the checks in flight.
const maxParallel = 8

// round checks every current target once.
func (m *Monitor) round(ctx context.Context) {
	m.mu.Lock()
	targets, headers := m.targets, m.headers
	m.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	check, err := m.opts.NewCheck()
	m.mu.Lock()
	if err != nil && (m.loadErr == nil || m.loadErr.Error() != err.Error()) {
		m.log.Error("cannot check whether the apiservers accept the proxy certificate", "error", err)
	} else if err == nil && m.loadErr != nil {
		m.log.Info("proxy certificate loaded again; checking the apiservers")
	}
	m.loadErr = err
	m.mu.Unlock()
	if err != nil {
		return
	}

	results := make([]Result, len(targets))
	sem := make(chan struct{}, maxParallel)
	var wg sync.WaitGroup
	for i, tg := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			cctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
			defer cancel()
			results[i] = check(cctx, tg.Address, headers)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // stopping: the results are cut short
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Equal(m.headers, headers) {
		return // asked with user headers no longer in use; the next round is queued
	}
	current := map[string]Target{}
	for _, tg := range m.targets {
		current[tg.ID] = tg
	}
	for i, tg := range targets {
		if cur, ok := current[tg.ID]; ok && cur.Address == tg.Address {
			m.record(cur, results[i])
		}
	}
	m.notify()
}

// Findings are the last conclusive check of every current target that had one, sorted by
// ID, and a channel closed when they next change (what extproc reports to xds-server).
func (m *Monitor) Findings() ([]Finding, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.findings(), m.changed
}

// findings is Findings' list. Call with mu held.
func (m *Monitor) findings() []Finding {
	var out []Finding
	for _, tg := range m.targets {
		if st, ok := m.states[tg.ID]; ok && st.conclusive.Verdict != Inconclusive {
			out = append(out, Finding{Target: st.target, Result: st.conclusive})
		}
	}
	return out
}

// notify closes changed when the findings changed since it was last closed. Call with mu
// held.
func (m *Monitor) notify() {
	var key strings.Builder
	for _, f := range m.findings() {
		fmt.Fprintf(&key, "%s\x00%s\x00%s\x00%d\x00%t\x00%s\n", f.ID, f.Hostname, f.Address, f.Verdict, f.Dangerous, f.Reason)
	}
	if key.String() == m.findingsKey {
		return
	}
	m.findingsKey = key.String()
	close(m.changed)
	m.changed = make(chan struct{})
}

// record keeps r as tg's state, logs a change of state and sets the gauge. Call with mu held.
func (m *Monitor) record(tg Target, r Result) {
	prev, seen := m.states[tg.ID]
	st := &state{target: tg, result: r, conclusive: r}
	if r.Verdict == Inconclusive {
		st.conclusive = Result{}
		if seen {
			st.conclusive = prev.conclusive
		}
	}
	m.states[tg.ID] = st
	switch r.Verdict {
	case Accepted:
		m.gauge.WithLabelValues(tg.ID).Set(1)
	case Refused:
		m.gauge.WithLabelValues(tg.ID).Set(0)
	}
	// A change of verdict is logged, and for a refusal a change of reason; an inconclusive
	// check's reason (an error) may differ every time and is not.
	if seen && prev.result.Verdict == r.Verdict && (r.Verdict != Refused || prev.result.Reason == r.Reason) {
		return
	}
	attrs := []any{"apiserver", tg.ID, "hostname", tg.Hostname, "address", tg.Address}
	switch r.Verdict {
	case Accepted:
		m.log.Info("apiserver accepts the proxy certificate as a front proxy", attrs...)
	case Refused:
		m.log.Error("apiserver refuses the proxy certificate: Envoy's requests with it fail there", append(attrs, "status", r.Status, "user", r.User, "dangerous", r.Dangerous, "reason", r.Reason)...)
	default:
		m.log.Warn("cannot tell whether the apiserver accepts the proxy certificate", append(attrs, "reason", r.Reason)...)
	}
}

// Report says whether kube-mvp can work with its proxy certificate (ready: false only when
// every apiserver that answered refuses it) and, in plain text, which apiservers refuse it
// and what to fix; text is empty when there is nothing to say.
func (m *Monitor) Report() (ready bool, text string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var accepted, refused, inconclusive []*state
	for _, tg := range m.targets {
		st, ok := m.states[tg.ID]
		switch {
		case !ok:
		case st.result.Verdict == Accepted:
			accepted = append(accepted, st)
		case st.result.Verdict == Refused:
			refused = append(refused, st)
		default:
			inconclusive = append(inconclusive, st)
		}
	}
	var b strings.Builder
	if m.loadErr != nil {
		fmt.Fprintf(&b, "warning: cannot check whether the apiservers accept the proxy certificate: %v\n", m.loadErr)
	}
	ready = len(refused) == 0 || len(accepted) > 0
	switch {
	case len(refused) == 0:
	case !ready:
		fmt.Fprintf(&b, "every apiserver that answered (%d) refuses kube-mvp's proxy certificate: "+
			"Envoy's requests with it (client certificates, health checks) "+
			"fail everywhere, so nothing works through kube-mvp. Fix each:\n", len(refused))
	default:
		fmt.Fprintf(&b, "warning: %d of %d apiservers that answered refuse kube-mvp's proxy certificate (kube-mvp "+
			"stays ready: Envoy's health checks keep requests away from an apiserver that answers them 401). Fix each:\n",
			len(refused), len(refused)+len(accepted))
	}
	for _, st := range refused {
		fmt.Fprintf(&b, "  - %s: %s\n", st.target, st.result.Reason)
	}
	if len(inconclusive) > 0 {
		fmt.Fprintf(&b, "not known whether %d apiserver(s) accept the proxy certificate:\n", len(inconclusive))
		for _, st := range inconclusive {
			fmt.Fprintf(&b, "  - %s: %s\n", st.target, st.result.Reason)
		}
	}
	if len(accepted) > 0 && (len(refused) > 0 || len(inconclusive) > 0) {
		names := make([]string, len(accepted))
		for i, st := range accepted {
			names[i] = cmp.Or(st.target.Hostname, st.target.ID)
		}
		fmt.Fprintf(&b, "accepted by: %s\n", strings.Join(names, ", "))
	}
	return ready, b.String()
}
