package pipeline_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/makebeforebreak"
	"github.com/kube-mvp/kube-mvp/internal/pipeline"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// The fixtures' apiservers: all-equal has every one serve batch/v1, batch-off not cp-b.
const (
	cpA       = "apiserver-tqsyvnc7rs47fayzipsuqpfg4m"
	cpAAddr   = "127.0.0.1:6443"
	batchSet  = "kube-apiservers-only-cp-a+cp-c"
	frontSets = "kube-apiservers/front-proxy"
)

var jobs = topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}

// TestChain runs the whole chain in one process: the fixtures' objects are built into
// topologies and given to a Pipeline on a fake clock; a real ADS client and a real table
// follower (as extproc runs it) read what comes out over gRPC. A new serving set reaches
// Envoy at once and extproc's table narrowed, whole only after the table delay; an
// apiserver that extproc's proxy certificate report calls dangerous leaves the front-proxy
// clusters.
func TestChain(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	log := slog.New(slog.DiscardHandler)
	clock := clocktesting.NewFakeClock(fixtures.Now)
	reg := prometheus.NewRegistry()
	pl := pipeline.New(pipeline.Options{
		Snapshot: snapshot.Config{ExtProcAddress: "unix:/run/kube-mvp/extproc.sock", Secrets: snapshot.SecretFiles{
			ProxyClientCert: "/p/tls.crt", ProxyClientKey: "/p/tls.key", PeerCA: "/peer/ca.crt",
		}},
		MakeBeforeBreak: makebeforebreak.Options{TableDelay: 2 * time.Second, Linger: 30 * time.Second, Clock: clock},
		Log:             log, Registerer: reg,
	})
	conn := serveInProcess(t, ctx, pl)
	tables := follow(ctx, conn)
	envoy := subscribe(t, ctx, conn)

	pl.OnTopology(fixtures.Topology(t, "all-equal"))
	envoy.await(t, ctx, "the first configuration: batch/v1 at line rate", func(s envoyState) error {
		if s.routeExtProc["batch/v1"] {
			return fmt.Errorf("route batch/v1 goes through ext_proc")
		}
		if len(s.sets[batchSet]) != 0 {
			return fmt.Errorf("serving set %s exists: %v", batchSet, s.sets[batchSet])
		}
		return nil
	})
	tables.await(t, ctx, "the first table, at once: jobs to the default cluster", func(pt *plan.Table) error {
		if r := pt.Routes[""].Lookup(jobs); r.Outcome != topology.Default || r.Cluster != contract.ClusterDefault {
			return fmt.Errorf("jobs route %+v", r)
		}
		return nil
	})

	pl.OnTopology(fixtures.Topology(t, "batch-off"))
	envoy.await(t, ctx, "the new serving set in Envoy at once", func(s envoyState) error {
		if !s.routeExtProc["batch/v1"] {
			return fmt.Errorf("route batch/v1 does not go through ext_proc")
		}
		if got := s.sets[batchSet]; !slices.Equal(got, []string{"127.0.0.1:6443", "127.0.0.3:6443"}) {
			return fmt.Errorf("serving set %s: %v", batchSet, got)
		}
		return nil
	})
	tables.await(t, ctx, "a narrowed table at once: jobs to a known set of one", func(pt *plan.Table) error {
		if r := pt.Routes[""].Lookup(jobs); r.Outcome != topology.Subset || (r.Cluster != "kube-apiservers-only-cp-a" && r.Cluster != "kube-apiservers-only-cp-c") {
			return fmt.Errorf("jobs route %+v", r)
		}
		return nil
	})
	clock.Step(2 * time.Second)
	tables.await(t, ctx, "the whole table after the delay: jobs to the new set", func(pt *plan.Table) error {
		if r := pt.Routes[""].Lookup(jobs); r.Outcome != topology.Subset || r.Cluster != batchSet {
			return fmt.Errorf("jobs route %+v", r)
		}
		return nil
	})

	reason := "takes the proxy certificate as the client front-proxy-client"
	reports := []proxycert.Finding{{Target: proxycert.Target{ID: cpA, Hostname: "cp-a", Address: cpAAddr},
		Result: proxycert.Result{Verdict: proxycert.Refused, Dangerous: true, Reason: reason}}}
	go tablestream.ReportProxyChecks(ctx, conn, "extproc-1", log, func() ([]proxycert.Finding, <-chan struct{}) { return reports, nil })
	envoy.await(t, ctx, "cp-a out of the front-proxy cluster", func(s envoyState) error {
		if got := s.endpoints[frontSets]; len(got) != 2 || slices.Contains(got, cpAAddr) {
			return fmt.Errorf("%s endpoints %v", frontSets, got)
		}
		if !slices.Contains(s.endpoints[contract.ClusterDefault], cpAAddr) {
			return fmt.Errorf("%s endpoints %v lack cp-a", contract.ClusterDefault, s.endpoints[contract.ClusterDefault])
		}
		return nil
	})
	tables.await(t, ctx, "cp-a dangerous in the table", func(pt *plan.Table) error {
		if s, _ := pt.Server(cpA); s.Dangerous != reason {
			return fmt.Errorf("cp-a dangerous %q", s.Dangerous)
		}
		return nil
	})
	for name, want := range map[string]float64{"kube_mvp_xds_dangerous_apiservers": 1, "kube_mvp_xds_topology_updates_total": 2} {
		if got := valueOf(t, reg, name); got != want {
			t.Errorf("%s %v, want %v", name, got, want)
		}
	}
}

