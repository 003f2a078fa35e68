package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/klog/v2"

	"github.com/kube-mvp/kube-mvp/internal/adminhttp"
	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/configdiff"
	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/opstatus"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
)

var configDumpCommand = &cli.Command{
	Name:    "config-dump",
	Summary: "each Envoy's applied configuration against xds-server's, resource by resource",
	Usage:   configDumpUsage,
	Run:     runConfigDump,
}

func configDumpUsage() string {
	return cli.Usage(configDumpIntro, new(configDumpOptions).flagSet(), configDumpOutro)
}

const configDumpIntro = `usage: kubectl mvp config-dump [-n NAMESPACE] [--node POD] [flags]
       kubectl mvp config-dump --xds-admin URL --envoy-admin URL [--node ID] [flags]

Compares, for each Envoy, the configuration it applied (its admin /config_dump?include_eds)
with what xds-server holds for that node (/debug/config_dump?node=ID), one line per resource:
equal, differs (with the fields), only-xds-server (not applied: not sent, NACKed with
Envoy's reason, or warming), only-envoy (removed from xds-server) or warming; with the
version xds-server sent and Envoy acknowledged (/debug/syncz) and Envoy's version_info.
Secrets are compared by name, certificate and validation context; no key is ever printed.
`

const configDumpOutro = `With --xds-admin and --envoy-admin: the processes at those URLs (outside a cluster, as make
demo runs them); the node is --node, or the only one xds-server's /debug/syncz lists.
Otherwise through the Kubernetes API: xds-server's admin through the pod proxy (for each
Envoy, the replica it is connected to), and each
Envoy pod's admin, which listens on the pod's loopback only, through a port-forward to it
(its node ID is the pod name). That needs list on pods, get on pods/proxy and create on
pods/portforward in the namespace (the chart's rbac.operators).
Exit codes: 0 printed, 1 an admin did not answer (or you may not reach it), 2 bad command line,
3 with --exit-code: printed, and some resource is not equal (or a problem was found).
`

type configDumpOptions struct {
	xdsAdmin, envoyAdmin string
	node                 string
	envoyAdminPort       int
	envoyAdminPortSet    bool // given: it wins over the pods' annotation
	exitCode             bool
	adminFlags
}

func (o *configDumpOptions) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("config-dump")
	fs.StringVar(&o.xdsAdmin, "xds-admin", "", "xds-server's admin `URL`, e.g. http://127.0.0.1:9100 (with --envoy-admin)")
	fs.StringVar(&o.envoyAdmin, "envoy-admin", "", "Envoy's admin `URL`, e.g. http://127.0.0.1:9901 (with --xds-admin)")
	fs.StringVar(&o.node, "node", "", "only this Envoy: its node `ID` (in a cluster, its pod's name)")
	fs.Var(cli.NewValue(&o.envoyAdminPort, 9901, "PORT", func(s string) (int, error) {
		var p int
		if _, err := fmt.Sscan(s, &p); err != nil || p < 1 || p > 65535 || fmt.Sprint(p) != s {
			return 0, errors.New("is not a port number")
		}
		return p, nil
	}), "envoy-admin-port", "without --envoy-admin: Envoy's admin port in its pods (default: what each pod's "+contract.AnnotationEnvoyAdminPort+" annotation says, else 9901)")
	fs.BoolVar(&o.exitCode, "exit-code", false, "exit 3 unless every resource of every Envoy is equal and nothing went unread (for scripts: a rollout's check)")
	o.adminFlags.addFlags(fs, 30*time.Second, "how long to wait for everything")
	return fs
}

// envoyTarget is one Envoy to compare: its node ID and how to reach its admin.
type envoyTarget struct {
	node, label string
	// base is the admin's URL; forward, in a cluster, opens a port-forward and returns it.
	base    string
	forward func(ctx context.Context) (string, func(), error)
}

