package snapshot_test

import (
	"os"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// TestClusterResourcesIgnoreMembership: nothing in an apiserver cluster's CDS resource
// changes with who is inside it or what role it plays, because Envoy rebuilds a cluster
// whose resource changed (warm-up again, health and outlier state lost, connection pools
// drained). Every fixture: all caller clusters are the same resource but for their name,
// and so are all front-proxy variants. And an apiserver leaving (its Lease gone) changes the
// default cluster's endpoints, not the cluster.
func TestClusterResourcesIgnoreMembership(t *testing.T) {
	apiserverClusters := func(res *snapshot.Resources) map[string]*clusterv3.Cluster {
		out := map[string]*clusterv3.Cluster{}
		for _, r := range res.Clusters {
			if c := r.(*clusterv3.Cluster); c.GetName() != snapshot.ExtProcClusterName {
				out[c.GetName()] = c
			}
		}
		return out
	}
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			res, err := snapshot.Build(mustPlan(t, loadCase(t, name)), testConfig())
			if err != nil {
				t.Fatal(err)
			}
			// One reference per kind: as named or front-proxy variant, HTTP/2 or HTTP/1.1.
			type kind struct{ proxyCert, http1 bool }
			refs := map[kind]*clusterv3.Cluster{}
			for n, c := range apiserverClusters(res) {
				cn := contract.ParseClusterName(n)
				if serving := cn.Base == contract.ClusterServingSets; serving != (c.GetLbSubsetConfig() != nil) {
					t.Errorf("cluster %s: subset load balancing %v", n, c.GetLbSubsetConfig())
				}
				k := kind{cn.ProxyCert, cn.HTTP1}
				ref := refs[k]
				if ref == nil {
					refs[k] = c
					continue
				}
				// The serving-sets cluster and its variant differ from the others in their
				// subset load balancing only.
				x, y := proto.Clone(c).(*clusterv3.Cluster), proto.Clone(ref).(*clusterv3.Cluster)
				x.Name, x.LbSubsetConfig, y.LbSubsetConfig = y.GetName(), nil, nil
				if !proto.Equal(x, y) {
					t.Errorf("cluster %s differs from %s in more than its name", n, ref.GetName())
				}
			}
		})
	}

	raw, err := os.ReadFile(fixtures.Path("all-equal"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := objects.DecodeFixture(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	build := func(o objects.Objects) *snapshot.Resources {
		topo, warnings := objects.Build(o, objects.Options{})
		if topo == nil {
			t.Fatalf("no topology: %v", warnings)
		}
		res, err := snapshot.Build(mustPlan(t, topo), testConfig())
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	before := build(objs)
	if len(objs.Leases) < 2 {
		t.Fatalf("all-equal has %d Leases, want several", len(objs.Leases))
	}
	fewer := objs
	fewer.Leases = objs.Leases[1:]
	after := build(fewer)
	endpoints := func(res *snapshot.Resources, cluster string) *endpointv3.ClusterLoadAssignment {
		for _, r := range res.Endpoints {
			if c := r.(*endpointv3.ClusterLoadAssignment); c.GetClusterName() == cluster {
				return c
			}
		}
		t.Fatalf("no endpoints of %s", cluster)
		return nil
	}
	for _, n := range []string{plan.DefaultCluster(""), contract.ClusterName{Base: plan.DefaultCluster(""), ProxyCert: true}.String()} {
		b, a := apiserverClusters(before)[n], apiserverClusters(after)[n]
		if b == nil || a == nil {
			t.Fatalf("cluster %s missing before (%v) or after (%v) an apiserver left", n, b != nil, a != nil)
		}
		if !proto.Equal(a, b) {
			t.Errorf("cluster %s changed when an apiserver left", n)
		}
		if proto.Equal(endpoints(before, n), endpoints(after, n)) {
			t.Errorf("endpoints of %s did not change when an apiserver left: the test proves nothing", n)
		}
	}
}

// TestHTTP2WindowsCoverEveryStream: every HTTP/2 the configuration speaks, to an apiserver
// (each HTTP/2 cluster) and to clients (the listener), sets its windows and stream limit
// explicitly, within Envoy's bounds (65535..2^31-1), and with stream window × streams ≤
// connection window, so that streams stalled by slow readers cannot hold the whole
// connection window (clusters.go, the flow-control constants).
func TestHTTP2WindowsCoverEveryStream(t *testing.T) {
	check := func(t *testing.T, what string, o *corev3.Http2ProtocolOptions) {
		t.Helper()
		streams, sw, cw := o.GetMaxConcurrentStreams(), o.GetInitialStreamWindowSize(), o.GetInitialConnectionWindowSize()
		if streams == nil || sw == nil || cw == nil {
			t.Fatalf("%s: max_concurrent_streams %v, initial_stream_window_size %v, initial_connection_window_size %v: all must be set", what, streams, sw, cw)
		}
		for _, w := range []uint32{sw.GetValue(), cw.GetValue()} {
			if w < 65535 || w > 1<<31-1 {
				t.Errorf("%s: window %d outside Envoy's 65535..2147483647", what, w)
			}
		}
		if uint64(streams.GetValue())*uint64(sw.GetValue()) > uint64(cw.GetValue()) {
			t.Errorf("%s: %d streams × %d > connection window %d", what, streams.GetValue(), sw.GetValue(), cw.GetValue())
		}
	}
	res, err := snapshot.Build(mustPlan(t, loadCase(t, "all-equal")), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	h2 := 0
	for _, r := range res.Clusters {
		c := r.(*clusterv3.Cluster)
		if c.GetName() == snapshot.ExtProcClusterName {
			continue
		}
		var o httpv3.HttpProtocolOptions
		for _, a := range c.GetTypedExtensionProtocolOptions() {
			if err := a.UnmarshalTo(&o); err != nil {
				t.Fatal(err)
			}
		}
		if h := o.GetExplicitHttpConfig().GetHttp2ProtocolOptions(); h != nil {
			h2++
			check(t, "cluster "+c.GetName(), h)
		}
	}
	if h2 == 0 {
		t.Fatal("no HTTP/2 apiserver cluster")
	}
	var hcm hcmv3.HttpConnectionManager
	if err := res.Listeners[0].(*listenerv3.Listener).GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	check(t, "listener", hcm.GetHttp2ProtocolOptions())
}
