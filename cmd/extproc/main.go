// Command extproc is kube-mvp's Envoy external processor: it serves
// envoy.service.ext_proc.v3.ExternalProcessor, deciding per request which apiservers may
// serve it (see internal/extproc); `extproc --help` lists its flags. Its subcommands:
// copy-files republishes a node's front-proxy-client pair (internal/nodepki), drain-envoy
// drains the Envoy beside it, the chart's preStop hook (internal/drain).
//
// The commands, the admin pages and signals: docs/operating.md#extprocs-commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/drain"
	"github.com/kube-mvp/kube-mvp/internal/extproc"
	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/version"
)

const usageIntro = `usage: extproc --source xds:HOST:PORT|file:FILE --listen ADDR [flags]

Serves Envoy's ext_proc API for kube-mvp: names the apiserver cluster for each request,
strips client-supplied identity headers and forwards the client certificate's identity.
`

const usageOutro = `SIGHUP re-reads a file source; SIGTERM and SIGINT stop gracefully.

extproc copy-files --help: the command that publishes a node's kubeadm front-proxy-client pair
for Envoy and extproc.
extproc drain-envoy --help: the preStop hook that drains Envoy before it is stopped; GET /drained
on the admin address answers once it did.
`

func usage() string { return cli.Usage(usageIntro, new(config).flagSet(), usageOutro) }

// config is the validated command line: extproc.Config, and the flags read into it.
type config struct {
	extproc.Config

	// Flags read into the above after parsing.
	source, tlsDir string
	plaintext      bool
	proxy          proxycert.Files
}

// flagSet defines extproc's flags on c, with their defaults.
func (c *config) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("extproc")
	fs.StringVar(&c.source, "source", "", "where the routing table comes from, a `SOURCE` (required): xds:HOST:PORT (xds-server's --xds-address) or file:FILE (an inventory fixture)")
	fs.StringVar(&c.tlsDir, "xds-tls-dir", "", "xds source: the control plane's TLS, `DIR`/tls.crt and tls.key (an extproc certificate) and ca.crt, as made by xds-server certgen")
	cli.Bool(fs, &c.plaintext, "xds-insecure-plaintext", false, "xds source: no TLS (an xds-server started with the same flag)")
	fs.StringVar(&c.Listen, "listen", "", "gRPC address `ADDR`: unix:/path/to.sock or host:port (required)")
	fs.StringVar(&c.AdminAddress, "admin-address", "127.0.0.1:9002", "/healthz, /readyz, /metrics and /drained on `HOST:PORT`")
	fs.Var(cli.NewValue(&c.Now, time.Time{}, "RFC3339", cli.Time), "now", "file source: judge Lease liveness at this time (default: every Lease is live)")
	fs.Var(cli.NewValue(&c.PollInterval, 0, "DURATION", cli.Duration(0, "a non-negative duration, e.g. 10s")), "poll-interval",
		"file source: also re-read the file when it changes, checked this often (0: only on SIGHUP)")
	fs.StringVar(&c.proxy.Cert, "proxy-client-cert", "", "the proxy client certificate Envoy presents (xds-server's --proxy-client-cert), a `FILE`: check that every live apiserver accepts it")
	fs.StringVar(&c.proxy.Key, "proxy-client-key", "", "the key of --proxy-client-cert, a `FILE`")
	fs.StringVar(&c.proxy.PeerCA, "peer-ca", "", "the CA of the apiservers' serving certificates (xds-server's --peer-ca), a `FILE`: the proxy certificate goes only to apiservers it verifies")
	fs.StringVar(&c.proxy.ServerName, "upstream-server-name", proxycert.DefaultServerName,
		"with --proxy-client-cert: the SNI sent to the apiservers and the DNS SAN required of them (xds-server's --upstream-server-name), a `NAME`")
	fs.StringVar(&c.DrainedFile, "drained-file", drain.DefaultDoneFile,
		"the `FILE` extproc drain-envoy writes when Envoy is drained (its --done-file): GET /drained on the admin address answers once it exists")
	fs.Var(cli.NewValue(&c.DrainedMaxWait, 2*time.Minute, "DURATION", cli.Duration(0, "a non-negative duration, e.g. 2m")), "drained-max-wait",
		"GET /drained answers at the latest this long after it was asked, drained or not; 0: no /drained (404)")
	fs.Var(cli.NewValue(&c.ProxyCheckInterval, proxycert.DefaultInterval, "DURATION", cli.Duration(time.Second, "a duration of at least 1s, e.g. 60s")), "proxy-check-interval",
		"with --proxy-client-cert: how often every live apiserver is asked whether it accepts the proxy certificate")
	streams := func(p *int, def int, name, usage string) {
		fs.Var(cli.NewValue(p, def, "N", func(s string) (int, error) {
			n, err := strconv.ParseUint(s, 10, 31)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("is not a whole number from 1 to %d", math.MaxInt32)
			}
			return int(n), nil
		}), name, usage)
	}
	streams(&c.MaxStreams, extproc.DefaultMaxStreams, "max-streams",
		"ext_proc streams open at once across connections, about 12 KB each; one more is refused (Envoy answers 503 with Retry-After)")
	streams(&c.MaxStreamsPerConnection, extproc.DefaultMaxStreamsPerConnection, "max-streams-per-connection",
		"ext_proc streams open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); --max-streams bounds them all")
	fs.Var(cli.NewValue(&c.FirstMessageTimeout, extproc.DefaultFirstMessageTimeout, "DURATION", cli.Duration(100*time.Millisecond, "a duration of at least 100ms, e.g. 5s")), "first-message-timeout",
		"end an ext_proc stream whose first message has not come this long after it opened (Envoy sends it with the stream)")
	fs.Bool("version", false, "print the version and exit")
	return fs
}

