// Package makebeforebreak decides when a topology change reaches Envoy and extproc. It is
// the one place that knows about delays, holds and narrowing; xds.Server and xds-server's
// serve only wire it (plans in, snapshots and routing tables out). Envoy gets each new
// snapshot at once, with the Hold that Holds works out; extproc gets a routing table that
// names something new narrowed at once and whole TableDelay later (Publisher); serving sets
// linger, and a new apiserver joins the default cluster JoinDelay later (Holds). Everything
// runs on Options.Clock, so tests step a fake clock instead of sleeping.
//
// When each change goes out, and the three rules that make it safe:
// docs/design.md#when-a-change-reaches-envoy-and-extproc.
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
