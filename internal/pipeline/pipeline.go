// Package pipeline is xds-server's chain from a topology to what Envoy and extproc receive:
// topology (internal/inventory watches it, a test builds it from objects) → plans
// (internal/plan) → Envoy's snapshots (internal/snapshot, served by internal/xds) and
// extproc's routing table (internal/tablestream), timed by internal/makebeforebreak.
//
// One Pipeline owns every piece of that state: the last topology, the apiservers extproc
// reports dangerous, the ADS server, the routing-table server and its publisher. Each input
// has its method (OnTopology, OnProxyChecks, OnConfigRejected); every decision is made in
// replanLocked, and Envoy's snapshots and extproc's table are both translations of its plans.
package pipeline

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/makebeforebreak"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// Options configure New.
type Options struct {
	// Snapshot is the Envoy configuration snapshot.Build makes the plans into.
	Snapshot snapshot.Config
	// MakeBeforeBreak times what reaches Envoy and extproc; its Clock runs the table delays,
	// the linger and the join delay (tests step a fake one).
	MakeBeforeBreak makebeforebreak.Options
	// Limits bound what the ADS server's clients can make it hold.
	Limits xds.Limits
	// Credentials are the control plane's own TLS on the gRPC port: every Envoy stream must
	// prove an Envoy role, and the certificates' expiry is exported. Nil: plaintext.
	Credentials *cptls.Credentials
	// Log; nil means slog.Default().
	Log *slog.Logger
	// Registerer gets the pipeline's metrics (metrics.go); nil: a registry of its own.
	Registerer prometheus.Registerer
}

// Pipeline turns each topology into Envoy's snapshots and extproc's routing table. It is
// safe for concurrent use.
type Pipeline struct {
	log         *slog.Logger
	translation Translation
	metrics     *metrics
	xds         *xds.Server
	tables      *tablestream.Server
	checks      *tablestream.ProxyChecks
	publisher   *makebeforebreak.Publisher[*plan.Envoys]

	mu        sync.Mutex
	topology  *topology.Topology // the last one given; nil before the first
	dangerous map[string]string  // what the last plans were made with, by apiserver ID
}

// New returns a Pipeline with no topology yet: Envoys and extprocs that connect wait for the
// first OnTopology.
func New(o Options) *Pipeline {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	p := &Pipeline{log: o.Log, translation: Translation{Config: o.Snapshot, Log: o.Log}, dangerous: map[string]string{}}
	p.metrics = newMetrics(o.Registerer)
	p.checks = &tablestream.ProxyChecks{Log: o.Log, OnChange: p.OnProxyChecks}
	p.tables = tablestream.NewServer(tablestream.ServerOptions{Log: o.Log, Registerer: o.Registerer, ProxyChecks: p.checks})

	mbb := o.MakeBeforeBreak
	mbb.OnDelay = func(names []makebeforebreak.Name, delay time.Duration) {
		p.log.Info("routing table narrowed to what Envoy has; the whole table follows after the delay", "delay", delay, "new", names)
	}
	mbb.OnHoldExpired = func() {
		p.log.Warn("a routing table held while an Envoy refuses the newest configuration " +
			"went out anyway: the serving sets the older table names linger no longer " +
			"(--cluster-linger), and the Envoys that accepted it need the new one")
	}
	// time.Now, not the clock: under a fake clock publish runs inside Step, which holds it.
	p.publisher = makebeforebreak.NewPublisher(mbb, func(e *plan.Envoys) { p.tables.Publish(e.Table(), time.Now()) })

	p.xds = xds.New(xds.Options{
		Translate: (&reusing{translate: p.translation.Snapshot}).Snapshot, MakeBeforeBreak: o.MakeBeforeBreak, Log: o.Log, OnBuild: p.metrics.observeBuild,
		Admit:  func(e *plan.Envoys) error { return tablestream.Fits(e.Table()) },
		Limits: o.Limits, RequireRole: o.Credentials != nil,
		OnRefused:        func(reason string, _ error) { p.metrics.refused.WithLabelValues(reason).Inc() },
		OnRejectedChange: p.OnConfigRejected,
	})
	p.metrics.registerServing(o.Registerer, p.xds, p.checks, o.Credentials)
	return p
}

// Register serves the ADS server (and the per-type xDS services) and extproc's TableService
// on g.
func (p *Pipeline) Register(ctx context.Context, g *grpc.Server) {
	p.xds.Register(ctx, g)
	tablev1.RegisterTableServiceServer(g, p.tables)
}

