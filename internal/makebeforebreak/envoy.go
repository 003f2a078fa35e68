package makebeforebreak

import (
	"maps"
	"time"

	"k8s.io/utils/clock"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Hold is what Envoy's config must keep besides what the current plan names.
type Hold struct {
	// Lingering are serving sets, by name, kept for older routing tables (their members
	// as when last named; the plan gives each only its live ones). Nil when none.
	Lingering map[string]topology.ServerSet
	// Joining are live apiserver IDs held out of the default cluster. Nil when none. It may
	// hold every live apiserver (all came live together after the first Observe): the plan
	// then holds none back (plan.Plan.WithHold), since an empty default cluster serves
	// nobody, and that is not this package's decision.
	Joining map[string]bool
}

// Envoy tracks, across topology changes, the serving sets named and when each apiserver
// became live. Not safe for concurrent use (the caller holds its own lock).
type Envoy struct {
	opts  Options
	clock clock.WithDelayedExecution
	// named is what the last Observe was told; lingering is what earlier ones named and it
	// did not, until when.
	named     map[string]topology.ServerSet
	lingering map[string]lingeringCluster
	// joinEnd is when each live apiserver joins (or joined) the default cluster; the zero
	// time for those live in the first Observe. Nil before the first Observe.
	joinEnd map[string]time.Time
}

type lingeringCluster struct {
	set   topology.ServerSet
	until time.Time
}

// NewEnvoy returns an Envoy that has observed nothing yet.
func NewEnvoy(o Options) *Envoy {
	return &Envoy{opts: o, clock: o.clock(), lingering: map[string]lingeringCluster{}}
}

// Clock is the clock Observe reads: schedule the next Observe on it.
func (e *Envoy) Clock() clock.WithDelayedExecution { return e.clock }

// Observe records the serving sets the current plans name (by name → members) and the
// live apiserver IDs, and returns the Hold for the snapshots and the time at which Observe
// must be called again with the same arguments because a linger or a join ends (zero time:
// none pending).
//
// The apiservers live at the first Observe (even if none) are the ones Envoy starts with:
// no table predates them, so they never wait. One that is live later, including one that
// went away and came back, joins JoinDelay after the Observe that first sees it live. A
// serving set lingers from the first Observe that no longer names it (members as last named)
// until Linger has passed, or until it is named again.
func (e *Envoy) Observe(named map[string]topology.ServerSet, live []string) (Hold, time.Time) {
	now := e.clock.Now()
	var hold Hold
	var next time.Time
	earliest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}

	if e.opts.Linger > 0 {
		for name, set := range e.named {
			if _, still := named[name]; still {
				continue
			}
			if _, already := e.lingering[name]; !already {
				e.lingering[name] = lingeringCluster{set: set, until: now.Add(e.opts.Linger)}
			}
		}
	}
	e.named = maps.Clone(named)
	for name, l := range e.lingering {
		if _, back := named[name]; back || !now.Before(l.until) {
			delete(e.lingering, name)
			continue
		}
		if hold.Lingering == nil {
			hold.Lingering = map[string]topology.ServerSet{}
		}
		hold.Lingering[name] = l.set
		earliest(l.until)
	}

	first := e.joinEnd == nil
	joinEnd := make(map[string]time.Time, len(live))
	for _, id := range live {
		end, known := e.joinEnd[id]
		if !known && !first {
			end = now.Add(e.opts.JoinDelay())
		}
		joinEnd[id] = end
		if now.Before(end) {
			if hold.Joining == nil {
				hold.Joining = map[string]bool{}
			}
			hold.Joining[id] = true
			earliest(end)
		}
	}
	e.joinEnd = joinEnd
	return hold, next
}
