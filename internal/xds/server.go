// Package xds serves Envoy its configuration over ADS (state of the world and delta) and
// records, per Envoy node, what was sent and what was acknowledged or rejected.
//
// Every node gets its own snapshot, because a sidecar Envoy (node metadata
// "kube-mvp.io/local-apiserver") routes differently from a front load balancer. Snapshots are
// made by a Translator from the current topology; a node first seen is given its snapshot
// before the cache answers its first request.
package xds

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// LocalAPIServerMetadataKey is the node metadata field that puts an Envoy in sidecar mode: the
// ID or hostname of the apiserver it runs beside.
const LocalAPIServerMetadataKey = "kube-mvp.io/local-apiserver"

// Translator turns a (per-node) topology into a snapshot.
type Translator func(*topology.Topology) (*cachev3.Snapshot, error)

// Server is the ADS server.
type Server struct {
	cache     cachev3.SnapshotCache
	translate Translator
	log       *slog.Logger
	now       func() time.Time

	mu    sync.Mutex
	topo  *topology.Topology
	nodes map[string]*NodeStatus
	// OnBuild, if set, is told how every translation went (for metrics).
	OnBuild func(d time.Duration, err error)

	// Linger is how long a subset cluster stays in every snapshot after the topology stopped
	// naming it; zero drops it at once. Set before the first Update.
	Linger time.Duration
	// JoinDelay is how long an apiserver that became live stays out of the default cluster
	// (it is in the subset clusters at once); zero adds it at once. Set before the first
	// Update; it must exceed the routing table delay.
	JoinDelay time.Duration
	// named are the subset clusters of the current topology (every node's view); lingering
	// those that recent topologies named, with when they go.
	named       map[string]topology.ServerSet
	lingering   map[string]lingeringCluster
	lingerTimer *time.Timer
	// liveSince is when each live apiserver became live (zero: live in the first topology).
	liveSince map[string]time.Time
}

type lingeringCluster struct {
	set   topology.ServerSet
	until time.Time
}

// NodeStatus is what the debug page shows for one Envoy.
type NodeStatus struct {
	NodeID         string                 `json:"nodeID"`
	Cluster        string                 `json:"cluster,omitempty"`
	LocalAPIServer string                 `json:"localAPIServer,omitempty"`
	Streams        int                    `json:"openStreams"`
	Snapshot       string                 `json:"snapshotVersion,omitempty"`
	SnapshotError  string                 `json:"snapshotError,omitempty"`
	Types          map[string]*TypeStatus `json:"types"`
}

// TypeStatus is the state of one resource type on one node.
type TypeStatus struct {
	Sent       string    `json:"sent,omitempty"`
	Acked      string    `json:"acked,omitempty"`
	NackedAt   time.Time `json:"nackedAt,omitzero"`
	NackError  string    `json:"nackError,omitempty"`
	NackedNext string    `json:"nackedVersion,omitempty"`
}

// New returns a server with no topology; nodes wait until the first Update.
func New(translate Translator, log *slog.Logger) *Server {
	s := &Server{translate: translate, log: log, now: time.Now, nodes: map[string]*NodeStatus{}}
	s.cache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	return s
}

// Register adds ADS (and the per-type services, for Envoys configured without ADS) to g.
func (s *Server) Register(ctx context.Context, g *grpc.Server) {
	srv := serverv3.NewServer(ctx, s.cache, s.callbacks())
	discovery.RegisterAggregatedDiscoveryServiceServer(g, srv)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, srv)
	routeservice.RegisterRouteDiscoveryServiceServer(g, srv)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, srv)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, srv)
	secretservice.RegisterSecretDiscoveryServiceServer(g, srv)
}

// Update makes t the current topology and gives every known node its new snapshot.
//
// Make before break: Envoy learns of a topology change from us, extproc from the routing
// table stream, and neither waits for the other. So:
//   - xds-server sends a table that names a new cluster or apiserver only after a delay
//     (cmd/xds-server --routing-table-delay), so that it is in Envoy, warmed, first;
//   - a subset cluster that t no longer names stays in the snapshots for Linger (with its
//     live members), so that requests extproc routes by the older table still find it;
//   - an apiserver that became live joins the default cluster only after JoinDelay, when
//     the tables in use know it: an older table may send to the default cluster a request
//     that the newcomer cannot serve (it was "every live apiserver" without it).
func (s *Server) Update(t *topology.Topology) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updateLocked(t.WithLingering(nil).WithJoining(nil))
}

