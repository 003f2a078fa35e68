package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/hashicorp/go-multierror"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/makebeforebreak"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/pipeline"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

var serveCommand = &cli.Command{
	Name:    "serve",
	Summary: "watch a cluster's apiservers and serve Envoy (ADS) and extproc (routing table)",
	Usage:   serveUsage,
	Run: untilSignal(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return runServe(ctx, args, stdout, stderr, nil)
	}),
}

func serveUsage() string { return cli.Usage(serveIntro, new(serveOptions).flagSet(), serveOutro) }

const serveIntro = `usage: xds-server serve [flags]

Watches the apiserver identity Leases, StorageVersions, APIServices and each live apiserver's
discovery, and serves on one gRPC port both Envoy's configuration (ADS, state of the world and
delta) and the routing table extproc decides from.
`

const serveOutro = `--cluster-linger must be longer than --routing-table-delay; an apiserver that became live
joins the default cluster two table delays later, when every table in use knows it.

The Envoy certificate flags name files in Envoy's file system (absolute paths): xds-server never
reads them, and SDS carries only their paths; Envoy watches them, so a renewed file takes effect
without a restart. No private key travels over xDS. Each one left out leaves its TLS piece out.
`

type serveOptions struct {
	rest         *rest.Config
	xdsAddress   string
	xdsTLS       *cptls.Files // nil: plaintext (--xds-insecure-plaintext)
	limits       xds.Limits
	adminAddress string
	watch        inventory.WatchOptions
	cfg          snapshot.Config
	// mbb: when a change reaches Envoy and extproc, see internal/makebeforebreak.
	mbb           makebeforebreak.Options
	shutdownDelay time.Duration

	// Flags read into the above after parsing.
	kubeconfig, tlsDir, addresses, memoryConfigMap string
	plaintext                                      bool
	envoy                                          envoyFlags
}

// flagSet defines serve's flags on o, with their defaults.
func (o *serveOptions) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("serve")
	count := func(p *int, def int, name, usage string) {
		fs.Var(cli.NewValue(p, def, "N", func(s string) (int, error) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return 0, errors.New("is not a whole number of at least 1")
			}
			return n, nil
		}), name, usage)
	}
	duration := func(p *time.Duration, def time.Duration, name string, min time.Duration, why, usage string) {
		fs.Var(cli.NewValue(p, def, "DURATION", cli.Duration(min, fmt.Sprintf("a duration of at least %s (%s)", min, why))), name, usage)
	}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "the cluster to watch, a kubeconfig `FILE` (default: in-cluster, then $KUBECONFIG)")
	fs.StringVar(&o.xdsAddress, "xds-address", ":18000", "gRPC listen `ADDR` for Envoy and extproc")
	fs.StringVar(&o.tlsDir, "xds-tls-dir", "", "the control plane's own TLS for that port: `DIR`/tls.crt and tls.key (an xds-server certificate) and ca.crt, as made by xds-server certgen")
	cli.Bool(fs, &o.plaintext, "xds-insecure-plaintext", false, "serve that port without TLS to anyone who connects (local experiments only: no client is authenticated)")
	count(&o.limits.MaxNodes, 1000, "max-nodes", "Envoy nodes connected at once")
	count(&o.limits.MaxStreams, 4000, "max-streams", "xDS streams open at once")
	fs.StringVar(&o.adminAddress, "admin-address", "127.0.0.1:9100", "HTTP `ADDR`: /healthz /readyz /metrics /debug/topology /debug/syncz /debug/config_dump[?node=ID]")
	duration(&o.watch.LivenessWindow, objects.DefaultLivenessWindow, "liveness-window", objects.MinLivenessWindow, "apiservers renew their Lease every 10s",
		"a Lease renewed longer ago is a dead apiserver")
	duration(&o.watch.DiscoveryInterval, inventory.DefaultDiscoveryInterval, "discovery-interval", time.Second, "a refetch per apiserver",
		"refetch each apiserver's discovery this often")
	bodyLimit := cli.NewValue(&o.watch.MaxDiscoveryBody, inventory.DefaultMaxDiscoveryBody, "SIZE", parseBodyLimit)
	bodyLimit.Format = formatSize
	fs.Var(bodyLimit, "max-discovery-body", "the most bytes of an apiserver's discovery answer kept (decoded; an aggregated document up to 32 times larger is pruned into it): bytes, Ki or Mi")
	duration(&o.watch.DepartedGrace, inventory.DefaultDepartedGrace, "departed-apiserver-grace", time.Second, "the memory is checked every few seconds",
		"remember what an apiserver served this long after its identity Lease is deleted (503, not 404, for its APIs meanwhile)")
	fs.StringVar(&o.memoryConfigMap, "memory-configmap", "", "keep that memory and the request-header names in this ConfigMap, `NAMESPACE/NAME`, shared by every replica (default: in this process only)")
	fs.StringVar(&o.addresses, "apiserver-addresses", "", "addresses for Leases without a peer-advertise address, a `LIST` of HOSTNAME=HOST:PORT")
	duration(&o.mbb.TableDelay, 2*time.Second, "routing-table-delay", 0, "0 sends each table at once",
		"send extproc a routing table that names a new serving set or apiserver whole this long after Envoy got it (narrowed to what Envoy has before)")
	duration(&o.mbb.Linger, 30*time.Second, "cluster-linger", 0, "0 drops unnamed serving sets at once",
		"keep a serving set no longer named this long, for requests routed by an older table")
	duration(&o.shutdownDelay, 0, "shutdown-delay", 0, "0 stops at once",
		"after SIGTERM keep serving this long, /readyz failing, before closing every stream: longer than the cluster DNS caches this replica's address")
	fs.AddFlagSet(o.envoy.flagSet())
	return fs
}

