// Package harness runs kube-mvp in front of a test control plane, the way the end-to-end tests
// and the demo need it: the real xds-server and extproc binaries built from this checkout, as
// processes, and Envoy as a process too, started as the chart starts it and configured by
// xds-server over ADS: real Envoy (KUBE_MVP_ENVOY, make test-envoy) or the test stand-in's
// binary (test/cmd/envoy-stand-in), observed only through its listener and admin API.
package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// ListenerName is the name of the listener xds-server emits.
const ListenerName = "kube-apiserver"

// EnvoyEnv names the environment variable that selects the Envoy binary the harness runs
// (make test-envoy ENVOY=... sets it); unset, it runs the stand-in BuildBinaries built.
const EnvoyEnv = "KUBE_MVP_ENVOY"

// StandInBinary is the stand-in's binary name in BinDir.
const StandInBinary = "envoy-stand-in"

// BuildBinaries builds xds-server, extproc and the Envoy stand-in from this checkout into dir.
func BuildBinaries(ctx context.Context, dir string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/xds-server", "./cmd/extproc", "./test/cmd/"+StandInBinary)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building xds-server, extproc and the Envoy stand-in: %w\n%s", err, out.String())
	}
	return nil
}

// Options describe one kube-mvp deployment.
type Options struct {
	ControlPlane *controlplane.ControlPlane
	// BinDir holds xds-server, extproc and the Envoy stand-in (BuildBinaries).
	BinDir string
	// Dir receives the sockets and the processes' logs; keep it short (unix socket paths are
	// limited to 108 bytes).
	Dir string
	// Name names the deployment: the Envoy node ID, log file prefix.
	Name string
	// LocalAPIServer, when set (an apiserver's hostname), makes this a sidecar deployment
	// beside that apiserver; empty is a front proxy for all of them.
	LocalAPIServer string
	// LivenessWindow is xds-server's --liveness-window; zero means its default.
	LivenessWindow time.Duration
	// ExtProcMessageTimeout is xds-server's --extproc-message-timeout; zero means
	// TestExtProcMessageTimeout.
	ExtProcMessageTimeout time.Duration
	// Envoy is the Envoy binary; "" means $KUBE_MVP_ENVOY, or else BinDir's stand-in.
	Envoy string
	// EnvoyLogLevel is Envoy's --log-level (the chart's envoy.logLevel); "" means debug (the
	// stand-in logs a line per request and per upstream attempt, for failing tests).
	// Benchmarks use info, as Envoy runs in production: formatting each ext_proc exchange
	// costs about half a millisecond.
	EnvoyLogLevel string
	// XDSServerArgs are extra `xds-server serve` flags, appended last.
	XDSServerArgs []string
	// ExtprocArgs are extra extproc flags, appended last.
	ExtprocArgs []string
	// WatchThrough, when set (an apiserver's hostname), is where xds-server's first
	// connection through the balancer goes, the one its watches share: a test that freezes
	// that apiserver leaves xds-server's view stuck, as a hung apiserver behind the
	// kubernetes Service can.
	WatchThrough string
	// ExtprocUnready: Start waits for extproc's /healthz, not its /readyz, for tests in
	// which its readiness must fail (every apiserver refuses the proxy certificate).
	ExtprocUnready bool
	// XDSServerBin and ExtprocBin, when set, are the binaries to run instead of BinDir's
	// (another version of kube-mvp, for version-skew tests); XDSServerBin also makes the
	// control plane's certificates (certgen).
	XDSServerBin, ExtprocBin string
	// XDSSwitch: the data plane and extproc each reach xds-server through a Switch of their
	// own (KubeMVP.EnvoyXDS, KubeMVP.ExtprocXDS), so that a test can move them to another
	// xds-server (StartXDSServer) as a rollout of its Deployment does.
	XDSSwitch bool
	// DataPlaneUnready: Start returns once the data plane is started, without waiting for
	// it to apply a whole configuration, for tests in which it refuses (NACKs) the
	// configuration it is given.
	DataPlaneUnready bool
	// EnvoyVersion is the Envoy release the stand-in models (its --envoy-version; "": the
	// newest it models). Only the stand-in models releases: with another Envoy, Start
	// refuses it (a test that needs it skips: RequireStandIn).
	EnvoyVersion string
}

// TestExtProcMessageTimeout is how long the data plane waits for extproc in tests. The
// production default (200 ms) is sized for Envoy and extproc on a production node; under the
// race detector, on a shared 2-core machine that also runs etcd and several apiservers, one
// extproc exchange sometimes took longer (a CI rolling upgrade: 1 of 7,351 requests), which
// measures the machine, not kube-mvp. Speed is measured by the benchmarks instead.
const TestExtProcMessageTimeout = 2 * time.Second

