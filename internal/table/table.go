// Package table carries a topology.Topology from xds-server to extproc over gRPC
// (proto/kubemvp/table/v1): the server side broadcasts every new table, the client side keeps
// the last one it received and reconnects with backoff when the stream drops.
package table

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// ToProto converts t; the version is a hash of the content, so equal topologies give equal
// versions on every replica.
func ToProto(t *topology.Topology, now time.Time) *tablev1.Table {
	tb := &tablev1.Table{}
	for _, s := range t.APIServers {
		tb.Apiservers = append(tb.Apiservers, &tablev1.APIServer{Id: s.ID, Hostname: s.Hostname, Address: s.Address, Alive: s.Alive})
	}
	for _, r := range t.Resources() {
		tb.Resources = append(tb.Resources, &tablev1.ServedResource{
			Group: r.Group, Version: r.Version, Resource: r.Resource, Subresource: r.Subresource,
			ApiserverIds: t.Served[r],
		})
	}
	for g := range t.ServedEverywhere {
		tb.ServedEverywhereGroups = append(tb.ServedEverywhereGroups, g)
	}
	slices.Sort(tb.ServedEverywhereGroups)
	if t.Discovery != nil {
		tb.ApisDiscovery = t.Discovery.JSON
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(tb)
	sum := sha256.Sum256(b)
	tb.Version = hex.EncodeToString(sum[:8])
	tb.GeneratedAt = timestamppb.New(now)
	return tb
}

// FromProto converts a received table back; a malformed one is an error, never a panic.
func FromProto(tb *tablev1.Table) (*topology.Topology, error) {
	servers := make([]topology.APIServer, 0, len(tb.GetApiservers()))
	for _, s := range tb.GetApiservers() {
		servers = append(servers, topology.APIServer{ID: s.GetId(), Hostname: s.GetHostname(), Address: s.GetAddress(), Alive: s.GetAlive()})
	}
	served := make(map[topology.Resource][]string, len(tb.GetResources()))
	for _, r := range tb.GetResources() {
		key := topology.Resource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource(), Subresource: r.GetSubresource()}
		served[key] = append(served[key], r.GetApiserverIds()...)
	}
	t, err := topology.New(servers, served, tb.GetServedEverywhereGroups())
	if err != nil {
		return nil, fmt.Errorf("table %s: %w", tb.GetVersion(), err)
	}
	t.Discovery = topology.NewDiscovery(tb.GetApisDiscovery())
	return t, nil
}

// Server is the xds-server side: it serves TableService and broadcasts each Publish.
type Server struct {
	tablev1.UnimplementedTableServiceServer
	mu      sync.Mutex
	current *tablev1.Table
	changed chan struct{} // closed and replaced on every Publish
}

// NewServer returns a Server with no table yet; watchers wait for the first Publish.
func NewServer() *Server { return &Server{changed: make(chan struct{})} }

// Publish makes t the current table, unless its content equals the current one.
func (s *Server) Publish(t *topology.Topology, now time.Time) {
	tb := ToProto(t, now)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != nil && s.current.Version == tb.Version {
		return
	}
	s.current = tb
	close(s.changed)
	s.changed = make(chan struct{})
}

// Version is the version of the current table; empty before the first Publish.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return ""
	}
	return s.current.Version
}

// Watch implements TableService.
func (s *Server) Watch(_ *tablev1.WatchRequest, stream grpc.ServerStreamingServer[tablev1.Table]) error {
	var sent string
	for {
		s.mu.Lock()
		tb, changed := s.current, s.changed
		s.mu.Unlock()
		if tb != nil && tb.Version != sent {
			if err := stream.Send(tb); err != nil {
				return err
			}
			sent = tb.Version
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// Follow is the extproc side: it watches the table over conn until ctx ends, calling apply
// with every table received. When the stream fails it waits (exponential backoff up to 10 s)
// and reconnects; in between, the caller keeps using the last table it was given.
func Follow(ctx context.Context, conn grpc.ClientConnInterface, clientID string, log *slog.Logger, apply func(*topology.Topology, string)) {
	client := tablev1.NewTableServiceClient(conn)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := client.Watch(ctx, &tablev1.WatchRequest{ClientId: clientID})
		for err == nil {
			var tb *tablev1.Table
			if tb, err = stream.Recv(); err != nil {
				break
			}
			backoff = 100 * time.Millisecond
			t, convErr := FromProto(tb)
			if convErr != nil {
				log.Error("routing table rejected; keeping the previous one", "error", convErr)
				continue
			}
			apply(t, tb.GetVersion())
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("routing table stream lost; keeping the last table and reconnecting", "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}
