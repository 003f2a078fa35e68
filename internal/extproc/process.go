package extproc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/drain"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
)

// Config is what a running extproc is made of: cmd/extproc's command line, validated.
type Config struct {
	SourceFile   string // file:FILE
	SourceXDS    string // xds:HOST:PORT
	Listen       string // "unix:/path" or host:port
	AdminAddress string
	// Now and PollInterval: a file source's FileOptions.
	Now          time.Time
	PollInterval time.Duration
	XDSTLS       *cptls.Files // xds source: nil with --xds-insecure-plaintext
	// ProxyCheck are the files of the proxy certificate check; nil without
	// --proxy-client-cert.
	ProxyCheck *proxycert.Files
	// ProxyCheckInterval is how often the proxy certificate is checked when nothing changed.
	ProxyCheckInterval time.Duration

	// DrainedFile and DrainedMaxWait: /drained (drain.Waiter).
	DrainedFile    string
	DrainedMaxWait time.Duration

	// Stream bounds (DefaultMaxStreams explains the defaults).
	MaxStreams, MaxStreamsPerConnection int
	FirstMessageTimeout                 time.Duration
}

// HealthService is the gRPC health service name of the ext_proc API.
const HealthService = "envoy.service.ext_proc.v3.ExternalProcessor"

// Process is a running extproc: the gRPC server, the admin server and the table source.
type Process struct {
	log       *slog.Logger
	srv       *Server
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

// Start opens both listeners and serves. A file source is loaded first, so a bad file stops
// start-up; an xds source connects in the background (xds-server may start later), and
// until its first table arrives every request is answered 503 and /readyz fails. reload
// re-reads a file source.
func Start(cfg Config, log *slog.Logger, reload <-chan os.Signal) (*Process, error) {
	a := &Process{log: log, errs: make(chan error, 2), watchDone: make(chan struct{})}
	a.srv = New(Options{Logger: log, MaxStreams: cfg.MaxStreams, FirstMessageTimeout: cfg.FirstMessageTimeout})
	reg := a.srv.Registry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// For Envoy's gRPC health checks of the ext_proc cluster: SERVING once a table is loaded.
	a.health = health.NewServer()
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	a.health.SetServingStatus(HealthService, healthpb.HealthCheckResponse_NOT_SERVING)
	var expiries []cptls.Expiry // certificates held, for kube_mvp_certificate_expiry_timestamp_seconds
	if files := cfg.ProxyCheck; files != nil {
		expiries = append(expiries, cptls.Expiry{Certificate: cptls.CertificateProxyClient, Role: cptls.RoleExtproc, NotAfter: cptls.FileNotAfter(files.Cert)})
		a.proxyCheck = proxycert.NewMonitor(proxycert.MonitorOptions{
			NewCheck: func() (proxycert.CheckFunc, error) {
				c, err := files.Load()
				return c.Check, err
			},
			Interval:   cfg.ProxyCheckInterval,
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
		a.health.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
	}

	var follow func(ctx context.Context)
	if cfg.SourceFile != "" {
		source := FileSource(cfg.SourceFile, FileOptions{
			Now: cfg.Now, PollInterval: cfg.PollInterval, Reload: reload, Logger: log,
		})
		t, version, err := source.Load()
		if err != nil {
			return nil, fmt.Errorf("routing table source: %w", err)
		}
		apply(t, version)
		follow = func(ctx context.Context) { source.Run(ctx, apply) }
	} else {
		creds := insecure.NewCredentials()
		if cfg.XDSTLS != nil {
			c, err := cptls.Load(*cfg.XDSTLS, cptls.RoleExtproc, log)
			if err != nil {
				return nil, fmt.Errorf("--xds-tls-dir: %w", err)
			}
			expiries = append(expiries, cptls.Expiry{Certificate: cptls.CertificateControlPlane, Role: cptls.RoleExtproc, NotAfter: c.NotAfterOf()})
			creds = credentials.NewTLS(c.ClientConfig())
		}
		// The table stream is idle between changes; keepalives notice a dead xds-server.
		keepalives := grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true})
		conn, err := grpc.NewClient(cfg.SourceXDS, grpc.WithTransportCredentials(creds), keepalives)
		if err != nil {
			return nil, fmt.Errorf("--source xds:%s: %w", cfg.SourceXDS, err)
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
					tablestream.ReportToReplicas(ctx, cfg.SourceXDS, tablestream.Replicas{
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
	a.grpcLis, err = Listen(cfg.Listen)
	if err != nil {
		return nil, err
	}
	a.adminLis, err = net.Listen("tcp", cfg.AdminAddress)
	if err != nil {
		a.grpcLis.Close()
		return nil, fmt.Errorf("admin address: %w", err)
	}

	a.grpc = grpc.NewServer(
		// Envoy's gRPC client may ping idle connections; do not punish it for that.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(uint32(cfg.MaxStreamsPerConnection)),
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
	mux.Handle("/drained", &drain.Waiter{File: cfg.DrainedFile, MaxWait: cfg.DrainedMaxWait, Stop: stopping, Logger: log})
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
	log.Info("extproc serving", "listen", addrString(a.grpcLis), "admin", a.adminLis.Addr().String(), "table", a.srv.Version(), "source", cfg.SourceFile+cfg.SourceXDS, "max_streams", cfg.MaxStreams)
	return a, nil
}

// Server is the ext_proc server.
func (a *Process) Server() *Server { return a.srv }

// AdminAddr is where the admin server listens.
func (a *Process) AdminAddr() net.Addr { return a.adminLis.Addr() }

// Wait serves until ctx ends (a signal) or a server fails, then stops gracefully: in-flight
// ext_proc streams (one per HTTP request, short) get up to 10 s to finish.
func (a *Process) Wait(ctx context.Context) error {
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

// Listen opens ADDR: "unix:/path" (a stale socket file left by a previous run is removed;
// one some process still serves is not) or host:port. Errors name it as --listen does.
func Listen(addr string) (net.Listener, error) {
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