// XDS is the ADS server: its admin pages, its status, the refusals of the gRPC policy.
func (p *Pipeline) XDS() *xds.Server { return p.xds }

// OnTopology is the inventory's input: every topology it builds.
func (p *Pipeline) OnTopology(t *topology.Topology) {
	p.metrics.observeTopology(t)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.topology = t
	p.replanLocked(t)
}

// OnProxyChecks is extproc's input: its proxy certificate reports changed. The plans are
// made again only if that changes the dangerous apiservers of the last topology.
func (p *Pipeline) OnProxyChecks() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.topology != nil && !maps.Equal(p.checks.Dangerous(p.topology), p.dangerous) {
		p.replanLocked(p.topology)
	}
}

// OnConfigRejected is the connected Envoys' input: whether one refuses the newest
// configuration may have changed. While one does, whole routing tables that name something
// new wait, since that Envoy may not have it (narrowed tables still go out).
func (p *Pipeline) OnConfigRejected() {
	rejected := p.xds.ConfigRejected()
	if rejected {
		p.metrics.tableHeld.Set(1)
		p.log.Warn("an Envoy refused the newest configuration: routing tables naming something new wait until it accepts one (narrowed ones go out)")
	} else {
		p.metrics.tableHeld.Set(0)
		p.log.Info("every Envoy accepts the newest configuration: held routing tables go out")
	}
	p.publisher.Hold(rejected)
}

// replanLocked makes every Envoy's plan of t with the apiservers extproc calls dangerous, and
// hands the plans to the ADS server, then to the routing-table publisher.
func (p *Pipeline) replanLocked(t *topology.Topology) {
	d := p.checks.Dangerous(t)
	logDangerChanges(p.log, t, p.dangerous, d)
	p.dangerous = d
	p.metrics.dangerous.Set(float64(len(d)))
	e, err := plan.ForEveryEnvoy(t.WithDangerous(d))
	if err != nil {
		p.metrics.builds.WithLabelValues("error").Inc()
		p.log.Error("no routing plan for the new topology; Envoy and extproc keep the last one", "error", err)
		return
	}
	// Envoy's snapshots first: a plan that cannot be built is held back whole, so
	// extproc's table never names what Envoy did not receive.
	if err := p.xds.Update(e); err != nil {
		p.metrics.planHeld.Set(1)
		p.log.Error("the new plan cannot be built into Envoy's configuration and extproc's routing table; Envoy and extproc keep the last good pair", "error", err)
		return
	}
	p.metrics.planHeld.Set(0)
	p.publisher.Offer(e)
}

// Translation makes a plan's Envoy resources with snapshot.Build. An apiserver with an
// unusable address only loses its endpoint (logged); any other error keeps the previous
// snapshot.
type Translation struct {
	Config snapshot.Config
	Log    *slog.Logger
}

// Snapshot is the xds.Translator of t.
func (t Translation) Snapshot(p *plan.Plan) (*cachev3.Snapshot, error) {
	res, err := snapshot.Build(p, t.Config)
	if res == nil {
		return nil, err
	}
	if merr, ok := err.(interface{ Unwrap() []error }); ok { // Resources despite problems: each an *AddressError
		for _, e := range merr.Unwrap() {
			t.Log.Warn("apiserver left out of the endpoints", "error", e)
		}
	}
	return res.Snapshot()
}

// logDangerChanges logs each apiserver of t that became dangerous (now) or stopped being so
// since before.
func logDangerChanges(log *slog.Logger, t *topology.Topology, before, now map[string]string) {
	for _, id := range slices.Sorted(maps.Keys(now)) {
		if before[id] == now[id] {
			continue
		}
		s, _ := t.Server(id)
		log.Error("extproc reports that the apiserver takes the proxy certificate for an ordinary client's: requests whose identity kube-mvp sets go only to other apiservers, or get a 503 naming it",
			"apiserver", id, "hostname", s.Hostname, "address", s.Address, "reason", now[id])
	}
	for _, id := range slices.Sorted(maps.Keys(before)) {
		if _, still := now[id]; !still {
			s, _ := t.Server(id)
			log.Info("no extproc reports the apiserver dangerous any more: requests whose identity kube-mvp sets may go to it again",
				"apiserver", id, "hostname", s.Hostname, "address", s.Address)
		}
	}
}
