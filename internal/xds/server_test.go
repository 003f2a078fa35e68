package xds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/makebeforebreak"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
)

// clustersOnly is a minimal translator: one cluster named after the default cluster, so the
// test sees front-proxy and sidecar nodes get different snapshots.
func clustersOnly(p *plan.Plan) (*cachev3.Snapshot, error) {
	name := p.DefaultClusterName()
	return cachev3.NewSnapshot(name+"-"+strings.Join(p.Topology.Live(), ","), map[string][]types.Resource{
		resourcev3.ClusterType: {&cluster.Cluster{Name: name}},
	})
}

// plans are the plans of tp, as xds-server makes them for Update.
func plans(t *testing.T, tp *topology.Topology) *plan.Envoys {
	t.Helper()
	e, err := plan.ForEveryEnvoy(tp)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// noMBB: make before break holds nothing back.
var noMBB makebeforebreak.Options

func topo(t *testing.T, liveB bool) *topology.Topology {
	t.Helper()
	tp, err := topology.New([]topology.APIServer{
		{ID: "apiserver-a", Hostname: "cp-a", Address: "127.0.0.1:1", Alive: true, Verified: true},
		{ID: "apiserver-b", Hostname: "cp-b", Address: "127.0.0.1:2", Alive: liveB, Verified: true},
	}, map[topology.Resource][]string{{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-a"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

type adsClient struct {
	t      *testing.T
	stream grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse]
	node   *core.Node
}

func dial(t *testing.T, ctx context.Context, addr string, node *core.Node) *adsClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &adsClient{t: t, stream: stream, node: node}
}

func (c *adsClient) send(req *discovery.DiscoveryRequest) {
	c.t.Helper()
	req.Node, req.TypeUrl = c.node, resourcev3.ClusterType
	if err := c.stream.Send(req); err != nil {
		c.t.Fatal(err)
	}
}

func (c *adsClient) recvCluster() (*discovery.DiscoveryResponse, string) {
	c.t.Helper()
	resp, err := c.stream.Recv()
	if err != nil {
		c.t.Fatal(err)
	}
	var cl cluster.Cluster
	if len(resp.Resources) != 1 || resp.Resources[0].UnmarshalTo(&cl) != nil {
		c.t.Fatalf("response: %v", resp)
	}
	return resp, cl.Name
}

func TestADSPerNodeSnapshotsAndAcks(t *testing.T) {
	ctx := testutil.Context(t, 30*time.Second)
	srv := xds.New(xds.Options{Translate: clustersOnly, MakeBeforeBreak: noMBB})
	addr := serveADS(t, ctx, srv)
	srv.Update(plans(t, topo(t, true)))

	front := dial(t, ctx, addr, &core.Node{Id: "front-1"})
	meta, _ := structpb.NewStruct(map[string]any{xds.LocalAPIServerMetadataKey: "cp-b"})
	sidecar := dial(t, ctx, addr, &core.Node{Id: "sidecar-b", Metadata: meta})

	front.send(&discovery.DiscoveryRequest{})
	resp, name := front.recvCluster()
	if name != contract.ClusterDefault {
		t.Errorf("front proxy got cluster %q", name)
	}
	front.send(&discovery.DiscoveryRequest{VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}) // ACK

	sidecar.send(&discovery.DiscoveryRequest{})
	sresp, name := sidecar.recvCluster()
	if name != contract.ClusterLocal {
		t.Errorf("sidecar got cluster %q", name)
	}
	sidecar.send(&discovery.DiscoveryRequest{ResponseNonce: sresp.Nonce, ErrorDetail: &statuspb.Status{Message: "unknown field frobnicate"}}) // NACK

	// A topology change reaches a connected node as a new version.
	srv.Update(plans(t, topo(t, false)))
	resp2, _ := front.recvCluster()
	if resp2.VersionInfo == resp.VersionInfo {
		t.Errorf("version unchanged after the topology changed: %s", resp2.VersionInfo)
	}

	var status []xdsstatus.NodeStatus
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		status = srv.Status()
		if len(status) == 2 && status[1].Types[resourcev3.ClusterType].NackError != "" && status[0].Types[resourcev3.ClusterType].Acked == resp.VersionInfo {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the ACK and the NACK: %+v", status)
		}
	}
	if status[0].NodeID != "front-1" || status[0].Streams != 1 || status[1].LocalAPIServer != "cp-b" || status[0].Nacks != 0 || status[1].Nacks != 1 {
		t.Errorf("status: %+v", status)
	}

	// The debug page shows the same.
	rec := httptest.NewRecorder()
	srv.AdminHandler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/syncz", nil))
	if !strings.Contains(rec.Body.String(), "unknown field frobnicate") {
		t.Errorf("/debug/syncz: %s", rec.Body)
	}
	srv.Update(plans(t, topo(t, true))) // with B alive again, batch/v1 jobs is A's alone
	rec = httptest.NewRecorder()
	srv.AdminHandler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/topology", nil))
	var view xds.TopologyView
	if err := json.Unmarshal(rec.Body.Bytes(), &view); err != nil {
		t.Fatal(err)
	}
	if len(view.GroupVersions) != 1 || view.GroupVersions[0].Resources[0].Cluster != "kube-apiservers-only-cp-a" {
		t.Errorf("/debug/topology: %s", rec.Body)
	}
}

func TestReadyzWaitsForTopology(t *testing.T) {
	srv := xds.New(xds.Options{Translate: clustersOnly, MakeBeforeBreak: noMBB})
	h := srv.AdminHandler(http.NotFoundHandler())
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before any topology: %d", rec.Code)
	}
	srv.Update(plans(t, topo(t, true)))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("/readyz after a topology: %d", rec.Code)
	}
}

