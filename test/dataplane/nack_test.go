package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// buildResources translates a fixture with test secrets and an extproc on a unix socket.
func buildResources(t *testing.T, fixture string) *snapshot.Resources {
	t.Helper()
	objs, err := objects.LoadFixture(fixtures.Path(fixture))
	if err != nil {
		t.Fatal(err)
	}
	topo, _ := objects.Build(objs, objects.Options{})
	pl, err := plan.Build(topo)
	if err != nil {
		t.Fatal(err)
	}
	p := newPKI(t)
	res, err := snapshot.Build(pl, snapshot.Config{ExtProcAddress: "unix:/nonexistent/extproc.sock", Secrets: p.files(t)})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func hcmOf(t *testing.T, l *listenerv3.Listener) *hcmv3.HttpConnectionManager {
	h := &hcmv3.HttpConnectionManager{}
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(h); err != nil {
		t.Fatal(err)
	}
	return h
}

func setHCM(t *testing.T, l *listenerv3.Listener, h *hcmv3.HttpConnectionManager) {
	a, err := anypb.New(h)
	if err != nil {
		t.Fatal(err)
	}
	l.GetFilterChains()[0].GetFilters()[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
}

// TestNACKUnimplemented: a resource using a field or extension the data plane does not
// implement is rejected with an error naming it, and the previous configuration (none here)
// stays.
func TestNACKUnimplemented(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(t *testing.T, r *snapshot.Resources)
		want   string
	}{
		{"cluster field", func(t *testing.T, r *snapshot.Resources) {
			r.Clusters[0].(*clusterv3.Cluster).DnsRefreshRate = durationpb.New(time.Second)
		}, "envoy.config.cluster.v3.Cluster: field dns_refresh_rate is not implemented"},
		{"cluster lb policy value", func(t *testing.T, r *snapshot.Resources) {
			r.Clusters[0].(*clusterv3.Cluster).LbPolicy = clusterv3.Cluster_RING_HASH
		}, "field lb_policy: value RING_HASH is not implemented"},
		{"field inside a typed_config", func(t *testing.T, r *snapshot.Resources) {
			l := r.Listeners[0].(*listenerv3.Listener)
			h := hcmOf(t, l)
			router := &routerv3.Router{}
			last := h.HttpFilters[len(h.HttpFilters)-1]
			if err := last.GetTypedConfig().UnmarshalTo(router); err != nil {
				t.Fatal(err)
			}
			router.StartChildSpan = true
			last.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, router)}
			setHCM(t, l, h)
		}, "envoy.extensions.filters.http.router.v3.Router: field start_child_span is not implemented"},
		{"unknown typed_config", func(t *testing.T, r *snapshot.Resources) {
			l := r.Listeners[0].(*listenerv3.Listener)
			h := hcmOf(t, l)
			h.HttpFilters = append([]*hcmv3.HttpFilter{{Name: "envoy.filters.http.buffer",
				ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, wrapperspb.String("x"))}}}, h.HttpFilters...)
			setHCM(t, l, h)
		}, "typed_config @type type.googleapis.com/google.protobuf.StringValue is not implemented"},
		{"route field", func(t *testing.T, r *snapshot.Resources) {
			firstForwarding(r).PrefixRewrite = "/x"
		}, "field virtual_hosts.routes.route.prefix_rewrite is not implemented"},
		// Path normalization, slash merging and unescaping change the routed and forwarded
		// :path; none is implemented.
		{"normalize_path", func(t *testing.T, r *snapshot.Resources) {
			l := r.Listeners[0].(*listenerv3.Listener)
			h := hcmOf(t, l)
			h.NormalizePath = wrapperspb.Bool(true)
			setHCM(t, l, h)
		}, "field normalize_path: true is not implemented"},
		{"merge_slashes", func(t *testing.T, r *snapshot.Resources) {
			l := r.Listeners[0].(*listenerv3.Listener)
			h := hcmOf(t, l)
			h.MergeSlashes = true
			setHCM(t, l, h)
		}, "field merge_slashes is not implemented"},
		{"escaped slashes unescaped", func(t *testing.T, r *snapshot.Resources) {
			l := r.Listeners[0].(*listenerv3.Listener)
			h := hcmOf(t, l)
			h.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD
			setHCM(t, l, h)
		}, "field path_with_escaped_slashes_action: value UNESCAPE_AND_FORWARD is not implemented"},
		{"path_separated_prefix ending in /", func(t *testing.T, r *snapshot.Resources) {
			rc := r.Routes[0].(*routev3.RouteConfiguration)
			for _, rt := range rc.VirtualHosts[0].Routes {
				if p, ok := rt.Match.PathSpecifier.(*routev3.RouteMatch_PathSeparatedPrefix); ok {
					p.PathSeparatedPrefix += "/"
				}
			}
		}, `PathSeparatedPrefix: value does not match regex pattern`},
		{"retry condition", func(t *testing.T, r *snapshot.Resources) {
			firstRetryPolicy(r).RetryOn = "5xx"
		}, `retry condition "5xx" is not implemented`},
		// Envoy retries 425 apart (only a request that did not arrive as early data, at
		// once, without early data): not implemented.
		{"retriable status 425", func(t *testing.T, r *snapshot.Resources) {
			rp := firstRetryPolicy(r)
			rp.RetryOn += ",retriable-status-codes"
			rp.RetriableStatusCodes = []uint32{503, 425}
		}, `retriable status 425 (Too Early) is not implemented`},
		// Envoy would pick such a host's transport socket from the cluster's
		// transport_socket_matches; this data plane always uses the cluster's own for requests.
		{"endpoint transport socket match", func(t *testing.T, r *snapshot.Resources) {
			cla := r.Endpoints[0].(*endpointv3.ClusterLoadAssignment)
			ep := proto.Clone(cla.Endpoints[0].LbEndpoints[0]).(*endpointv3.LbEndpoint)
			if ep.Metadata == nil {
				ep.Metadata = &corev3.Metadata{}
			}
			if ep.Metadata.FilterMetadata == nil {
				ep.Metadata.FilterMetadata = map[string]*structpb.Struct{}
			}
			ep.Metadata.FilterMetadata["envoy.transport_socket_match"] = &structpb.Struct{Fields: map[string]*structpb.Value{"kube-mvp": structpb.NewStringValue("health-check")}}
			cla.Endpoints[0].LbEndpoints[0] = ep
		}, "ClusterLoadAssignment \"" + "kube-apiservers\": endpoint metadata envoy.transport_socket_match is not implemented"},
		// Session resumption is modelled on or off only (listener.go); Envoy's own ticket
		// keys and session lifetime are not.
		{"session_timeout", func(t *testing.T, r *snapshot.Resources) {
			if err := editDownstreamTLS(r, func(c *tlsv3.DownstreamTlsContext) { c.SessionTimeout = durationpb.New(time.Minute) }); err != nil {
				t.Fatal(err)
			}
		}, "DownstreamTlsContext: field session_timeout is not implemented"},
		{"session_ticket_keys_sds_secret_config", func(t *testing.T, r *snapshot.Resources) {
			if err := editDownstreamTLS(r, func(c *tlsv3.DownstreamTlsContext) {
				c.SessionTicketKeysType = &tlsv3.DownstreamTlsContext_SessionTicketKeysSdsSecretConfig{SessionTicketKeysSdsSecretConfig: sdsSecretOf("ticket-keys")}
			}); err != nil {
				t.Fatal(err)
			}
		}, "DownstreamTlsContext: field session_ticket_keys_sds_secret_config is not implemented"},
		{"HCM value", func(t *testing.T, r *snapshot.Resources) {
			l := r.Listeners[0].(*listenerv3.Listener)
			h := hcmOf(t, l)
			h.StreamIdleTimeout = durationpb.New(time.Minute)
			setHCM(t, l, h)
		}, "field stream_idle_timeout: value 1m0s is not implemented"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nacks := mutatedNACKs(t, tc.mutate)
			if len(nacks) != 1 || !strings.Contains(nacks[0], tc.want) {
				t.Fatalf("NACKs %q, want one containing %q", nacks, tc.want)
			}
		})
	}
}

