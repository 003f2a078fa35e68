package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/drain"
)

const drainEnvoyIntro = `usage: extproc drain-envoy [--envoy-admin 127.0.0.1:9901] [--delay 5s] [--drain-time 45s] [--done-file FILE]

Drains the Envoy beside extproc before it is stopped, as the extproc container's preStop hook
(the image has no shell): after --delay (Envoy keeps serving while the EndpointSlice and
kube-proxy stop sending it new connections) it asks Envoy's admin to drain its listeners
(POST /drain_listeners?graceful: Envoy closes its connections as their requests end, for
its --drain-time-s), then counts Envoy's active requests every --poll-interval until none is
left or --drain-time passed. Then, whatever happened (Envoy unreachable, refusing, answering
nonsense), it writes --done-file, which extproc's GET /drained (the Envoy container's
preStop hook) waits for, so that the kubelet stops Envoy only now, and waits up to
--exit-wait for Envoy to exit, so that extproc stops only after Envoy, which needs it while
it drains. The done file holds drain-envoy's log, which extproc logs: the kubelet keeps a
hook's output only when it fails.
`

const drainEnvoyOutro = `Exit codes: 0 whatever became of the drain (it is logged); 2: a bad command line.
`

func drainEnvoyUsage() string {
	return cli.Usage(drainEnvoyIntro, new(drainEnvoyConfig).flagSet(), drainEnvoyOutro)
}

// drainEnvoyConfig is drain-envoy's command line.
type drainEnvoyConfig struct {
	admin                  string
	delay, drainTime       time.Duration
	pollInterval, exitWait time.Duration
	doneFile               string
}

func (c *drainEnvoyConfig) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("drain-envoy")
	fs.StringVar(&c.admin, "envoy-admin", "127.0.0.1:9901", "Envoy's admin API, `HOST:PORT` (the chart's envoy.adminPort, on the pod's loopback)")
	fs.Var(cli.NewValue(&c.delay, 5*time.Second, "DURATION", cli.Duration(0, "a non-negative duration, e.g. 5s")), "delay",
		"how long Envoy serves on as before, while the EndpointSlice and kube-proxy stop sending it new connections")
	fs.Var(cli.NewValue(&c.drainTime, 45*time.Second, "DURATION", cli.Duration(time.Second, "a duration of at least 1s, e.g. 45s")), "drain-time",
		"the longest wait for Envoy's active requests once the drain began: Envoy's --drain-time-s")
	fs.Var(cli.NewValue(&c.pollInterval, time.Second, "DURATION", cli.Duration(10*time.Millisecond, "a duration of at least 10ms, e.g. 1s")), "poll-interval",
		"how often Envoy's active requests are counted")
	fs.Var(cli.NewValue(&c.exitWait, 10*time.Second, "DURATION", cli.Duration(0, "a non-negative duration, e.g. 10s")), "exit-wait",
		"the longest wait for Envoy to exit (its admin refusing connections) once the done file is written")
	fs.StringVar(&c.doneFile, "done-file", drain.DefaultDoneFile, "the `FILE` written when the drain is over, in a directory shared with extproc (its --drained-file)")
	return fs
}

func parseDrainEnvoyArgs(args []string) (drainEnvoyConfig, error) {
	return parseConfig(args, (*drainEnvoyConfig).validate)
}

// validate adds to errs what is wrong with the flags' values.
func (c *drainEnvoyConfig) validate(_ *pflag.FlagSet, errs *multierror.Error) *multierror.Error {
	if err := checkHostPort(c.admin); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("--envoy-admin %q: %v; want host:port, e.g. 127.0.0.1:9901", c.admin, err))
	}
	if c.doneFile == "" {
		errs = multierror.Append(errs, errors.New("--done-file must name a file, e.g. "+drain.DefaultDoneFile))
	}
	return errs
}

// runDrainEnvoy is `extproc drain-envoy`; it returns the exit code.
func runDrainEnvoy(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseDrainEnvoyArgs(args)
	if code, ok := cli.Done("extproc drain-envoy", err, drainEnvoyUsage, stdout, stderr); !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	drain.Run(ctx, drain.Options{
		Admin: cfg.admin, Delay: cfg.delay, DrainTime: cfg.drainTime, PollInterval: cfg.pollInterval,
		ExitWait: cfg.exitWait, DoneFile: cfg.doneFile, Logger: slog.New(slog.NewTextHandler(stderr, nil)),
	})
	return 0
}