// parseArgs validates the whole command line and reports every problem at once.
func parseArgs(args []string) (config, error) {
	var cfg config
	fs := cfg.flagSet()
	errs, stop := cli.Parse(fs, args)
	if stop != nil {
		return cfg, stop
	}

	switch src := cfg.source; {
	case !fs.Changed("source"):
		errs = multierror.Append(errs, errors.New("--source is required: --source xds:xds-server:18000 or --source file:/path/to/fixture.yaml"))
	case strings.HasPrefix(src, "xds:"):
		cfg.SourceXDS = strings.TrimPrefix(src, "xds:")
		if err := checkHostPort(cfg.SourceXDS); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--source %q: %v; want xds:HOST:PORT, xds-server's --xds-address", src, err))
		}
	case !strings.HasPrefix(src, "file:"):
		errs = multierror.Append(errs, fmt.Errorf("--source %q: unknown kind of source; use xds:HOST:PORT or file:FILE", src))
	default:
		cfg.SourceFile = strings.TrimPrefix(src, "file:")
		if cfg.SourceFile == "" {
			errs = multierror.Append(errs, errors.New("--source file: needs a path, e.g. file:/etc/kube-mvp/table.yaml"))
		} else if st, err := os.Stat(cfg.SourceFile); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--source %q: %v", src, err))
		} else if st.IsDir() {
			errs = multierror.Append(errs, fmt.Errorf("--source %q is a directory; give the fixture file", src))
		}
	}

	hasDir := fs.Changed("xds-tls-dir")
	switch {
	case cfg.SourceXDS == "" && (hasDir || cfg.plaintext):
		errs = multierror.Append(errs, errors.New("--xds-tls-dir and --xds-insecure-plaintext apply to an xds source only"))
	case cfg.SourceXDS != "":
		var err error
		cfg.XDSTLS, err = cptls.FromFlags(cfg.tlsDir, hasDir, cfg.plaintext, cptls.RoleExtproc,
			"with an xds source, xds-server serves the routing table only to holders of an extproc certificate of "+
				"the control plane's CA (xds-server certgen); --xds-insecure-plaintext for an xds-server without TLS")
		if err != nil {
			errs = multierror.Append(errs, err)
		}
	}

	switch l := cfg.Listen; {
	case !fs.Changed("listen"):
		errs = multierror.Append(errs, errors.New("--listen is required: --listen unix:/run/kube-mvp/extproc.sock or --listen 127.0.0.1:9001"))
	case strings.HasPrefix(l, "unix:"):
		if strings.TrimPrefix(l, "unix:") == "" {
			errs = multierror.Append(errs, errors.New("--listen unix: needs a socket path, e.g. unix:/run/kube-mvp/extproc.sock"))
		}
	default:
		if err := checkHostPort(l); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--listen %q: %v; want unix:/path or host:port", l, err))
		}
	}

	if err := checkHostPort(cfg.AdminAddress); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("--admin-address %q: %v; want host:port, e.g. 127.0.0.1:9002", cfg.AdminAddress, err))
	}
	if cfg.SourceXDS != "" {
		for _, name := range []string{"now", "poll-interval"} {
			if fs.Changed(name) {
				errs = multierror.Append(errs, fmt.Errorf("--%s applies to a file source only; xds-server judges liveness and pushes every change", name))
			}
		}
	}
	if cfg.DrainedFile == "" && cfg.DrainedMaxWait > 0 {
		errs = multierror.Append(errs, errors.New("--drained-file must name a file (drain-envoy's --done-file), or --drained-max-wait=0 turns /drained off"))
	}
	errs = checkProxyFlags(&cfg, fs, errs)
	return cfg, cli.Err(errs)
}