func sdsSecretOf(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestNACKOverADS: over ADS, the NACK carries the error (error_detail) and the last accepted
// version; a corrected snapshot is then ACKed.
func TestNACKOverADS(t *testing.T) {
	good := buildResources(t, "batch-off")
	bad := buildResources(t, "batch-off")
	bad.Clusters[0].(*clusterv3.Cluster).DnsRefreshRate = durationpb.New(time.Second)

	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	snap := func(r *snapshot.Resources, version string) *cachev3.Snapshot {
		s, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{
			resource.ListenerType: r.Listeners, resource.RouteType: r.Routes, resource.ClusterType: r.Clusters,
			resource.EndpointType: r.Endpoints, resource.SecretType: r.Secrets})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cache.SetSnapshot(ctx, "node", snap(bad, "bad")); err != nil {
		t.Fatal(err)
	}
	// The first NACK's detail (the cache answers a NACK with the same snapshot: NACKs repeat).
	nacked := make(chan string, 1)
	srv := serverv3.NewServer(ctx, cache, serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
		if req.GetErrorDetail() != nil && req.GetTypeUrl() == resource.ClusterType {
			select {
			case nacked <- req.GetErrorDetail().GetMessage():
			default:
			}
		}
		return nil
	}})
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()

	dp, err := Start(ctx, Options{XDSAddress: ln.Addr().String(), NodeID: "node", ListenerAddress: map[string]string{"kube-apiserver": "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	var nackDetail string
	select {
	case nackDetail = <-nacked:
	case <-time.After(10 * time.Second):
		t.Fatal("no NACK")
	}
	if !strings.Contains(nackDetail, "dns_refresh_rate") {
		t.Errorf("NACK detail %q does not name the field", nackDetail)
	}
	if v := dp.Versions()[resource.ClusterType]; v != "" {
		t.Errorf("clusters acked at %q despite the NACK", v)
	}
	if err := cache.SetSnapshot(ctx, "node", snap(good, "good")); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := dp.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	if v := dp.Versions()[resource.ClusterType]; v != "good" {
		t.Errorf("clusters version %q, want good", v)
	}
	// The admin API shows it as Envoy's does: the CDS subscription's update_rejected (each
	// repeated NACK counts), then update_success; LDS never rejected.
	if n := dp.Stat("cluster_manager.cds.update_rejected"); n == 0 {
		t.Error("cluster_manager.cds.update_rejected is 0 after a NACK")
	}
	if n := dp.Stat("cluster_manager.cds.update_success"); n == 0 {
		t.Error("cluster_manager.cds.update_success is 0 after the ACK")
	}
	if n := dp.Stat("listener_manager.lds.update_rejected"); n != 0 {
		t.Errorf("listener_manager.lds.update_rejected is %d; only clusters were refused", n)
	}
	if n := dp.Stat("listener_manager.lds.update_success"); n == 0 {
		t.Error("listener_manager.lds.update_success is 0")
	}
}

// TestGoldenConfigsAccepted: every golden output of internal/snapshot (one directory per
// case, one file per resource type) is accepted whole: the data plane implements every field
// our configuration uses. The secrets' files are the chart's layout
// (/etc/kube-mvp/<secret>/...), moved under a directory holding real ones.
func TestGoldenConfigsAccepted(t *testing.T) {
	testdata := fixtures.Dir()
	ins, err := filepath.Glob(filepath.Join(testdata, "*.in.yaml"))
	if err != nil || len(ins) == 0 {
		t.Fatalf("no golden fixtures: %v", err)
	}
	root := filepath.Dir(filepath.Dir(newPKI(t).files(t).ServingCert)) // .../serving/tls.crt
	for _, in := range ins {
		name := strings.TrimSuffix(filepath.Base(in), ".in.yaml")
		t.Run(name, func(t *testing.T) {
			// The config dump translate -o json prints, from the case's golden files.
			dump := map[string]json.RawMessage{"version": json.RawMessage(`"golden"`)}
			var all []byte
			for _, typ := range []string{"listeners", "routes", "clusters", "endpoints", "secrets"} {
				y, err := os.ReadFile(filepath.Join(testdata, name, typ+".yaml"))
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, y...)
				y = bytes.ReplaceAll(y, []byte(" /etc/kube-mvp/"), []byte(" "+root+"/"))
				js, err := yaml.YAMLToJSON(y)
				if err != nil {
					t.Fatalf("%s: %v", typ, err)
				}
				dump[typ] = js
			}
			if !bytes.Contains(all, []byte("filename: /etc/kube-mvp/")) {
				t.Fatal("the golden files refer to no secret file under /etc/kube-mvp/")
			}
			js, err := json.Marshal(dump)
			if err != nil {
				t.Fatal(err)
			}
			dp := startConfig(t, js)
			if n := dp.NACKs(); len(n) > 0 {
				t.Fatalf("NACKs: %q", n)
			}
			ctx := testutil.Context(t, 5*time.Second)
			if err := dp.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			if dp.ListenerAddr("kube-apiserver") == "" {
				t.Fatal("listener not bound")
			}
		})
	}
}

// startConfig starts a data plane on the config js, its listener on a free port, until the
// test ends.
// mutatedNACKs loads the golden batch-off configuration as mutate changes it and returns
// the NACKs.
func mutatedNACKs(t *testing.T, mutate func(*testing.T, *snapshot.Resources)) []string {
	t.Helper()
	res := buildResources(t, "batch-off")
	mutate(t, res)
	js, err := res.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return startConfig(t, js).NACKs()
}

func startConfig(t *testing.T, js []byte) *DataPlane {
	t.Helper()
	dp, err := Start(context.Background(), Options{ConfigJSON: js, ListenerAddress: map[string]string{"kube-apiserver": "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return dp
}