func (s *Server) updateLocked(t *topology.Topology) {
	now := s.now()
	named := t.SubsetClusters()
	for _, n := range s.nodes {
		if n.LocalAPIServer == "" {
			continue
		}
		if id := t.ResolveLocal(n.LocalAPIServer); id != "" {
			maps.Copy(named, t.WithLocal(id).SubsetClusters())
		}
	}
	if s.lingering == nil {
		s.lingering = map[string]lingeringCluster{}
	}
	if s.Linger > 0 {
		for name, set := range s.named {
			if _, still := named[name]; !still {
				if _, already := s.lingering[name]; !already {
					s.lingering[name] = lingeringCluster{set: set, until: now.Add(s.Linger)}
				}
			}
		}
	}
	s.named = named
	var keep map[string]topology.ServerSet
	var next time.Time
	for name, l := range s.lingering {
		if _, back := named[name]; back || !now.Before(l.until) {
			delete(s.lingering, name)
			continue
		}
		if keep == nil {
			keep = map[string]topology.ServerSet{}
		}
		keep[name] = l.set
		if next.IsZero() || l.until.Before(next) {
			next = l.until
		}
	}
	first := s.liveSince == nil
	since := map[string]time.Time{}
	var joining map[string]bool
	for _, id := range t.Live() {
		at, known := s.liveSince[id]
		if !known && !first {
			at = now
		}
		since[id] = at
		if end := at.Add(s.JoinDelay); now.Before(end) {
			if joining == nil {
				joining = map[string]bool{}
			}
			joining[id] = true
			if next.IsZero() || end.Before(next) {
				next = end
			}
		}
	}
	s.liveSince = since
	s.topo = t.WithLingering(keep).WithJoining(joining)
	built := map[string]*cachev3.Snapshot{} // by local apiserver: nodes of one kind share a build
	for _, n := range s.nodes {
		s.setSnapshotLocked(n, built)
	}
	if s.lingerTimer != nil {
		s.lingerTimer.Stop()
		s.lingerTimer = nil
	}
	if !next.IsZero() {
		// Translate again when the first lingering cluster expires or joiner joins.
		s.lingerTimer = time.AfterFunc(next.Sub(now), func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.topo != nil {
				s.updateLocked(s.topo.WithLingering(nil).WithJoining(nil))
			}
		})
	}
}

// Joining returns the IDs of the live apiservers still held out of the default cluster.
func (s *Server) Joining() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.topo == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.topo.Joining))
}

// Lingering returns the names of the clusters kept only for an older routing table.
func (s *Server) Lingering() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.lingering))
}

// Topology returns the current topology (nil before the first Update).
func (s *Server) Topology() *topology.Topology {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.topo
}

// Snapshot returns the snapshot of a node, or the front-proxy snapshot for "".
func (s *Server) Snapshot(nodeID string) (*cachev3.Snapshot, error) {
	if nodeID != "" {
		snap, err := s.cache.GetSnapshot(nodeID)
		if err != nil {
			return nil, err
		}
		return snap.(*cachev3.Snapshot), nil
	}
	t := s.Topology()
	if t == nil {
		return nil, fmt.Errorf("no topology yet")
	}
	return s.translate(t)
}

