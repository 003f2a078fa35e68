// Package makebeforebreak decides when a topology change reaches Envoy and extproc. It is
// the one place that knows about delays, holds and narrowing; xds.Server and xds-server's
// serve only wire it (plans in, snapshots and routing tables out).
//
// # When a change reaches Envoy and extproc
//
// Every topology change makes new plans (internal/plan, a pure function of the topology).
// With them, on Options.Clock:
//
//   - Envoy gets its new snapshot at once (xds.Server.Update), with the Hold that Holds
//     works out: serving sets older routing tables may still name, and apiservers that
//     just became live, kept out of the default cluster for now.
//   - extproc gets the routing table at once if it names nothing the last one did not
//     (Names); otherwise narrowed to what Envoy has at once, and whole TableDelay later
//     (Publisher).
//   - Linger after a serving set stops being named, Envoy drops it; JoinDelay after an
//     apiserver becomes live, Envoy's default cluster takes it in. Holds calls back then,
//     and every Envoy gets its snapshot again.
//
// # Why
//
// Envoy learns of a change over ADS, extproc over the routing table stream, and neither
// waits for the other. A request is routed by extproc's table and served by Envoy's
// clusters, so for a while the two may disagree. Three rules make the new state before
// breaking the old one:
//
//  1. A routing table that names a serving set, cluster or apiserver the last published
//     table did not reaches extproc whole TableDelay after it is offered, so that every
//     Envoy, given the matching snapshot at the same moment (possibly by another
//     xds-server replica), has the endpoints that list the set first; and not while an
//     Envoy refuses the newest configuration (Publisher.Hold). Meanwhile it goes
//     out at once narrowed (narrow.go): each new serving set replaced by the largest
//     subset of it the last table named, so that a new API reaches an apiserver that
//     serves it rather than the default route's 404. Any other table goes out at once, as
//     does the first (nothing can be routed without one). See Publisher.
//  2. A serving set that no plan names any more stays in the endpoints' metadata for
//     Linger, with the members it had when last named, for requests extproc routed by an
//     older table. See Holds.
//  3. An apiserver that becomes live joins the default ("every live apiserver") cluster
//     only JoinDelay later (it is in serving sets at once): an older table's decision
//     "the default cluster serves this" did not account for it, and it may not serve what
//     the others do. See Holds.
//
// Everything runs on Options.Clock, so tests step a fake clock instead of sleeping.
package makebeforebreak

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// Options are the make-before-break durations and the clock they are measured on.
type Options struct {
	// TableDelay: a routing table that names a serving set, cluster or apiserver that the
	// last published table did not is published whole this long after it is offered (every
	// Envoy has the new endpoints first; narrowed before). 0 publishes every table at once.
	TableDelay time.Duration
	// Linger: a serving set no plan names any more stays in Envoy's endpoints this long
	// (0: dropped at once). Must exceed TableDelay when > 0 (Validate).
	Linger time.Duration
	// Clock; nil means clock.RealClock{}.
	Clock clock.WithDelayedExecution
	// OnDelay, when set, is told which names made a routing table wait (sorted), for the
	// log: an operator can see why a change took TableDelay to reach extproc.
	OnDelay func(fresh []Name, delay time.Duration)
	// OnHoldExpired, when set, is told when a routing table held for an Envoy's refusal
	// (Publisher.Hold) goes out because Linger-TableDelay passed, for the log.
	OnHoldExpired func()
}

// Validate reports durations that would break a request in flight: a negative one, or a
// linger that ends before the tables naming the cluster are replaced.
func (o Options) Validate() error {
	var errs []error
	if o.TableDelay < 0 {
		errs = append(errs, fmt.Errorf("routing table delay %s is negative (0 sends each table at once)", o.TableDelay))
	}
	if o.Linger < 0 {
		errs = append(errs, fmt.Errorf("cluster linger %s is negative (0 drops unnamed serving sets at once)", o.Linger))
	}
	if o.Linger > 0 && o.Linger <= o.TableDelay {
		errs = append(errs, fmt.Errorf("cluster linger %s must be longer than routing table delay %s: a cluster must outlive the tables that name it", o.Linger, o.TableDelay))
	}
	return errors.Join(errs...)
}

// JoinDelay is 2*TableDelay: a newcomer is named by the table offered with it, which goes
// out a table delay later; a table delay after that, every table in use knows it.
func (o Options) JoinDelay() time.Duration { return 2 * o.TableDelay }

func (o Options) clock() clock.WithDelayedExecution {
	if o.Clock == nil {
		return clock.RealClock{}
	}
	return o.Clock
}
