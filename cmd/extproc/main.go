// Command extproc is kube-mvp's Envoy external processor: it serves
// envoy.service.ext_proc.v3.ExternalProcessor, deciding per request which apiservers may
// serve it (see internal/extproc).
//
//	extproc --source xds:HOST:PORT|file:FILE --listen ADDR [--admin-address 127.0.0.1:9002]
//	        [--now RFC3339] [--poll-interval DURATION] [--local-id APISERVER-ID]
//
// ADDR is unix:/path/to.sock or host:port. The admin address serves /healthz, /readyz (ready
// once a routing table is loaded) and /metrics. With a file source SIGHUP re-reads the file;
// SIGTERM or SIGINT stops gracefully.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/hashicorp/go-multierror"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/extproc"
	"github.com/kube-mvp/kube-mvp/internal/table"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/version"
)

const usage = `usage: extproc --source xds:HOST:PORT|file:FILE --listen ADDR [flags]

Serves Envoy's ext_proc API for kube-mvp: names the apiserver cluster for each request,
strips client-supplied identity headers and forwards the client certificate's identity.

flags:
  --source SOURCE            where the routing table comes from (required):
                               xds:HOST:PORT  xds-server's table stream (its --xds-address);
                                              the last table is kept while it reconnects
                               file:FILE      an inventory fixture (YAML), as read by
                                              xds-server translate -f
  --xds-tls-dir DIR          xds source: the control plane's TLS, DIR/tls.crt and DIR/tls.key
                             (an extproc certificate) and DIR/ca.crt (the control plane's CA
                             bundle), as made by xds-server certgen; xds-server must present a
                             certificate of that CA naming its role (re-read on change)
  --xds-insecure-plaintext   xds source: no TLS (an xds-server started with the same flag)
  --listen ADDR              gRPC address: unix:/path/to.sock or host:port (required)
  --admin-address HOST:PORT  /healthz, /readyz and /metrics (default 127.0.0.1:9002)
  --now RFC3339              file source: judge Lease liveness at this time (default: every
                             Lease is live)
  --poll-interval DURATION   file source: also re-read the file when it changes, checked this
                             often (default 0: only on SIGHUP)
  --local-id ID|HOSTNAME     sidecar mode: the apiserver this Envoy runs beside, by ID or by
                             the hostname of its identity Lease (e.g. the node name)
  -h, --help                 this text
  --version                  print the version and exit

SIGHUP re-reads a file source; SIGTERM and SIGINT stop gracefully.
`

// config is the validated command line.
type config struct {
	sourceFile   string // file:FILE
	sourceXDS    string // xds:HOST:PORT
	listen       string // "unix:/path" or host:port
	adminAddress string
	now          time.Time
	pollInterval time.Duration
	localID      string
	xdsTLS       *cptls.Files // xds source: nil with --xds-insecure-plaintext
}

// extprocService is the gRPC health service name of the ext_proc API.
const extprocService = "envoy.service.ext_proc.v3.ExternalProcessor"

// errHelp asks for the usage text.
var errHelp = errors.New("help requested")

