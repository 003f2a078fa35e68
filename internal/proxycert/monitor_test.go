package proxycert

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// fakeChecks answers each address with the result set for it (inconclusive if none) and
// records what it was asked.
type fakeChecks struct {
	mu      sync.Mutex
	results map[string]Result
	asked   map[string]int // by address
	headers map[string]bool
	loadErr error
	loads   int
}

func newFakeChecks() *fakeChecks {
	return &fakeChecks{results: map[string]Result{}, asked: map[string]int{}, headers: map[string]bool{}}
}

func (f *fakeChecks) set(addr string, r Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.results[addr] = r
}

func (f *fakeChecks) count(addr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[addr]
}

func (f *fakeChecks) newCheck() (CheckFunc, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads++
	if f.loadErr != nil {
		return nil, f.loadErr
	}
	return func(_ context.Context, addr string, headers []string) Result {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.asked[addr]++
		f.headers[strings.Join(headers, ",")] = true
		r, ok := f.results[addr]
		if !ok {
			return Result{Reason: "unreachable: connection refused"}
		}
		return r
	}, nil
}

var (
	accepted = Result{Verdict: Accepted, Status: 201, User: "kube-mvp:health-check"}
	refused  = Result{Verdict: Refused, Status: 401, Reason: `does not accept the proxy certificate as a front proxy: add its CN "front-proxy-client" to --requestheader-allowed-names`}
)

func table(servers ...topology.APIServer) *plan.Table { return &plan.Table{APIServers: servers} }