// Bounds of --max-discovery-body: below 1 MiB real apiservers would be refused, and xds-server
// holds a few such bodies, decoded, at once.
const (
	minDiscoveryBody = 1 << 20
	maxDiscoveryBody = 256 << 20
)

// parseBodyLimit reads a byte count, optionally with a binary suffix (16Mi).
func parseBodyLimit(s string) (int64, error) {
	num, unit := s, int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, unit = n, u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 || n > maxDiscoveryBody/unit || n*unit < minDiscoveryBody {
		return 0, fmt.Errorf("is not a size from 1Mi to 256Mi: a whole number of bytes, or of Ki or Mi, e.g. %s", formatSize(inventory.DefaultMaxDiscoveryBody))
	}
	return n * unit, nil
}

func formatSize(n int64) string {
	switch {
	case n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "Mi"
	case n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "Ki"
	}
	return strconv.FormatInt(n, 10)
}

func parseServe(args []string) (serveOptions, error) {
	var opts serveOptions
	errs, stop := cli.Parse(opts.flagSet(), args)
	if stop != nil {
		return opts, stop
	}
	var err error
	opts.xdsTLS, err = cptls.FromFlags(opts.tlsDir, opts.tlsDir != "", opts.plaintext, cptls.RoleXDSServer,
		"the gRPC port hands out Envoy's configuration and the routing table, so only "+
			"holders of the control plane's certificates may connect (make them with xds-server "+
			"certgen); --xds-insecure-plaintext serves anyone, for local experiments only")
	if err != nil {
		errs = multierror.Append(errs, err)
	}
	for flag, addr := range map[string]string{"--xds-address": opts.xdsAddress, "--admin-address": opts.adminAddress} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("%s %q is not host:port (e.g. :18000): %v", flag, addr, err))
		}
	}
	if err := opts.mbb.Validate(); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("--routing-table-delay %s, --cluster-linger %s: %w", opts.mbb.TableDelay, opts.mbb.Linger, err))
	}
	if opts.addresses != "" {
		opts.watch.Addresses = map[string]string{}
		for _, pair := range strings.Split(opts.addresses, ",") {
			host, addr, ok := strings.Cut(pair, "=")
			if _, _, err := net.SplitHostPort(addr); !ok || host == "" || err != nil {
				errs = multierror.Append(errs, fmt.Errorf("--apiserver-addresses: %q is not HOSTNAME=HOST:PORT", pair))
				continue
			}
			opts.watch.Addresses[host] = addr
		}
	}
	if opts.memoryConfigMap != "" {
		if opts.watch.MemoryConfigMap, err = inventory.ParseMemoryConfigMap(opts.memoryConfigMap); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--memory-configmap: %v", err))
		}
		if opts.tlsDir == "" {
			errs = multierror.Append(errs, errors.New("--memory-configmap needs --xds-tls-dir: xds-server signs "+
				"every entry with its own key (DIR/tls.key) and believes only entries an xds-server "+
				"certificate of the control plane's CA (DIR/ca.crt) signed, so that whoever "+
				"may write the ConfigMap cannot make xds-server route by it; give --xds-tls-dir, "+
				"or leave --memory-configmap out to keep the memory in this process only"))
		}
	}
	opts.cfg, errs = opts.envoy.config(errs)
	if errs == nil {
		if opts.rest, err = clusterConfig(opts.kubeconfig); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--kubeconfig: %v", err))
		}
	}
	return opts, cli.Err(errs)
}

