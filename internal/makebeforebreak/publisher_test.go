package makebeforebreak

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// action is one step of a Publisher script: offer table id naming names (as clusters), or, when id is 0,
// step the clock by d. want is every table published so far, in order.
type action struct {
	id    int
	names string // space-separated
	step  time.Duration
	hold  *bool // when set: Hold(*hold) instead
	want  []int
}

func offer(id int, names string, want ...int) action { return action{id: id, names: names, want: want} }
func step(d time.Duration, want ...int) action       { return action{step: d, want: want} }
func hold(held bool, want ...int) action             { return action{hold: &held, want: want} }

func TestPublisher(t *testing.T) {
	const d = 2 * time.Second
	tests := []struct {
		name    string
		delay   time.Duration
		linger  time.Duration // a hold lasts at most linger-delay
		narrow  bool          // narrowing publishes -id for a table that must wait
		actions []action
	}{
		{
			name:   "narrowed: a table that must wait goes out narrowed at once, whole after TableDelay",
			delay:  d,
			narrow: true,
			actions: []action{
				offer(1, "cluster-default apiserver-a", 1),
				offer(2, "cluster-default cluster-only-a apiserver-a", 1, -2),
				step(d-time.Nanosecond, 1, -2),
				step(time.Nanosecond, 1, -2, 2),
				offer(3, "cluster-default cluster-only-a apiserver-a", 1, -2, 2, 3), // known now
			},
		},
		{
			name:   "narrowed: a newer narrowed table drops an older whole one still waiting",
			delay:  d,
			narrow: true,
			actions: []action{
				offer(1, "cluster-default", 1),
				offer(2, "cluster-default cluster-x", 1, -2),
				step(d/2, 1, -2),
				offer(3, "cluster-default cluster-x cluster-y", 1, -2, -3), // x still unknown
				step(d/2, 1, -2, -3),
				step(d/2, 1, -2, -3, 3),
			},
		},
		{
			name:    "the first table goes out at once",
			delay:   d,
			actions: []action{offer(1, "cluster-default apiserver-a", 1)},
		},
		{
			name:  "a table naming a new apiserver waits exactly TableDelay",
			delay: d,
			actions: []action{
				offer(1, "cluster-default apiserver-a", 1),
				offer(2, "cluster-default apiserver-a apiserver-b", 1),
				step(d-time.Nanosecond, 1),
				step(time.Nanosecond, 1, 2),
			},
		},
		{
			name:  "a table naming a new cluster waits exactly TableDelay",
			delay: d,
			actions: []action{
				offer(1, "cluster-default apiserver-a", 1),
				offer(2, "cluster-default cluster-only-a apiserver-a", 1),
				step(d-time.Nanosecond, 1),
				step(time.Nanosecond, 1, 2),
			},
		},
		{
			name:  "a table naming nothing new goes out at once, and no older delayed table replaces it",
			delay: d,
			actions: []action{
				offer(1, "cluster-default apiserver-a apiserver-b", 1),
				offer(2, "cluster-default apiserver-a apiserver-b apiserver-c", 1),
				offer(3, "cluster-default apiserver-a", 1, 3),
				step(d, 1, 3),
				step(10*d, 1, 3),
			},
		},
		{
			name:  "names are compared with the last published table, not the last offered",
			delay: d,
			actions: []action{
				offer(1, "cluster-default apiserver-a", 1),
				offer(2, "cluster-default apiserver-a apiserver-b", 1),
				offer(3, "cluster-default apiserver-a apiserver-b", 1), // b still unknown to extproc
				step(d, 1, 2, 3),
				offer(4, "cluster-default apiserver-b", 1, 2, 3, 4), // b published now
			},
		},
		{
			name:  "each delayed table waits from its own offer",
			delay: d,
			actions: []action{
				offer(1, "cluster-default", 1),
				offer(2, "cluster-default cluster-x", 1),
				step(d/2, 1),
				offer(3, "cluster-default cluster-x cluster-y", 1),
				step(d/2, 1, 2),
				step(d/2-time.Nanosecond, 1, 2),
				step(time.Nanosecond, 1, 2, 3),
			},
		},
		{
			name:   "held: a whole table that must wait stays out while held, and goes out when the hold ends",
			delay:  d,
			linger: 100 * d,
			actions: []action{
				offer(1, "cluster-default", 1),
				hold(true, 1),
				offer(2, "cluster-default cluster-x", 1),
				step(d, 1),
				step(10*d, 1),
				hold(false, 1, 2),
				step(10*d, 1, 2),
			},
		},
		{
			name:   "held: narrowed tables and tables naming nothing new still go out; a newer one drops the held one",
			delay:  d,
			linger: 100 * d,
			narrow: true,
			actions: []action{
				offer(1, "cluster-default", 1),
				hold(true, 1),
				offer(2, "cluster-default cluster-x", 1, -2),
				step(d, 1, -2),
				offer(3, "cluster-default", 1, -2, 3),
				hold(false, 1, -2, 3),
			},
		},
		{
			name:   "held and released before the delay ends: the table goes out at its time",
			delay:  d,
			linger: 100 * d,
			actions: []action{
				offer(1, "cluster-default", 1),
				hold(true, 1),
				offer(2, "cluster-default cluster-x", 1),
				hold(false, 1),
				step(d-time.Nanosecond, 1),
				step(time.Nanosecond, 1, 2),
			},
		},
		{
			name:   "held past Linger-TableDelay: the table goes out anyway (the sets the old one names stop lingering)",
			delay:  d,
			linger: 3 * d,
			actions: []action{
				offer(1, "cluster-default", 1),
				hold(true, 1),
				offer(2, "cluster-default cluster-x", 1),
				step(d, 1),
				step(2*d-time.Nanosecond, 1),
				step(time.Nanosecond, 1, 2),
				hold(false, 1, 2),
			},
		},
		{
			name:  "without a linger a hold holds nothing",
			delay: d,
			actions: []action{
				offer(1, "cluster-default", 1),
				hold(true, 1),
				offer(2, "cluster-default cluster-x", 1),
				step(d, 1, 2),
			},
		},
		{
			name:  "TableDelay 0 publishes every table at once",
			delay: 0,
			actions: []action{
				offer(1, "cluster-default apiserver-a", 1),
				offer(2, "cluster-default apiserver-a apiserver-b", 1, 2),
				offer(3, "cluster-default cluster-x apiserver-a apiserver-b", 1, 2, 3),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			var published []int
			names := map[int]Names{} // by table id
			var narrow func(int, Names) int
			if tc.narrow {
				narrow = func(id int, known Names) int {
					if known == nil {
						t.Error("narrow without the known names")
					}
					return -id
				}
			}
			p := newPublisher(Options{TableDelay: tc.delay, Linger: tc.linger, Clock: clk}, func(id int) { published = append(published, id) },
				func(id int) Names { return names[id] }, narrow)
			for i, a := range tc.actions {
				if a.hold != nil {
					p.Hold(*a.hold)
				} else if a.id != 0 {
					names[a.id] = Names{}
					for _, n := range strings.Fields(a.names) {
						names[a.id][Name{KindCluster, n}] = true
					}
					p.Offer(a.id)
				} else {
					clk.Step(a.step)
				}
				if !slices.Equal(published, a.want) {
					t.Fatalf("action %d: published %v, want %v", i, published, a.want)
				}
			}
			if tc.delay == 0 && clk.HasWaiters() {
				t.Errorf("TableDelay 0 set a timer")
			}
		})
	}
}

