// Command node starts the test node (test/node) with kube-mvp installed by Helm, as the node
// tests do, and keeps it up for a look by hand (`make node`):
//
//	node [--mode front|sidecar] [--kubeadm-pki] [--exit]
//
// It prints the admin kubeconfig, kube-mvp's endpoint and the helm binary it used, checks
// that requests through kube-mvp work, and runs until interrupted (--exit: stops after the
// checks). It needs root and the packages .ci/run installs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-mvp/kube-mvp/test/cmd/internal/cmdmain"
	"github.com/kube-mvp/kube-mvp/test/node"
)

func main() { cmdmain.Main("node", 1, run) }

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	mode := fs.String("mode", "front", "how the chart runs Envoy: front (Deployment + Service) or sidecar (DaemonSet on the control-plane node)")
	exit := fs.Bool("exit", false, "stop after the checks instead of running until interrupted")
	envoyImage := fs.String("envoy-image", node.EnvoyImage, "an Envoy image archive (docker save or OCI, one tagged "+
		"image) to run instead of the test stand-in: imported into "+
		"the node's containerd and given to the chart as image.envoy")
	kubeadm := fs.Bool("kubeadm-pki", false, "sidecar mode: Envoy presents the node's kubeadm front-proxy pair (/etc/kubernetes/pki), sidecar.kubeadmFrontProxyClient")
	if err := fs.Parse(args); err != nil {
		return err
	}
	node.EnvoyImage = *envoyImage
	if *mode != "front" && *mode != "sidecar" {
		return fmt.Errorf("--mode %q: want front or sidecar", *mode)
	}
	if *kubeadm && *mode != "sidecar" {
		return errors.New("--kubeadm-pki needs --mode=sidecar")
	}
	if err := node.Missing(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kube-mvp-node-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tarballs, _, err := node.BuildImages(ctx, dir, os.Stderr)
	if err != nil {
		return err
	}
	n, err := node.Start(ctx, node.Options{Servers: node.DefaultServers, ControlPlane: *mode == "sidecar", Images: tarballs, Log: os.Stderr})
	if err != nil {
		return err
	}
	defer n.Close()
	in, err := n.Install(ctx, node.InstallOptions{Mode: *mode, KubeadmPKI: *kubeadm})
	if err != nil {
		return err
	}
	through := filepath.Join(n.Dir, "kube-mvp.kubeconfig")
	if err := n.CP.WriteKubeconfigFor(through, "https://"+in.Endpoint); err != nil {
		return err
	}
	// Clients dial an address; kube-mvp's certificate names its Service.
	kc, err := clientcmd.LoadFromFile(through)
	if err != nil {
		return err
	}
	for _, c := range kc.Clusters {
		c.TLSServerName = in.ServerName
	}
	if err := clientcmd.WriteToFile(*kc, through); err != nil {
		return err
	}
	if err := check(ctx, through); err != nil {
		return fmt.Errorf("through kube-mvp: %w", err)
	}
	fmt.Printf("KUBECONFIG=%s  (the cluster admin, straight to the first apiserver)\n", n.Kubeconfig)
	fmt.Printf("kube-mvp endpoint: https://%s  (its certificate names %s; an admin kubeconfig through it: KUBECONFIG=%s)\n", in.Endpoint, in.ServerName, through)
	fmt.Printf("helm: %s\n", in.Helm)
	fmt.Printf("the node's network namespace: %s (ip netns exec %s ...)\n", n.NetNS, n.NetNS)
	if *exit {
		return nil
	}
	fmt.Println("up; Ctrl-C stops it and removes everything")
	<-ctx.Done()
	return nil
}

// check lists batch/v1 Jobs through kube-mvp: only the newer apiserver serves them.
func check(ctx context.Context, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var errs []error
	for range 10 {
		if _, err := c.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