// serveInProcess serves pl's gRPC services on a loopback port and returns a client of them.
func serveInProcess(t *testing.T, ctx context.Context, pl *pipeline.Pipeline) *grpc.ClientConn {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pl.Register(ctx, g)
	go g.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// latest keeps the newest value a stream received, for await to check.
type latest[T any] struct {
	mu      sync.Mutex
	v       T
	ok      bool
	changed chan struct{}
}

func newLatest[T any]() *latest[T] { return &latest[T]{changed: make(chan struct{}, 1)} }

func (l *latest[T]) set(v T) {
	l.mu.Lock()
	l.v, l.ok = v, true
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

func (l *latest[T]) await(t *testing.T, ctx context.Context, what string, check func(T) error) {
	t.Helper()
	testutil.WaitFor(t, ctx, 10*time.Second, what, func() error {
		l.mu.Lock()
		v, ok := l.v, l.ok
		l.mu.Unlock()
		if !ok {
			return fmt.Errorf("nothing received yet")
		}
		return check(v)
	})
}

// follow receives the routing table as extproc does.
func follow(ctx context.Context, conn *grpc.ClientConn) *latest[*plan.Table] {
	l := newLatest[*plan.Table]()
	go tablestream.Follow(ctx, conn, "extproc-1", func(pt *plan.Table, _ string) { l.set(pt) }, tablestream.FollowOptions{Log: slog.New(slog.DiscardHandler)})
	return l
}

// envoyState is what the ADS client holds: each route's ext_proc engagement by route name,
// each cluster's endpoint addresses, and each serving set's members (the serving-sets
// cluster's endpoints that list it).
type envoyState struct {
	routeExtProc map[string]bool
	endpoints    map[string][]string
	sets         map[string][]string
}

// subscribe opens one ADS stream as a front-proxy Envoy, asks for every route
// configuration and every cluster's endpoints, and ACKs everything.
func subscribe(t *testing.T, ctx context.Context, conn *grpc.ClientConn) *latest[envoyState] {
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: "pipeline-test", Cluster: "test"}
	for _, typ := range []string{resourcev3.RouteType, resourcev3.EndpointType} {
		if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
	}
	l := newLatest[envoyState]()
	go func() {
		st := envoyState{}
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			switch resp.TypeUrl {
			case resourcev3.RouteType:
				st.routeExtProc = map[string]bool{}
				for _, a := range resp.Resources {
					var rc route.RouteConfiguration
					if a.UnmarshalTo(&rc) == nil {
						for _, vh := range rc.VirtualHosts {
							for _, r := range vh.Routes {
								_, disabled := r.TypedPerFilterConfig["envoy.filters.http.ext_proc"]
								st.routeExtProc[r.Name] = !disabled
							}
						}
					}
				}
			case resourcev3.EndpointType:
				st.endpoints, st.sets = map[string][]string{}, map[string][]string{}
				for _, a := range resp.Resources {
					var cla endpoint.ClusterLoadAssignment
					if a.UnmarshalTo(&cla) != nil {
						continue
					}
					for _, le := range cla.Endpoints {
						for _, lb := range le.LbEndpoints {
							sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
							addr := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
							st.endpoints[cla.ClusterName] = append(st.endpoints[cla.ClusterName], addr)
							if cla.ClusterName == contract.ClusterServingSets {
								for _, v := range lb.GetMetadata().GetFilterMetadata()[contract.MetadataNamespaceLB].GetFields()[contract.LBSetKey].GetListValue().GetValues() {
									st.sets[v.GetStringValue()] = append(st.sets[v.GetStringValue()], addr)
								}
							}
						}
					}
				}
				for _, addrs := range st.sets {
					slices.Sort(addrs)
				}
			}
			l.set(st)
			stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}) //nolint:errcheck // a failed stream ends Recv
		}
	}()
	return l
}

// valueOf is the value of reg's metric name, a gauge or counter without labels.
func valueOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
