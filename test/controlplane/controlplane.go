package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// ServerSpec describes one kube-apiserver.
type ServerSpec struct {
	// Name is the server's hostname inside its own UTS namespace; the apiserver ID, its identity
	// Lease and its StorageVersion entries all derive from it, so it must differ per server.
	Name string
	// Version is one of Versions.
	Version string
	// RuntimeConfig entries are added to --runtime-config, e.g. "batch/v1=false".
	RuntimeConfig []string
	// PeerProxy turns on upstream's in-process Mixed Version Proxy (--peer-ca-file and the
	// proxy client certificate); off, the feature gate is still on (unless ClusterDefaults) so
	// the identity Lease carries the peer-advertise address. With ClusterDefaults it needs a
	// version whose gate is on by default.
	PeerProxy bool
	// ClusterDefaults starts the server as a real cluster of its version runs it: feature
	// gates and APIs at their defaults (so no StorageVersion API, no
	// internal.apiserver.k8s.io/v1alpha1, and the identity Lease carries a peer-advertise
	// address only where UnknownVersionInteroperabilityProxy is on by default: see
	// DefaultsOf), with only the flags every cluster needs (serving, clients, etcd,
	// front-proxy). Off, the server runs with those gates and that API turned on.
	ClusterDefaults bool
	// IP, when set, is the address the server binds and advertises, on port 6443 (see
	// Options.NetNS): every server of a real cluster has its own address and one port, which
	// the kubernetes Service's endpoints list. Empty: 127.0.0.1 on a free port.
	IP string
	// Args are extra kube-apiserver flags, appended last. A flag given here as --name=value
	// replaces the default flag of that name: kube-apiserver appends the values of a list flag
	// given twice (--requestheader-allowed-names=a then =b allows both), so appending alone
	// could not change such a default.
	Args []string
}

// Options configure a control plane.
type Options struct {
	Servers []ServerSpec
	// Dir holds certificates, data and logs; empty means a new temporary directory, removed by
	// Close.
	Dir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// NetNS, when set, is a network namespace (ip netns) every process runs in: a test node
	// (test/node) puts its whole cluster in one. EtcdIP is then an address of that namespace
	// the test process can reach.
	NetNS  string
	EtcdIP string
	// ServiceCIDR is --service-cluster-ip-range (default 10.96.0.0/24, never routed).
	ServiceCIDR string
	// ServingIPs are added to the apiservers' serving certificate (their IPs and the
	// kubernetes Service's ClusterIP, for clients in pods).
	ServingIPs []net.IP
}

// ControlPlane is a running etcd and its apiservers.
type ControlPlane struct {
	PKI *PKI

	dir       string
	removeDir bool
	opts      Options
	log       io.Writer
	etcd      *Process
	etcdURL   string

	mu      sync.Mutex
	servers map[string]*Server
}

// Server is one running (or stopped) kube-apiserver.
type Server struct {
	Spec ServerSpec
	Port int
	cp   *ControlPlane
	proc *Process
}

// URL is the server's https base URL.
func (s *Server) URL() string { return "https://" + s.Address() }

// Address is host:port, as in its identity Lease's peer-advertise annotation.
func (s *Server) Address() string { return net.JoinHostPort(s.host(), strconv.Itoa(s.Port)) }

func (s *Server) host() string {
	if s.Spec.IP != "" {
		return s.Spec.IP
	}
	return "127.0.0.1"
}

// Running reports whether the process is up.
func (s *Server) Running() bool { return s.proc != nil && !s.proc.exited() }

// CPUTime is the CPU time the running kube-apiserver (its process group) has used so far.
func (s *Server) CPUTime() (time.Duration, error) {
	if !s.Running() {
		return 0, fmt.Errorf("%s is not running", s.Spec.Name)
	}
	return testutil.ProcessGroupCPU(s.proc.cmd.Process.Pid)
}

// RESTConfig returns an admin client config for this server.
func (s *Server) RESTConfig() *rest.Config {
	return &rest.Config{
		Host: s.URL(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   s.cp.PKI.ServerCA.CertPEM,
			CertData: s.cp.PKI.Admin.CertPEM,
			KeyData:  s.cp.PKI.Admin.KeyPEM,
		},
		QPS:   -1, // tests poll; client-side throttling would only slow them
		Burst: -1,
	}
}

// Client returns an admin clientset for this server.
func (s *Server) Client() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(s.RESTConfig())
}

