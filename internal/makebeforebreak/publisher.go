package makebeforebreak

import (
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Publisher sends routing tables to extproc in order, delaying those that name something
// new so that Envoy has warmed it (rule 1 of the package doc). Safe for concurrent use.
type Publisher[T any] struct {
	delay   time.Duration // <= 0: no delay
	clock   clock.WithDelayedExecution
	publish func(T)
	// OnDelay, if set before the first Offer, is told which names made a table wait (sorted),
	// for the log: an operator can see why a change took TableDelay to reach extproc.
	OnDelay func(newNames []string, delay time.Duration)
	// Narrow, if set before the first Offer, makes a table that must wait go out at once in
	// a form that names only what known holds (the names of the last table published whole);
	// the whole table follows after TableDelay as without it. Nil: the last published table
	// stays until then.
	Narrow func(t T, known map[string]bool) T

	mu sync.Mutex
	// offered numbers the tables in the order Offer saw them. Publishing goes by sequence
	// number, table n narrowed being 2n-1 and whole 2n, so that nothing is published after
	// something newer: published is the last sequence number published (0: none yet), and
	// known the names of the last table published whole.
	offered, published uint64
	known              map[string]bool
}

// NewPublisher returns a Publisher that hands each table to publish, in order and never
// two at once. publish may run on a clock goroutine (under a FakeClock, inside Step: it
// must not read that clock).
func NewPublisher[T any](o Options, publish func(T)) *Publisher[T] {
	return &Publisher[T]{delay: o.TableDelay, clock: o.clock(), publish: publish}
}

// Offer publishes t now or after TableDelay. names is what t lets extproc route to (cluster
// and live apiserver names, caller's choice of strings); it is compared with the names of
// the last published table, not of the last offered one, since extproc only knows the
// former. Offer keeps names: the caller must not change it afterwards. The first table goes
// out at once, and a table is never published after a newer one (a delayed table that a
// later one overtook is dropped).
func (p *Publisher[T]) Offer(t T, names map[string]bool) {
	p.mu.Lock()
	p.offered++
	n := p.offered
	if p.published == 0 || p.delay <= 0 || subset(names, p.known) {
		p.publishLocked(2*n, t, names)
		p.mu.Unlock()
		return
	}
	if p.Narrow != nil {
		p.publishLocked(2*n-1, p.Narrow(t, p.known), nil)
	}
	var fresh []string
	if p.OnDelay != nil {
		for name := range names {
			if !p.known[name] {
				fresh = append(fresh, name)
			}
		}
	}
	p.mu.Unlock()
	if p.OnDelay != nil {
		slices.Sort(fresh)
		p.OnDelay(fresh, p.delay)
	}
	// Outside mu: a FakeClock runs due callbacks under its own lock, and they take mu.
	p.clock.AfterFunc(p.delay, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.publishLocked(2*n, t, names)
	})
}

// publishLocked publishes t as sequence number seq unless something newer went out; names
// nil: a narrowed table, which leaves known as it is.
func (p *Publisher[T]) publishLocked(seq uint64, t T, names map[string]bool) {
	if seq <= p.published {
		return
	}
	p.published = seq
	if names != nil {
		p.known = names
	}
	p.publish(t)
}

func subset(names, of map[string]bool) bool {
	for name := range names {
		if !of[name] {
			return false
		}
	}
	return true
}
