package dataplane

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/encoding/protowire"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/deploy"
	"github.com/kube-mvp/kube-mvp/internal/certgen"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/testutil/cptlstest"
)

// chartEnvoy is what the chart gives the Envoy container: its arguments (with the kubelet's
// $(VAR) expansion done) and the bootstrap ConfigMap's files.
type chartEnvoy struct {
	args  []string
	files map[string]string // ConfigMap key -> content
	xds   string            // xds-server's host name in the bootstrap
}

const (
	chartDir     = "../../deploy/kube-mvp"
	chartPod     = "kmvp-kube-mvp-envoy-abcde"
	chartNode    = "cp-a"
	chartMountAt = "/etc/kube-mvp/"
)

// renderChartEnvoy renders the chart (release kmvp in namespace kube-mvp) with vals.
func renderChartEnvoy(t *testing.T, vals map[string]any) chartEnvoy {
	t.Helper()
	out, err := deploy.RenderChart(chartDir, "kmvp", "kube-mvp", vals)
	if err != nil {
		t.Fatal(err)
	}
	var ce chartEnvoy
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(out["kube-mvp/templates/envoy-bootstrap.yaml"]), &cm); err != nil {
		t.Fatal(err)
	}
	ce.files = cm.Data
	var workload struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name string   `json:"name"`
						Args []string `json:"args"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	doc := strings.SplitN(out["kube-mvp/templates/envoy.yaml"], "\n---", 2)[0]
	if err := yaml.Unmarshal([]byte(doc), &workload); err != nil {
		t.Fatal(err)
	}
	for _, c := range workload.Spec.Template.Spec.Containers {
		if c.Name == "envoy" {
			for _, a := range c.Args {
				a = strings.ReplaceAll(a, "$(POD_NAME)", chartPod)
				ce.args = append(ce.args, strings.ReplaceAll(a, "$(NODE_NAME)", chartNode))
			}
		}
	}
	if len(ce.args) == 0 || len(ce.files) != 3 {
		t.Fatalf("rendered envoy args %q, bootstrap files %d", ce.args, len(ce.files))
	}
	for _, l := range strings.Split(ce.files["envoy.yaml"], "\n") {
		if i := strings.Index(l, "socket_address: {address: "); i >= 0 && strings.Contains(l, "xds-server") {
			ce.xds = strings.TrimSpace(strings.SplitN(l[i+len("socket_address: {address: "):], ",", 2)[0])
		}
	}
	return ce
}

// install writes the bootstrap files where the pod mounts them, under root (a test cannot
// use /etc/kube-mvp): every "/etc/kube-mvp/" in the files and arguments becomes
// root+"/etc/kube-mvp/", nothing else changes. It returns the rewritten arguments.
func (ce chartEnvoy) install(t *testing.T, root string) []string {
	t.Helper()
	mount := filepath.Join(root, "etc", "kube-mvp") + "/"
	dir := filepath.Join(mount, "bootstrap")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range ce.files {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(strings.ReplaceAll(v, chartMountAt, mount)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var args []string
	for _, a := range ce.args {
		args = append(args, strings.ReplaceAll(a, chartMountAt, mount))
	}
	return args
}

var chartModes = []struct {
	name  string
	vals  map[string]any
	local string
}{
	{"front", map[string]any{}, ""},
	{"sidecar", map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"xdsFrom": []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/24"}}}}}, chartNode},
}

// TestChartBootstrapOptions: the chart's rendered bootstrap and arguments, in both modes,
// become the options Envoy would run with.
func TestChartBootstrapOptions(t *testing.T) {
	for _, m := range chartModes {
		t.Run(m.name, func(t *testing.T) {
			ce := renderChartEnvoy(t, m.vals)
			root := t.TempDir()
			args := ce.install(t, root)
			cl, err := ParseCommandLine(args)
			if err != nil {
				t.Fatal(err)
			}
			if !cl.RejectUnknownDynamicFields || cl.ServiceNode != chartPod || cl.ServiceCluster != "kube-mvp" {
				t.Errorf("command line %+v", cl)
			}
			o, err := BootstrapOptions(cl)
			if err != nil {
				t.Fatal(err)
			}
			if o.NodeID != chartPod || o.NodeCluster != "kube-mvp" || o.LocalAPIServer != m.local || len(o.NodeMetadata) != 0 {
				t.Errorf("node %q cluster %q local apiserver %q metadata %v", o.NodeID, o.NodeCluster, o.LocalAPIServer, o.NodeMetadata)
			}
			if !o.RejectUnknownDynamicFields {
				t.Error("--reject-unknown-dynamic-fields not passed on")
			}
			if o.Drain == nil || o.Drain.Time != cl.DrainTime || o.Drain.Strategy != cl.DrainStrategy {
				t.Errorf("drain options %+v, command line %v %v", o.Drain, cl.DrainTime, cl.DrainStrategy)
			}
			if o.AdminAddress != "127.0.0.1:9901" {
				t.Errorf("admin %q", o.AdminAddress)
			}
			x := o.XDSCluster
			if x == nil || x.Name != "xds-server" || x.Host != ce.xds || x.Port != 18000 || x.DNSRefreshRate != 5*time.Second ||
				x.ConnectTimeout != time.Second || x.KeepaliveInterval != 30*time.Second || x.KeepaliveTimeout != 5*time.Second {
				t.Errorf("xDS cluster %+v (host in the bootstrap %q)", x, ce.xds)
			}
			if !strings.HasSuffix(ce.xds, ".kube-mvp.svc.cluster.local") {
				t.Errorf("xds-server host %q is not the Service's DNS name", ce.xds)
			}
			tlsDir := filepath.Join(root, "etc", "kube-mvp", "xds-tls")
			want := XDSTLS{CertFile: filepath.Join(tlsDir, "tls.crt"), KeyFile: filepath.Join(tlsDir, "tls.key"), CAFile: filepath.Join(tlsDir, "ca.crt"),
				ServerURISAN: "spiffe://kube-mvp/role/xds-server", CertWatchedDirectory: tlsDir, CAWatchedDirectory: tlsDir, CertSecret: "xds-client-cert"}
			if o.XDSTLS == nil || *o.XDSTLS != want {
				t.Errorf("xDS TLS %+v, want %+v", o.XDSTLS, want)
			}
			h := o.HealthListener
			if h == nil || h.Name != "envoy-health" || h.Address != "0.0.0.0:9902" || len(h.Routes) != 2 {
				t.Fatalf("health listener %+v", h)
			}
			for i, path := range []string{"/ready", "/stats/prometheus"} {
				r := h.Routes[i]
				if r.Path != path || r.Cluster != "envoy-admin" || r.Upstream != o.AdminAddress || len(r.Headers) != 1 || r.Headers[":method"] != "GET" || r.ConnectTimeout != 250*time.Millisecond {
					t.Errorf("route %d: %+v", i, r)
				}
			}
		})
	}
}

// TestRepoBootstrapsLoad: envoy/front.yaml and envoy/sidecar.yaml load too (their SDS files
// are envoy/sds/, installed as the comments say).
func TestRepoBootstrapsLoad(t *testing.T) {
	for _, f := range []string{"front.yaml", "sidecar.yaml"} {
		root := t.TempDir()
		mount := filepath.Join(root, "etc", "kube-mvp") + "/"
		b, err := os.ReadFile(filepath.Join("../../envoy", f))
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.MkdirAll(filepath.Join(mount, "bootstrap"), 0o755))
		for _, s := range []string{"xds-ca.yaml", "xds-client-cert.yaml"} {
			sb, err := os.ReadFile(filepath.Join("../../envoy/sds", s))
			must(t, err)
			must(t, os.WriteFile(filepath.Join(mount, "bootstrap", s), []byte(strings.ReplaceAll(string(sb), chartMountAt, mount)), 0o644))
		}
		path := filepath.Join(root, f)
		must(t, os.WriteFile(path, []byte(strings.ReplaceAll(string(b), chartMountAt, mount)), 0o644))
		o, err := BootstrapOptions(CommandLine{ConfigPath: path})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if o.XDSCluster.Host == "" || o.XDSTLS == nil || o.HealthListener == nil || o.NodeID == "" {
			t.Errorf("%s: %+v", f, o)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestBootstrapRefusals: what Envoy would do differently or the stand-in does not implement
// is an error naming it, at start.
func TestBootstrapRefusals(t *testing.T) {
	ce := renderChartEnvoy(t, map[string]any{})
	for _, c := range []struct {
		name       string
		edit       func(string) string
		configYAML string
		want       string
	}{
		{"unknown field", func(s string) string {
			return strings.Replace(s, "node:\n", "node:\n  colour: blue\n", 1)
		}, "", `unknown field "colour"`},
		{"unimplemented field", func(s string) string {
			return strings.Replace(s, "node:\n", "layered_runtime: {layers: [{name: static, static_layer: {}}]}\nnode:\n", 1)
		}, "", "field layered_runtime is not implemented"},
		{"unimplemented cluster field", func(s string) string {
			return strings.Replace(s, "    type: STRICT_DNS\n", "    type: STRICT_DNS\n    respect_dns_ttl: true\n", 1)
		}, "", "field static_resources.clusters.respect_dns_ttl is not implemented"},
		{"unimplemented cluster type", func(s string) string {
			return strings.Replace(s, "    type: STRICT_DNS\n", "    type: LOGICAL_DNS\n", 1)
		}, "", "value LOGICAL_DNS is not implemented"},
		{"unimplemented typed config field", func(s string) string {
			return strings.Replace(s, "          stat_prefix: envoy-health\n", "          stat_prefix: envoy-health\n          generate_request_id: false\n", 1)
		}, "", "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager: field generate_request_id is not implemented"},
		{"unknown field in --config-yaml", nil, `{"node": {"metdata": {}}}`, `unknown field "metdata"`},
		{"unimplemented in --config-yaml", nil, `{"stats_flush_interval": "5s"}`, "field stats_flush_interval is not implemented"},
		{"invalid", func(s string) string {
			return strings.Replace(s, "    connect_timeout: 1s\n", "    connect_timeout: -1s\n", 1)
		}, "", "ConnectTimeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			args := ce.install(t, root)
			cl, err := ParseCommandLine(args)
			must(t, err)
			if c.edit != nil {
				b, err := os.ReadFile(cl.ConfigPath)
				must(t, err)
				edited := c.edit(string(b))
				if edited == string(b) {
					t.Fatal("edit changed nothing")
				}
				must(t, os.WriteFile(cl.ConfigPath, []byte(edited), 0o644))
			}
			cl.ConfigYAML = c.configYAML
			_, err = BootstrapOptions(cl)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	// File formats: Envoy's choice by extension; binary and text protos are not read here.
	if _, err := LoadBootstrap(filepath.Join(t.TempDir(), "b.pb_text"), ""); err == nil || !strings.Contains(err.Error(), "only YAML") {
		t.Errorf("a .pb_text bootstrap: %v", err)
	}
	js := filepath.Join(t.TempDir(), "b.json")
	must(t, os.WriteFile(js, []byte(`{"node": {"id": "n", "cluster": "c"}}`), 0o644))
	if b, err := LoadBootstrap(js, `{"node": {"id": "m"}}`); err != nil || b.GetNode().GetId() != "m" || b.GetNode().GetCluster() != "c" {
		t.Errorf("JSON bootstrap merged with --config-yaml: %v %v", b, err)
	}
}

// TestParseCommandLine: Envoy's arguments as the chart writes them, and refusals.
func TestParseCommandLine(t *testing.T) {
	cl, err := ParseCommandLine([]string{"-c", "/b.yaml", "--service-node=n", "-l", "debug", "--disable-hot-restart"})
	if err != nil || cl.ConfigPath != "/b.yaml" || cl.ServiceNode != "n" || cl.LogLevel.String() != "DEBUG" {
		t.Errorf("%+v %v", cl, err)
	}
	for _, bad := range [][]string{{"--concurrency", "2"}, {"-x"}, {"stray"}, {"--log-level", "loud"}, {"-c"}, {"-c", "a", "--config-path", "b"}, {"--disable-hot-restart=yes"},
		{"--drain-time-s", "ten"}, {"--drain-time-s", "-1"}, {"--drain-time-s", "4294967296"}, {"--drain-time-s"}, {"--drain-time-s", "1", "--drain-time-s=2"},
		{"--envoy-version", "1.35"}, {"--envoy-version", "1.41.0"}, {"--envoy-version=2.0"}, {"--envoy-version", "latest"}} {
		if _, err := ParseCommandLine(bad); err == nil || !strings.Contains(err.Error(), "PARSE ERROR") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	// The stand-in's own --envoy-version reaches the data plane's options.
	ce := renderChartEnvoy(t, map[string]any{})
	cl, err = ParseCommandLine(append(ce.install(t, t.TempDir()), "--envoy-version", "1.37.6"))
	must(t, err)
	if o, err := BootstrapOptions(cl); err != nil || o.EnvoyVersion != "1.37.6" {
		t.Errorf("--envoy-version 1.37.6: options' %q, %v", o.EnvoyVersion, err)
	}
}

// TestParseCommandLineDrain: --drain-time-s and --drain-strategy (Envoy's defaults 600 s and
// gradual), and an unknown strategy refused after parsing as Envoy's OptionsImpl does; the
// bootstrap's options carry them to the data plane.
func TestParseCommandLineDrain(t *testing.T) {
	cl, err := ParseCommandLine([]string{"-c", "/b.yaml"})
	if err != nil || cl.DrainTime != 600*time.Second || cl.DrainStrategy != DrainGradual {
		t.Errorf("defaults: %v %v %v", cl.DrainTime, cl.DrainStrategy, err)
	}
	cl, err = ParseCommandLine([]string{"-c", "/b.yaml", "--drain-time-s", "45", "--drain-strategy=immediate"})
	if err != nil || cl.DrainTime != 45*time.Second || cl.DrainStrategy != DrainImmediate {
		t.Errorf("set: %v %v %v", cl.DrainTime, cl.DrainStrategy, err)
	}
	cl, err = ParseCommandLine([]string{"--drain-time-s=0", "--drain-strategy", "gradual"})
	if err != nil || cl.DrainTime != 0 || cl.DrainStrategy != DrainGradual {
		t.Errorf("zero: %v %v %v", cl.DrainTime, cl.DrainStrategy, err)
	}
	for _, bad := range []string{"Immediate", "fast", ""} {
		_, err := ParseCommandLine([]string{"--drain-strategy", bad})
		if err == nil || err.Error() != "error: unknown drain-strategy '"+bad+"'" {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := ParseCommandLine([]string{"--drain-strategy"}); err == nil || !strings.Contains(err.Error(), "Missing a value") {
		t.Errorf("no value: %v", err)
	}
	ce := renderChartEnvoy(t, map[string]any{})
	cl, err = ParseCommandLine(ce.install(t, t.TempDir()))
	must(t, err)
	cl.DrainTime, cl.DrainStrategy = 7*time.Second, DrainImmediate
	o, err := BootstrapOptions(cl)
	if err != nil {
		t.Fatal(err)
	}
	if o.Drain == nil || *o.Drain != (DrainOptions{Time: 7 * time.Second, Strategy: DrainImmediate}) {
		t.Errorf("options' drain %+v", o.Drain)
	}
}

// kubeletDir lays out a Secret volume as the kubelet's atomic writer does: the files in a
// timestamped directory, ..data pointing at it, and each name a symlink through ..data.
func kubeletDir(t *testing.T, dir, from string) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755))
	swapData(t, dir, from, "..2026_01_01_00_00_00.1")
	for _, n := range []string{"tls.crt", "tls.key", "ca.crt"} {
		must(t, os.Symlink(filepath.Join("..data", n), filepath.Join(dir, n)))
	}
}

// swapData is the kubelet's update: a new timestamped directory, a ..data_tmp symlink to it
// renamed over ..data.
func swapData(t *testing.T, dir, from, ts string) {
	t.Helper()
	must(t, os.Mkdir(filepath.Join(dir, ts), 0o755))
	for _, n := range []string{"tls.crt", "tls.key", "ca.crt"} {
		b, err := os.ReadFile(filepath.Join(from, n))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, ts, n), b, 0o600))
	}
	must(t, os.Symlink(ts, filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
}

func freePort(t *testing.T) int {
	t.Helper()
	return testutil.MustFreePort(t)
}

// TestChartBootstrapRealTLS: a stand-in started from the chart's rendered bootstrap and
// arguments (sidecar mode: the --config-yaml metadata too) reaches an ADS server over mutual
// TLS with certificates of the control plane's CA (xds-server's role certificate, as
// `xds-server certgen` makes them), through the STRICT_DNS cluster's name, ACKs, and answers
// /ready and /stats/prometheus on its health listener. Then the kubelet swaps ..data to a
// renewed certificate and the name moves to another address: the next connection presents
// the renewed certificate.
func TestChartBootstrapRealTLS(t *testing.T) {
	pki := cptlstest.New(t, t.TempDir())
	adminPort, xdsPort := freePort(t), freePort(t)
	vals := map[string]any{"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false},
		"envoy":     map[string]any{"adminPort": adminPort},
		"xdsServer": map[string]any{"port": xdsPort}}
	ce := renderChartEnvoy(t, vals)
	root := t.TempDir()
	args := ce.install(t, root)
	tlsDir := filepath.Join(root, "etc", "kube-mvp", "xds-tls")
	kubeletDir(t, tlsDir, pki.Dir(cptls.RoleEnvoySidecar))

	// Two ADS servers on one port, 127.0.0.1 and 127.0.0.2: the Service's name points at the
	// first, then at the second.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	snap, err := cachev3.NewSnapshot("v1", map[resource.Type][]types.Resource{resource.ListenerType: {}, resource.ClusterType: {}})
	must(t, err)
	must(t, cache.SetSnapshot(ctx, chartPod, snap))
	type seen struct{ server, serial string }
	var mu sync.Mutex
	var streams []seen
	var nodes []string // id/cluster/local apiserver of each stream's first request
	serverCreds, err := cptls.Load(pki.Files(cptls.RoleXDSServer), cptls.RoleXDSServer, nil)
	must(t, err)
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		ip := ip
		srv := serverv3.NewServer(ctx, cache, serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			if n := req.GetNode(); n != nil {
				mu.Lock()
				nodes = append(nodes, n.GetId()+"/"+n.GetCluster()+"/"+n.GetMetadata().GetFields()[localAPIServerKey].GetStringValue())
				mu.Unlock()
			}
			return nil
		}, StreamOpenFunc: func(sctx context.Context, _ int64, _ string) error {
			p, _ := peer.FromContext(sctx)
			info, _ := p.AuthInfo.(credentials.TLSInfo)
			s := seen{server: ip}
			if len(info.State.PeerCertificates) > 0 {
				s.serial = info.State.PeerCertificates[0].SerialNumber.String()
			}
			mu.Lock()
			streams = append(streams, s)
			mu.Unlock()
			return nil
		}})
		g := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverCreds.ServerConfig())))
		discovery.RegisterAggregatedDiscoveryServiceServer(g, srv)
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(xdsPort)))
		must(t, err)
		go func() { _ = g.Serve(ln) }()
		defer g.Stop()
	}
	var dnsMu sync.Mutex
	answer := []string{"127.0.0.1"}
	cl, err := ParseCommandLine(args)
	must(t, err)
	o, err := BootstrapOptions(cl)
	must(t, err)
	o.Logger = testLogger(t)
	o.ListenerAddress = map[string]string{"envoy-health": "127.0.0.1:0"}
	o.LookupHost = func(_ context.Context, host string) ([]string, error) {
		if host != ce.xds {
			return nil, fmt.Errorf("no such host %s", host)
		}
		dnsMu.Lock()
		defer dnsMu.Unlock()
		return append([]string(nil), answer...), nil
	}
	dp, err := Start(ctx, o)
	must(t, err)
	defer dp.Close()

	health := "http://" + dp.HealthListenerAddr()
	if code, body := get(t, health+"/ready"); code != http.StatusServiceUnavailable && code != http.StatusOK {
		t.Errorf("/ready before the configuration: %d %q", code, body)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	must(t, dp.WaitReady(wctx))
	if code, body := get(t, health+"/ready"); code != http.StatusOK || body != "LIVE\n" {
		t.Errorf("/ready: %d %q, want 200 LIVE", code, body)
	}
	if code, body := get(t, health+"/stats/prometheus"); code != http.StatusOK || !strings.Contains(body, "# TYPE envoy_http_downstream_rq_active gauge\n") ||
		!strings.Contains(body, "\nenvoy_http_downstream_rq_active{envoy_http_conn_manager_prefix=\"envoy-health\"} 1\n") {
		t.Errorf("/stats/prometheus: %d %q", code, body)
	}
	// The admin's /drain_listeners is not routed by the health listener (exact paths, GET).
	if res, err := http.Post(health+"/drain_listeners?graceful", "", nil); err != nil || res.StatusCode != http.StatusNotFound {
		t.Errorf("POST /drain_listeners on the health listener: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	if dp.drain.isDraining() {
		t.Error("the health listener started a drain")
	}
	for _, path := range []string{"/config_dump", "/clusters", "/readyz"} {
		if code, _ := get(t, health+path); code != http.StatusNotFound {
			t.Errorf("%s through the health listener: %d, want 404 (no route)", path, code)
		}
	}
	if resp, err := http.Post(health+"/ready", "text/plain", nil); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST /ready: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	firstSerial := serial(t, filepath.Join(tlsDir, "tls.crt"))
	mu.Lock()
	if len(streams) == 0 || streams[0].server != "127.0.0.1" || streams[0].serial != firstSerial {
		t.Errorf("streams %+v, want the first on 127.0.0.1 with certificate %s", streams, firstSerial)
	}
	if want := chartPod + "/kube-mvp/" + chartNode; len(nodes) == 0 || nodes[0] != want {
		t.Errorf("nodes %q, want %s", nodes, want)
	}
	mu.Unlock()
	if n := dp.NACKs(); len(n) > 0 {
		t.Errorf("NACKs: %q", n)
	}

	// Renewal: the same CA, a new certificate, swapped in as the kubelet does.
	policy := certgen.DefaultPolicy()
	policy.CertLifetime = 30 * 24 * time.Hour
	renewed, _, err := certgen.Renew(time.Now(), pki.State, []certgen.Spec{{Role: cptls.RoleEnvoySidecar}}, policy)
	must(t, err)
	renewedDir := t.TempDir()
	must(t, cptlstest.WriteLeaf(renewedDir, renewed.Leaves[cptls.RoleEnvoySidecar]))
	swapData(t, tlsDir, renewedDir, "..2026_01_02_00_00_00.2")
	secondSerial := serial(t, filepath.Join(tlsDir, "tls.crt"))
	if secondSerial == firstSerial {
		t.Fatal("the renewal did not change the certificate")
	}
	dnsMu.Lock()
	answer = []string{"127.0.0.2"}
	dnsMu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		last := streams[len(streams)-1]
		mu.Unlock()
		if last.server == "127.0.0.2" {
			if last.serial != secondSerial {
				t.Errorf("the connection after the swap presented %s, want the renewed %s", last.serial, secondSerial)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream to 127.0.0.2 after the DNS change: %+v", streams)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func serial(t *testing.T, certFile string) string {
	t.Helper()
	b, err := os.ReadFile(certFile)
	must(t, err)
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	must(t, err)
	return c.SerialNumber.String()
}

// TestUnknownDynamicFields: a resource with a field this build does not know (configuration
// for a newer Envoy) is refused with --reject-unknown-dynamic-fields and counted otherwise;
// inside a typed config too.
func TestUnknownDynamicFields(t *testing.T) {
	hcm := &hcmv3.HttpConnectionManager{StatPrefix: "x"}
	hcm.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9999, protowire.VarintType), 1))
	l := &listenerv3.Listener{Name: "l", FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
		Name: "hcm", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)}}}}}}
	strict := &DataPlane{opts: Options{RejectUnknownDynamicFields: true}, stats: newStats(), log: testLogger(t)}
	err := strict.checkUnknownFields(l)
	if err == nil || !strings.Contains(err.Error(), "HttpConnectionManager with unknown field set {9999}) has unknown fields") {
		t.Errorf("strict: %v", err)
	}
	lax := &DataPlane{stats: newStats(), log: testLogger(t)}
	if err := lax.checkUnknownFields(l); err != nil || lax.Stat("server.dynamic_unknown_fields") != 1 {
		t.Errorf("without the flag: %v, counted %d", err, lax.Stat("server.dynamic_unknown_fields"))
	}
	if err := strict.checkUnknownFields(&listenerv3.Listener{Name: "clean"}); err != nil {
		t.Error(err)
	}
}