// Start builds what is missing, then starts etcd and every server, and waits until each is
// ready to serve writes. On error everything started is stopped again.
func Start(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	if len(opts.Servers) == 0 {
		return nil, errors.New("controlplane: no servers")
	}
	seen := map[string]bool{}
	for _, s := range opts.Servers {
		if s.Name == "" || seen[s.Name] {
			return nil, fmt.Errorf("controlplane: server names must be set and unique, got %q", s.Name)
		}
		seen[s.Name] = true
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = "10.96.0.0/24"
	}
	if opts.EtcdIP == "" {
		opts.EtcdIP = "127.0.0.1"
	}
	cp = &ControlPlane{dir: opts.Dir, log: opts.Log, opts: opts, servers: map[string]*Server{}}
	started := cp // "return nil, err" clears cp before the deferred clean-up runs
	if cp.log == nil {
		cp.log = io.Discard
	}
	if cp.dir == "" {
		if cp.dir, err = os.MkdirTemp("", "kube-mvp-cp-"); err != nil {
			return nil, err
		}
		cp.removeDir = true
	}
	defer func() {
		if err != nil {
			started.Close()
			cp = nil
		}
	}()
	if cp.PKI, err = NewPKI(cp.dir, opts.ServingIPs...); err != nil {
		return nil, err
	}
	versions := map[string]Binaries{}
	for _, s := range opts.Servers {
		if _, ok := versions[s.Version]; !ok {
			if versions[s.Version], err = EnsureBinaries(ctx, s.Version, cp.log); err != nil {
				return nil, err
			}
		}
	}
	// etcd's version is pinned by the newest release in use; all releases here share etcd 3.6+.
	newest := slices.MaxFunc(opts.Servers, func(a, b ServerSpec) int { return strings.Compare(a.Version, b.Version) }).Version
	if err = cp.startEtcd(ctx, versions[newest].Etcd); err != nil {
		return nil, err
	}
	for _, spec := range opts.Servers {
		s := &Server{Spec: spec, cp: cp}
		cp.servers[spec.Name] = s
		if err = s.start(ctx, versions[spec.Version]); err != nil {
			return nil, err
		}
	}
	for _, s := range cp.servers {
		if err = s.WaitReady(ctx); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// Server returns the named server.
func (cp *ControlPlane) Server(name string) *Server {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.servers[name]
}

// Dir is the directory with certificates, data and logs.
func (cp *ControlPlane) Dir() string { return cp.dir }

// Addresses are the host:port of every apiserver (running or not), sorted by name.
func (cp *ControlPlane) Addresses() []string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	names := make([]string, 0, len(cp.servers))
	for name := range cp.servers {
		names = append(names, name)
	}
	slices.Sort(names)
	addrs := make([]string, len(names))
	for i, name := range names {
		addrs[i] = cp.servers[name].Address()
	}
	return addrs
}

// WriteKubeconfigFor writes a kubeconfig (admin credentials) for one server URL, e.g. a
// balancer in front of the apiservers, to path.
func (cp *ControlPlane) WriteKubeconfigFor(path, server string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.PKI.Admin.CertPEM, ClientKeyData: cp.PKI.Admin.KeyPEM}
	cfg.Clusters["default"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cp.PKI.ServerCA.CertPEM}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "admin"}
	cfg.CurrentContext = "default"
	return clientcmd.WriteToFile(*cfg, path)
}

// Close stops every process and removes the temporary directory. It is safe to call twice.
func (cp *ControlPlane) Close() {
	cp.mu.Lock()
	servers := cp.servers
	cp.servers = map[string]*Server{}
	cp.mu.Unlock()
	for _, s := range servers {
		s.proc.Kill()
	}
	cp.etcd.Kill()
	if cp.removeDir {
		os.RemoveAll(cp.dir)
	}
}

// Stop ends server name gracefully (SIGTERM), as a rolling upgrade would.
func (cp *ControlPlane) Stop(name string) error {
	return cp.Server(name).proc.Terminate(stopGrace)
}

// stopGrace is how long a stopping apiserver may take. With watches open it drains them for
// up to its shutdown timeout (60 s by default) before it exits.
const stopGrace = 90 * time.Second

// Kill ends server name at once (SIGKILL): its Lease is left to expire.
func (cp *ControlPlane) Kill(name string) { cp.Server(name).proc.Kill() }

// Freeze stops server name where it is (SIGSTOP): its connections stay open, the kernel
// still acknowledging them, but nothing answers, as with a hung or partitioned apiserver;
// its Lease goes stale after the liveness window. Thaw resumes it.
func (cp *ControlPlane) Freeze(name string) error {
	return cp.Server(name).proc.signal(syscall.SIGSTOP)
}

// Thaw resumes a frozen server (SIGCONT).
func (cp *ControlPlane) Thaw(name string) error { return cp.Server(name).proc.signal(syscall.SIGCONT) }

