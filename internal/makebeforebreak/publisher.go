package makebeforebreak

import (
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kube-mvp/kube-mvp/internal/plan"
)

// Publisher sends routing tables to extproc in order, delaying those that name something
// new so that Envoy has warmed it, and sending those narrowed meanwhile (rule 1 of the
// package doc). Safe for concurrent use. T is *plan.Envoys but for tests.
type Publisher[T any] struct {
	delay   time.Duration // <= 0: no delay
	clock   clock.WithDelayedExecution
	publish func(T)
	// names are what t lets extproc route to.
	names func(t T) Names
	// narrow, if not nil, makes a table that must wait go out at once in a form that names
	// only what known holds (the names of the last table published whole); the whole table
	// follows after TableDelay as without it. Nil: the last published table stays until then.
	narrow  func(t T, known Names) T
	onDelay func(fresh []Name, delay time.Duration) // Options.OnDelay

	mu sync.Mutex
	// offered numbers the tables in the order Offer saw them. Publishing goes by sequence
	// number, table n narrowed being 2n-1 and whole 2n, so that nothing is published after
	// something newer: published is the last sequence number published (0: none yet), and
	// known the names of the last table published whole.
	offered, published uint64
	known              Names
	// held: whole tables that name something new wait in pending rather than go out (Hold),
	// each at most maxHold past its delay: the serving sets the table in use names linger only
	// Linger after they stop being planned, so a longer hold would break the Envoys that took
	// the new configuration to spare the one that refused it. 0: Hold holds nothing.
	held    bool
	pending *heldTable[T]
	maxHold time.Duration
	// onHoldExpired, if set, is told of a held table sent because its hold ran out.
	onHoldExpired func()
}

type heldTable[T any] struct {
	seq   uint64
	t     T
	names Names
}

// NewPublisher returns the Publisher of the routing tables made from plans: it hands each
// to publish, in order and never two at once. publish may run on a clock goroutine (under a
// FakeClock, inside Step: it must not read that clock).
func NewPublisher(o Options, publish func(*plan.Envoys)) *Publisher[*plan.Envoys] {
	return newPublisher(o, publish, namesOf, narrowTo)
}

func newPublisher[T any](o Options, publish func(T), names func(T) Names, narrow func(T, Names) T) *Publisher[T] {
	return &Publisher[T]{delay: o.TableDelay, clock: o.clock(), publish: publish, names: names, narrow: narrow, onDelay: o.OnDelay,
		maxHold: max(o.Linger-o.TableDelay, 0), onHoldExpired: o.OnHoldExpired}
}

// Offer publishes t now or after TableDelay. Its names are compared with those of the last
// published table, not of the last offered one, since extproc only knows the former. The
// first table goes out at once, and a table is never published after a newer one (a delayed
// table that a later one overtook is dropped).
func (p *Publisher[T]) Offer(t T) {
	names := p.names(t)
	p.mu.Lock()
	p.offered++
	n := p.offered
	if p.published == 0 || p.delay <= 0 || subset(names, p.known) {
		p.publishLocked(2*n, t, names)
		p.mu.Unlock()
		return
	}
	if p.narrow != nil {
		p.publishLocked(2*n-1, p.narrow(t, p.known), nil)
	}
	var fresh []Name
	if p.onDelay != nil {
		for name := range names {
			if !p.known[name] {
				fresh = append(fresh, name)
			}
		}
	}
	p.mu.Unlock()
	if p.onDelay != nil {
		slices.SortFunc(fresh, func(a, b Name) int { return strings.Compare(a.String(), b.String()) })
		p.onDelay(fresh, p.delay)
	}
	// Outside mu: a FakeClock runs due callbacks under its own lock, and they take mu.
	p.clock.AfterFunc(p.delay, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.held && p.maxHold > 0 {
			if p.pending == nil || p.pending.seq < 2*n {
				p.pending = &heldTable[T]{seq: 2 * n, t: t, names: names}
			}
			return
		}
		p.publishLocked(2*n, t, names)
	})
	if p.maxHold > 0 {
		// Set now: a FakeClock's callback may not set another timer.
		p.clock.AfterFunc(p.delay+p.maxHold, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if h := p.pending; h != nil && h.seq == 2*n {
				p.pending = nil
				if h.seq > p.published && p.onHoldExpired != nil {
					p.onHoldExpired()
				}
				p.publishLocked(h.seq, h.t, h.names)
			}
		})
	}
}

// Hold keeps whole tables that name something new from going out while held is true: an
// Envoy refused the newest configuration (a NACK), so it may lack what they name, and
// extproc would route requests to clusters it does not have. Narrowed tables, and tables
// that name nothing new, still go out. When the hold ends, the newest table held goes out at
// once (its delay has passed), unless something newer went out meanwhile; a table held
// Linger-TableDelay past its delay goes out anyway (see maxHold).
func (p *Publisher[T]) Hold(held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = held
	if held || p.pending == nil {
		return
	}
	h := p.pending
	p.pending = nil
	p.publishLocked(h.seq, h.t, h.names)
}

// publishLocked publishes t as sequence number seq unless something newer went out; names
// nil: a narrowed table, which leaves known as it is.
func (p *Publisher[T]) publishLocked(seq uint64, t T, names Names) {
	if seq <= p.published {
		return
	}
	p.published = seq
	if names != nil {
		p.known = names
	}
	p.publish(t)
}

func subset(names, of Names) bool {
	for name := range names {
		if !of[name] {
			return false
		}
	}
	return true
}
