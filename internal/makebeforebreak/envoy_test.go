package makebeforebreak

import (
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// none is the want.next of an Observe with nothing pending.
const none time.Duration = -1

type sets = map[string]topology.ServerSet

// observation is one Observe at t0+at and what it must return.
type observation struct {
	at            time.Duration
	named         sets
	live          []string
	wantLingering sets
	wantJoining   []string
	wantNext      time.Duration // since t0, or none
}

func TestEnvoy(t *testing.T) {
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
			e := NewEnvoy(o)
			if e.Clock() != clk {
				t.Fatalf("Envoy.Clock is not the clock given")
			}
			for i, s := range tc.steps {
				clk.SetTime(start.Add(s.at))
				named := maps.Clone(s.named)
				hold, next := e.Observe(named, s.live)
				clear(named) // Observe must not keep the caller's map
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

// TestEnvoyDefaultClock: without a clock, Observe reads the wall clock.
func TestEnvoyDefaultClock(t *testing.T) {
	e := NewEnvoy(Options{TableDelay: time.Hour, Linger: 2 * time.Hour})
	e.Observe(nil, []string{"a"})
	before := time.Now()
	hold, next := e.Observe(nil, []string{"a", "b"})
	if !hold.Joining["b"] || next.Before(before.Add(2*time.Hour)) || next.After(time.Now().Add(2*time.Hour)) {
		t.Errorf("joining %v until %v, want b until 2h after %v", hold.Joining, next, before)
	}
}
