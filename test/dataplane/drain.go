package dataplane

import "time"

// The drain options of Envoy's command line (--drain-time-s, --drain-strategy).

// DrainStrategy is Envoy's --drain-strategy (Server::DrainStrategy).
type DrainStrategy int

const (
	// DrainGradual: once draining, a connection is drain-closed with a probability that
	// grows with the time elapsed over the drain time (Envoy's default).
	DrainGradual DrainStrategy = iota
	// DrainImmediate: once draining, every connection is drain-closed.
	DrainImmediate
)

func (s DrainStrategy) String() string {
	if s == DrainImmediate {
		return "immediate"
	}
	return "gradual"
}

// DrainOptions are Envoy's --drain-time-s and --drain-strategy.
type DrainOptions struct {
	Time     time.Duration // --drain-time-s (Envoy: whole seconds; default 600 s)
	Strategy DrainStrategy // --drain-strategy (default gradual)
}

// defaultDrainTime is --drain-time-s's default (source/server/options_impl.cc: OptionsImpl).
const defaultDrainTime = 600 * time.Second
