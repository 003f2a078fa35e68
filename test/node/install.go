package node

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/node/images"
)

// The release as the README installs it.
const (
	Release   = "kube-mvp"
	Namespace = "kube-mvp"
	// TestRegistry names the product images built for the node (make images REGISTRY=...).
	TestRegistry = "kube-mvp.test"
	// SidecarPort is where sidecar Envoys listen on the node (the chart's sidecar.listenPort).
	SidecarPort = 6444
)

// DefaultServers are the node's apiservers: two releases, the older without batch/v1, as
// during an upgrade that moved an API; both as real clusters run them (feature gates and
// APIs at their defaults).
var DefaultServers = []controlplane.ServerSpec{
	{Name: "cp-a", Version: "v1.37.1", ClusterDefaults: true},
	{Name: "cp-b", Version: "v1.36.4", ClusterDefaults: true, RuntimeConfig: []string{"batch/v1=false"}},
}

// Installed is kube-mvp installed on a node by Helm.
type Installed struct {
	Mode string // front or sidecar
	// Endpoint is kube-mvp's host:port for clients: the Service's ClusterIP (front) or the
	// node's address (sidecar).
	Endpoint string
	// ServerName is the name kube-mvp's serving certificate is checked for.
	ServerName string
	// Helm is the helm binary used.
	Helm string
	// Dir holds the files given to helm (certificates).
	Dir string
}

// BuildImages builds what a node running kube-mvp needs besides its own images: the
// product's images (make images, this machine's architecture), the stand-in for Envoy and
// the workload image. It returns the tarballs to import and the workload image's reference.
func BuildImages(ctx context.Context, dir string, log io.Writer) (tarballs []string, workload string, err error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, "", err
	}
	out := filepath.Join(dir, "images")
	fmt.Fprintln(log, "node: building the product's images (make images)")
	cmd := exec.CommandContext(ctx, "go", "run", "./tools/images", "-registry", TestRegistry, "-arch", runtime.GOARCH, "-out", out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("make images: %w\n%s", err, b)
	}
	_, envoyTar, err := envoyImage(ctx, log)
	if err != nil {
		return nil, "", err
	}
	busybox, err := images.Busybox(ctx, log)
	if err != nil {
		return nil, "", err
	}
	return []string{filepath.Join(out, "xds-server-"+runtime.GOARCH+".tar"), filepath.Join(out, "extproc-"+runtime.GOARCH+".tar"), envoyTar, busybox.Tarball}, busybox.Ref, nil
}

// InstallOptions say how to install kube-mvp.
type InstallOptions struct {
	// Mode is the chart's mode: front (default) or sidecar.
	Mode string
	// KubeadmPKI: sidecar Envoys present the node's own kubeadm front-proxy client pair
	// (sidecar.kubeadmFrontProxyClient), which the node then carries in /etc/kubernetes/pki
	// with kubeadm's owners and modes; the chart gets no proxy pair.
	KubeadmPKI bool
	// Extra are more helm arguments.
	Extra []string
	// ChartDir is the chart to install; empty: this checkout's deploy/kube-mvp. (An older
	// commit's chart, for an upgrade from it: pass only values that chart knows in Extra.)
	ChartDir string
	// ImageTag is the tag of the xds-server and extproc images (kube-mvp.test/...); empty:
	// the chart's default, its appVersion, which BuildImages builds.
	ImageTag string
}

