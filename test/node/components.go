package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// The node's own configuration files. Each is what a kubeadm node would carry, trimmed to
// one node whose network ends on this machine.

// containerdConfig is containerd 1.6's configuration (version 2) for a private instance:
// its own root, state and socket; the CRI plugin with our pause image and the bridge CNI.
func containerdConfig(dir, pauseRef string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
# Only what a Kubernetes node needs: no other snapshotters.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  # This VM withholds CAP_SYS_RESOURCE: runc cannot lower a container's oom_score_adj below
  # containerd's own, and every sandbox fails ("can't get final child's PID from pipe")
  # unless the CRI plugin keeps the score at or above its own. Memory limits still apply.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[6]q
`, filepath.Join(dir, "containerd", "root"), filepath.Join(dir, "containerd", "state"),
		containerdSocket(dir), filepath.Join(dir, "containerd", "ttrpc.sock"), pauseRef, filepath.Join(dir, "cni"))
}

func containerdSocket(dir string) string { return filepath.Join(dir, "containerd", "containerd.sock") }

// cniConfig is the pod network: one bridge in the node's namespace, host-local addresses
// from podCIDR, hairpin on (a pod reaching itself through a Service). The bridge CNI enforces
// no NetworkPolicy.
func cniConfig(dir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "kube-mvp-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, filepath.Join(dir, "cni-ipam"), podCIDR, podGateway)
}

// kubeletConfig is the kubelet's KubeletConfiguration.
func kubeletConfig(dir string, pki *controlplane.PKI) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1, which kubelet 1.35+ refuses unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]q}
authorization:
  mode: Webhook
clusterDNS: [%[4]s]
clusterDomain: cluster.local
resolvConf: %[5]q
failSwapOn: false
# The disk and memory are shared with everything else on the machine: evict only when
# nearly nothing is left, and never collect images (none can be pulled again).
evictionHard: {memory.available: 50Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 40
serializeImagePulls: false
`, containerdSocket(dir), nodeIP, pki.Path("client-ca.crt"), dnsServiceIP, filepath.Join(dir, "resolv.conf"))
}

// kubeProxyConfig is kube-proxy's configuration, iptables mode.
func kubeProxyConfig(kubeconfig, nodeName string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The node's namespace is not the machine: leave the machine's conntrack settings alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  minSyncPeriod: 0s
  syncPeriod: 30s
`, kubeconfig, clusterCIDR, nodeName, nodeIP)
}

// waitFile waits for path to exist (a socket a process creates).
func waitFile(ctx context.Context, p *controlplane.Process, path string, timeout time.Duration) error {
	return controlplane.Poll(ctx, timeout, p, func() error {
		_, err := os.Stat(path)
		return err
	})
}

// flags renders name, value, ... as --name=value flags.
func flags(kv ...string) []string {
	out := make([]string, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, "--"+strings.TrimPrefix(kv[i], "--")+"="+kv[i+1])
	}
	return out
}