func runConfigDump(args []string, stdout, stderr io.Writer) int {
	var o configDumpOptions
	fs := o.flagSet()
	errs, stop := cli.Parse(fs, args)
	o.envoyAdminPortSet = fs.Changed("envoy-admin-port")
	err := stop
	if err == nil {
		if (o.xdsAdmin == "") != (o.envoyAdmin == "") {
			errs = multierror.Append(errs, errors.New("--xds-admin and --envoy-admin go together (without both, config-dump finds the pods through the Kubernetes API)"))
		}
		err = cli.Err(errs)
	}
	if code, ok := cli.Done("kubectl mvp config-dump", err, configDumpUsage, stdout, stderr); !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	r, err := configDump(ctx, &o)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mvp config-dump: %v\n", err)
		return 1
	}
	if !printStructured(stdout, r, o.output) {
		configdiff.Write(stdout, r)
	}
	if o.exitCode && !r.InSync() {
		return 3
	}
	return 0
}

func configDump(ctx context.Context, o *configDumpOptions) (*configdiff.Report, error) {
	client := &http.Client{}
	replicas := []opstatus.Target{{Name: o.xdsAdmin, URL: o.xdsAdmin}}
	r := &configdiff.Report{Nodes: []configdiff.Node{}}
	var envoys []envoyTarget
	inCluster := o.xdsAdmin == ""
	if inCluster {
		cfg, ns, err := o.cluster.restConfig()
		if err != nil {
			return nil, err
		}
		var pods []string
		var ports map[string]int
		client, replicas, pods, ports, r.Problems, err = configDumpTargets(ctx, cfg, ns)
		if err != nil {
			return nil, err
		}
		for _, pod := range pods {
			if o.node != "" && pod != o.node {
				continue
			}
			port := o.envoyAdminPort
			if p, ok := ports[pod]; ok && !o.envoyAdminPortSet {
				port = p
			}
			envoys = append(envoys, envoyTarget{node: pod, label: "pod " + pod, forward: func(ctx context.Context) (string, func(), error) {
				return forwardToPod(ctx, cfg, ns, pod, port)
			}})
		}
		if o.node != "" && len(envoys) == 0 {
			return nil, fmt.Errorf("no running Envoy pod %s in namespace %s", o.node, ns)
		}
	}
	// Each replica knows only the Envoys connected to it.
	var synczs []replicaSyncz
	for _, rp := range replicas {
		syncz, err := readSyncz(ctx, client, strings.TrimSuffix(rp.URL, "/"))
		if err != nil {
			if len(replicas) == 1 {
				return nil, err
			}
			r.Problems = append(r.Problems, rp.Name+": "+err.Error())
			continue
		}
		synczs = append(synczs, replicaSyncz{admin: strings.TrimSuffix(rp.URL, "/"), nodes: syncz})
	}
	if len(synczs) == 0 {
		return nil, fmt.Errorf("no xds-server replica's /debug/syncz could be read: %s", strings.Join(r.Problems, "; "))
	}
	if !inCluster {
		node := o.node
		if node == "" {
			var ids []string
			for _, n := range synczs[0].nodes {
				ids = append(ids, n.NodeID)
			}
			if len(ids) == 0 {
				return nil, errors.New("xds-server's /debug/syncz lists no Envoy node (none connected?): give --node ID, the one at --envoy-admin")
			}
			if len(ids) != 1 {
				return nil, fmt.Errorf("xds-server's /debug/syncz lists %d Envoy nodes (%s): give --node ID, the one at --envoy-admin", len(ids), strings.Join(ids, ", "))
			}
			node = ids[0]
		}
		envoys = append(envoys, envoyTarget{node: node, label: o.envoyAdmin, base: strings.TrimSuffix(o.envoyAdmin, "/")})
	}
	for _, e := range envoys {
		rs := connectedTo(synczs, e.node)
		n, problems, err := compareNode(ctx, client, rs.admin, e, rs.nodes)
		r.Problems = append(r.Problems, problems...)
		var forbidden *forbiddenError
		switch {
		case errors.As(err, &forbidden) || (err != nil && !inCluster):
			return nil, err
		case err != nil:
			r.Problems = append(r.Problems, err.Error())
			continue
		}
		r.Nodes = append(r.Nodes, *n)
	}
	if inCluster && len(envoys) > 0 && len(r.Nodes) == 0 {
		return nil, fmt.Errorf("no Envoy's admin could be read: %s", strings.Join(r.Problems, "; "))
	}
	r.Sort()
	return r, nil
}