// parseArgs validates the whole command line and reports every problem at once.
func parseArgs(args []string) (config, error) {
	cfg := config{adminAddress: "127.0.0.1:9002"}
	var errs *multierror.Error
	raw := map[string]string{}
	seen := map[string]bool{}
	known := []string{"source", "xds-tls-dir", "xds-insecure-plaintext", "listen", "admin-address", "now", "poll-interval", "local-id"}
	booleans := []string{"xds-insecure-plaintext"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-h" || a == "-help" || a == "--help" {
			return cfg, errHelp
		}
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			errs = multierror.Append(errs, fmt.Errorf("unexpected argument %q: every option is a --flag", a))
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !slices.Contains(known, name) {
			errs = multierror.Append(errs, fmt.Errorf("unknown flag %q (known: --%s)", a, strings.Join(known, ", --")))
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++ // most likely its value
			}
			continue
		}
		if slices.Contains(booleans, name) {
			if !hasValue {
				value = "true"
			} else if value != "true" && value != "false" {
				errs = multierror.Append(errs, fmt.Errorf("--%s=%q: want true or false", name, value))
			}
		} else if !hasValue {
			if i+1 == len(args) {
				errs = multierror.Append(errs, fmt.Errorf("--%s needs a value", name))
				continue
			}
			i++
			value = args[i]
		}
		if seen[name] {
			errs = multierror.Append(errs, fmt.Errorf("--%s given more than once", name))
		}
		seen[name] = true
		raw[name] = value
	}

	switch src, ok := raw["source"]; {
	case !ok:
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

	dir, hasDir := raw["xds-tls-dir"]
	plaintext := raw["xds-insecure-plaintext"] == "true"
	switch {
	case cfg.sourceXDS == "" && (hasDir || plaintext):
		errs = multierror.Append(errs, errors.New("--xds-tls-dir and --xds-insecure-plaintext apply to an xds source only"))
	case cfg.sourceXDS != "":
		var err error
		cfg.xdsTLS, err = cptls.FromFlags(dir, hasDir, plaintext, cptls.RoleExtproc,
			"with an xds source, xds-server serves the routing table only to holders of an extproc certificate of the control plane's CA (xds-server certgen); --xds-insecure-plaintext for an xds-server without TLS")
		if err != nil {
			errs = multierror.Append(errs, err)
		}
	}

	switch l, ok := raw["listen"]; {
	case !ok:
		errs = multierror.Append(errs, errors.New("--listen is required: --listen unix:/run/kube-mvp/extproc.sock or --listen 127.0.0.1:9001"))
	case strings.HasPrefix(l, "unix:"):
		if strings.TrimPrefix(l, "unix:") == "" {
			errs = multierror.Append(errs, errors.New("--listen unix: needs a socket path, e.g. unix:/run/kube-mvp/extproc.sock"))
		}
		cfg.listen = l
	default:
		if err := checkHostPort(l); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--listen %q: %v; want unix:/path or host:port", l, err))
		}
		cfg.listen = l
	}

	if a, ok := raw["admin-address"]; ok {
		if err := checkHostPort(a); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--admin-address %q: %v; want host:port, e.g. 127.0.0.1:9002", a, err))
		}
		cfg.adminAddress = a
	}
	if cfg.sourceXDS != "" {
		for _, name := range []string{"now", "poll-interval"} {
			if _, ok := raw[name]; ok {
				errs = multierror.Append(errs, fmt.Errorf("--%s applies to a file source only; xds-server judges liveness and pushes every change", name))
			}
		}
	}
	if n, ok := raw["now"]; ok {
		t, err := time.Parse(time.RFC3339, n)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--now %q is not an RFC 3339 time, e.g. 2026-11-23T10:00:00Z", n))
		}
		cfg.now = t
	}
	if p, ok := raw["poll-interval"]; ok {
		d, err := time.ParseDuration(p)
		if err != nil || d < 0 {
			errs = multierror.Append(errs, fmt.Errorf("--poll-interval %q is not a non-negative duration, e.g. 10s", p))
		}
		cfg.pollInterval = d
	}
	if id, ok := raw["local-id"]; ok {
		if id == "" {
			errs = multierror.Append(errs, errors.New("--local-id needs an apiserver ID or hostname, e.g. cp-a"))
		}
		cfg.localID = id
	}
	if errs != nil {
		errs.ErrorFormat = listErrors
	}
	return cfg, errs.ErrorOrNil()
}

func listErrors(errs []error) string {
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = "  - " + e.Error()
	}
	return fmt.Sprintf("%d problem(s) with the command line:\n%s", len(errs), strings.Join(lines, "\n"))
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
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		fmt.Fprintln(stdout, version.String("extproc"))
		return 0
	}
	cfg, err := parseArgs(args)
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "extproc: %v\nRun extproc --help for usage.\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
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
}

// start opens both listeners and serves. A file source is loaded first, so a bad file stops
// start-up; an xds source connects in the background (xds-server may start later), and
// until its first table arrives every request is answered 503 and /readyz fails.
func start(cfg config, log *slog.Logger, reload <-chan os.Signal) (*app, error) {
	a := &app{log: log, errs: make(chan error, 2), watchDone: make(chan struct{})}
	a.srv = extproc.New(extproc.Options{Logger: log})
	reg := a.srv.Registry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// For Envoy's gRPC health checks of the ext_proc cluster: SERVING once a table is loaded.
	a.health = health.NewServer()
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	a.health.SetServingStatus(extprocService, healthpb.HealthCheckResponse_NOT_SERVING)
	apply := func(t *topology.Topology, version string) {
		a.srv.SetTopology(t, version)
		a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		a.health.SetServingStatus(extprocService, healthpb.HealthCheckResponse_SERVING)
	}

	var follow func(ctx context.Context)
	if cfg.sourceFile != "" {
		source := extproc.FileSource(cfg.sourceFile, extproc.FileOptions{
			Now: cfg.now, LocalID: cfg.localID, PollInterval: cfg.pollInterval, Reload: reload, Logger: log,
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
			creds = credentials.NewTLS(c.ClientConfig())
		}
		conn, err := grpc.NewClient(cfg.sourceXDS, grpc.WithTransportCredentials(creds),
			// The table stream is idle between changes; keepalives notice a dead xds-server.
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}))
		if err != nil {
			return nil, fmt.Errorf("--source xds:%s: %w", cfg.sourceXDS, err)
		}
		clientID, _ := os.Hostname()
		follow = func(ctx context.Context) {
			defer conn.Close()
			table.Follow(ctx, conn, clientID, log, func(t *topology.Topology, version string) {
				apply(extproc.Sidecar(t, version, cfg.localID, log))
			}, table.OnReject(a.srv.TableUpdateFailed))
		}
	}

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
		fmt.Fprintf(w, "ok: routing table %s\n", a.srv.Version())
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	a.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

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
		follow(watchCtx)
	}()
	log.Info("extproc serving", "listen", addrString(a.grpcLis), "admin", a.adminLis.Addr().String(), "table", a.srv.Version(), "source", cfg.sourceFile+cfg.sourceXDS)
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
