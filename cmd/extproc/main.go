// Command extproc is kube-mvp's Envoy external processor: it serves
// envoy.service.ext_proc.v3.ExternalProcessor, deciding per request which apiservers may
// serve it (see internal/extproc).
//
//	extproc --source xds:HOST:PORT|file:FILE --listen ADDR [flags]   (extproc --help lists them)
//
// ADDR is unix:/path/to.sock or host:port. The admin address serves /healthz, /readyz (ready
// once a routing table is loaded), /metrics and /drained (below). With a file source SIGHUP
// re-reads the file; SIGTERM or SIGINT stops gracefully.
//
// With --proxy-client-cert, --proxy-client-key and --peer-ca (the files Envoy presents and
// verifies with, in the same pod) extproc asks every live apiserver of its routing table
// whether it accepts the proxy certificate as a front proxy (internal/proxycert): /readyz
// fails when every apiserver that answered refuses it, and lists the refusing ones, with what
// to fix, as warnings when only some do. With an xds source it reports what it found to
// xds-server (TableService.ReportProxyChecks), which keeps requests whose identity kube-mvp
// sets away from apiservers that take the proxy certificate for an ordinary client's.
//
//	extproc copy-files --file CERT --file KEY --to DIR [--once|--check] [flags]
//
// publishes a certificate and key another program rewrites in place (a kubeadm node's
// front-proxy-client pair) into DIR as the kubelet publishes a Secret volume, a matching pair
// at a time (internal/nodepki; extproc copy-files --help). The chart runs it beside Envoy
// with sidecar.kubeadmFrontProxyClient, so that Envoy and extproc read the node's pair as
// their own user.
//
//	extproc drain-envoy [--envoy-admin 127.0.0.1:9901] [--delay 5s] [--drain-time 45s] [flags]
//
// drains the Envoy beside extproc through its admin API, then writes a done file whatever
// happened, and waits for Envoy to exit (internal/drain; extproc drain-envoy --help): the
// chart's preStop hook of the extproc container. The Envoy container's preStop hook is
// extproc's GET /drained, which answers once that file exists (or after
// --drained-max-wait), so that the kubelet stops Envoy only when it is drained, and extproc,
// which Envoy needs while it drains, only after Envoy.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/hashicorp/go-multierror"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/drain"
	"github.com/kube-mvp/kube-mvp/internal/extproc"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
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

// config is the validated command line.
type config struct {
	sourceFile   string // file:FILE
	sourceXDS    string // xds:HOST:PORT
	listen       string // "unix:/path" or host:port
	adminAddress string
	now          time.Time
	pollInterval time.Duration
	xdsTLS       *cptls.Files // xds source: nil with --xds-insecure-plaintext
	// proxyCheck are the files of the proxy certificate check; nil without
	// --proxy-client-cert.
	proxyCheck *proxycert.Files
	// proxyCheckInterval is how often the proxy certificate is checked when nothing changed.
	proxyCheckInterval time.Duration

	// Flags read into the above after parsing.
	source, tlsDir string
	plaintext      bool
	proxy          proxycert.Files

	drainedFile    string
	drainedMaxWait time.Duration

	// Stream bounds (extproc.DefaultMaxStreams explains the defaults).
	maxStreams, maxStreamsPerConnection int
	firstMessageTimeout                 time.Duration
}

// extprocService is the gRPC health service name of the ext_proc API.
const extprocService = "envoy.service.ext_proc.v3.ExternalProcessor"