// Status returns a copy of every node's status, sorted by node ID.
func (s *Server) Status() []NodeStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]NodeStatus, 0, len(s.nodes))
	for _, n := range s.nodes {
		c := *n
		c.Types = make(map[string]*TypeStatus, len(n.Types))
		for k, v := range n.Types {
			ts := *v
			c.Types[k] = &ts
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out
}

// setSnapshotLocked translates for one node and hands the result to the cache.
func (s *Server) setSnapshotLocked(n *NodeStatus, built map[string]*cachev3.Snapshot) {
	if s.topo == nil {
		return
	}
	t := s.topo
	local := ""
	if n.LocalAPIServer != "" {
		local = t.ResolveLocal(n.LocalAPIServer)
		if local == "" {
			n.SnapshotError = fmt.Sprintf("node metadata %s=%q names no known apiserver (ID or hostname); serving it front-proxy config", LocalAPIServerMetadataKey, n.LocalAPIServer)
		} else {
			t = t.WithLocal(local)
		}
	}
	snap, ok := built[local]
	if !ok {
		start := s.now()
		var err error
		snap, err = s.translate(t)
		if s.OnBuild != nil {
			s.OnBuild(s.now().Sub(start), err)
		}
		if err != nil {
			// Keep serving the last good snapshot: Envoy is better off with slightly stale
			// routes than with none.
			n.SnapshotError = err.Error()
			s.log.Error("translation failed; node keeps its previous config", "node", n.NodeID, "error", err)
			return
		}
		built[local] = snap
	}
	if err := s.cache.SetSnapshot(context.Background(), n.NodeID, snap); err != nil {
		n.SnapshotError = err.Error()
		return
	}
	if local != "" || n.LocalAPIServer == "" {
		n.SnapshotError = ""
	}
	n.Snapshot = snapshotVersion(snap)
}

func snapshotVersion(snap *cachev3.Snapshot) string {
	v := ""
	for _, r := range snap.Resources {
		if r.Version != "" {
			if v != "" {
				v += "."
			}
			v += r.Version
		}
	}
	return v
}

func (s *Server) nodeLocked(node *core.Node) *NodeStatus {
	n, ok := s.nodes[node.GetId()]
	if ok {
		return n
	}
	n = &NodeStatus{NodeID: node.GetId(), Cluster: node.GetCluster(), Types: map[string]*TypeStatus{}}
	if f := node.GetMetadata().GetFields()[LocalAPIServerMetadataKey]; f != nil {
		n.LocalAPIServer = f.GetStringValue()
	}
	s.nodes[n.NodeID] = n
	s.setSnapshotLocked(n, map[string]*cachev3.Snapshot{})
	return n
}

func (s *Server) typeLocked(node *core.Node, typeURL string) *TypeStatus {
	n := s.nodeLocked(node)
	ts, ok := n.Types[typeURL]
	if !ok {
		ts = &TypeStatus{}
		n.Types[typeURL] = ts
	}
	return ts
}

// request records an ACK or NACK: a request that carries a response nonce answers our last
// response; error_detail makes it a rejection, and version_info is then the last good version.
func (s *Server) request(node *core.Node, typeURL, version, nonce string, errDetail string) {
	if node == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.typeLocked(node, typeURL)
	switch {
	case errDetail != "":
		ts.NackedAt, ts.NackError, ts.NackedNext, ts.Acked = s.now(), errDetail, ts.Sent, version
		s.log.Warn("Envoy rejected config", "node", node.GetId(), "type", typeURL, "error", errDetail)
	case nonce != "":
		ts.Acked = version
		if version == ts.Sent {
			ts.NackError, ts.NackedNext = "", ""
		}
	}
}

func (s *Server) sent(node *core.Node, typeURL, version string) {
	if node == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.typeLocked(node, typeURL).Sent = version
}

func (s *Server) streams(node *core.Node, delta int) {
	if node == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeLocked(node).Streams += delta
}

// streamTracker attributes streams to nodes: node identity arrives with the first request of
// a stream, and the close has to be counted against the same node.
type streamTracker struct {
	s     *Server
	mu    sync.Mutex
	nodes map[int64]*core.Node
}

func (t *streamTracker) request(id int64, node *core.Node) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.nodes[id]; !ok && node != nil {
		t.nodes[id] = node
		t.s.streams(node, 1)
	}
}

func (t *streamTracker) closed(id int64, _ *core.Node) {
	t.mu.Lock()
	node := t.nodes[id]
	delete(t.nodes, id)
	t.mu.Unlock()
	t.s.streams(node, -1)
}

func (s *Server) callbacks() serverv3.Callbacks {
	// State-of-the-world and delta streams are numbered independently.
	sotw := &streamTracker{s: s, nodes: map[int64]*core.Node{}}
	delta := &streamTracker{s: s, nodes: map[int64]*core.Node{}}
	return serverv3.CallbackFuncs{
		StreamClosedFunc:      sotw.closed,
		DeltaStreamClosedFunc: delta.closed,
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			sotw.request(id, req.GetNode())
			s.request(req.GetNode(), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			s.sent(req.GetNode(), resp.GetTypeUrl(), resp.GetVersionInfo())
		},
		StreamDeltaRequestFunc: func(id int64, req *discovery.DeltaDiscoveryRequest) error {
			delta.request(id, req.GetNode())
			s.request(req.GetNode(), req.GetTypeUrl(), "", req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
			return nil
		},
		StreamDeltaResponseFunc: func(_ int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
			s.sent(req.GetNode(), resp.GetTypeUrl(), resp.GetSystemVersionInfo())
		},
	}
}
