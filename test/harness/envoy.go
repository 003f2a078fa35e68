package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/deploy"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/dataplane"
)

// Envoy is a deployment's data plane: an Envoy binary run as its own process, started with
// the bootstrap and command line the chart gives Envoy, and observed only as an operator
// observes Envoy: through its listener and its admin API (/ready, /stats, /config_dump,
// /clusters). The binary is real Envoy (make test-envoy ENVOY=...) or the test stand-in's
// (test/cmd/envoy-stand-in, built by BuildBinaries), which takes the same command line.
type Envoy struct {
	Bin string
	// Admin is the admin API's base URL, http://127.0.0.1:port (the chart keeps it on
	// loopback).
	Admin string
	// Listener is the host:port of the apiserver listener xds-server configures.
	Listener string
	proc     *process
}

// envoyChart is where the chart is, and the release the harness renders it as.
const (
	envoyChartRelease   = "kmvp"
	envoyChartNamespace = "kube-mvp"
)

// envoyStart is what startEnvoy needs of a deployment.
type envoyStart struct {
	bin       string
	dir       string // receives the bootstrap files and envoy.log
	node      string // the node id: the pod name
	local     string // sidecar mode: the apiserver's hostname, the pod's node name
	xds       string // host:port where xds-server (or its switch) serves ADS
	xdsTLSDir string // this Envoy role's control plane certificate (tls.crt, tls.key, ca.crt)
	logLevel  string // Envoy's --log-level
	version   string // the stand-in's --envoy-version, "" for none
	listener  string // what xds-server puts in the listener, host:port
}

// startEnvoy renders the chart's Envoy (the bootstrap ConfigMap and the envoy container of
// its workload), maps the container's mounts to directories here as a kubelet would, points
// the xds-server cluster at s.xds (what the Service name resolves to in a cluster), and runs
// the binary with the container's arguments.
func startEnvoy(ctx context.Context, s envoyStart) (*Envoy, error) {
	ports, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	adminPort, healthPort := portOf(ports[0]), portOf(ports[1])
	mode := "front"
	if s.local != "" {
		mode = "sidecar"
	}
	vals := map[string]any{
		"mode":          mode,
		"networkPolicy": map[string]any{"enabled": false},
		"envoy":         map[string]any{"adminPort": adminPort, "healthPort": healthPort, "logLevel": s.logLevel},
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	rendered, err := deploy.RenderChart(filepath.Join(root, "deploy", "kube-mvp"), envoyChartRelease, envoyChartNamespace, vals)
	if err != nil {
		return nil, fmt.Errorf("rendering the chart's Envoy: %w", err)
	}
	files, err := chartBootstrap(rendered["kube-mvp/templates/envoy-bootstrap.yaml"])
	if err != nil {
		return nil, err
	}
	c, err := chartEnvoyContainer(rendered["kube-mvp/templates/envoy.yaml"])
	if err != nil {
		return nil, err
	}

	// The container's mounts, as directories here: the bootstrap ConfigMap's files written
	// out, the role's certificate directory for the xds-tls Secret, an empty one for others.
	bootstrapDir := filepath.Join(s.dir, "envoy-bootstrap")
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		switch m.Name {
		case "bootstrap":
			mounts[m.MountPath] = bootstrapDir
		case "xds-tls":
			mounts[m.MountPath] = s.xdsTLSDir
		default:
			mounts[m.MountPath] = filepath.Join(s.dir, "envoy-volume-"+m.Name)
		}
		if err := os.MkdirAll(mounts[m.MountPath], 0o755); err != nil {
			return nil, err
		}
	}
	for name, doc := range files {
		v, err := remount(doc, mounts)
		if err != nil {
			return nil, fmt.Errorf("the chart's %s: %w", name, err)
		}
		if name == "envoy.yaml" {
			if err := pointXDSCluster(v, s.xds); err != nil {
				return nil, err
			}
		}
		b, err := yaml.Marshal(v)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(bootstrapDir, name), b, 0o644); err != nil {
			return nil, err
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch e.ValueFrom.FieldRef.FieldPath {
		case "metadata.name":
			env[e.Name] = s.node
		case "spec.nodeName":
			env[e.Name] = s.local
		default:
			return nil, fmt.Errorf("the chart's envoy container: env %s: the harness cannot give it a value", e.Name)
		}
	}
	args := make([]string, 0, len(c.Args)+2)
	for _, a := range c.Args {
		args = append(args, remountString(expandEnv(a, env), mounts))
	}
	if s.version != "" {
		args = append(args, "--envoy-version", s.version)
	}
	e := &Envoy{Bin: s.bin, Admin: "http://" + ports[0], Listener: s.listener}
	if e.proc, err = startProcess(filepath.Join(s.dir, "envoy.log"), s.bin, args...); err != nil {
		return nil, err
	}
	return e, nil
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// chartBootstrap returns the files of the chart's bootstrap ConfigMap, parsed.
func chartBootstrap(manifest string) (map[string]string, error) {
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(manifest), &cm); err != nil || cm.Kind != "ConfigMap" || cm.Data["envoy.yaml"] == "" {
		return nil, fmt.Errorf("the chart's envoy-bootstrap.yaml is not a ConfigMap with envoy.yaml (%v)", err)
	}
	return cm.Data, nil
}

