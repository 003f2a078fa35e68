package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/opstatus"
)

// The chart's labels and container port names (deploy/kube-mvp) that status looks for.
const (
	componentLabel   = "app.kubernetes.io/component"
	xdsComponent     = "xds-server"
	envoyComponent   = "envoy"
	xdsAdminPort     = "admin"
	extprocAdminPort = "extproc-admin"
	defaultNamespace = "kube-mvp"
)

// clusterAccess is how status reaches kube-mvp through the Kubernetes API: the kubeconfig
// and the namespace the chart was installed in.
type clusterAccess struct {
	kubeconfig, context, namespace string
}

// addFlags defines --kubeconfig, --context and -n, each used only when (e.g. "without
// --xds-admin").
func (a *clusterAccess) addFlags(fs *pflag.FlagSet, when string) {
	fs.StringVar(&a.kubeconfig, "kubeconfig", "", when+": the kubeconfig `FILE` (default as kubectl: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&a.context, "context", "", when+": the kubeconfig `CONTEXT`")
	fs.StringVarP(&a.namespace, "namespace", "n", "", when+": the `NAMESPACE` kube-mvp is installed in (default: the context's, else kube-mvp)")
}

// adminFlags are the flags status and config-dump end with, after their own (--xds-admin
// among them: its help differs): the cluster access without --xds-admin, -o and --timeout.
type adminFlags struct {
	cluster clusterAccess
	output  string
	timeout time.Duration
}

// addFlags defines them, with each command's own --timeout default and help.
func (f *adminFlags) addFlags(fs *pflag.FlagSet, timeout time.Duration, timeoutHelp string) {
	f.cluster.addFlags(fs, "without --xds-admin")
	fs.VarP(outputValue(&f.output), "output", "o", "output format")
	fs.Var(cli.NewValue(&f.timeout, timeout, "DURATION", cli.Duration(1, "a positive duration, e.g. "+timeout.String())), "timeout", timeoutHelp)
}

// restConfig loads the kubeconfig as kubectl does, and the namespace: the flag's, the
// context's, or the chart's usual one.
func (a clusterAccess) restConfig() (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = a.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: a.context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("no kubeconfig to reach kube-mvp through (%v): give --kubeconfig, or --xds-admin URL for processes outside a cluster", err)
	}
	ns := a.namespace
	if ns == "" {
		if n, overridden, err := cc.Namespace(); err == nil && overridden {
			ns = n
		} else {
			ns = defaultNamespace
		}
	}
	return cfg, ns, nil
}

// targets finds kube-mvp's pods and returns the client and URLs that reach their admin ports
// through the apiserver's pod proxy (GET pods/proxy), one xds-server and every extproc.
func targets(ctx context.Context, cfg *rest.Config, ns string) (*http.Client, []opstatus.Target, []opstatus.Target, []string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	list := func(component string) ([]corev1.Pod, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: componentLabel + "=" + component})
		switch {
		case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			return nil, fmt.Errorf("you may not list pods in namespace %s (%v); kubectl mvp needs list on pods and get on pods/proxy there (config-dump: create on pods/portforward too)", ns, err)
		case err != nil:
			return nil, fmt.Errorf("the Kubernetes API at %s: %w", cfg.Host, err)
		}
		return pods.Items, nil
	}
	xdsPods, err := list(xdsComponent)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if len(xdsPods) == 0 {
		return nil, nil, nil, nil, fmt.Errorf("no xds-server pod in namespace %s (label %s=%s): is kube-mvp installed there? (--namespace names another)", ns, componentLabel, xdsComponent)
	}
	base := strings.TrimSuffix(cfg.Host, "/") + "/api/v1/namespaces/" + ns + "/pods/"
	xdsServers, problems := proxied(xdsPods, xdsAdminPort, "xds-server", base)
	if len(xdsServers) == 0 {
		return nil, nil, nil, nil, fmt.Errorf("no running xds-server pod in namespace %s: kube-mvp is down (%s)", ns, strings.Join(problems, "; "))
	}
	envoyPods, err := list(envoyComponent)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	extprocs, envoyProblems := proxied(envoyPods, extprocAdminPort, "Envoy", base)
	problems = append(problems, envoyProblems...)
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return c, xdsServers, extprocs, problems, nil
}

// proxied are the admin URLs, through the pod proxy under base, of the pods running with the
// container port portName, in the pods' order; a pod with the port but not running is a
// problem (role names the pod's kind in it), one without the port is skipped.
func proxied(pods []corev1.Pod, portName, role, base string) ([]opstatus.Target, []string) {
	var out []opstatus.Target
	var problems []string
	for _, p := range pods {
		port, ok := containerPort(p, portName)
		if !ok {
			continue
		}
		if !running(p) {
			problems = append(problems, fmt.Sprintf("%s pod %s is not running: %s", role, p.Name, podState(p)))
			continue
		}
		out = append(out, opstatus.Target{Name: p.Name, URL: fmt.Sprintf("%s%s:%d/proxy", base, p.Name, port)})
	}
	return out, problems
}

func containerPort(p corev1.Pod, name string) (int32, bool) {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

func running(p corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
}

// podState says why a pod is not running: its phase and its containers' waiting reasons.
func podState(p corev1.Pod) string {
	s := string(p.Status.Phase)
	if p.DeletionTimestamp != nil {
		s += ", terminating"
	}
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			s += fmt.Sprintf(", %s %s", c.Name, w.Reason)
		}
	}
	return s
}