// flagSet defines extproc's flags on c, with their defaults.
func (c *config) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("extproc")
	fs.StringVar(&c.source, "source", "", "where the routing table comes from, a `SOURCE` (required): xds:HOST:PORT, xds-server's table stream (its --xds-address; the last table is kept while it reconnects), or file:FILE, an inventory fixture (YAML) as read by xds-server translate -f")
	fs.StringVar(&c.tlsDir, "xds-tls-dir", "", "xds source: the control plane's TLS, `DIR`/tls.crt and DIR/tls.key (an extproc certificate) and DIR/ca.crt (the control plane's CA bundle), as made by xds-server certgen; xds-server must present a certificate of that CA naming its role (re-read on change)")
	cli.Bool(fs, &c.plaintext, "xds-insecure-plaintext", false, "xds source: no TLS (an xds-server started with the same flag)")
	fs.StringVar(&c.listen, "listen", "", "gRPC address `ADDR`: unix:/path/to.sock or host:port (required)")
	fs.StringVar(&c.adminAddress, "admin-address", "127.0.0.1:9002", "/healthz, /readyz, /metrics and /drained on `HOST:PORT`")
	fs.Var(cli.NewValue(&c.now, time.Time{}, "RFC3339", cli.Time), "now", "file source: judge Lease liveness at this time (default: every Lease is live)")
	fs.Var(cli.NewValue(&c.pollInterval, 0, "DURATION", cli.Duration(0, "a non-negative duration, e.g. 10s")), "poll-interval",
		"file source: also re-read the file when it changes, checked this often (0: only on SIGHUP)")
	fs.StringVar(&c.proxy.Cert, "proxy-client-cert", "", "the front-proxy client certificate Envoy presents to the apiservers (xds-server's --proxy-client-cert), a `FILE` in this container: "+
		"extproc then asks every live apiserver whether it accepts it as a front proxy, when they change and every 60 s; /readyz fails when every apiserver that answered refuses it "+
		"and lists those that refuse it, with what to fix; with an xds source it reports them to xds-server, which keeps requests whose identity kube-mvp sets away from those that take it for an ordinary client's (needs --proxy-client-key and --peer-ca; re-read for every round)")
	fs.StringVar(&c.proxy.Key, "proxy-client-key", "", "the key of --proxy-client-cert, a `FILE`")
	fs.StringVar(&c.proxy.PeerCA, "peer-ca", "", "the CA of the apiservers' serving certificates (xds-server's --peer-ca), a `FILE`: the proxy certificate goes only to apiservers it verifies")
	fs.StringVar(&c.proxy.ServerName, "upstream-server-name", proxycert.DefaultServerName, "with --proxy-client-cert: the SNI sent to the apiservers and the DNS SAN required of them (xds-server's --upstream-server-name), a `NAME`")
	fs.StringVar(&c.drainedFile, "drained-file", drain.DefaultDoneFile, "the `FILE` extproc drain-envoy writes when Envoy is drained (its --done-file): GET /drained on the admin address answers once it exists")
	fs.Var(cli.NewValue(&c.drainedMaxWait, 2*time.Minute, "DURATION", cli.Duration(0, "a non-negative duration, e.g. 2m")), "drained-max-wait",
		"GET /drained answers at the latest this long after it was asked, drained or not (longer than drain-envoy's --delay and --drain-time); 0: no /drained (404)")
	fs.Var(cli.NewValue(&c.proxyCheckInterval, proxycert.DefaultInterval, "DURATION", cli.Duration(time.Second, "a duration of at least 1s, e.g. 60s")), "proxy-check-interval",
		"with --proxy-client-cert: how often every live apiserver is asked whether it accepts the proxy certificate, besides at once when the apiservers or the request-header names change")
	streams := func(p *int, def int, name, usage string) {
		fs.Var(cli.NewValue(p, def, "N", func(s string) (int, error) {
			n, err := strconv.ParseUint(s, 10, 31)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("is not a whole number from 1 to %d", math.MaxInt32)
			}
			return int(n), nil
		}), name, usage)
	}
	streams(&c.maxStreams, extproc.DefaultMaxStreams, "max-streams",
		"ext_proc streams open at once across connections; one more is refused (gRPC ResourceExhausted, which Envoy answers 503 with Retry-After). "+
			"One costs about 12 KB: the default is about 48 MiB, well inside the chart's 128 MiB memory limit")
	streams(&c.maxStreamsPerConnection, extproc.DefaultMaxStreamsPerConnection, "max-streams-per-connection",
		"ext_proc streams open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): Envoy opens another connection rather than exceed it; --max-streams bounds them all")
	fs.Var(cli.NewValue(&c.firstMessageTimeout, extproc.DefaultFirstMessageTimeout, "DURATION", cli.Duration(100*time.Millisecond, "a duration of at least 100ms, e.g. 5s")), "first-message-timeout",
		"end an ext_proc stream whose first message has not come this long after it opened (Envoy sends it with the stream, then waits xds-server's --extproc-message-timeout, 200ms by default, for the answer)")
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
		cfg.sourceXDS = strings.TrimPrefix(src, "xds:")
		if err := checkHostPort(cfg.sourceXDS); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--source %q: %v; want xds:HOST:PORT, xds-server's --xds-address", src, err))
		}
	case !strings.HasPrefix(src, "file:"):
		errs = multierror.Append(errs, fmt.Errorf("--source %q: unknown kind of source; use xds:HOST:PORT or file:FILE", src))
	default:
		cfg.sourceFile = strings.TrimPrefix(src, "file:")
		if cfg.sourceFile == "" {
			errs = multierror.Append(errs, errors.New("--source file: needs a path, e.g. file:/etc/kube-mvp/table.yaml"))
		} else if st, err := os.Stat(cfg.sourceFile); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--source %q: %v", src, err))
		} else if st.IsDir() {
			errs = multierror.Append(errs, fmt.Errorf("--source %q is a directory; give the fixture file", src))
		}
	}

	hasDir := fs.Changed("xds-tls-dir")
	switch {
	case cfg.sourceXDS == "" && (hasDir || cfg.plaintext):
		errs = multierror.Append(errs, errors.New("--xds-tls-dir and --xds-insecure-plaintext apply to an xds source only"))
	case cfg.sourceXDS != "":
		var err error
		cfg.xdsTLS, err = cptls.FromFlags(cfg.tlsDir, hasDir, cfg.plaintext, cptls.RoleExtproc,
			"with an xds source, xds-server serves the routing table only to holders of an extproc certificate of the control plane's CA (xds-server certgen); --xds-insecure-plaintext for an xds-server without TLS")
		if err != nil {
			errs = multierror.Append(errs, err)
		}
	}

	switch l := cfg.listen; {
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

	if err := checkHostPort(cfg.adminAddress); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("--admin-address %q: %v; want host:port, e.g. 127.0.0.1:9002", cfg.adminAddress, err))
	}
	if cfg.sourceXDS != "" {
		for _, name := range []string{"now", "poll-interval"} {
			if fs.Changed(name) {
				errs = multierror.Append(errs, fmt.Errorf("--%s applies to a file source only; xds-server judges liveness and pushes every change", name))
			}
		}
	}
	if cfg.drainedFile == "" && cfg.drainedMaxWait > 0 {
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
		return multierror.Append(errs, errors.New("--proxy-client-cert needs --peer-ca, the CA of the apiservers' serving certificates (xds-server's --peer-ca): the proxy certificate goes only to verified apiservers"))
	}
	if n := p.ServerName; n == "" || strings.ContainsAny(n, " /:") || n != strings.ToLower(n) {
		return multierror.Append(errs, fmt.Errorf("--upstream-server-name %q is not a lower-case DNS name, e.g. %s", n, proxycert.DefaultServerName))
	}
	if _, err := p.Load(); err != nil {
		return multierror.Append(errs, fmt.Errorf("--proxy-client-cert, --proxy-client-key, --peer-ca: %w", err))
	}
	cfg.proxyCheck = &p
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

	a, err := start(cfg, log, hup)
	if err != nil {
		log.Error("extproc cannot start", "error", err)
		return 1
	}
	if err := a.wait(ctx); err != nil {
		log.Error("extproc stopped", "error", err)
		return 1
	}
	return 0
}

