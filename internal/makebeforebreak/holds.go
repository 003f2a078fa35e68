package makebeforebreak

import (
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Hold is what Envoy's configuration must keep besides what the current plans name. It
// changes the clusters, never the routes.
type Hold struct {
	// Lingering are serving sets, by name, kept for older routing tables (their members
	// as when last named; Apply keeps only the live ones). Nil when none.
	Lingering map[string]topology.ServerSet
	// Joining are live apiserver IDs held out of the default cluster. Nil when none. It may
	// hold every live apiserver (all came live together after the first Observe): Apply then
	// holds none back, since an empty default cluster serves nobody.
	Joining map[string]bool
}

// Apply returns a copy of p whose clusters also keep h's lingering serving sets (with their
// members that are still live) and whose default cluster leaves out h's joining apiservers;
// when every live apiserver is joining, none is held back. Routes are shared with p.
func (h Hold) Apply(p *plan.Plan) *plan.Plan {
	c := *p
	c.Clusters = slices.Clone(p.Clusters)
	live := p.Topology.Live()
	for i, cl := range c.Clusters {
		if cl.Role != plan.RoleDefault || len(h.Joining) == 0 {
			continue
		}
		var members topology.ServerSet
		for _, id := range cl.Members {
			if !h.Joining[id] {
				members = append(members, id)
			}
		}
		if len(members) > 0 {
			c.Clusters[i].Members = members
		}
	}
	named := map[string]bool{}
	for _, cl := range c.Clusters {
		named[cl.Name] = true
	}
	for name, set := range h.Lingering {
		if named[name] {
			continue
		}
		var members topology.ServerSet
		for _, id := range set {
			if slices.Contains(live, id) {
				members = append(members, id)
			}
		}
		c.Clusters = append(c.Clusters, plan.Cluster{Name: name, Role: plan.RoleLingering, Members: members})
	}
	slices.SortFunc(c.Clusters, func(a, b plan.Cluster) int { return strings.Compare(a.Name, b.Name) })
	return &c
}

// Holds decides, across topology changes, what Envoy's configuration keeps besides the
// plans (rules 2 and 3): it tracks the serving sets named and when each apiserver became
// live, and when a linger or a join ends it calls back for the Hold to be worked out again.
// Not safe for concurrent use (the caller holds its own lock).
type Holds struct {
	opts  Options
	clock clock.WithDelayedExecution
	// expired is called, in a goroutine of its own, when the last Hold is out of date.
	expired func()
	timer   clock.Timer
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

// NewHolds returns Holds that have observed nothing yet. expired is called when a linger
// or a join ends: the caller should then call Observe again with what is current. It runs
// in a goroutine of its own, so it may take the lock the caller holds around Observe (a
// clock may run timers under its own lock, k8s.io/utils' FakeClock does, and Observe reads
// the clock).
func NewHolds(o Options, expired func()) *Holds {
	return &Holds{opts: o, clock: o.clock(), expired: expired, lingering: map[string]lingeringCluster{}}
}

// Clock is the clock the delays are measured on.
func (h *Holds) Clock() clock.WithDelayedExecution { return h.clock }

// Observe records the plans in use, e's front plan and the sidecar plans of the apiserver
// IDs in sidecars (those beside which a sidecar is connected; unknown IDs are skipped), and
// returns the Hold for their snapshots. It calls expired when that Hold goes out of date
// with time.
func (h *Holds) Observe(e *plan.Envoys, sidecars []string) Hold {
	named := e.Front.SubsetClusters()
	for _, id := range sidecars {
		if p := e.For(id); p != nil {
			maps.Copy(named, p.SubsetClusters())
		}
	}
	hold, next := h.observe(named, e.Front.Topology.Live())
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	if !next.IsZero() {
		h.timer = h.clock.AfterFunc(next.Sub(h.clock.Now()), func() { go h.expired() })
	}
	return hold
}

// observe records the serving sets the current plans name (by name → members) and the
// live apiserver IDs, and returns the Hold for the snapshots and the time at which observe
// must be called again with the same arguments because a linger or a join ends (zero time:
// none pending).
//
// The apiservers live at the first observe (even if none) are the ones Envoy starts with:
// no table predates them, so they never wait. One that is live later, including one that
// went away and came back, joins JoinDelay after the observe that first sees it live. A
// serving set lingers from the first observe that no longer names it (members as last named)
// until Linger has passed, or until it is named again.
func (h *Holds) observe(named map[string]topology.ServerSet, live []string) (Hold, time.Time) {
	now := h.clock.Now()
	var hold Hold
	var next time.Time
	earliest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}

	if h.opts.Linger > 0 {
		for name, set := range h.named {
			if _, still := named[name]; still {
				continue
			}
			if _, already := h.lingering[name]; !already {
				h.lingering[name] = lingeringCluster{set: set, until: now.Add(h.opts.Linger)}
			}
		}
	}
	h.named = maps.Clone(named)
	for name, l := range h.lingering {
		if _, back := named[name]; back || !now.Before(l.until) {
			delete(h.lingering, name)
			continue
		}
		if hold.Lingering == nil {
			hold.Lingering = map[string]topology.ServerSet{}
		}
		hold.Lingering[name] = l.set
		earliest(l.until)
	}

	first := h.joinEnd == nil
	joinEnd := make(map[string]time.Time, len(live))
	for _, id := range live {
		end, known := h.joinEnd[id]
		if !known && !first {
			end = now.Add(h.opts.JoinDelay())
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
	h.joinEnd = joinEnd
	return hold, next
}