// Install runs `helm install` as the README says, with the certificates an operator would
// bring (made from the node's PKI) and the images built here, and waits until every workload
// is ready.
func (n *Node) Install(ctx context.Context, opts InstallOptions) (*Installed, error) {
	mode := opts.Mode
	if mode == "" {
		mode = "front"
	}
	helm, err := images.Helm(ctx, n.log)
	if err != nil {
		return nil, err
	}
	envoyRef, _, err := envoyImage(ctx, n.log)
	if err != nil {
		return nil, err
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	in := &Installed{Mode: mode, Helm: helm, Dir: filepath.Join(n.Dir, "install"), ServerName: Release + "-envoy." + Namespace + ".svc"}
	// A serving certificate for the names clients use, and the cluster's client CA,
	// front-proxy pair and the CA of the apiservers' serving certificates.
	pki := n.CP.PKI
	serving, err := pki.ServerCA.Issue(pkix.Name{CommonName: "kube-mvp"}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		[]string{in.ServerName, in.ServerName + ".cluster.local"}, []net.IP{net.ParseIP(nodeIP)})
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"tls.crt": serving.CertPEM, "tls.key": serving.KeyPEM,
		"client-ca.crt":          pki.ClientCA.CertPEM,
		"front-proxy-client.crt": pki.ProxyClient.CertPEM, "front-proxy-client.key": pki.ProxyClient.KeyPEM,
		"apiserver-ca.crt": pki.ServerCA.CertPEM,
	}
	proxyPair := []string{
		"--set-file", "certificates.proxyClientCert=front-proxy-client.crt",
		"--set-file", "certificates.proxyClientKey=front-proxy-client.key",
	}
	if opts.KubeadmPKI {
		if mode != "sidecar" {
			return nil, errors.New("node: the kubeadm front-proxy pair is for sidecar mode")
		}
		if err := n.writeKubeadmPKI(); err != nil {
			return nil, err
		}
		proxyPair = []string{"--set", "sidecar.kubeadmFrontProxyClient=true"}
	}
	for name, b := range files {
		if err := writeFile(filepath.Join(in.Dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	envoyRepo, envoyTag, _ := strings.Cut(envoyRef, ":")
	chart := opts.ChartDir
	if chart == "" {
		chart = filepath.Join(root, "deploy", "kube-mvp")
	}
	args := []string{"install", Release, chart,
		"--namespace", Namespace, "--create-namespace", "--kubeconfig", n.Kubeconfig,
		"--set-file", "certificates.servingCert=tls.crt", "--set-file", "certificates.servingKey=tls.key",
		"--set-file", "certificates.clientCA=client-ca.crt",
		"--set-file", "certificates.peerCA=apiserver-ca.crt",
		// The images built here: make images, and the tests' stand-in for Envoy.
		"--set", "image.xdsServer.repository=" + TestRegistry + "/xds-server",
		"--set", "image.extproc.repository=" + TestRegistry + "/extproc",
		"--set", "image.envoy.repository=" + envoyRepo, "--set", "image.envoy.tag=" + envoyTag,
		"--set", "mode=" + mode,
	}
	if opts.ImageTag != "" {
		args = append(args, "--set", "image.xdsServer.tag="+opts.ImageTag, "--set", "image.extproc.tag="+opts.ImageTag)
	}
	args = append(args, proxyPair...)
	if mode == "sidecar" {
		// hostNetwork Envoys dial xds-server from the node's address.
		args = append(args, "--set", "networkPolicy.xdsFrom[0].ipBlock.cidr="+nodeIP+"/32")
	}
	args = append(args, opts.Extra...)
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Dir = in.Dir
	out, err := cmd.CombinedOutput()
	fmt.Fprintf(n.log, "node: helm install (%s mode):\n%s", mode, out)
	if err != nil {
		return nil, fmt.Errorf("helm install: %w", err)
	}
	client, err := n.Client()
	if err != nil {
		return nil, err
	}
	switch mode {
	case "sidecar":
		in.Endpoint = net.JoinHostPort(nodeIP, fmt.Sprint(SidecarPort))
	default:
		svc, err := client.CoreV1().Services(Namespace).Get(ctx, Release+"-envoy", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		in.Endpoint = net.JoinHostPort(svc.Spec.ClusterIP, "443")
	}
	if err := n.WaitWorkloads(ctx, Namespace, 4*time.Minute); err != nil {
		return nil, err
	}
	// Ready pods are not yet a reachable Service: kube-proxy programs the ClusterIP once the
	// EndpointSlice lists them (a loaded CI machine once timed out the first dial).
	return in, waitReachable(ctx, in.Endpoint, 2*time.Minute)
}

// waitReachable waits until a TCP connection to endpoint is accepted.
func waitReachable(ctx context.Context, endpoint string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", endpoint)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-mvp's endpoint %s not reachable after %v: %w", endpoint, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// WaitWorkloads waits until every Deployment and DaemonSet of namespace is ready.
func (n *Node) WaitWorkloads(ctx context.Context, ns string, timeout time.Duration) error {
	client, err := n.Client()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		var pending []string
		deps, err := client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, d := range deps.Items {
			if d.Status.ReadyReplicas != *d.Spec.Replicas || d.Status.UpdatedReplicas != *d.Spec.Replicas {
				pending = append(pending, fmt.Sprintf("deployment %s %d/%d ready", d.Name, d.Status.ReadyReplicas, *d.Spec.Replicas))
			}
		}
		dss, err := client.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, d := range dss.Items {
			if d.Status.DesiredNumberScheduled == 0 || d.Status.NumberReady != d.Status.DesiredNumberScheduled {
				pending = append(pending, fmt.Sprintf("daemonset %s %d/%d ready", d.Name, d.Status.NumberReady, d.Status.DesiredNumberScheduled))
			}
		}
		if len(deps.Items)+len(dss.Items) > 0 && len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %s\n%s", timeout, strings.Join(pending, ", "), n.PodReport(ctx, ns))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// kubeadmPKI is where kubeadm keeps a control-plane node's certificates.
const kubeadmPKI = "/etc/kubernetes/pki"

// writeKubeadmPKI writes the front-proxy client pair where kubeadm does, with kubeadm's
// owners and modes (root:root, certificate 0644, key 0600), in this machine's own
// /etc/kubernetes/pki: the node shares the machine's file system, as a kubeadm node's pods
// share the node's. It refuses to touch a directory it did not make; Close removes it.
func (n *Node) writeKubeadmPKI() error {
	if _, err := os.Stat(kubeadmPKI); err == nil {
		if _, err := os.Stat(filepath.Join(kubeadmPKI, ".kube-mvp-node")); err != nil {
			return fmt.Errorf("node: %s exists and is not the test node's: refusing to write kubeadm files there", kubeadmPKI)
		}
	}
	parent := filepath.Dir(kubeadmPKI)
	_, err := os.Stat(parent)
	madeParent := os.IsNotExist(err)
	if err := os.MkdirAll(kubeadmPKI, 0o755); err != nil {
		return err
	}
	n.cleanups = append(n.cleanups, func() {
		os.RemoveAll(kubeadmPKI)
		if madeParent {
			os.Remove(parent)
		}
	})
	pki := n.CP.PKI
	for name, f := range map[string]struct {
		b    []byte
		mode os.FileMode
	}{
		".kube-mvp-node":         {[]byte("made by the kube-mvp test node; removed when it stops\n"), 0o644},
		"front-proxy-client.crt": {pki.ProxyClient.CertPEM, 0o644},
		"front-proxy-client.key": {pki.ProxyClient.KeyPEM, 0o600},
		"front-proxy-ca.crt":     {pki.FrontProxyCA.CertPEM, 0o644},
	} {
		path := filepath.Join(kubeadmPKI, name)
		if err := os.WriteFile(path, f.b, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(path, f.mode); err != nil {
			return err
		}
		if err := os.Chown(path, 0, 0); err != nil {
			return err
		}
	}
	return nil
}