// KubeMVP is a running deployment: xds-server, extproc following its table stream, and a
// data plane configured by it.
type KubeMVP struct {
	Name         string
	XDSAddress   string
	XDSAdmin     string // http://host:port
	ExtprocAdmin string // http://host:port
	// ControlPlaneTLS is the directory of a role's control-plane certificate (tls.crt,
	// tls.key, ca.crt), as xds-server certgen --out-dir made it.
	ControlPlaneTLS func(cptls.Role) string
	// Envoy is the data plane.
	Envoy *Envoy
	procs []*process // xds-server first
	// XDSServers are the xds-server processes: Start's first, then StartXDSServer's.
	XDSServers []*XDSServer
	// EnvoyXDS and ExtprocXDS, with Options.XDSSwitch, are where the data plane and extproc
	// connect for xds-server.
	EnvoyXDS, ExtprocXDS *Switch
	extArgs              []string
	xdsArgs              []string
	xdsLog               string
	apiBalancer          *RoundRobin
}

// Start starts a deployment and waits until its data plane has applied a full configuration.
// On error everything started is stopped again.
func Start(ctx context.Context, opts Options) (k *KubeMVP, err error) {
	cp := opts.ControlPlane
	dir := filepath.Join(opts.Dir, opts.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	addrs, err := freeAddrs(4) // xds-server's ADS and admin, extproc's admin, Envoy's listener
	if err != nil {
		return nil, err
	}
	k = &KubeMVP{Name: opts.Name, XDSAddress: addrs[0], XDSAdmin: "http://" + addrs[1], ExtprocAdmin: "http://" + addrs[2]}
	started := k // the error returns below set k to nil
	defer func() {
		if err != nil {
			started.Close()
		}
	}()
	// xds-server watches through a balancer over every apiserver, as in a cluster it does
	// through the kubernetes Service: pointed at one apiserver, it would lose sight of every
	// Lease when that one stops.
	backends := cp.Addresses()
	if opts.WatchThrough != "" {
		first := cp.Server(opts.WatchThrough).Address()
		backends = append([]string{first}, slices.DeleteFunc(backends, func(a string) bool { return a == first })...)
	}
	if k.apiBalancer, err = StartRoundRobin(backends); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfigFor(kubeconfig, "https://"+k.apiBalancer.Addr()); err != nil {
		return nil, err
	}

	// The control plane's own certificates, made by the command the chart's Job runs.
	if opts.XDSServerBin == "" {
		opts.XDSServerBin = filepath.Join(opts.BinDir, "xds-server")
	}
	if opts.ExtprocBin == "" {
		opts.ExtprocBin = filepath.Join(opts.BinDir, "extproc")
	}
	cpTLS := filepath.Join(dir, "cp-tls")
	if out, err := exec.CommandContext(ctx, opts.XDSServerBin, "certgen", "--out-dir", cpTLS, "--dns-names", "localhost").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("xds-server certgen: %w\n%s", err, out)
	}
	envoyRole := cptls.RoleEnvoyFront
	if opts.LocalAPIServer != "" {
		envoyRole = cptls.RoleEnvoySidecar
	}
	k.ControlPlaneTLS = func(r cptls.Role) string { return filepath.Join(cpTLS, string(r)) }

	pki := cp.PKI
	sock := filepath.Join(dir, "extproc.sock")
	xdsArgs := []string{"serve",
		"--kubeconfig", kubeconfig, "--xds-address", addrs[0], "--admin-address", addrs[1],
		"--xds-tls-dir", k.ControlPlaneTLS(cptls.RoleXDSServer),
		"--extproc-address", "unix:" + sock, "--listen-address", "127.0.0.1", "--listen-port", strconv.Itoa(portOf(addrs[3])),
		"--serving-cert", pki.Path("serving.crt"), "--serving-key", pki.Path("serving.key"),
		"--client-ca", pki.Path("client-ca.crt"), "--peer-ca", pki.Path("server-ca.crt"),
		"--proxy-client-cert", pki.Path("proxy-client.crt"), "--proxy-client-key", pki.Path("proxy-client.key"),
	}
	if opts.LivenessWindow > 0 {
		xdsArgs = append(xdsArgs, "--liveness-window", opts.LivenessWindow.String())
	}
	if opts.ExtProcMessageTimeout == 0 {
		opts.ExtProcMessageTimeout = TestExtProcMessageTimeout
	}
	xdsArgs = append(xdsArgs, "--extproc-message-timeout", opts.ExtProcMessageTimeout.String())
	// A user must name the addresses of apiservers whose identity Lease carries none (cluster
	// defaults before 1.36); a test that gives the flag itself decides instead.
	if a := cp.AddressesFlag(); a != "" && !slices.ContainsFunc(opts.XDSServerArgs, func(s string) bool {
		return s == "--apiserver-addresses" || strings.HasPrefix(s, "--apiserver-addresses=")
	}) {
		xdsArgs = append(xdsArgs, "--apiserver-addresses", a)
	}
	xdsArgs = append(xdsArgs, opts.XDSServerArgs...)
	k.xdsArgs, k.xdsLog = append([]string{opts.XDSServerBin}, xdsArgs...), filepath.Join(dir, "xds-server.log")
	p, err := startProcess(k.xdsLog, k.xdsArgs[0], k.xdsArgs[1:]...)
	if err != nil {
		return nil, err
	}
	k.procs = append(k.procs, p)
	k.XDSServers = append(k.XDSServers, &XDSServer{Bin: opts.XDSServerBin, Address: addrs[0], Admin: k.XDSAdmin, proc: p})
	envoyXDS, extprocXDS := addrs[0], addrs[0]
	if opts.XDSSwitch {
		if k.EnvoyXDS, err = StartSwitch(addrs[0]); err != nil {
			return nil, err
		}
		if k.ExtprocXDS, err = StartSwitch(addrs[0]); err != nil {
			return nil, err
		}
		envoyXDS, extprocXDS = k.EnvoyXDS.Addr(), k.ExtprocXDS.Addr()
	}

	// extproc checks with the files Envoy presents and verifies with (xds-server's
	// --proxy-client-cert, --proxy-client-key, --peer-ca) that the apiservers accept the
	// proxy certificate.
	extArgs := []string{"--source", "xds:" + extprocXDS, "--xds-tls-dir", k.ControlPlaneTLS(cptls.RoleExtproc),
		"--listen", "unix:" + sock, "--admin-address", addrs[2],
		"--proxy-client-cert", pki.Path("proxy-client.crt"), "--proxy-client-key", pki.Path("proxy-client.key"), "--peer-ca", pki.Path("server-ca.crt"),
	}
	extArgs = append(extArgs, opts.ExtprocArgs...)
	k.extArgs = append([]string{opts.ExtprocBin}, extArgs...)
	p, err = startProcess(filepath.Join(dir, "extproc.log"), opts.ExtprocBin, extArgs...)
	if err != nil {
		return nil, err
	}
	k.procs = append(k.procs, p)
	if opts.ExtprocUnready {
		if err := waitOK(ctx, k.ExtprocAdmin+"/healthz", 2*time.Minute); err != nil {
			return nil, fmt.Errorf("extproc never served: %w\n%s", err, k.Logs())
		}
	} else if err := waitOK(ctx, k.ExtprocAdmin+"/readyz", 2*time.Minute); err != nil {
		return nil, fmt.Errorf("extproc never became ready (a routing table, and an apiserver that accepts the proxy certificate): %w\n%s", err, k.Logs())
	}

	envoyBin := opts.Envoy
	if envoyBin == "" {
		envoyBin = os.Getenv(EnvoyEnv)
	}
	if envoyBin == "" {
		envoyBin = filepath.Join(opts.BinDir, StandInBinary)
	}
	if opts.EnvoyVersion != "" && !IsStandIn(envoyBin) {
		return nil, fmt.Errorf("EnvoyVersion %s: only the stand-in models an Envoy release; %s is not it", opts.EnvoyVersion, envoyBin)
	}
	logLevel := opts.EnvoyLogLevel
	if logLevel == "" {
		logLevel = "debug"
	}
	k.Envoy, err = startEnvoy(ctx, envoyStart{
		bin: envoyBin, dir: dir, node: opts.Name, local: opts.LocalAPIServer, xds: envoyXDS,
		xdsTLSDir: k.ControlPlaneTLS(envoyRole), logLevel: logLevel, version: opts.EnvoyVersion,
		listener: addrs[3],
	})
	if err != nil {
		return nil, err
	}
	if opts.DataPlaneUnready {
		return k, nil
	}
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := k.Envoy.WaitReady(readyCtx); err != nil {
		rejected, rerr := k.Envoy.Rejected(ctx)
		return nil, fmt.Errorf("Envoy %s: %w (rejected updates: %v %v)\n%s", opts.Name, err, rejected, rerr, k.Logs())
	}
	// Settled: every live apiserver's discovery is in (the merged discovery exists) and the
	// table delay has passed, so extproc decides from it.
	if err := waitMergedDiscovery(readyCtx, k.XDSAdmin+"/debug/topology"); err != nil {
		return nil, fmt.Errorf("xds-server never merged the apiservers' discovery: %w\n%s", err, k.Logs())
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(3 * time.Second): // --routing-table-delay (2s) and then some
	}
	return k, nil
}