// checkProxyFlags validates the proxy certificate check's flags and loads its files once, so
// a wrong path stops start-up.
func checkProxyFlags(cfg *config, fs *pflag.FlagSet, errs *multierror.Error) *multierror.Error {
	p := cfg.proxy
	switch {
	case (p.Cert == "") != (p.Key == ""):
		return multierror.Append(errs, errors.New("--proxy-client-cert and --proxy-client-key go together: give both or neither"))
	case p.Cert == "":
		for _, name := range []string{"peer-ca", "upstream-server-name", "proxy-check-interval"} {
			if fs.Changed(name) {
				errs = multierror.Append(errs, fmt.Errorf("--%s applies only with --proxy-client-cert and --proxy-client-key: it verifies the apiservers the proxy certificate is checked with", name))
			}
		}
		return errs
	case p.PeerCA == "":
		return multierror.Append(errs, errors.New("--proxy-client-cert needs --peer-ca, the CA of the apiservers' "+
			"serving certificates (xds-server's --peer-ca): the proxy certificate goes only to verified apiservers"))
	}
	if n := p.ServerName; n == "" || strings.ContainsAny(n, " /:") || n != strings.ToLower(n) {
		return multierror.Append(errs, fmt.Errorf("--upstream-server-name %q is not a lower-case DNS name, e.g. %s", n, proxycert.DefaultServerName))
	}
	if _, err := p.Load(); err != nil {
		return multierror.Append(errs, fmt.Errorf("--proxy-client-cert, --proxy-client-key, --peer-ca: %w", err))
	}
	cfg.ProxyCheck = &p
	return errs
}

// parseConfig parses args into a subcommand's configuration C, whose flagSet declares its
// flags; unless that stops the command (--help, a flag error), validate adds what is wrong with
// the values, and every problem is reported at once.
func parseConfig[C any, P interface {
	*C
	flagSet() *pflag.FlagSet
}](args []string, validate func(c P, fs *pflag.FlagSet, errs *multierror.Error) *multierror.Error) (C, error) {
	var c C
	fs := P(&c).flagSet()
	errs, stop := cli.Parse(fs, args)
	if stop != nil {
		return c, stop
	}
	return c, cli.Err(validate(&c, fs, errs))
}

func checkHostPort(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs made explicit; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "copy-files":
			return runCopyFiles(args[1:], stdout, stderr)
		case "drain-envoy":
			return runDrainEnvoy(args[1:], stdout, stderr)
		}
	}
	cfg, err := parseArgs(args)
	if errors.Is(err, cli.ErrVersion) {
		fmt.Fprintln(stdout, version.String("extproc"))
		return 0
	}
	if code, ok := cli.Done("extproc", err, usage, stdout, stderr); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	// The container's memory limit, less a tenth, as Go's: the garbage collector then works
	// harder near it instead of letting the heap double into the OOM killer, which the
	// routing table's and the streams' limits assume (GOMEMLIMIT, if set, wins).
	memlimit.Set(memlimit.WithLogger(log)) //nolint:errcheck // it logs its own failure
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	a, err := extproc.Start(cfg.Config, log, hup)
	if err != nil {
		log.Error("extproc cannot start", "error", err)
		return 1
	}
	if err := a.Wait(ctx); err != nil {
		log.Error("extproc stopped", "error", err)
		return 1
	}
	return 0
}