// replicaSyncz is one xds-server replica's admin and the Envoys its /debug/syncz lists.
type replicaSyncz struct {
	admin string
	nodes []xdsstatus.NodeStatus
}

// connectedTo is the replica node is connected to: the one listing it with the most open
// streams (a replica keeps an Envoy that moved away for a while, disconnected), else the
// first, whose 404 then says it does not know the node.
func connectedTo(synczs []replicaSyncz, node string) replicaSyncz {
	best, streams := synczs[0], -1
	for _, rs := range synczs {
		for _, n := range rs.nodes {
			if n.NodeID == node && n.Streams > streams {
				best, streams = rs, n.Streams
			}
		}
	}
	return best
}

// configDumpTargets is status's targets: the client and the URLs of the running xds-server
// replicas' admins through the pod proxy, and the running Envoy pods (those with extproc
// beside them).
func configDumpTargets(ctx context.Context, cfg *rest.Config, ns string) (*http.Client, []opstatus.Target, []string, map[string]int, []string, error) {
	client, replicas, extprocs, problems, err := targets(ctx, cfg, ns)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	var pods []string
	for _, e := range extprocs {
		pods = append(pods, e.Name)
	}
	ports, err := envoyAdminPorts(ctx, cfg, ns)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	return client, replicas, pods, ports, problems, nil
}

// envoyAdminPorts are the Envoy pods' admin ports, by pod, as their annotation
// contract.AnnotationEnvoyAdminPort says (pods without a valid one are left out).
func envoyAdminPorts(ctx context.Context, cfg *rest.Config, ns string) (map[string]int, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: componentLabel + "=" + envoyComponent})
	if err != nil {
		return nil, fmt.Errorf("listing the Envoy pods in namespace %s: %w", ns, err)
	}
	out := map[string]int{}
	for _, p := range pods.Items {
		if n, err := strconv.ParseUint(p.Annotations[contract.AnnotationEnvoyAdminPort], 10, 16); err == nil && n > 0 {
			out[p.Name] = int(n)
		}
	}
	return out, nil
}

// compareNode reads one node's two dumps and compares them; the problems are Envoy's
// resources that could not be read.
func compareNode(ctx context.Context, client *http.Client, xdsAdmin string, e envoyTarget, syncz []xdsstatus.NodeStatus) (*configdiff.Node, []string, error) {
	body, err := adminGet(ctx, client, xdsAdmin+"/debug/config_dump?node="+url.QueryEscape(e.node), "xds-server")
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: %w", e.node, err)
	}
	ours, err := configdiff.ParseXDSServer(body)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: %w", e.node, err)
	}
	base, hint := e.base, ""
	if e.forward != nil {
		b, stop, err := e.forward(ctx)
		if err != nil {
			return nil, nil, err
		}
		defer stop()
		base, hint = b, " (is Envoy's admin on that port in the pod? --envoy-admin-port names another)"
	}
	body, err = adminGet(ctx, &http.Client{}, base+"/config_dump?include_eds", "Envoy")
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w%s", e.label, err, hint)
	}
	theirs, problems, err := configdiff.ParseEnvoy(body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", e.label, err)
	}
	for i, p := range problems {
		problems[i] = e.label + ": " + p
	}
	var status *xdsstatus.NodeStatus
	for i := range syncz {
		if syncz[i].NodeID == e.node {
			status = &syncz[i]
		}
	}
	n := configdiff.Compare(e.node, ours, theirs, status)
	n.Envoy = e.label
	return &n, problems, nil
}