// Restart stops server name if it runs and starts it again with version (empty: the same),
// on the same port and hostname, and waits until it is ready.
func (cp *ControlPlane) Restart(ctx context.Context, name, version string) error {
	s := cp.Server(name)
	if s == nil {
		return fmt.Errorf("no server %q", name)
	}
	if s.Running() {
		if err := s.proc.Terminate(stopGrace); err != nil {
			return err
		}
	}
	if version != "" {
		s.Spec.Version = version
	}
	bins, err := EnsureBinaries(ctx, s.Spec.Version, cp.log)
	if err != nil {
		return err
	}
	if err := s.start(ctx, bins); err != nil {
		return err
	}
	return s.WaitReady(ctx)
}

func (cp *ControlPlane) startEtcd(ctx context.Context, bin string) error {
	client, peer := freePort(), freePort()
	if client == 0 || peer == 0 {
		return errors.New("no free port for etcd")
	}
	cp.etcdURL = "http://" + net.JoinHostPort(cp.opts.EtcdIP, strconv.Itoa(client))
	peerURL := "http://" + net.JoinHostPort(cp.opts.EtcdIP, strconv.Itoa(peer))
	var err error
	cp.etcd, err = StartProcess(filepath.Join(cp.dir, "etcd.log"), nil, cp.opts.NetNS, bin,
		"--name=kube-mvp-test",
		"--data-dir="+filepath.Join(cp.dir, "etcd-data"),
		"--listen-client-urls="+cp.etcdURL, "--advertise-client-urls="+cp.etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kube-mvp-test="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn",
	)
	if err != nil {
		return err
	}
	fmt.Fprintf(cp.log, "etcd: listening on %s\n", cp.etcdURL)
	err = Poll(ctx, 30*time.Second, cp.etcd, func() error {
		resp, err := http.Get(cp.etcdURL + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("etcd: %w\n%s", err, cp.etcd.LogTail())
	}
	return nil
}

func (s *Server) start(ctx context.Context, bins Binaries) error {
	if s.Port == 0 && s.Spec.IP != "" {
		s.Port = 6443
	}
	if s.Port == 0 {
		if s.Port = freePort(); s.Port == 0 {
			return errors.New("no free port for kube-apiserver")
		}
	}
	args, err := s.args()
	if err != nil {
		return err
	}
	// Each apiserver gets its own UTS namespace so it sees its own hostname: the apiserver ID
	// is a hash of the hostname, and two servers with one ID would share a Lease.
	wrapper := []string{"--uts", "--", "/bin/sh", "-c", `hostname "$0" && exec "$@"`, s.Spec.Name, bins.KubeAPIServer}
	proc, err := StartProcess(filepath.Join(s.cp.dir, s.Spec.Name+".log"), nil, s.cp.opts.NetNS, "unshare", append(wrapper, args...)...)
	if err != nil {
		return err
	}
	s.proc = proc
	setting := "test gates"
	if s.Spec.ClusterDefaults {
		setting = "cluster defaults"
	}
	fmt.Fprintf(s.cp.log, "kube-apiserver %s (%s, %s): starting on %s\n", s.Spec.Name, s.Spec.Version, setting, s.URL())
	return nil
}

// args are the server's kube-apiserver flags.
func (s *Server) args() ([]string, error) {
	p := s.cp.PKI
	defaults, err := DefaultsOf(s.Spec.Version)
	if err != nil {
		return nil, err
	}
	if s.Spec.ClusterDefaults && s.Spec.PeerProxy && !defaults.PeerAdvertiseAddress {
		return nil, fmt.Errorf("kube-apiserver %s: upstream's peer proxy needs UnknownVersionInteroperabilityProxy, off by default in %s", s.Spec.Name, s.Spec.Version)
	}
	runtimeConfig := s.Spec.RuntimeConfig
	if !s.Spec.ClusterDefaults {
		runtimeConfig = append([]string{"internal.apiserver.k8s.io/v1alpha1=true"}, runtimeConfig...)
	}
	// With an address of its own, each server lists itself in the kubernetes Service's
	// endpoints, as in a real cluster; on loopback there is nothing a pod could reach.
	reconciler := "none"
	if s.Spec.IP != "" {
		reconciler = "lease"
	}
	args := []string{
		"--etcd-servers=" + s.cp.etcdURL,
		"--bind-address=" + s.host(),
		"--advertise-address=" + s.host(),
		"--secure-port=" + strconv.Itoa(s.Port),
		"--tls-cert-file=" + p.Path("serving.crt"),
		"--tls-private-key-file=" + p.Path("serving.key"),
		"--client-ca-file=" + p.Path("client-ca.crt"),
		"--requestheader-client-ca-file=" + p.Path("front-proxy-ca.crt"),
		"--requestheader-allowed-names=" + ProxyClientCN,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.Path("proxy-client.crt"),
		"--proxy-client-key-file=" + p.Path("proxy-client.key"),
		"--service-account-key-file=" + p.Path("sa.pub"),
		"--service-account-signing-key-file=" + p.Path("sa.key"),
		"--service-account-issuer=https://" + UpstreamServerName,
		"--service-cluster-ip-range=" + s.cp.opts.ServiceCIDR,
		"--authorization-mode=RBAC",
		"--endpoint-reconciler-type=" + reconciler,
		"--profiling=false",
		"--cert-dir=" + filepath.Join(s.cp.dir, s.Spec.Name+"-certs"),
	}
	if !s.Spec.ClusterDefaults {
		args = append(args, "--feature-gates=StorageVersionAPI=true,APIServerIdentity=true,UnknownVersionInteroperabilityProxy=true")
	}
	if len(runtimeConfig) > 0 {
		args = append(args, "--runtime-config="+strings.Join(runtimeConfig, ","))
	}
	if s.Spec.PeerProxy {
		args = append(args, "--peer-ca-file="+p.Path("server-ca.crt"))
	}
	return withOverrides(args, s.Spec.Args), nil
}

// withOverrides is args without the flags extra gives, followed by extra.
func withOverrides(args, extra []string) []string {
	name := func(a string) string {
		n, _, _ := strings.Cut(a, "=")
		return n
	}
	given := map[string]bool{}
	for _, a := range extra {
		if strings.HasPrefix(a, "--") {
			given[name(a)] = true
		}
	}
	out := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return given[name(a)] })
	return append(out, extra...)
}