// runServe runs until ctx ends. ready, if not nil, receives the bound gRPC and admin
// addresses once both listen (tests use port 0).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- [2]string) int {
	opts, err := parseServe(args)
	if code, ok := cli.Done("xds-server serve", err, serveUsage, stdout, stderr); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	// The container's memory limit, less a tenth, as Go's (GOMEMLIMIT, if set, wins): the
	// discovery and table limits assume the garbage collector works harder near it.
	memlimit.Set(memlimit.WithLogger(log)) //nolint:errcheck // it logs its own failure
	for _, w := range opts.envoy.warnings() {
		log.Warn(w)
	}
	if err := serve(ctx, opts, log, ready); err != nil {
		log.Error("xds-server stopped", "error", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, opts serveOptions, log *slog.Logger, ready chan<- [2]string) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var creds *cptls.Credentials
	if opts.xdsTLS != nil {
		var err error
		if creds, err = cptls.Load(*opts.xdsTLS, cptls.RoleXDSServer, log); err != nil {
			return fmt.Errorf("--xds-tls-dir: %w", err)
		}
	}
	// inventory → topology → plan → snapshot → xds: internal/pipeline.
	pl := pipeline.New(pipeline.Options{
		Snapshot: opts.cfg, MakeBeforeBreak: opts.mbb, Limits: opts.limits, Credentials: creds, Log: log, Registerer: reg,
	})
	watch, err := watchOptions(opts.watch, creds, log, newInventoryMetrics(reg))
	if err != nil {
		return err
	}
	watcher, err := inventory.NewWatcher(opts.rest, watch, pl.OnTopology)
	if err != nil {
		return err
	}

	grpcLis, err := net.Listen("tcp", opts.xdsAddress)
	if err != nil {
		return fmt.Errorf("--xds-address: %w", err)
	}
	adminLis, err := net.Listen("tcp", opts.adminAddress)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("--admin-address: %w", err)
	}
	// The streams and the watch outlive the signal by --shutdown-delay.
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	g := grpcServer(creds, pl.XDS(), log)
	pl.Register(runCtx, g)
	admin := &http.Server{Handler: pl.XDS().AdminHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})), ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 3)
	go func() { errc <- g.Serve(grpcLis) }()
	go func() { errc <- admin.Serve(adminLis) }()
	go func() { errc <- watcher.Run(runCtx) }()
	log.Info("xds-server serving", "xds", grpcLis.Addr().String(), "admin", adminLis.Addr().String(), "apiserver", opts.rest.Host)
	if ready != nil {
		ready <- [2]string{grpcLis.Addr().String(), adminLis.Addr().String()}
	}
	select {
	case <-ctx.Done():
		err = nil
		if opts.shutdownDelay > 0 {
			// Out of the Service's endpoints (terminating, and /readyz fails) but still
			// serving whoever a DNS cache still sends here.
			pl.XDS().SetStopping()
			log.Info("stopping: serving on until --shutdown-delay is over", "delay", opts.shutdownDelay)
			select {
			case <-time.After(opts.shutdownDelay):
			case err = <-errc:
			}
		}
	case err = <-errc:
	}
	stopRun()
	g.Stop()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	admin.Shutdown(shutdown)
	return err
}

// watchOptions are the inventory's options with its hooks: the log and its metrics, and
// creds to sign the memory with.
func watchOptions(w inventory.WatchOptions, creds *cptls.Credentials, log *slog.Logger, m *inventoryMetrics) (inventory.WatchOptions, error) {
	w.Log = log
	w.OnSkipped = func(n int) { m.skipped.Set(float64(n)) }
	w.OnDiscoveryRefused = func(reason string) { m.discoveryRefused.WithLabelValues(reason).Inc() }
	w.OnDiscoveryPruned = m.discoveryPruned.Inc
	if w.MemoryConfigMap.Name != "" {
		if creds == nil {
			return w, errors.New("--memory-configmap needs --xds-tls-dir")
		}
		w.MemoryCredentials = creds
		w.OnMemoryRejected = func(reason string) { m.memoryRejected.WithLabelValues(reason).Inc() }
	}
	w.OnRequestHeaderConfig = func(ok bool) {
		if ok {
			m.headerConfigBad.Set(0)
		} else {
			m.headerConfigBad.Set(1)
		}
	}
	return w, nil
}