// RestartXDSServer stops xds-server (SIGTERM) and starts it again with the same flags, on
// the same addresses (its log appended to), and waits until its admin port answers
// /readyz. Envoy and extproc reconnect by themselves.
func (k *KubeMVP) RestartXDSServer(ctx context.Context) error {
	k.procs[0].stop(15 * time.Second)
	if err := os.Rename(k.xdsLog, k.xdsLog+".1"); err != nil {
		return err
	}
	p, err := startProcess(k.xdsLog, k.xdsArgs[0], k.xdsArgs[1:]...)
	if err != nil {
		return err
	}
	k.procs[0] = p
	return waitOK(ctx, k.XDSAdmin+"/readyz", 2*time.Minute)
}

// Endpoint is the https://host:port where clients reach the apiservers through kube-mvp.
// StopExtproc stops extproc (SIGTERM, then SIGKILL after a second), leaving xds-server and
// the data plane running: what Envoy meets when its extproc crashes.
func (k *KubeMVP) StopExtproc() {
	for _, p := range k.procs {
		if filepath.Base(p.cmd.Path) == "extproc" {
			p.stop(time.Second)
		}
	}
}

func (k *KubeMVP) Endpoint() string {
	return "https://" + k.Envoy.Listener
}

// Logs returns the tail of every process's log.
func (k *KubeMVP) Logs() string {
	var b bytes.Buffer
	for _, p := range k.procs {
		fmt.Fprintf(&b, "--- %s (last 4 KiB) ---\n%s\n", filepath.Base(p.logPath), tail(p.logPath, 4096))
	}
	if k.Envoy != nil {
		fmt.Fprintf(&b, "--- %s (last 8 KiB) ---\n%s\n", filepath.Base(k.Envoy.proc.logPath), tail(k.Envoy.proc.logPath, 8192))
	}
	return b.String()
}