type chartContainer struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	Env  []struct {
		Name      string `json:"name"`
		ValueFrom struct {
			FieldRef struct {
				FieldPath string `json:"fieldPath"`
			} `json:"fieldRef"`
		} `json:"valueFrom"`
	} `json:"env"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

// chartEnvoyContainer returns the envoy container of the chart's Envoy workload (a
// Deployment in front mode, a DaemonSet in sidecar mode).
func chartEnvoyContainer(manifests string) (chartContainer, error) {
	for _, doc := range strings.Split(manifests, "\n---") {
		var w struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []chartContainer `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &w); err != nil {
			return chartContainer{}, fmt.Errorf("the chart's envoy.yaml: %w", err)
		}
		for _, c := range w.Spec.Template.Spec.Containers {
			if c.Name == "envoy" {
				return c, nil
			}
		}
	}
	return chartContainer{}, errors.New("the chart's envoy.yaml has no container named envoy")
}

// expandEnv is the kubelet's $(VAR) expansion of a container argument.
func expandEnv(s string, env map[string]string) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// remount parses a bootstrap file and rewrites every path under a mount to the directory
// standing for it.
func remount(doc string, mounts map[string]string) (any, error) {
	var v any
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		return nil, err
	}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		case string:
			return remountString(x, mounts)
		}
		return v
	}
	return walk(v), nil
}