// app is a running extproc: the gRPC server, the admin server and the table source.
type app struct {
	log       *slog.Logger
	srv       *extproc.Server
	grpc      *grpc.Server
	health    *health.Server
	admin     *http.Server
	grpcLis   net.Listener
	adminLis  net.Listener
	errs      chan error
	stopWatch context.CancelFunc
	watchDone chan struct{}
	// proxyCheck checks the apiservers with the proxy certificate; nil without
	// --proxy-client-cert.
	proxyCheck *proxycert.Monitor
}

// start opens both listeners and serves. A file source is loaded first, so a bad file stops
// start-up; an xds source connects in the background (xds-server may start later), and
// until its first table arrives every request is answered 503 and /readyz fails.
func start(cfg config, log *slog.Logger, reload <-chan os.Signal) (*app, error) {
	a := &app{log: log, errs: make(chan error, 2), watchDone: make(chan struct{})}
	a.srv = extproc.New(extproc.Options{Logger: log, MaxStreams: cfg.maxStreams, FirstMessageTimeout: cfg.firstMessageTimeout})
	reg := a.srv.Registry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// For Envoy's gRPC health checks of the ext_proc cluster: SERVING once a table is loaded.
	a.health = health.NewServer()
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	a.health.SetServingStatus(extprocService, healthpb.HealthCheckResponse_NOT_SERVING)
	var expiries []cptls.Expiry // certificates held, for kube_mvp_certificate_expiry_timestamp_seconds
	if files := cfg.proxyCheck; files != nil {
		expiries = append(expiries, cptls.Expiry{Certificate: cptls.CertificateProxyClient, Role: cptls.RoleExtproc, NotAfter: cptls.FileNotAfter(files.Cert)})
		a.proxyCheck = proxycert.NewMonitor(proxycert.MonitorOptions{
			NewCheck: func() (proxycert.CheckFunc, error) {
				c, err := files.Load()
				return c.Check, err
			},
			Interval:   cfg.proxyCheckInterval,
			Logger:     log,
			Registerer: reg,
		})
	}
	apply := func(t *plan.Table, version string) {
		a.srv.SetTable(t, version)
		if a.proxyCheck != nil {
			a.proxyCheck.SetTable(t)
		}
		a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		a.health.SetServingStatus(extprocService, healthpb.HealthCheckResponse_SERVING)
	}

	var follow func(ctx context.Context)
	if cfg.sourceFile != "" {
		source := extproc.FileSource(cfg.sourceFile, extproc.FileOptions{
			Now: cfg.now, PollInterval: cfg.pollInterval, Reload: reload, Logger: log,
		})
		t, version, err := source.Load()
		if err != nil {
			return nil, fmt.Errorf("routing table source: %w", err)
		}
		apply(t, version)
		follow = func(ctx context.Context) { source.Run(ctx, apply) }
	} else {
		creds := insecure.NewCredentials()
		if cfg.xdsTLS != nil {
			c, err := cptls.Load(*cfg.xdsTLS, cptls.RoleExtproc, log)
			if err != nil {
				return nil, fmt.Errorf("--xds-tls-dir: %w", err)
			}
			expiries = append(expiries, cptls.Expiry{Certificate: cptls.CertificateControlPlane, Role: cptls.RoleExtproc, NotAfter: c.NotAfterOf()})
			creds = credentials.NewTLS(c.ClientConfig())
		}
		// The table stream is idle between changes; keepalives notice a dead xds-server.
		keepalives := grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true})
		conn, err := grpc.NewClient(cfg.sourceXDS, grpc.WithTransportCredentials(creds), keepalives)
		if err != nil {
			return nil, fmt.Errorf("--source xds:%s: %w", cfg.sourceXDS, err)
		}
		clientID, _ := os.Hostname()
		follow = func(ctx context.Context) {
			defer conn.Close()
			if a.proxyCheck != nil {
				// What the check finds goes to every xds-server replica (they share no
				// state, and Envoy may follow any of them), which keep requests whose
				// identity kube-mvp sets away from apiservers found dangerous.
				reported := make(chan struct{})
				go func() {
					defer close(reported)
					tablestream.ReportToReplicas(ctx, cfg.sourceXDS, tablestream.Replicas{
						Dial: func(addr string) (*grpc.ClientConn, error) {
							return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds), keepalives)
						},
					}, clientID, log, a.proxyCheck.Findings)
				}()
				defer func() { <-reported }()
			}
			tablestream.Follow(ctx, conn, clientID, apply, tablestream.FollowOptions{Log: log, OnReject: a.srv.TableUpdateFailed})
		}
	}
	reg.MustRegister(cptls.NewExpiryCollector(expiries...))

	var err error
	a.grpcLis, err = listen(cfg.listen)
	if err != nil {
		return nil, err
	}
	a.adminLis, err = net.Listen("tcp", cfg.adminAddress)
	if err != nil {
		a.grpcLis.Close()
		return nil, fmt.Errorf("admin address: %w", err)
	}

	a.grpc = grpc.NewServer(
		// Envoy's gRPC client may ping idle connections; do not punish it for that.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(uint32(cfg.maxStreamsPerConnection)),
	)
	extprocv3.RegisterExternalProcessorServer(a.grpc, a.srv)
	healthpb.RegisterHealthServer(a.grpc, a.health)

	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.srv.Ready() {
			http.Error(w, "no routing table yet", http.StatusServiceUnavailable)
			return
		}
		// The proxy certificate fails readiness only when every apiserver that answered
		// refuses it (nothing can work); a few refusing apiservers are warnings, since their
		// 401s to Envoy's health checks keep requests away from them already, and failing
		// every Envoy pod's readiness for one misconfigured apiserver would be an outage.
		ready, report := true, ""
		if a.proxyCheck != nil {
			ready, report = a.proxyCheck.Report()
		}
		if !ready {
			http.Error(w, strings.TrimSuffix(report, "\n"), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ok: routing table %s\n%s", a.srv.Version(), report)
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	// The Envoy container's preStop hook: it only waits, so it needs no protection beyond
	// its limits (drain.Waiter).
	stopping := make(chan struct{})
	mux.Handle("/drained", &drain.Waiter{File: cfg.drainedFile, MaxWait: cfg.drainedMaxWait, Stop: stopping, Logger: log})
	a.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	a.admin.RegisterOnShutdown(func() { close(stopping) })

	go func() { a.errs <- a.grpc.Serve(a.grpcLis) }()
	go func() {
		if err := a.admin.Serve(a.adminLis); !errors.Is(err, http.ErrServerClosed) {
			a.errs <- err
		}
	}()
	watchCtx, cancel := context.WithCancel(context.Background())
	a.stopWatch = cancel
	go func() {
		defer close(a.watchDone)
		if a.proxyCheck != nil {
			checked := make(chan struct{})
			go func() { defer close(checked); a.proxyCheck.Run(watchCtx) }()
			defer func() { <-checked }()
		}
		follow(watchCtx)
	}()
	log.Info("extproc serving", "listen", addrString(a.grpcLis), "admin", a.adminLis.Addr().String(), "table", a.srv.Version(), "source", cfg.sourceFile+cfg.sourceXDS, "max_streams", cfg.maxStreams)
	return a, nil
}

// wait serves until ctx ends (a signal) or a server fails, then stops gracefully: in-flight
// ext_proc streams (one per HTTP request, short) get up to 10 s to finish.
func (a *app) wait(ctx context.Context) error {
	var err error
	select {
	case <-ctx.Done():
		a.log.Info("stopping")
	case err = <-a.errs:
	}
	a.stopWatch()
	a.health.Shutdown()
	stopped := make(chan struct{})
	go func() { a.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		a.grpc.Stop()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.admin.Shutdown(shutdownCtx) //nolint:errcheck // best effort on the way out
	<-a.watchDone
	return err
}

// listen opens ADDR: "unix:/path" (a stale socket file left by a previous run is removed;
// one some process still serves is not) or host:port.
func listen(addr string) (net.Listener, error) {
	path, isUnix := strings.CutPrefix(addr, "unix:")
	if !isUnix {
		return net.Listen("tcp", addr)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("--listen %s: %s exists and is not a socket; not removing it", addr, path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--listen %s: another process is serving on this socket", addr)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--listen %s: removing the stale socket: %w", addr, err)
		}
	}
	return net.Listen("unix", path)
}

func addrString(l net.Listener) string {
	if l.Addr().Network() == "unix" {
		return "unix:" + l.Addr().String()
	}
	return l.Addr().String()
}
