// Package node runs a real one-node Kubernetes cluster for tests, on this machine: etcd and
// kube-apiservers (test/controlplane), kube-controller-manager, kube-scheduler, a kubelet on
// containerd and runc, kube-proxy (iptables) and cluster DNS (CoreDNS), all built from Go
// modules or Debian's packages; every image a pod runs is built here, since no registry is
// reachable.
//
// The node lives in a network namespace of its own, joined to the test process by a veth
// pair, with every address in 198.18.0.0/15: the apiservers each have their own address on one
// port (6443), pods get 198.18.128.0/24 from the bridge CNI, Services 198.19.0.0/24. The test
// process reaches all of them through the veth; nothing is routed off the machine.
//
// One node runs at a time on a machine (a file lock): it uses fixed paths, the machine's
// cgroups and containerd's shim directory. Start clears what a killed run left behind.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/node/images"
)

// Fixed places: one node per machine.
const (
	baseDir   = "/var/tmp/kube-mvp-node"
	lockPath  = "/var/tmp/kube-mvp-node.lock"
	netnsName = "kube-mvp-node"
)

// Options configure a node.
type Options struct {
	// Servers are the apiservers; each gets its own address (198.18.0.11, .12, ...) on port
	// 6443. Their IP is set by Start.
	Servers []controlplane.ServerSpec
	// NodeName is the node's name; default: the first server's name, so the node is that
	// apiserver's host (sidecar mode names the local apiserver by the node name).
	NodeName string
	// ControlPlane labels the node as kubeadm does a control-plane node
	// (node-role.kubernetes.io/control-plane). It is not tainted: on a one-node cluster, as
	// kubeadm's documentation says to do, the control-plane taint is removed so that other
	// workloads (here xds-server and certgen) can run.
	ControlPlane bool
	// Images are `docker load`-style tarballs imported into the node's containerd besides
	// the node's own (pause, CoreDNS).
	Images []string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Node is a running one-node cluster.
type Node struct {
	CP *controlplane.ControlPlane
	// Name is the node's name.
	Name string
	// Dir holds the node's files: kubeconfig, logs, containerd's and the kubelet's state.
	Dir string
	// Kubeconfig is an admin kubeconfig for the first apiserver.
	Kubeconfig string
	// NetNS is the node's network namespace (ip netns): hostNetwork pods share it.
	NetNS string

	log        io.Writer
	net        *network
	first      string                  // the first apiserver's name
	procs      []*controlplane.Process // in start order
	containerd *controlplane.Process
	cleanups   []func() // run by Close, last first
	unlock     func()
}

// IP is the node's InternalIP.
func (n *Node) IP() string { return nodeIP }

// Prerequisites names what the machine must have, with the Debian package that brings it.
var Prerequisites = map[string]string{
	"containerd":              "containerd",
	"ctr":                     "containerd",
	"runc":                    "runc",
	"ip":                      "iproute2",
	"iptables":                "iptables",
	"conntrack":               "conntrack",
	"unshare":                 "util-linux",
	"nsenter":                 "util-linux",
	"/usr/lib/cni/bridge":     "containernetworking-plugins",
	"/usr/lib/cni/host-local": "containernetworking-plugins",
	"/usr/lib/cni/loopback":   "containernetworking-plugins",
	"/usr/lib/cni/portmap":    "containernetworking-plugins",
}

// Missing reports what the machine lacks to run a node (nil if nothing): root, and each
// Prerequisites entry.
func Missing() error {
	var missing []string
	pkgs := map[string]bool{}
	for what, pkg := range Prerequisites {
		var err error
		if strings.HasPrefix(what, "/") {
			_, err = os.Stat(what)
		} else {
			_, err = exec.LookPath(what)
		}
		if err != nil {
			missing = append(missing, what)
			pkgs[pkg] = true
		}
	}
	var errs []string
	if os.Geteuid() != 0 {
		errs = append(errs, "a node needs root (network namespaces, mounts, cgroups)")
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		names := make([]string, 0, len(pkgs))
		for p := range pkgs {
			names = append(names, p)
		}
		slices.Sort(names)
		errs = append(errs, fmt.Sprintf("missing %s: apt-get install %s", strings.Join(missing, ", "), strings.Join(names, " ")))
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// Start builds what is missing and starts the node; it returns once the node is Ready and
// cluster DNS answers. On error everything started is stopped again.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	if err := Missing(); err != nil {
		return nil, err
	}
	if len(opts.Servers) == 0 {
		return nil, errors.New("node: no apiservers")
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	unlock, err := lock(ctx, log)
	if err != nil {
		return nil, err
	}
	n = &Node{Dir: filepath.Join(baseDir, "run"), NetNS: netnsName, log: log, unlock: unlock}
	started := n
	defer func() {
		if err != nil {
			started.Close()
			n = nil
		}
	}()
	clearLeftovers(ctx, log)
	if err = os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, err
	}
	n.Name = opts.NodeName
	if n.Name == "" {
		n.Name = opts.Servers[0].Name
	}

	bins, err := controlplane.EnsureNodeBinaries(ctx, log)
	if err != nil {
		return nil, err
	}
	if n.net, err = newNetwork(ctx, netnsName, len(opts.Servers)); err != nil {
		return nil, err
	}

	// The control plane, inside the node's namespace.
	servers := slices.Clone(opts.Servers)
	servingIPs := []net.IP{parseIP(kubernetesServiceIP), parseIP(nodeIP)}
	for i := range servers {
		servers[i].IP = apiserverIP(i)
		servingIPs = append(servingIPs, parseIP(servers[i].IP))
		// The apiserver reaches the kubelet (logs, exec, port-forward) at its InternalIP,
		// presenting the admin certificate, which the kubelet's webhook authorizes.
		servers[i].Args = append(slices.Clone(servers[i].Args),
			"--kubelet-preferred-address-types=InternalIP",
			"--kubelet-client-certificate="+filepath.Join(n.Dir, "pki", "admin.crt"),
			"--kubelet-client-key="+filepath.Join(n.Dir, "pki", "admin.key"),
		)
	}
	if err = os.MkdirAll(filepath.Join(n.Dir, "pki"), 0o700); err != nil {
		return nil, err
	}
	n.CP, err = controlplane.Start(ctx, controlplane.Options{
		Servers: servers, Dir: filepath.Join(n.Dir, "pki"), Log: log,
		NetNS: netnsName, EtcdIP: nodeIP, ServiceCIDR: serviceCIDR, ServingIPs: servingIPs,
	})
	if err != nil {
		return nil, err
	}
	n.Kubeconfig = filepath.Join(n.Dir, "admin.kubeconfig")
	if err = n.CP.WriteKubeconfigFor(n.Kubeconfig, n.CP.Server(servers[0].Name).URL()); err != nil {
		return nil, err
	}

	// containerd with the images.
	pause, err := images.Pause(ctx, log)
	if err != nil {
		return nil, err
	}
	for path, content := range map[string]string{
		filepath.Join(n.Dir, "containerd.toml"):           containerdConfig(n.Dir, pause.Ref),
		filepath.Join(n.Dir, "cni", "10-bridge.conflist"): cniConfig(n.Dir),
		filepath.Join(n.Dir, "kubelet.yaml"):              kubeletConfig(n.Dir, n.CP.PKI),
		filepath.Join(n.Dir, "kube-proxy.yaml"):           kubeProxyConfig(n.Kubeconfig, n.Name),
		filepath.Join(n.Dir, "resolv.conf"):               "# The node's network ends on this machine: no upstream resolver.\n",
	} {
		if err = writeFile(path, []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	n.first = servers[0].Name
	containerd, err := n.start("containerd", "containerd", "--config", filepath.Join(n.Dir, "containerd.toml"))
	if err != nil {
		return nil, err
	}
	n.containerd = containerd
	if err = waitFile(ctx, containerd, containerdSocket(n.Dir), 30*time.Second); err != nil {
		return nil, fmt.Errorf("containerd: %w\n%s", err, containerd.LogTail())
	}
	dns, err := images.CoreDNS(ctx, log)
	if err != nil {
		return nil, err
	}
	for _, tarball := range append([]string{pause.Tarball, dns.Tarball}, opts.Images...) {
		if err = n.ImportImage(ctx, tarball); err != nil {
			return nil, err
		}
	}

	// The controllers, the scheduler, kube-proxy and the kubelet.
	if _, err = n.start("kube-controller-manager", bins.KubeControllerManager, flags(
		"kubeconfig", n.Kubeconfig,
		"authentication-kubeconfig", n.Kubeconfig, "authorization-kubeconfig", n.Kubeconfig,
		"bind-address", "127.0.0.1", "secure-port", "10257",
		"leader-elect", "false",
		"service-account-private-key-file", n.CP.PKI.Path("sa.key"),
		"root-ca-file", n.CP.PKI.Path("server-ca.crt"),
		"cluster-cidr", clusterCIDR, "service-cluster-ip-range", serviceCIDR,
		"use-service-account-credentials", "true",
		"controllers", "*,-nodeipam",
		"cluster-name", "kube-mvp-node",
	)...); err != nil {
		return nil, err
	}
	if _, err = n.start("kube-scheduler", bins.KubeScheduler, flags(
		"kubeconfig", n.Kubeconfig,
		"authentication-kubeconfig", n.Kubeconfig, "authorization-kubeconfig", n.Kubeconfig,
		"bind-address", "127.0.0.1", "secure-port", "10259",
		"leader-elect", "false",
	)...); err != nil {
		return nil, err
	}
	if _, err = n.start("kube-proxy", bins.KubeProxy, "--config="+filepath.Join(n.Dir, "kube-proxy.yaml")); err != nil {
		return nil, err
	}
	kubelet, err := n.start("kubelet", bins.Kubelet, flags(
		"config", filepath.Join(n.Dir, "kubelet.yaml"),
		"kubeconfig", n.Kubeconfig,
		"root-dir", filepath.Join(n.Dir, "kubelet"),
		"cert-dir", filepath.Join(n.Dir, "kubelet-pki"),
		"node-ip", nodeIP,
		"hostname-override", n.Name,
		"v", "1",
	)...)
	if err != nil {
		return nil, err
	}
	if err = n.waitReady(ctx, kubelet, opts.ControlPlane); err != nil {
		return nil, err
	}
	if err = n.deployDNS(ctx, dns.Ref); err != nil {
		return nil, err
	}
	return n, nil
}

// start runs one of the node's processes inside its namespace, logging to <name>.log.
func (n *Node) start(name, bin string, args ...string) (*controlplane.Process, error) {
	p, err := controlplane.StartProcess(filepath.Join(n.Dir, name+".log"), nil, n.NetNS, bin, args...)
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, p)
	fmt.Fprintf(n.log, "node: %s started\n", name)
	return p, nil
}

// ImportImage imports a tarball into the node's containerd, where the kubelet finds it.
func (n *Node) ImportImage(ctx context.Context, tarball string) error {
	out, err := n.Ctr(ctx, "images", "import", "--no-unpack=false", tarball)
	if err != nil {
		return fmt.Errorf("importing %s: %w: %s", tarball, err, out)
	}
	return nil
}

// Ctr runs ctr against the node's containerd, in the kubelet's namespace.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", containerdSocket(n.Dir), "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// RESTConfig is an admin client config for the first apiserver.
func (n *Node) RESTConfig() *rest.Config {
	return n.CP.Server(n.first).RESTConfig()
}

// Client is an admin clientset.
func (n *Node) Client() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(n.RESTConfig())
}

// waitReady waits for the node to register and become Ready, then labels it as kubeadm
// would a control-plane node if asked.
func (n *Node) waitReady(ctx context.Context, kubelet *controlplane.Process, controlPlane bool) error {
	client, err := n.Client()
	if err != nil {
		return err
	}
	start := time.Now()
	err = controlplane.Poll(ctx, 3*time.Minute, kubelet, func() error {
		node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s not ready: %s: %s", n.Name, c.Reason, c.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", n.Name)
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, kubelet.LogTail())
	}
	fmt.Fprintf(n.log, "node: %s Ready in %s\n", n.Name, time.Since(start).Round(time.Second))
	node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if controlPlane {
		node.Labels["node-role.kubernetes.io/control-plane"] = ""
	}
	_, err = client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	return err
}

// Close stops everything, the pods first, and removes the node's namespace and files.
func (n *Node) Close() {
	if n == nil {
		return
	}
	for i := len(n.procs) - 1; i >= 0; i-- { // the kubelet first, containerd last
		if n.procs[i] == n.containerd {
			killPods(n.log)
		}
		n.procs[i].Kill()
	}
	if n.CP != nil {
		n.CP.Close()
	}
	for i := len(n.cleanups) - 1; i >= 0; i-- {
		n.cleanups[i]()
	}
	clearLeftovers(context.Background(), n.log)
	if n.unlock != nil {
		n.unlock()
	}
}