// TestLingeringClusters: a subset cluster the topology stops naming stays in the snapshots
// for Linger (make before break), then goes; one named again stops lingering at once.
func TestLingeringClusters(t *testing.T) {
	three := func(aliveA bool) *topology.Topology {
		tp, err := topology.New([]topology.APIServer{
			{ID: "apiserver-a", Hostname: "cp-a", Address: "127.0.0.1:1", Alive: aliveA, Verified: true},
			{ID: "apiserver-b", Hostname: "cp-b", Address: "127.0.0.1:2", Alive: true, Verified: true},
			{ID: "apiserver-c", Hostname: "cp-c", Address: "127.0.0.1:3", Alive: true, Verified: true},
		}, map[topology.Resource][]string{
			{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-a", "apiserver-c"},
			{Group: "", Version: "v1", Resource: "pods"}:      {"apiserver-a", "apiserver-b", "apiserver-c"},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	// lingeringIn is what the translator is given now.
	var mu sync.Mutex
	var lastClusters []string
	clusters := func(p *plan.Plan) (*cachev3.Snapshot, error) {
		mu.Lock()
		defer mu.Unlock()
		lastClusters = nil
		for _, c := range p.Clusters {
			if c.Role == plan.RoleLingering {
				lastClusters = append(lastClusters, c.Name)
			}
		}
		return clustersOnly(p)
	}
	lingeringIn := func(*xds.Server) []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lastClusters)
	}
	clock := clocktesting.NewFakeClock(time.Unix(1000, 0))
	srv := xds.New(xds.Options{Translate: clusters, MakeBeforeBreak: makebeforebreak.Options{TableDelay: time.Second, Linger: 30 * time.Second, Clock: clock}, Log: slog.New(slog.DiscardHandler)})
	srv.Update(plans(t, three(true))) // batch → only-cp-a+cp-c
	// A connected node, so that every update is translated.
	c := dial(t, t.Context(), serveADS(t, t.Context(), srv), &core.Node{Id: "front"})
	c.send(&discovery.DiscoveryRequest{})
	c.recvCluster()
	if got := srv.Lingering(); len(got) != 0 {
		t.Fatalf("lingering %v before any change", got)
	}
	srv.Update(plans(t, three(false))) // A dead: batch → only-cp-c; only-cp-a+cp-c lingers
	if got := lingeringIn(srv); len(got) != 1 || got[0] != "kube-apiservers-only-cp-a+cp-c" {
		t.Fatalf("lingering %v, want kube-apiservers-only-cp-a+cp-c", got)
	}
	srv.Update(plans(t, three(true))) // named again: no longer lingering; only-cp-c lingers now
	if got := srv.Lingering(); len(got) != 1 || got[0] != "kube-apiservers-only-cp-c" {
		t.Fatalf("lingering %v, want kube-apiservers-only-cp-c", got)
	}
	clock.Step(30*time.Second - time.Nanosecond)
	if got := srv.Lingering(); len(got) != 1 {
		t.Fatalf("lingering %v before its time is up", got)
	}
	clock.Step(time.Nanosecond) // the server translates again, on the clock's timer
	testutil.WaitFor(t, t.Context(), 10*time.Second, "no cluster lingering", func() error {
		if got := srv.Lingering(); len(got) > 0 {
			return fmt.Errorf("still lingering: %v", got)
		}
		return nil
	})
	if got := lingeringIn(srv); len(got) != 0 {
		t.Errorf("the current topology still carries lingering clusters %v", got)
	}
}

// TestJoiningApiserver: an apiserver that becomes live stays out of the default cluster for
// JoinDelay; those live in the first topology never wait.
func TestJoiningApiserver(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Unix(1000, 0))
	srv := xds.New(xds.Options{Translate: clustersOnly, MakeBeforeBreak: makebeforebreak.Options{TableDelay: time.Second, Clock: clock}, Log: slog.New(slog.DiscardHandler)})
	srv.Update(plans(t, topo(t, true)))
	if got := srv.Joining(); len(got) != 0 {
		t.Fatalf("joining %v in the first topology", got)
	}
	srv.Update(plans(t, topo(t, false))) // B dies
	srv.Update(plans(t, topo(t, true)))  // and comes back
	if got := srv.Joining(); !slices.Equal(got, []string{"apiserver-b"}) {
		t.Fatalf("joining %v, want [apiserver-b]", got)
	}
	if j := srv.Hold().Joining; !j["apiserver-b"] {
		t.Fatalf("the translator is not told: %v", j)
	}
	clock.Step(2*time.Second - time.Nanosecond) // the join delay is two table delays
	if got := srv.Joining(); len(got) != 1 {
		t.Fatalf("joined before its time: %v", got)
	}
	clock.Step(time.Nanosecond)
	testutil.WaitFor(t, t.Context(), 10*time.Second, "no apiserver joining", func() error {
		if got := srv.Joining(); len(got) > 0 {
			return fmt.Errorf("still joining: %v", got)
		}
		return nil
	})
}

// TestLimitsAndNodeLifetime: a node's state goes with its last stream; beyond MaxNodes a new
// node is refused (and counted), a known node's second stream is not; a stream may not
// switch to another node; equal nodes share one translation.
func TestLimitsAndNodeLifetime(t *testing.T) {
	ctx := testutil.Context(t, 30*time.Second)
	translations := 0
	refused := map[string]int{}
	var mu sync.Mutex
	srv := xds.New(xds.Options{
		Translate: func(p *plan.Plan) (*cachev3.Snapshot, error) {
			translations++
			return clustersOnly(p)
		},
		MakeBeforeBreak: noMBB,
		Limits:          xds.Limits{MaxNodes: 2},
		OnRefused:       func(reason string, _ error) { mu.Lock(); refused[reason]++; mu.Unlock() },
	})
	addr := serveADS(t, ctx, srv)
	base := translations
	srv.Update(plans(t, topo(t, true))) // builds the front proxy's plan, in use before any node

	open := func(id string) (*adsClient, context.CancelFunc) {
		sctx, scancel := context.WithCancel(ctx)
		c := dial(t, sctx, addr, &core.Node{Id: id})
		c.send(&discovery.DiscoveryRequest{})
		return c, scancel
	}
	a, closeA := open("a")
	a.recvCluster()
	b, closeB := open("b")
	b.recvCluster()
	defer closeB()
	a2, closeA2 := open("a") // a second stream of a known node is within the limit
	a2.recvCluster()
	if got := translations - base; got != 1 {
		t.Errorf("%d translations for an update and three streams of two equal front-proxy nodes, want 1", got)
	}

	c, closeC := open("c")
	if _, err := c.stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a third node: %v, want ResourceExhausted", err)
	}
	closeC()
	mu.Lock()
	if refused["max-nodes"] != 1 {
		t.Errorf("refusals %v, want one max-nodes", refused)
	}
	mu.Unlock()

	// A stream may not switch nodes.
	b.node = &core.Node{Id: "a"}
	b.send(&discovery.DiscoveryRequest{})
	if _, err := b.stream.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a stream switching its node: %v, want PermissionDenied", err)
	}

	closeA()
	closeA2()
	waitNodes := func(want ...string) {
		t.Helper()
		var got []string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			got = nil
			for _, n := range srv.Status() {
				got = append(got, n.NodeID)
			}
			if slices.Equal(got, want) {
				return
			}
		}
		t.Fatalf("nodes %v, want %v", got, want)
	}
	waitNodes() // b's stream was closed by its refusal, a's by the client
	d, closeD := open("d")
	defer closeD()
	d.recvCluster()
	waitNodes("d")
}