// Close stops Envoy and the processes (SIGTERM, then SIGKILL after 15 s).
func (k *KubeMVP) Close() error {
	var errs []error
	if k.Envoy != nil {
		k.Envoy.Stop()
	}
	for _, p := range k.procs {
		p.stop(15 * time.Second)
	}
	if k.apiBalancer != nil {
		k.apiBalancer.Close()
	}
	for _, s := range []*Switch{k.EnvoyXDS, k.ExtprocXDS} {
		if s != nil {
			s.Close()
		}
	}
	return multierror.Append(&multierror.Error{ErrorFormat: cli.Lines}, errs...).ErrorOrNil()
}

// process is a child that dies with us (Pdeathsig), its output in a log file.
type process struct {
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	exited  chan struct{}
	done    atomic.Bool
}

func startProcess(logPath, bin string, args ...string) (*process, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &process{cmd: cmd, logPath: logPath, logFile: f, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(p.exited) }() //nolint:errcheck // the exit is in the log
	return p, nil
}

func (p *process) stop(grace time.Duration) {
	if p.done.Swap(true) {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited already
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.cmd.Process.Kill() //nolint:errcheck
		<-p.exited
	}
	p.logFile.Close()
}

// tail is the end of a log file, from a line start.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

func waitMergedDiscovery(ctx context.Context, url string) error {
	for {
		var v xds.TopologyView
		res, err := http.Get(url)
		if err == nil {
			err = json.NewDecoder(res.Body).Decode(&v)
			res.Body.Close()
		}
		if err == nil && v.MergedDiscoveryETag != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitOK(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, res.Body) //nolint:errcheck
			res.Body.Close()
			if res.StatusCode == 200 {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, res.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return last
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freeAddrs returns n distinct loopback addresses for the processes this harness starts,
// reserved for the test process's lifetime (testutil.FreePort says why).
func freeAddrs(n int) ([]string, error) {
	var out []string
	for range n {
		port, err := testutil.FreePort()
		if err != nil {
			return nil, err
		}
		out = append(out, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	return out, nil
}

// CPUTime is the CPU time the first running process named name ("xds-server", "extproc")
// has used so far.
func (k *KubeMVP) CPUTime(name string) (time.Duration, error) {
	for _, p := range k.procs {
		if filepath.Base(p.cmd.Path) == name && !p.done.Load() && p.cmd.Process != nil {
			return testutil.ProcessCPU(p.cmd.Process.Pid)
		}
	}
	return 0, fmt.Errorf("no running %s", name)
}

// PeakMemory is the peak resident set (VmHWM, bytes) of the first running process named name
// ("xds-server", "extproc"): what a container's memory limit is set against.
func (k *KubeMVP) PeakMemory(name string) (int64, error) {
	for _, p := range k.procs {
		if filepath.Base(p.cmd.Path) != name || p.done.Load() || p.cmd.Process == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
				return kb << 10, err
			}
		}
		return 0, fmt.Errorf("%s: no VmHWM in /proc/%d/status", name, p.cmd.Process.Pid)
	}
	return 0, fmt.Errorf("no running %s", name)
}
