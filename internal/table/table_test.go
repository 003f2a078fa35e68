package table_test

import (
	"context"
	"log/slog"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kube-mvp/kube-mvp/internal/table"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

func sample(t *testing.T, aliveB bool) *topology.Topology {
	t.Helper()
	topo, err := topology.New(
		[]topology.APIServer{{ID: "apiserver-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: aliveB}, {ID: "apiserver-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true}},
		map[topology.Resource][]string{
			{Group: "batch", Version: "v1", Resource: "jobs"}:                        {"apiserver-a"},
			{Group: "batch", Version: "v1", Resource: "jobs", Subresource: "status"}: {"apiserver-a"},
			{Version: "v1", Resource: "pods"}:                                        {"apiserver-b", "apiserver-a"},
		},
		[]string{"example.com", "acme.io"})
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func TestRoundTrip(t *testing.T) {
	in := sample(t, true)
	in.Discovery = topology.NewDiscovery([]byte(`{"kind":"APIGroupDiscoveryList"}`))
	tb := table.ToProto(in, time.Unix(1, 0))
	out, err := table.FromProto(tb)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in.APIServers, out.APIServers) || !reflect.DeepEqual(in.Served, out.Served) || !reflect.DeepEqual(in.ServedEverywhere, out.ServedEverywhere) ||
		!reflect.DeepEqual(in.Discovery, out.Discovery) {
		t.Errorf("round trip changed the topology:\n in %+v\nout %+v", in, out)
	}
	if again := table.ToProto(out, time.Unix(99, 0)); again.Version != tb.Version {
		t.Errorf("version depends on more than content: %s vs %s", again.Version, tb.Version)
	}
	if other := table.ToProto(sample(t, false), time.Unix(1, 0)); other.Version == tb.Version {
		t.Error("different content, same version")
	}
	if other := table.ToProto(sample(t, true), time.Unix(1, 0)); other.Version == tb.Version {
		t.Error("different discovery, same version")
	}
	if _, err := table.FromProto(&tablev1.Table{Apiservers: []*tablev1.APIServer{{Id: ""}}}); err == nil {
		t.Error("an apiserver without ID was accepted")
	}
}

// TestFollowSurvivesRestart streams over real gRPC, drops the server, and checks that the
// client keeps its last table and picks up the new server's table after reconnecting.
func TestFollowSurvivesRestart(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	serve := func(lis net.Listener, topo *topology.Topology) (*grpc.Server, *table.Server) {
		srv := table.NewServer()
		srv.Publish(topo, time.Now())
		g := grpc.NewServer()
		tablev1.RegisterTableServiceServer(g, srv)
		go g.Serve(lis)
		return g, srv
	}
	g1, srv1 := serve(lis, sample(t, true))

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var mu sync.Mutex
	var versions []string
	var last *topology.Topology
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		table.Follow(ctx, conn, "test", slog.Default(), func(topo *topology.Topology, v string) {
			mu.Lock()
			versions, last = append(versions, v), topo
			mu.Unlock()
		})
		close(done)
	}()
	waitVersions := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; {
			mu.Lock()
			got := len(versions)
			mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("received %d tables, want %d", got, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitVersions(1)
	srv1.Publish(sample(t, false), time.Now())
	waitVersions(2)
	srv1.Publish(sample(t, false), time.Now()) // same content: not sent again

	g1.Stop()
	mu.Lock()
	if len(last.Live()) != 1 {
		t.Errorf("after the server went away the client lost its table: live %v", last.Live())
	}
	mu.Unlock()
	lis2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	g2, _ := serve(lis2, sample(t, true))
	defer g2.Stop()
	waitVersions(3)
	mu.Lock()
	if versions[0] != versions[2] || versions[1] == versions[0] || len(last.Live()) != 2 {
		t.Errorf("versions %v, live %v", versions, last.Live())
	}
	mu.Unlock()
	cancel()
	<-done
}
