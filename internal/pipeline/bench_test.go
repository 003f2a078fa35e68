package pipeline_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/pipeline"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// benchObjects is a large control plane mid-upgrade as the informers see it: 5 identity
// Leases and each apiserver's own discovery (as fetched, verified) for 400 resources in 40
// group/versions; every fourth group/version is not served by one apiserver, so there are
// subset clusters.
func benchObjects(now time.Time) objects.Objects {
	const servers, gvs, perGV = 5, 40, 10
	objs := objects.Objects{Discovery: map[string]*apidiscoveryv2.APIGroupDiscoveryList{}}
	var ids []string
	for i := range servers {
		id := objects.APIServerIDFor(fmt.Sprintf("cp-%d", i))
		ids = append(ids, id)
		renew := metav1.NewMicroTime(now)
		objs.Leases = append(objs.Leases, coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: id, Namespace: objects.IdentityLeaseNamespace,
				Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, "kubernetes.io/hostname": fmt.Sprintf("cp-%d", i)},
				Annotations: map[string]string{"kubernetes.io/peer-advertise-address": fmt.Sprintf("10.0.0.%d:6443", i+1)},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: new(id + "_holder"), RenewTime: &renew},
		})
		objs.Discovery[id] = &apidiscoveryv2.APIGroupDiscoveryList{}
	}
	for g := range gvs {
		group := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("group%d.example.io", g)}}
		v := apidiscoveryv2.APIVersionDiscovery{Version: "v1"}
		for r := range perGV {
			v.Resources = append(v.Resources, apidiscoveryv2.APIResourceDiscovery{Resource: fmt.Sprintf("things%d", r), Scope: apidiscoveryv2.ScopeNamespace, Verbs: []string{"get", "list"}})
		}
		group.Versions = []apidiscoveryv2.APIVersionDiscovery{v}
		for i, id := range ids {
			if g%4 == 0 && i == g%servers {
				continue
			}
			objs.Discovery[id].Items = append(objs.Discovery[id].Items, group)
		}
	}
	return objs
}

// BenchmarkConvergence measures how long a Lease change takes to reach an Envoy: from the
// moment the informers have the changed Lease (what the watcher's rebuild starts from) through
// objects.Build, translation, the snapshot cache and real gRPC, until an ADS client that
// subscribes and ACKs like Envoy (CDS wildcard, then EDS for the clusters it got) receives the
// new endpoints. Each iteration alternately expires and renews one apiserver's Lease, which
// changes both the clusters (serving sets) and the endpoints. Reported: p50 and p99 per
// change (goal: p99 < 100 ms).
func BenchmarkConvergence(b *testing.B) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	objs := benchObjects(now)
	opts := objects.Options{Now: now}
	var srv *xds.Server
	build := func() {
		t, errs := objects.Build(objs, opts)
		if len(errs) > 0 || t == nil {
			b.Fatalf("objects.Build: %v", errs)
		}
		e, err := plan.ForEveryEnvoy(t)
		if err != nil {
			b.Fatal(err)
		}
		srv.Update(e)
	}

	srv = xds.New(xds.Options{Translate: pipeline.Translation{Config: snapshot.Config{ListenPort: 6443}, Log: slog.New(slog.DiscardHandler)}.Snapshot, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := grpc.NewServer()
	srv.Register(ctx, g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go g.Serve(lis) //nolint:errcheck // ends with Stop
	defer g.Stop()
	build()

	edsVersions := make(chan string, 16)
	go envoyLikeClient(ctx, b, lis.Addr().String(), edsVersions)
	last := <-edsVersions

	var samples []time.Duration
	dead := metav1.NewMicroTime(now.Add(-time.Hour))
	alive := *objs.Leases[2].Spec.RenewTime
	for b.Loop() {
		start := time.Now()
		if objs.Leases[2].Spec.RenewTime.Equal(&alive) {
			objs.Leases[2].Spec.RenewTime = &dead
		} else {
			objs.Leases[2].Spec.RenewTime = &alive
		}
		build()
		timeout := time.After(10 * time.Second)
	wait:
		for {
			select {
			case v := <-edsVersions:
				if v != last {
					last = v
					break wait
				}
			case <-timeout:
				b.Fatal("the ADS client saw no new endpoints within 10s of the Lease change")
			}
		}
		samples = append(samples, time.Since(start))
	}
	slices.Sort(samples)
	pct := func(p float64) float64 {
		return float64(samples[min(len(samples)-1, int(p*float64(len(samples))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// envoyLikeClient subscribes to clusters, then to the endpoints of every cluster it was
// given, ACKs every response, and reports each endpoints version it receives.
func envoyLikeClient(ctx context.Context, b *testing.B, addr string, edsVersions chan<- string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Error(err)
		return
	}
	defer conn.Close()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		b.Error(err)
		return
	}
	node := &corev3.Node{Id: "bench-envoy"}
	send := func(req *discoveryv3.DiscoveryRequest) bool {
		req.Node = node
		return stream.Send(req) == nil
	}
	if !send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}) {
		return
	}
	var edsNames []string
	var edsVersion, edsNonce string
	for {
		resp, err := stream.Recv()
		if err != nil {
			return // the benchmark is over
		}
		switch resp.GetTypeUrl() {
		case resourcev3.ClusterType:
			var names []string
			for _, a := range resp.GetResources() {
				var c clusterv3.Cluster
				if err := a.UnmarshalTo(&c); err != nil {
					b.Error(err)
					return
				}
				if c.GetType() == clusterv3.Cluster_EDS {
					names = append(names, c.GetName())
				}
			}
			send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
			if !slices.Equal(names, edsNames) {
				edsNames = names
				send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: edsVersion, ResponseNonce: edsNonce})
			}
		case resourcev3.EndpointType:
			edsVersion, edsNonce = resp.GetVersionInfo(), resp.GetNonce()
			send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: edsNames, VersionInfo: edsVersion, ResponseNonce: edsNonce})
			select {
			case edsVersions <- edsVersion:
			case <-ctx.Done():
				return
			}
		}
	}
}