// WaitReady waits until /readyz is ok and writes are accepted: with StorageVersionAPI on, an
// apiserver rejects writes until it has published its storage versions.
func (s *Server) WaitReady(ctx context.Context) error {
	client, err := s.Client()
	if err != nil {
		return err
	}
	start := time.Now()
	err = Poll(ctx, 90*time.Second, s.proc, func() error {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w: %s", err, firstLine(body))
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "kube-mvp-write-probe-"}}
		_, err = client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver %s: %w\n%s", s.Spec.Name, err, s.proc.LogTail())
	}
	fmt.Fprintf(s.cp.log, "kube-apiserver %s (%s): ready in %s\n", s.Spec.Name, s.Spec.Version, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// HTTPClient returns an admin HTTP client that trusts the servers.
func (cp *ControlPlane) HTTPClient() (*http.Client, error) {
	cert, err := cp.PKI.Admin.TLS()
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.PKI.ServerCA.CertPEM)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}, nil
}

// WriteKubeconfig writes a kubeconfig with one context per server and returns its path.
func (cp *ControlPlane) WriteKubeconfig() (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.PKI.Admin.CertPEM, ClientKeyData: cp.PKI.Admin.KeyPEM}
	cp.mu.Lock()
	names := make([]string, 0, len(cp.servers))
	for name, s := range cp.servers {
		names = append(names, name)
		cfg.Clusters[name] = &clientcmdapi.Cluster{Server: s.URL(), CertificateAuthorityData: cp.PKI.ServerCA.CertPEM}
		cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: "admin"}
	}
	cp.mu.Unlock()
	slices.Sort(names)
	cfg.CurrentContext = names[0]
	path := filepath.Join(cp.dir, "kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

// Process is a child process whose output goes to a log file.
type Process struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
}

// StartProcess starts bin with args (in network namespace netns of /run/netns, if set), its
// output appended to logPath, killed if the test process dies. It enters only the network
// namespace (nsenter): `ip netns exec` would also remount /sys, hiding the cgroup mounts the
// kubelet needs.
func StartProcess(logPath string, env []string, netns, bin string, args ...string) (*Process, error) {
	if netns != "" {
		args = append([]string{"--net=/run/netns/" + netns, "--", bin}, args...)
		bin = "nsenter"
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so a kill reaches everything it started; and killed with us, so
	// a test binary that dies leaves nothing behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &Process{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill ends the process group at once and waits for it.
func (p *Process) Kill() {
	if p == nil || p.exited() {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// signal sends sig to the process's group.
func (p *Process) signal(sig syscall.Signal) error {
	if p == nil || p.exited() {
		return fmt.Errorf("process not running")
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Terminate sends SIGTERM to the process group and waits up to grace before killing it.
func (p *Process) Terminate(grace time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("process %d did not stop within %s; killed", p.cmd.Process.Pid, grace)
	}
}

// LogTail is the end of the process's log, for error messages.
func (p *Process) LogTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Sprintf("--- last lines of %s ---\n%s", p.logPath, b)
}

// Poll calls check until it succeeds, p exits, or the timeout passes.
func Poll(ctx context.Context, timeout time.Duration, p *Process, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("process exited (%v); last check: %w", p.cmd.ProcessState, last)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %w", timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// freePort is a port for etcd or an apiserver, reserved for the test process's lifetime
// (testutil.FreePort says why); 0 when there is none.
func freePort() int {
	port, err := testutil.FreePort()
	if err != nil {
		return 0
	}
	return port
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return string(line)
}
