package node

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The node's addresses, all in 198.18.0.0/15 (RFC 2544's benchmarking range): nothing of it is
// routed off this machine, and it collides with no private range a host may use.
const (
	// hostIP and nodeIP are the two ends of the veth pair between the test process's network
	// namespace and the node's: the node's InternalIP, which the apiservers dial for logs and
	// exec.
	hostIP = "198.18.255.1"
	nodeIP = "198.18.255.2"
	// linkPrefix is the veth's /30.
	linkPrefix = 30
	// clusterRange is routed from the test process into the node's namespace.
	clusterRange = "198.18.0.0/15"
	// apiserverIPs are the apiservers' own addresses (on the node's loopback), one per server.
	apiserverBase = "198.18.0." // + 11, 12, ...
	// podCIDR is the node's pod range (the bridge CNI's host-local IPAM); podGateway is the
	// bridge's address.
	podCIDR    = "198.18.128.0/24"
	podGateway = "198.18.128.1"
	// clusterCIDR is every pod range of the cluster (kube-proxy's and the controller-manager's).
	clusterCIDR = "198.18.128.0/17"
	// serviceCIDR is the Services' range; kubernetesServiceIP the first address (the
	// kubernetes Service), dnsServiceIP the cluster DNS.
	serviceCIDR         = "198.19.0.0/24"
	kubernetesServiceIP = "198.19.0.1"
	dnsServiceIP        = "198.19.0.10"
)

// hostLinkName is our end of the veth.
const hostLinkName = "kmvp-node0"

// apiserverIP is the address of the i-th apiserver (0-based).
func apiserverIP(i int) string { return fmt.Sprintf("%s%d", apiserverBase, 11+i) }

// network is the node's network namespace and the veth pair joining it to ours.
type network struct {
	ns, hostLink string
}

// newNetwork creates the node's namespace: the veth to this namespace, the apiservers'
// addresses on its loopback, forwarding and bridge netfilter on (kube-proxy's Service rules
// must see traffic between pods on the bridge), and in this namespace a route to the
// cluster's range through the veth.
func newNetwork(ctx context.Context, name string, apiservers int) (*network, error) {
	n := &network{ns: name, hostLink: hostLinkName}
	steps := [][]string{
		{"netns", "add", n.ns},
		{"link", "add", n.hostLink, "type", "veth", "peer", "name", "eth0", "netns", n.ns},
		{"addr", "add", fmt.Sprintf("%s/%d", hostIP, linkPrefix), "dev", n.hostLink},
		{"link", "set", n.hostLink, "up"},
		{"route", "add", clusterRange, "via", nodeIP, "dev", n.hostLink},
		{"-n", n.ns, "link", "set", "lo", "up"},
		{"-n", n.ns, "addr", "add", fmt.Sprintf("%s/%d", nodeIP, linkPrefix), "dev", "eth0"},
		{"-n", n.ns, "link", "set", "eth0", "up"},
		// The node's default route: through the veth to this namespace, which forwards
		// nothing (the address range ends here); kubelet and kube-proxy want one.
		{"-n", n.ns, "route", "add", "default", "via", hostIP},
	}
	for i := range apiservers {
		steps = append(steps, []string{"-n", n.ns, "addr", "add", apiserverIP(i) + "/32", "dev", "lo"})
	}
	for _, args := range steps {
		if err := run(ctx, "ip", args...); err != nil {
			n.close()
			return nil, err
		}
	}
	for _, kv := range []string{"net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1", "net.ipv4.conf.all.route_localnet=1"} {
		if err := run(ctx, "ip", "netns", "exec", n.ns, "sysctl", "-q", "-w", kv); err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

func (n *network) close() {
	ctx := context.Background()
	run(ctx, "ip", "link", "del", n.hostLink)
	run(ctx, "ip", "netns", "del", n.ns)
}

var execCommand = exec.CommandContext

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// parseIP is net.ParseIP for constants.
func parseIP(s string) net.IP {
	ip := net.ParseIP(s)
	if ip == nil {
		panic("bad IP constant " + s)
	}
	return ip
}

// writeFile writes b to path, creating its directory.
func writeFile(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, mode)
}
