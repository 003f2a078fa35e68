package makebeforebreak

import (
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// none is the want.next of an observe with nothing pending.
const none time.Duration = -1

type sets = map[string]topology.ServerSet

// observation is one observe at t0+at and what it must return.
type observation struct {
	at            time.Duration
	named         sets
	live          []string
	wantLingering sets
	wantJoining   []string
	wantNext      time.Duration // since t0, or none
}

func TestHolds(t *testing.T) {
	// TableDelay 1s (JoinDelay 2s), Linger 5s unless a case says otherwise.
	opts := Options{TableDelay: time.Second, Linger: 5 * time.Second}
	abc := []string{"a", "b", "c"}
	tests := []struct {
		name  string
		opts  *Options
		start time.Time // zero: t0
		steps []observation
	}{
		{
			name: "linger starts when a cluster stops being named and ends at Linger",
			steps: []observation{
				{at: 0, named: sets{"x": {"a", "c"}, "y": abc}, live: abc, wantNext: none},
				{at: time.Second, named: sets{"y": abc, "z": {"c"}}, live: abc,
					wantLingering: sets{"x": {"a", "c"}}, wantNext: 6 * time.Second},
				{at: 6*time.Second - 1, named: sets{"y": abc, "z": {"c"}}, live: abc,
					wantLingering: sets{"x": {"a", "c"}}, wantNext: 6 * time.Second},
				{at: 6 * time.Second, named: sets{"y": abc, "z": {"c"}}, live: abc, wantNext: none},
			},
		},
		{
			name: "a lingering cluster keeps the members it had when last named",
			steps: []observation{
				{at: 0, named: sets{"x": {"a", "c"}}, live: abc, wantNext: none},
				{at: time.Second, named: sets{"w": {"c"}}, live: []string{"b", "c"},
					wantLingering: sets{"x": {"a", "c"}}, wantNext: 6 * time.Second},
			},
		},
		{
			name: "the deadline is set once, not pushed back by later observations",
			steps: []observation{
				{at: 0, named: sets{"x": {"a"}}, live: abc, wantNext: none},
				{at: time.Second, named: sets{}, live: abc, wantLingering: sets{"x": {"a"}}, wantNext: 6 * time.Second},
				{at: 3 * time.Second, named: sets{"v": {"b"}}, live: abc, wantLingering: sets{"x": {"a"}}, wantNext: 6 * time.Second},
			},
		},
		{
			name: "a cluster named again stops lingering, and lingers afresh with its new members",
			steps: []observation{
				{at: 0, named: sets{"x": {"a", "c"}}, live: abc, wantNext: none},
				{at: time.Second, named: sets{}, live: abc, wantLingering: sets{"x": {"a", "c"}}, wantNext: 6 * time.Second},
				{at: 2 * time.Second, named: sets{"x": {"c"}}, live: abc, wantNext: none},
				{at: 3 * time.Second, named: sets{}, live: abc, wantLingering: sets{"x": {"c"}}, wantNext: 8 * time.Second},
			},
		},
		{
			name: "the next time is the earliest of several lingers",
			steps: []observation{
				{at: 0, named: sets{"x": {"a"}, "y": {"b"}}, live: abc, wantNext: none},
				{at: time.Second, named: sets{"y": {"b"}}, live: abc, wantLingering: sets{"x": {"a"}}, wantNext: 6 * time.Second},
				{at: 2 * time.Second, named: sets{}, live: abc, wantLingering: sets{"x": {"a"}, "y": {"b"}}, wantNext: 6 * time.Second},
				{at: 6 * time.Second, named: sets{}, live: abc, wantLingering: sets{"y": {"b"}}, wantNext: 7 * time.Second},
				{at: 7 * time.Second, named: sets{}, live: abc, wantNext: none},
			},
		},
		{
			name: "Linger 0 drops an unnamed cluster at once",
			opts: &Options{TableDelay: time.Second},
			steps: []observation{
				{at: 0, named: sets{"x": {"a"}}, live: abc, wantNext: none},
				{at: time.Second, named: sets{}, live: abc, wantNext: none},
			},
		},
		{
			name: "apiservers live in the first Observe never join; a later one joins for JoinDelay",
			steps: []observation{
				{at: 0, live: []string{"a", "b"}, wantNext: none},
				{at: time.Second, live: abc, wantJoining: []string{"c"}, wantNext: 3 * time.Second},
				{at: 3*time.Second - 1, live: abc, wantJoining: []string{"c"}, wantNext: 3 * time.Second},
				{at: 3 * time.Second, live: abc, wantNext: none},
			},
		},
		{
			name: "an apiserver that goes away and comes back joins again",
			steps: []observation{
				{at: 0, live: abc, wantNext: none},
				{at: time.Second, live: []string{"b", "c"}, wantNext: none},
				{at: 2 * time.Second, live: abc, wantJoining: []string{"a"}, wantNext: 4 * time.Second},
				{at: 4 * time.Second, live: abc, wantNext: none},
			},
		},
		{
			name: "after a first Observe with nothing live, every newcomer joins, even all of them",
			steps: []observation{
				{at: 0, wantNext: none},
				{at: time.Second, live: []string{"a", "b"}, wantJoining: []string{"a", "b"}, wantNext: 3 * time.Second},
				{at: 2 * time.Second, live: abc, wantJoining: abc, wantNext: 3 * time.Second},
				{at: 3 * time.Second, live: abc, wantJoining: []string{"c"}, wantNext: 4 * time.Second},
			},
		},
		{
			name: "the next time is the earliest of lingers and joins",
			steps: []observation{
				{at: 0, named: sets{"x": {"a"}}, live: []string{"a"}, wantNext: none},
				// x lingers until 6s, b joins until 3s.
				{at: time.Second, named: sets{}, live: []string{"a", "b"},
					wantLingering: sets{"x": {"a"}}, wantJoining: []string{"b"}, wantNext: 3 * time.Second},
				{at: 3 * time.Second, named: sets{}, live: []string{"a", "b"},
					wantLingering: sets{"x": {"a"}}, wantNext: 6 * time.Second},
				// c joins until 7s, after x's linger ends.
				{at: 5 * time.Second, named: sets{}, live: abc,
					wantLingering: sets{"x": {"a"}}, wantJoining: []string{"c"}, wantNext: 6 * time.Second},
				{at: 6 * time.Second, named: sets{}, live: abc, wantJoining: []string{"c"}, wantNext: 7 * time.Second},
			},
		},
		{
			name: "TableDelay 0: a newcomer joins at once",
			opts: &Options{},
			steps: []observation{
				{at: 0, live: []string{"a"}, wantNext: none},
				{at: time.Second, live: []string{"a", "b"}, wantNext: none},
			},
		},
		{
			name:  "a clock at the zero time still counts the first apiservers as live forever",
			start: time.Time{}.Add(time.Nanosecond),
			steps: []observation{
				{at: 0, live: []string{"a"}, wantNext: none},
				{at: time.Second, live: []string{"a", "b"}, wantJoining: []string{"b"}, wantNext: 3 * time.Second},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := opts
			if tc.opts != nil {
				o = *tc.opts
			}
			start := tc.start
			if start.IsZero() {
				start = t0
			}
			clk := clocktesting.NewFakeClock(start)
			o.Clock = clk
			h := NewHolds(o, func() {})
			if h.Clock() != clk {
				t.Fatalf("Holds.Clock is not the clock given")
			}
			for i, s := range tc.steps {
				clk.SetTime(start.Add(s.at))
				named := maps.Clone(s.named)
				hold, next := h.observe(named, s.live)
				clear(named) // observe must not keep the caller's map
				if !reflect.DeepEqual(hold.Lingering, s.wantLingering) {
					t.Errorf("step %d (at %s): lingering %v, want %v", i, s.at, hold.Lingering, s.wantLingering)
				}
				if got := slices.Sorted(maps.Keys(hold.Joining)); !slices.Equal(got, s.wantJoining) {
					t.Errorf("step %d (at %s): joining %v, want %v", i, s.at, got, s.wantJoining)
				}
				want := time.Time{}
				if s.wantNext != none {
					want = start.Add(s.wantNext)
				}
				if !next.Equal(want) {
					t.Errorf("step %d (at %s): next %v, want %v", i, s.at, next, want)
				}
			}
		})
	}
}

// TestHoldsDefaultClock: without a clock, observe reads the wall clock.
func TestHoldsDefaultClock(t *testing.T) {
	h := NewHolds(Options{TableDelay: time.Hour, Linger: 2 * time.Hour}, func() {})
	h.observe(nil, []string{"a"})
	before := time.Now()
	hold, next := h.observe(nil, []string{"a", "b"})
	if !hold.Joining["b"] || next.Before(before.Add(2*time.Hour)) || next.After(time.Now().Add(2*time.Hour)) {
		t.Errorf("joining %v until %v, want b until 2h after %v", hold.Joining, next, before)
	}
}

// TestHoldsObserve: Observe reads the serving sets from the plans in use and calls expired
// once the linger is over.
func TestHoldsObserve(t *testing.T) {
	pods := topology.Resource{Version: "v1", Resource: "pods"}
	jobs := topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	a := topology.APIServer{ID: "id-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true}
	b := topology.APIServer{ID: "id-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true}
	c := topology.APIServer{ID: "id-c", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true}
	envoys := func(jobsOn ...string) *plan.Envoys {
		t.Helper()
		return envoysOf(t, []topology.APIServer{a, b, c}, map[topology.Resource][]string{pods: {"id-a", "id-b", "id-c"}, jobs: jobsOn})
	}
	clk := clocktesting.NewFakeClock(t0)
	expired := make(chan struct{}, 1)
	h := NewHolds(Options{TableDelay: time.Second, Linger: 5 * time.Second, Clock: clk}, func() { expired <- struct{}{} })

	// jobs on a and c, then on b and c, then on a and c again: each set no longer named
	// lingers. An unknown sidecar is skipped.
	h.Observe(envoys("id-a", "id-c"), []string{"id-b", "unknown"})
	if hold := h.Observe(envoys("id-b", "id-c"), []string{"id-b"}); !slices.Equal(slices.Sorted(maps.Keys(hold.Lingering)), []string{"kube-apiservers-only-cp-a+cp-c"}) {
		t.Fatalf("lingering %v, want a+c", hold.Lingering)
	}
	if hold := h.Observe(envoys("id-a", "id-c"), nil); !slices.Equal(slices.Sorted(maps.Keys(hold.Lingering)), []string{"kube-apiservers-only-cp-b+cp-c"}) {
		t.Fatalf("lingering %v, want b+c", hold.Lingering)
	}
	clk.Step(5*time.Second - time.Nanosecond)
	select {
	case <-expired:
		t.Fatal("expired before the linger is over")
	default:
	}
	clk.Step(time.Nanosecond)
	select {
	case <-expired:
	case <-time.After(10 * time.Second):
		t.Fatal("expired not called when the linger is over")
	}
	if hold := h.Observe(envoys("id-a", "id-c"), nil); hold.Lingering != nil || clk.HasWaiters() {
		t.Errorf("after the linger: lingering %v, timer set %v", hold.Lingering, clk.HasWaiters())
	}
}