func remountString(s string, mounts map[string]string) string {
	// the longest mount first, as a path is under the deepest mount that holds it
	paths := make([]string, 0, len(mounts))
	for p := range mounts {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, p := range paths {
		if s == p || strings.HasPrefix(s, p+"/") {
			return mounts[p] + strings.TrimPrefix(s, p)
		}
	}
	return s
}

// pointXDSCluster sets the address of the bootstrap's xds-server cluster to addr: in a
// cluster its Service name resolves to the xds-server pods.
func pointXDSCluster(bootstrap any, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	p, _ := strconv.Atoi(port)
	clusters, _ := dig(bootstrap, "static_resources", "clusters").([]any)
	for _, c := range clusters {
		if dig(c, "name") != "xds-server" {
			continue
		}
		eps, _ := dig(c, "load_assignment", "endpoints").([]any)
		n := 0
		for _, ep := range eps {
			lbs, _ := dig(ep, "lb_endpoints").([]any)
			for _, lb := range lbs {
				if sa, ok := dig(lb, "endpoint", "address", "socket_address").(map[string]any); ok {
					sa["address"], sa["port_value"] = host, p
					n++
				}
			}
		}
		if n != 1 {
			return fmt.Errorf("the chart's bootstrap: the xds-server cluster has %d addresses, want 1", n)
		}
		return nil
	}
	return errors.New("the chart's bootstrap has no xds-server cluster")
}

func dig(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// IsStandIn reports whether bin is the test stand-in (its --version says so), which models
// Envoy releases on request (--envoy-version) and has a Go API; real Envoy has neither.
func IsStandIn(bin string) bool {
	out, err := exec.Command(bin, "--version").Output()
	return err == nil && bytes.Contains(out, []byte("envoy-stand-in"))
}

// adminGet is one GET of the admin API, within 10 s; a status other than 200 is an error.
func (e *Envoy) adminGet(ctx context.Context, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return dataplane.AdminGet(ctx, e.Admin, path)
}

// WaitReady waits until the admin's /ready says LIVE: Envoy initialised its listeners and
// clusters from xds-server.
func (e *Envoy) WaitReady(ctx context.Context) error {
	var last error
	for {
		if _, last = e.adminGet(ctx, "/ready"); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Envoy never became ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stats returns the counters and gauges whose names match filter (RE2, as the admin's
// ?filter=), by name.
func (e *Envoy) Stats(ctx context.Context, filter string) (map[string]uint64, error) {
	b, err := e.adminGet(ctx, "/stats?format=json&filter="+url.QueryEscape(filter))
	if err != nil {
		return nil, err
	}
	var doc struct {
		Stats []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("/stats?format=json: %w", err)
	}
	out := map[string]uint64{}
	for _, s := range doc.Stats {
		if s.Name == "" {
			continue // histograms and text readouts
		}
		var n uint64
		if json.Unmarshal(s.Value, &n) == nil {
			out[s.Name] = n
		}
	}
	return out, nil
}

// Stat returns one counter or gauge (0 when Envoy has not made it yet, as with a counter
// nothing incremented).
func (e *Envoy) Stat(ctx context.Context, name string) (uint64, error) {
	m, err := e.Stats(ctx, "^"+regexp.QuoteMeta(name)+"$")
	return m[name], err
}

// MustStat is Stat for a test: an admin API that does not answer fails it.
func (e *Envoy) MustStat(t testing.TB, name string) uint64 {
	t.Helper()
	n, err := e.Stat(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Rejected returns every subscription's update_rejected counter that is not zero: the
// configuration updates Envoy refused (NACKed), by stat name.
func (e *Envoy) Rejected(ctx context.Context) (map[string]uint64, error) {
	m, err := e.Stats(ctx, `\.update_rejected$`)
	for k, v := range m {
		if v == 0 {
			delete(m, k)
		}
	}
	return m, err
}

// Versions returns the last version Envoy accepted of each resource type (type URL),
// from /config_dump: the listeners' and clusters' version_info, and the newest of the
// routes', endpoints' and secrets'.
func (e *Envoy) Versions(ctx context.Context) (map[string]string, error) {
	b, err := e.adminGet(ctx, "/config_dump?include_eds")
	if err != nil {
		return nil, err
	}
	var dump struct {
		Configs []map[string]json.RawMessage `json:"configs"`
	}
	if err := json.Unmarshal(b, &dump); err != nil {
		return nil, err
	}
	out := map[string]string{}
	type versioned struct {
		VersionInfo string `json:"version_info"`
	}
	newest := func(typeURL string, raw json.RawMessage) {
		var vs []versioned
		if json.Unmarshal(raw, &vs) != nil {
			return
		}
		for _, v := range vs {
			if v.VersionInfo > out[typeURL] {
				out[typeURL] = v.VersionInfo
			}
		}
	}
	for _, c := range dump.Configs {
		var t string
		_ = json.Unmarshal(c["@type"], &t)
		var top versioned
		_ = json.Unmarshal(mustRaw(c, "version_info"), &top.VersionInfo)
		switch t {
		case "type.googleapis.com/envoy.admin.v3.ListenersConfigDump":
			if top.VersionInfo != "" {
				out["type.googleapis.com/envoy.config.listener.v3.Listener"] = top.VersionInfo
			}
		case "type.googleapis.com/envoy.admin.v3.ClustersConfigDump":
			if top.VersionInfo != "" {
				out["type.googleapis.com/envoy.config.cluster.v3.Cluster"] = top.VersionInfo
			}
		case "type.googleapis.com/envoy.admin.v3.RoutesConfigDump":
			newest("type.googleapis.com/envoy.config.route.v3.RouteConfiguration", c["dynamic_route_configs"])
		case "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump":
			newest("type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", c["dynamic_endpoint_configs"])
		case "type.googleapis.com/envoy.admin.v3.SecretsConfigDump":
			newest("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", c["dynamic_active_secrets"])
		}
	}
	return out, nil
}

func mustRaw(m map[string]json.RawMessage, k string) json.RawMessage {
	if v, ok := m[k]; ok {
		return v
	}
	return json.RawMessage(`""`)
}

// Clusters reads the admin's /clusters?format=json.
func (e *Envoy) Clusters(ctx context.Context) (*adminv3.Clusters, error) {
	return dataplane.ReadClusters(ctx, e.Admin)
}

// Stop stops Envoy (SIGTERM: it exits at once, as Envoy does).
func (e *Envoy) Stop() { e.proc.stop(15 * time.Second) }

// RequireStandIn skips t when the harness runs an Envoy other than the stand-in
// ($KUBE_MVP_ENVOY): why says what the test needs that only the stand-in has (a modelled
// release, a stat of its own), and is the skip's reason.
func RequireStandIn(t testing.TB, why string) {
	t.Helper()
	if !UsingStandIn() {
		t.Skip("needs the Envoy stand-in: " + why)
	}
}

// UsingStandIn reports whether the harness runs the stand-in: $KUBE_MVP_ENVOY is unset or
// names the stand-in.
func UsingStandIn() bool {
	bin := os.Getenv(EnvoyEnv)
	return bin == "" || IsStandIn(bin)
}
