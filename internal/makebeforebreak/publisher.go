package makebeforebreak

import (
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

	mu sync.Mutex
	// offered numbers the tables in the order Offer saw them; published is the number of
	// the last one published (0: none yet), and known its names.
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
		p.publishLocked(n, t, names)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	// Outside mu: a FakeClock runs due callbacks under its own lock, and they take mu.
	p.clock.AfterFunc(p.delay, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.publishLocked(n, t, names)
	})
}

func (p *Publisher[T]) publishLocked(n uint64, t T, names map[string]bool) {
	if n <= p.published {
		return
	}
	p.published, p.known = n, names
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