func readSyncz(ctx context.Context, client *http.Client, xdsAdmin string) ([]xdsstatus.NodeStatus, error) {
	body, err := adminGet(ctx, client, xdsAdmin+"/debug/syncz", "xds-server")
	if err != nil {
		return nil, err
	}
	var out []xdsstatus.NodeStatus
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("xds-server's /debug/syncz at %s: %w (another version of xds-server?)", xdsAdmin, err)
	}
	return out, nil
}

// adminGet reads an admin page, at most adminhttp.MaxPage bytes of it; who names the process.
func adminGet(ctx context.Context, c *http.Client, u, who string) ([]byte, error) {
	status, body, err := adminhttp.Do(ctx, c, http.MethodGet, u, adminhttp.MaxPage)
	page := u
	if parsed, perr := url.Parse(u); perr == nil {
		page = parsed.Redacted()
	}
	switch {
	case err != nil && status == 0:
		return nil, fmt.Errorf("%s's admin does not answer: %w", who, err)
	case err != nil:
		return nil, fmt.Errorf("%s's admin at %s: %w", who, page, err)
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return nil, fmt.Errorf("%s's admin at %s answered %d: %s (through the Kubernetes API: you need get on pods/proxy in its namespace)", who, page, status, adminhttp.FirstLine(body))
	case status != http.StatusOK:
		return nil, fmt.Errorf("%s's admin at %s answered %d: %s", who, page, status, adminhttp.FirstLine(body))
	}
	return body, nil
}

// forbiddenError is a port-forward the Kubernetes API refused: the same for every pod.
type forbiddenError struct{ msg string }

func (e *forbiddenError) Error() string { return e.msg }

// forwardToPod forwards a local port on 127.0.0.1 to port of pod through the Kubernetes API
// (pods/portforward, SPDY): Envoy's admin listens on the pod's loopback only, which the pod
// proxy cannot reach. It returns the admin's local URL and how to stop the forward.
func forwardToPod(ctx context.Context, cfg *rest.Config, ns, pod string, port int) (string, func(), error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", nil, err
	}
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", nil, err
	}
	u := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	// client-go logs a stream's failure through klog; the request through it fails too, and
	// that is what is reported.
	fctx, cancel := context.WithCancel(klog.NewContext(ctx, logr.Discard()))
	ready := make(chan struct{})
	var errOut lockedBuffer
	pf, err := portforward.NewOnAddressesWithContext(fctx, dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, ready, io.Discard, &errOut)
	if err != nil {
		cancel()
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() { done <- pf.ForwardPorts() }()
	stop := func() { cancel(); <-done }
	select {
	case <-ready:
	case err := <-done:
		cancel()
		if s := err.Error(); strings.Contains(strings.ToLower(s), "forbidden") {
			return "", nil, &forbiddenError{fmt.Sprintf("you may not port-forward to pod %s in namespace %s (%v); "+
				"config-dump reaches Envoy's admin, on the pod's loopback, through pods/portforward: "+
				"it needs create on pods/portforward there (the chart's rbac.operators)", pod, ns, err)}
		}
		return "", nil, fmt.Errorf("pod %s: port-forward through the Kubernetes API: %v", pod, err)
	case <-ctx.Done():
		stop()
		return "", nil, fmt.Errorf("pod %s: port-forward through the Kubernetes API: %w", pod, ctx.Err())
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) == 0 {
		stop()
		return "", nil, fmt.Errorf("pod %s: port-forward: no local port (%v; %s)", pod, err, errOut.String())
	}
	return fmt.Sprintf("http://127.0.0.1:%d", ports[0].Local), stop, nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