var (
	cpA = topology.APIServer{ID: "apiserver-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true}
	cpB = topology.APIServer{ID: "apiserver-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true}
	cpC = topology.APIServer{ID: "apiserver-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true}
)

// startMonitor runs a Monitor on f until the test ends.
func startMonitor(t *testing.T, f *fakeChecks, interval time.Duration) (*Monitor, *testutil.SyncBuffer, *prometheus.Registry) {
	t.Helper()
	var logs testutil.SyncBuffer
	reg := prometheus.NewRegistry()
	m := NewMonitor(MonitorOptions{NewCheck: f.newCheck, Interval: interval, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return m, &logs, reg
}

// series are the gauge's values by apiserver.
func series(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kube_mvp_extproc_proxy_certificate_accepted" {
			t.Errorf("unexpected metric %s", mf.GetName())
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	return out
}

func waitReport(t *testing.T, m *Monitor, what string, ok func(ready bool, text string) bool) (bool, string) {
	t.Helper()
	var ready bool
	var text string
	testutil.WaitFor(t, t.Context(), 10*time.Second, what, func() error {
		if ready, text = m.Report(); !ok(ready, text) {
			return errors.New("report: " + text)
		}
		return nil
	})
	return ready, text
}

// TestMonitorEveryRefuses: not ready, naming each refusing apiserver and what to fix;
// the unreachable one counts neither way. Back to ready once one accepts.
func TestMonitorEveryRefuses(t *testing.T) {
	f := newFakeChecks()
	f.set(cpA.Address, refused)
	f.set(cpB.Address, refused)
	m, logs, reg := startMonitor(t, f, time.Hour)
	if ready, text := m.Report(); !ready || text != "" {
		t.Errorf("before any table: ready %v, %q", ready, text)
	}
	m.SetTable(table(cpA, cpB, cpC))
	_, text := waitReport(t, m, "not ready", func(ready bool, _ string) bool { return !ready })
	for _, want := range []string{
		"every apiserver that answered (2) refuses kube-mvp's proxy certificate",
		"  - apiserver-a (hostname cp-a, address 10.0.0.1:6443): " + refused.Reason + "\n",
		"  - apiserver-b (hostname cp-b, address 10.0.0.2:6443): " + refused.Reason + "\n",
		"not known whether 1 apiserver(s) accept the proxy certificate:\n  - apiserver-c (hostname cp-c, address 10.0.0.3:6443): unreachable: connection refused\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if got := series(t, reg); !maps.Equal(got, map[string]float64{"apiserver-a": 0, "apiserver-b": 0}) {
		t.Errorf("series %v, want a and b 0 (none for the unreachable apiserver)", got)
	}
	if !strings.Contains(logs.String(), "level=ERROR msg=\"apiserver refuses the proxy certificate") {
		t.Errorf("logs:\n%s", logs)
	}

	// cp-c answers now and accepts: ready, cp-a and cp-b listed as warnings.
	f.set(cpC.Address, accepted)
	m.SetTable(table(cpA, cpB, cpC, topology.APIServer{ID: "apiserver-d", Hostname: "cp-d", Address: "10.0.0.4:6443"})) // not alive: no change
	m.SetTable(table(cpA, cpB, topology.APIServer{ID: cpC.ID, Hostname: cpC.Hostname, Address: "10.0.0.3:6443", Alive: true, Verified: true}))
	if n := f.count(cpC.Address); n != 1 {
		t.Fatalf("cp-c checked %d times; an unchanged table started a round", n)
	}
	cpC2 := cpC
	cpC2.Address = "10.0.0.33:6443" // moved: checked at once
	f.set(cpC2.Address, accepted)
	m.SetTable(table(cpA, cpB, cpC2))
	_, text = waitReport(t, m, "ready with warnings", func(ready bool, _ string) bool { return ready })
	for _, want := range []string{
		"warning: 2 of 3 apiservers that answered refuse kube-mvp's proxy certificate (kube-mvp stays ready",
		"  - apiserver-a (hostname cp-a, address 10.0.0.1:6443): " + refused.Reason,
		"accepted by: cp-c\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "not known") {
		t.Errorf("the old address of cp-c is still reported:\n%s", text)
	}
	if got := series(t, reg); !maps.Equal(got, map[string]float64{"apiserver-a": 0, "apiserver-b": 0, "apiserver-c": 1}) {
		t.Errorf("series %v", got)
	}
}

// TestMonitorLogsChangesOnce: periodic rounds log nothing new; a change of state is logged
// once; an apiserver that leaves the table loses its series and no longer counts.
func TestMonitorLogsChangesOnce(t *testing.T) {
	f := newFakeChecks()
	f.set(cpA.Address, refused)
	f.set(cpB.Address, accepted)
	m, logs, reg := startMonitor(t, f, 5*time.Millisecond)
	m.SetTable(&plan.Table{APIServers: []topology.APIServer{cpA, cpB}, RequestHeaders: topology.RequestHeaders{User: []string{"X-Login", "X-User"}}})
	testutil.WaitFor(t, t.Context(), 10*time.Second, "ten rounds", testutil.Cond(func() bool { return f.count(cpA.Address) >= 10 }))
	if n := strings.Count(logs.String(), "apiserver refuses the proxy certificate"); n != 1 {
		t.Errorf("refusal logged %d times, want once:\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), `msg="apiserver accepts the proxy certificate`); n != 1 {
		t.Errorf("acceptance logged %d times, want once:\n%s", n, logs)
	}
	f.mu.Lock()
	if len(f.headers) != 1 || !f.headers["x-login,x-user"] {
		t.Errorf("asked with headers %v, want every user header of the table, x-login,x-user (as Envoy's health checks send them)", f.headers)
	}
	f.mu.Unlock()

	f.set(cpA.Address, accepted)
	testutil.WaitFor(t, t.Context(), 10*time.Second, "cp-a accepted", testutil.Cond(func() bool { return series(t, reg)["apiserver-a"] == 1 }))
	f.set(cpA.Address, Result{Reason: "unreachable: i/o timeout"})
	n := f.count(cpA.Address)
	testutil.WaitFor(t, t.Context(), 10*time.Second, "more rounds", testutil.Cond(func() bool { return f.count(cpA.Address) >= n+5 }))
	if n := strings.Count(logs.String(), `msg="apiserver accepts the proxy certificate`); n != 2 {
		t.Errorf("acceptance logged %d times, want twice (cp-b, then cp-a):\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "cannot tell whether the apiserver accepts"); n != 1 {
		t.Errorf("inconclusive logged %d times, want once:\n%s", n, logs)
	}
	if got := series(t, reg)["apiserver-a"]; got != 1 {
		t.Errorf("an unreachable apiserver's gauge is %v, want its last conclusive 1", got)
	}

	f.set(cpB.Address, refused)
	waitReport(t, m, "not ready", func(ready bool, _ string) bool { return !ready })
	m.SetTable(table(cpA)) // cp-b leaves: nothing refuses any more
	if ready, text := m.Report(); !ready || strings.Contains(text, "cp-b") {
		t.Errorf("after cp-b left: ready %v\n%s", ready, text)
	}
	if got := series(t, reg); !maps.Equal(got, map[string]float64{"apiserver-a": 1}) {
		t.Errorf("series %v after cp-b left, want apiserver-a 1 only", got)
	}
}

// TestMonitorCannotLoad: credentials that cannot be read are a warning, not a failure.
func TestMonitorCannotLoad(t *testing.T) {
	f := newFakeChecks()
	f.loadErr = errors.New("proxy client certificate /x: no such file")
	m, logs, _ := startMonitor(t, f, 5*time.Millisecond)
	m.SetTable(table(cpA))
	ready, text := waitReport(t, m, "the warning", func(_ bool, text string) bool { return text != "" })
	if !ready || !strings.Contains(text, "warning: cannot check whether the apiservers accept the proxy certificate: proxy client certificate /x: no such file") {
		t.Errorf("ready %v, %q", ready, text)
	}
	testutil.WaitFor(t, t.Context(), 10*time.Second, "five rounds", testutil.Cond(func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.loads >= 5
	}))
	if n := strings.Count(logs.String(), "cannot check"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs)
	}
}

// TestMonitorFindings: Findings lists each current apiserver's last conclusive check (what
// extproc reports to xds-server), signals every change, keeps a dangerous verdict through an
// inconclusive check, and drops an apiserver that leaves the table.
func TestMonitorFindings(t *testing.T) {
	dangerous := Result{Verdict: Refused, Status: 201, User: "front-proxy-client", Dangerous: true, Reason: "DANGEROUS"}
	f := newFakeChecks()
	f.set(cpA.Address, accepted)
	f.set(cpC.Address, dangerous)
	m, _, _ := startMonitor(t, f, 50*time.Millisecond)
	findings, changed := m.Findings()
	if len(findings) != 0 {
		t.Errorf("findings before any table: %v", findings)
	}
	m.SetTable(table(cpA, cpB, cpC))
	waitFindings := func(what string, want map[string]Result) {
		t.Helper()
		testutil.WaitFor(t, t.Context(), 10*time.Second, what, func() error {
			var got []Finding
			got, changed = m.Findings()
			byID := map[string]Result{}
			for _, fd := range got {
				byID[fd.ID] = fd.Result
			}
			if !maps.Equal(byID, want) {
				return fmt.Errorf("findings %v", byID)
			}
			return nil
		})
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no change signalled after the first round")
	}
	// cp-b is unreachable: inconclusive, not listed.
	waitFindings("first round", map[string]Result{cpA.ID: accepted, cpC.ID: dangerous})

	// cp-c stops answering: still dangerous, since the last conclusive check said so.
	f.set(cpC.Address, Result{Reason: "unreachable: timeout"})
	before := f.count(cpC.Address)
	testutil.WaitFor(t, t.Context(), 10*time.Second, "cp-c checked again", func() error {
		if f.count(cpC.Address) < before+2 {
			return errors.New("not yet")
		}
		return nil
	})
	waitFindings("cp-c inconclusive", map[string]Result{cpA.ID: accepted, cpC.ID: dangerous})

	// cp-c fixed: a change, signalled.
	_, changed = m.Findings()
	f.set(cpC.Address, accepted)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no change signalled when cp-c was fixed")
	}
	waitFindings("cp-c fixed", map[string]Result{cpA.ID: accepted, cpC.ID: accepted})

	m.SetTable(table(cpA))
	waitFindings("cp-c left the table", map[string]Result{cpA.ID: accepted})
}