// serveADS serves srv's ADS on a free local port until the test ends and returns its address.
func serveADS(t *testing.T, ctx context.Context, srv *xds.Server) string {
	t.Helper()
	g := grpc.NewServer()
	srv.Register(ctx, g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// TestEnvoyVersion: an Envoy older than MinEnvoyVersion gets no configuration it would reject
// but a refusal saying what to upgrade; 1.37.0 and newer, and clients that are not Envoy or
// send no build version, are served. Status shows each Envoy's version, and what kube-mvp says
// of one past its end of life (here on 2027-02-01, after 1.37's) or newer than the window.
func TestEnvoyVersion(t *testing.T) {
	ctx := testutil.Context(t, 30*time.Second)
	refused := map[string]int{}
	var mu sync.Mutex
	var logs testutil.SyncBuffer
	clock := clocktesting.NewFakeClock(time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC))
	srv := xds.New(xds.Options{Translate: clustersOnly, MakeBeforeBreak: makebeforebreak.Options{Clock: clock},
		Log:       slog.New(slog.NewTextHandler(&logs, nil)),
		OnRefused: func(reason string, _ error) { mu.Lock(); refused[reason]++; mu.Unlock() }})
	addr := serveADS(t, ctx, srv)
	srv.Update(plans(t, topo(t, true)))
	envoy := func(id string, major, minor, patch uint32) *core.Node {
		return &core.Node{Id: id, UserAgentName: "envoy", UserAgentVersionType: &core.Node_UserAgentBuildVersion{UserAgentBuildVersion: &core.BuildVersion{
			Version: &typev3.SemanticVersion{MajorNumber: major, MinorNumber: minor, Patch: patch},
		}}}
	}
	for _, c := range []struct {
		node    *core.Node
		ok      bool
		version string
		support string // a part of EnvoySupport, "" for none
	}{
		{envoy("out-of-support", 1, 36, 7), false, "", ""},
		{envoy("older", 0, 99, 0), false, "", ""},
		{envoy("min-past-its-end", 1, 37, 6), true, "1.37.6", "past its end of life (2027-01-13)"},
		{envoy("newest", 1, 40, 0), true, "1.40.0", ""},
		{envoy("two", 2, 0, 0), true, "2.0.0", "newer than the releases kube-mvp was checked against (1.37 to 1.40)"},
		{&core.Node{Id: "stand-in", UserAgentName: "kube-mvp-test-dataplane"}, true, "", ""},
		{&core.Node{Id: "envoy-without-version", UserAgentName: "envoy"}, true, "", ""},
	} {
		sctx, scancel := context.WithCancel(ctx)
		a := dial(t, sctx, addr, c.node)
		a.send(&discovery.DiscoveryRequest{})
		_, err := a.stream.Recv()
		if c.ok && err != nil {
			t.Errorf("%s: %v, want served", c.node.GetId(), err)
		}
		if !c.ok && (status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "supports Envoy 1.37.0 and newer")) {
			t.Errorf("%s: %v, want FailedPrecondition naming the version needed", c.node.GetId(), err)
		}
		if c.ok {
			i := slices.IndexFunc(srv.Status(), func(n xdsstatus.NodeStatus) bool { return n.NodeID == c.node.GetId() })
			if i < 0 {
				t.Fatalf("%s: not in Status while its stream is open", c.node.GetId())
			}
			n := srv.Status()[i]
			if n.EnvoyVersion != c.version || (c.support == "") != (n.EnvoySupport == "") || !strings.Contains(n.EnvoySupport, c.support) {
				t.Errorf("%s: Status says Envoy %q, %q; want %q, %q", c.node.GetId(), n.EnvoyVersion, n.EnvoySupport, c.version, c.support)
			}
		}
		scancel()
	}
	mu.Lock()
	defer mu.Unlock()
	if refused["envoy-version"] != 2 {
		t.Errorf("refusals %v, want two envoy-version", refused)
	}
	for _, want := range []string{`node=min-past-its-end version=1.37.6`, `node=two version=2.0.0`} {
		if !strings.Contains(logs.String(), `msg="Envoy release not supported" `+want) {
			t.Errorf("no warning for %s in the log:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "node=newest") {
		t.Errorf("a warning for a supported Envoy:\n%s", logs.String())
	}
}

// TestConfigRejected: a NACK makes ConfigRejected true and calls OnRejectedChange; the ACK of
// the next version sent ends it, as does the node's leaving; each change is told once.
func TestConfigRejected(t *testing.T) {
	ctx := testutil.Context(t, 30*time.Second)
	changes := make(chan bool, 10)
	var srv *xds.Server
	srv = xds.New(xds.Options{Translate: clustersOnly, MakeBeforeBreak: noMBB, OnRejectedChange: func() { changes <- srv.ConfigRejected() }})
	addr := serveADS(t, ctx, srv)
	srv.Update(plans(t, topo(t, true)))
	expect := func(want bool) {
		t.Helper()
		select {
		case got := <-changes:
			if got != want {
				t.Fatalf("OnRejectedChange with ConfigRejected %v, want %v", got, want)
			}
		case <-ctx.Done():
			t.Fatalf("no OnRejectedChange (want ConfigRejected %v)", want)
		}
	}

	front := dial(t, ctx, addr, &core.Node{Id: "front-1"})
	front.send(&discovery.DiscoveryRequest{})
	resp, _ := front.recvCluster()
	front.send(&discovery.DiscoveryRequest{VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}) // ACK
	srv.Update(plans(t, topo(t, false)))
	resp2, _ := front.recvCluster()
	front.send(&discovery.DiscoveryRequest{VersionInfo: resp.VersionInfo, ResponseNonce: resp2.Nonce, ErrorDetail: &statuspb.Status{Message: "rejected"}}) // NACK
	expect(true)
	if !srv.ConfigRejected() {
		t.Error("ConfigRejected false after a NACK")
	}
	srv.Update(plans(t, topo(t, true)))
	resp3, _ := front.recvCluster()
	front.send(&discovery.DiscoveryRequest{VersionInfo: resp3.VersionInfo, ResponseNonce: resp3.Nonce}) // ACK of the newest
	expect(false)

	// A node that NACKs and leaves takes its rejection with it.
	srv.Update(plans(t, topo(t, false)))
	resp4, _ := front.recvCluster()
	front.send(&discovery.DiscoveryRequest{VersionInfo: resp3.VersionInfo, ResponseNonce: resp4.Nonce, ErrorDetail: &statuspb.Status{Message: "rejected"}})
	expect(true)
	front.stream.CloseSend()
	expect(false)
	select {
	case got := <-changes:
		t.Errorf("an extra OnRejectedChange (ConfigRejected %v)", got)
	default:
	}
}