// TestPublisherConcurrent: Offer from many goroutines while the clock moves. Each table is
// published at most once, and no goroutine's table is published after one it offered later
// (a table never replaces a newer one). Meant for -race.
func TestPublisherConcurrent(t *testing.T) {
	const d = time.Second
	clk := clocktesting.NewFakeClock(t0)
	type table struct{ g, i int }
	var (
		mu        sync.Mutex
		published []table
	)
	names := func(tb table) Names {
		names := Names{{KindCluster, "cluster-default"}: true}
		if tb.i%3 == 0 {
			names[Name{KindHost, fmt.Sprintf("apiserver-%d-%d", tb.g, tb.i)}] = true // new: delayed
		}
		return names
	}
	p := newPublisher(Options{TableDelay: d, Clock: clk}, func(tb table) {
		mu.Lock()
		defer mu.Unlock()
		published = append(published, tb)
	}, names, nil)
	const goroutines, each = 8, 50
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				p.Offer(table{g, i})
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			clk.Step(d / 4)
		}
	})
	wg.Wait()
	clk.Step(d)

	mu.Lock()
	defer mu.Unlock()
	if len(published) == 0 {
		t.Fatal("nothing published")
	}
	seen := map[table]bool{}
	last := map[int]int{}
	for _, tb := range published {
		if seen[tb] {
			t.Errorf("table %v published twice", tb)
		}
		seen[tb] = true
		if prev, ok := last[tb.g]; ok && tb.i <= prev {
			t.Errorf("goroutine %d: table %d published after its newer table %d", tb.g, tb.i, prev)
		}
		last[tb.g] = tb.i
	}
	if clk.HasWaiters() {
		t.Errorf("timers left after every delay passed")
	}
}

// TestPublisherOnDelay: OnDelay is told, sorted as the log shows them, the names that made a
// table wait, and nothing for a table that goes out at once.
func TestPublisherOnDelay(t *testing.T) {
	names := map[int]Names{
		1: {{KindCluster, "default"}: true, {KindHost, "a"}: true},
		2: {{KindCluster, "default"}: true, {KindHost, "a"}: true, {KindLive, "a"}: true, {KindCluster, "only-a"}: true},
		3: {{KindCluster, "default"}: true},
	}
	var told []string
	onDelay := func(fresh []Name, delay time.Duration) {
		if delay != time.Second {
			t.Errorf("delay %s", delay)
		}
		told = append(told, fmt.Sprint(fresh))
	}
	p := newPublisher(Options{TableDelay: time.Second, Clock: clocktesting.NewFakeClock(t0), OnDelay: onDelay}, func(int) {},
		func(id int) Names { return names[id] }, nil)
	for id := 1; id <= 3; id++ {
		p.Offer(id)
	}
	if want := []string{"[cluster only-a live a]"}; !slices.Equal(told, want) {
		t.Errorf("told %q, want %q", told, want)
	}
}