// grpcServer is the gRPC port's server: with creds, mutual TLS and grpcPolicy (refusals
// counted by the ADS server); without, plaintext to anyone.
func grpcServer(creds *cptls.Credentials, x *xds.Server, log *slog.Logger) *grpc.Server {
	grpcOpts := []grpc.ServerOption{
		// An Envoy opens one ADS stream, extproc one table stream; a few more per
		// connection allow for reconnects, nothing allows a flood on one connection.
		grpc.MaxConcurrentStreams(16),
		// Envoy and extproc hold their streams for days; keepalives find dead peers.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if creds != nil {
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(creds.ServerConfig())))
		grpcOpts = append(grpcOpts, grpcPolicy.ServerOptions(func(method string, role cptls.Role, err error) {
			x.Refused("role", fmt.Errorf("%s: %w", method, err))
		})...)
	} else {
		log.Warn("--xds-insecure-plaintext: anyone who reaches the gRPC port gets Envoy's configuration and the routing table, and may join as any Envoy node")
	}
	return grpc.NewServer(grpcOpts...)
}

// grpcPolicy is who may call what on the gRPC port: Envoys the xDS services, extproc the
// routing table. Nothing else is served to anyone.
var grpcPolicy = cptls.Policy{
	"envoy.service.discovery.v3.AggregatedDiscoveryService": envoyRoles,
	"envoy.service.listener.v3.ListenerDiscoveryService":    envoyRoles,
	"envoy.service.route.v3.RouteDiscoveryService":          envoyRoles,
	"envoy.service.cluster.v3.ClusterDiscoveryService":      envoyRoles,
	"envoy.service.endpoint.v3.EndpointDiscoveryService":    envoyRoles,
	"envoy.service.secret.v3.SecretDiscoveryService":        envoyRoles,
	"kubemvp.table.v1.TableService":                         {cptls.RoleExtproc},
}

var envoyRoles = []cptls.Role{cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar}

// inventoryMetrics are what the inventory's hooks export (the pipeline's own metrics are
// internal/pipeline's).
type inventoryMetrics struct {
	skipped prometheus.Gauge
	// headerConfigBad: the request-header ConfigMap is malformed or incomplete.
	headerConfigBad prometheus.Gauge
	// memoryRejected counts the versions of the memory ConfigMap rejected as a whole.
	memoryRejected *prometheus.CounterVec
	// discoveryRefused counts the discovery fetches failed by an answer refused.
	discoveryRefused *prometheus.CounterVec
	// discoveryPruned counts the discovery fetches used in part (over the bounds).
	discoveryPruned prometheus.Counter
}

func newInventoryMetrics(reg prometheus.Registerer) *inventoryMetrics {
	m := &inventoryMetrics{}
	m.skipped = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_mvp_xds_objects_skipped",
		Help: "Watched objects the last topology build skipped or only partly used (each is logged once " +
			"when it appears), such as identity Leases that are not believable: a holderIdentity that " +
			"is not <name>_<uid>, a renewTime in the future, an address that is not an IP and port.",
	})
	m.headerConfigBad = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_mvp_xds_request_header_config_malformed",
		Help: "1 while kube-system/extension-apiserver-authentication's requestheader keys are " +
			"malformed or missing: the last good header names stay in use (with none, nothing is " +
			"published and /readyz fails), and every name read before stays stripped from clients.",
	})
	m.memoryRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_mvp_xds_memory_rejected_total",
		Help: "Versions of the memory ConfigMap (--memory-configmap) ignored as a whole and replaced, by reason " +
			"(malformed; bounds: too many entries, group/versions, resources or bytes; future: a time in the future; " +
			"unsigned: an entry without a signature where none may be; signer: a signer certificate not of the " +
			"control plane's CA or not xds-server's; signature: a signature that does not match its entry and key).",
	}, []string{"reason"})
	m.discoveryRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_mvp_xds_discovery_refused_total",
		Help: discoveryRefusedHelp,
	}, []string{"reason"})
	for _, reason := range []string{inventory.RefusedRedirect, inventory.RefusedTooLarge} {
		m.discoveryRefused.WithLabelValues(reason)
	}
	m.discoveryPruned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kube_mvp_xds_discovery_pruned_total",
		Help: "Discovery fetches from an apiserver used in part: groups, versions or lists over the bounds (or over " +
			"--max-discovery-body) left out, the rest used. The log names the apiserver and what was left out.",
	})
	reg.MustRegister(m.skipped, m.headerConfigBad, m.memoryRejected, m.discoveryRefused, m.discoveryPruned)
	return m
}

const discoveryRefusedHelp = "Discovery fetches from an apiserver failed because its answer was refused, by reason " +
	"(redirect: a redirect, never followed; too-large: a body over --max-discovery-body). " +
	"The apiserver's previous discovery stays in use; the log names the apiserver."
