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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// LocalAPIServerMetadataKey is the node metadata field that puts an Envoy in sidecar mode: the
// ID or hostname of the apiserver it runs beside (contract.NodeMetadataLocalAPIServer).
const LocalAPIServerMetadataKey = contract.NodeMetadataLocalAPIServer

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
	// built are the current topology's snapshots by local apiserver ("" for front
	// proxies): nodes of one kind share one translation.
	built map[string]*cachev3.Snapshot
	// streams counts open xDS streams (both protocols).
	streams int
	// OnBuild, if set, is told how every translation went (for metrics).
	OnBuild func(d time.Duration, err error)

	// Limits bound what clients can make the server hold. Set before Register.
	Limits Limits
	// RequireRole makes every stream prove an Envoy role (cptls) with its client certificate
	// and present a node that fits it. Only a server started with plaintext gRPC turns it
	// off. Set before Register.
	RequireRole bool
	// OnRefused, if set, is told about every stream refused (reason: a short label for a
	// metric, such as "role", "node", "max-nodes", "max-streams", "fetch").
	OnRefused  func(reason string, err error)
	refusedLog rateLimitedLog

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

// Limits bound the per-client state. A stream over a limit is refused (gRPC
// RESOURCE_EXHAUSTED), logged and counted; the state of a node goes with its last stream.
type Limits struct {
	// MaxNodes is how many distinct Envoy nodes may be connected at once (0: no limit).
	MaxNodes int
	// MaxStreams is how many xDS streams may be open at once (0: no limit).
	MaxStreams int
}

type lingeringCluster struct {
	set   topology.ServerSet
	until time.Time
}

// NodeStatus is what the debug page shows for one Envoy.
type NodeStatus struct {
	NodeID         string                 `json:"nodeID"`
	Role           cptls.Role             `json:"role,omitempty"`
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
	locals := map[string]bool{} // once per local apiserver, however many sidecars name it
	for _, n := range s.nodes {
		if n.LocalAPIServer == "" {
			continue
		}
		if id := t.ResolveLocal(n.LocalAPIServer); id != "" && !locals[id] {
			locals[id] = true
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
	s.built = map[string]*cachev3.Snapshot{}
	for _, n := range s.nodes {
		s.setSnapshotLocked(n)
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

// setSnapshotLocked translates for one node, or reuses the translation of an equal node, and
// hands the result to the cache.
func (s *Server) setSnapshotLocked(n *NodeStatus) {
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
	snap, ok := s.built[local]
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
		s.built[local] = snap
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

// nodeLocked returns the state of a node that has a stream open (join made it).
func (s *Server) nodeLocked(node *core.Node) *NodeStatus {
	return s.nodes[node.GetId()]
}

// localAPIServer is the sidecar metadata of a node, "" for a front proxy.
func localAPIServer(node *core.Node) string {
	return node.GetMetadata().GetFields()[LocalAPIServerMetadataKey].GetStringValue()
}

// join counts a new stream of node, opened with a certificate of role, creating the node's
// state (and giving it its snapshot) on its first stream. It refuses a node that does not
// fit the role, one whose ID another role holds, and new nodes beyond Limits.MaxNodes.
func (s *Server) join(role cptls.Role, node *core.Node) error {
	if node.GetId() == "" {
		return s.refuse("node", codes.InvalidArgument, fmt.Errorf("the first request of a stream names no node id"))
	}
	local := localAPIServer(node)
	if s.RequireRole {
		var err error
		switch {
		case role == cptls.RoleEnvoyFront && local != "":
			err = fmt.Errorf("node %q has %s metadata but its certificate is a front proxy's (role %s)", node.GetId(), LocalAPIServerMetadataKey, role)
		case role == cptls.RoleEnvoySidecar && local == "":
			err = fmt.Errorf("node %q has no %s metadata but its certificate is a sidecar's (role %s)", node.GetId(), LocalAPIServerMetadataKey, role)
		case role != cptls.RoleEnvoyFront && role != cptls.RoleEnvoySidecar:
			err = fmt.Errorf("node %q: role %s is not an Envoy", node.GetId(), role)
		}
		if err != nil {
			return s.refuse("node", codes.PermissionDenied, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[node.GetId()]
	if ok {
		if n.Role != role || n.LocalAPIServer != local {
			return s.refuse("node", codes.PermissionDenied, fmt.Errorf("node id %q is connected as %s/%q; a stream as %s/%q may not use it", n.NodeID, n.Role, n.LocalAPIServer, role, local))
		}
		n.Streams++
		return nil
	}
	if s.Limits.MaxNodes > 0 && len(s.nodes) >= s.Limits.MaxNodes {
		return s.refuse("max-nodes", codes.ResourceExhausted, fmt.Errorf("node %q refused: %d nodes are connected (the limit)", node.GetId(), len(s.nodes)))
	}
	n = &NodeStatus{NodeID: node.GetId(), Role: role, Cluster: node.GetCluster(), LocalAPIServer: local, Streams: 1, Types: map[string]*TypeStatus{}}
	s.nodes[n.NodeID] = n
	if s.built == nil {
		s.built = map[string]*cachev3.Snapshot{}
	}
	s.setSnapshotLocked(n)
	return nil
}

// leave counts a closed stream of node; the node's state and snapshot go with its last one,
// so clients that come and go leave nothing behind.
func (s *Server) leave(node *core.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[node.GetId()]
	if n == nil {
		return
	}
	if n.Streams--; n.Streams <= 0 {
		delete(s.nodes, n.NodeID)
		s.cache.ClearSnapshot(n.NodeID)
	}
}

// Refused reports a call refused elsewhere (the gRPC role policy) the way the server reports
// its own refusals: a rate-limited log line and OnRefused.
func (s *Server) Refused(reason string, err error) { _ = s.refuse(reason, codes.PermissionDenied, err) }

// refuse reports a refused stream (rate-limited log line, OnRefused) and returns the gRPC
// error the client gets.
func (s *Server) refuse(reason string, code codes.Code, err error) error {
	s.refusedLog.warn(s.log, "xDS stream refused", "reason", reason, "error", err)
	if s.OnRefused != nil {
		s.OnRefused(reason, err)
	}
	return status.Error(code, err.Error())
}

func (s *Server) typeLocked(node *core.Node, typeURL string) *TypeStatus {
	n := s.nodeLocked(node)
	if n == nil {
		return &TypeStatus{} // not (or no longer) joined: nothing to record
	}
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

// streamTracker attributes streams to nodes and roles: the role comes from the client
// certificate when the stream opens, the node with its first request, and every later
// request must name the same node (go-control-plane would let a later request switch it).
type streamTracker struct {
	s       *Server
	mu      sync.Mutex
	streams map[int64]*trackedStream
}

type trackedStream struct {
	role cptls.Role
	node *core.Node // nil until the first request
}

func (t *streamTracker) open(ctx context.Context, id int64) error {
	role, err := cptls.PeerRole(ctx)
	if t.s.RequireRole && err != nil {
		return t.s.refuse("role", codes.PermissionDenied, err)
	}
	t.s.mu.Lock()
	full := t.s.Limits.MaxStreams > 0 && t.s.streams >= t.s.Limits.MaxStreams
	if !full {
		t.s.streams++
	}
	n := t.s.streams
	t.s.mu.Unlock()
	if full {
		return t.s.refuse("max-streams", codes.ResourceExhausted, fmt.Errorf("%d xDS streams are open (the limit)", n))
	}
	t.mu.Lock()
	t.streams[id] = &trackedStream{role: role}
	t.mu.Unlock()
	return nil
}

func (t *streamTracker) request(id int64, node *core.Node) error {
	t.mu.Lock()
	st := t.streams[id]
	t.mu.Unlock()
	if st == nil {
		return status.Error(codes.Internal, "unknown stream")
	}
	if st.node != nil {
		if node != nil && (node.GetId() != st.node.GetId() || localAPIServer(node) != localAPIServer(st.node)) {
			return t.s.refuse("node", codes.PermissionDenied, fmt.Errorf("a stream opened as node %q may not switch to %q", st.node.GetId(), node.GetId()))
		}
		return nil
	}
	if err := t.s.join(st.role, node); err != nil {
		return err
	}
	t.mu.Lock()
	st.node = node
	t.mu.Unlock()
	return nil
}

func (t *streamTracker) closed(id int64, _ *core.Node) {
	t.mu.Lock()
	st := t.streams[id]
	delete(t.streams, id)
	t.mu.Unlock()
	if st == nil {
		return
	}
	t.s.mu.Lock()
	t.s.streams--
	t.s.mu.Unlock()
	if st.node != nil {
		t.s.leave(st.node)
	}
}

func (s *Server) callbacks() serverv3.Callbacks {
	// State-of-the-world and delta streams are numbered independently.
	sotw := &streamTracker{s: s, streams: map[int64]*trackedStream{}}
	delta := &streamTracker{s: s, streams: map[int64]*trackedStream{}}
	return serverv3.CallbackFuncs{
		StreamOpenFunc:        func(ctx context.Context, id int64, _ string) error { return sotw.open(ctx, id) },
		DeltaStreamOpenFunc:   func(ctx context.Context, id int64, _ string) error { return delta.open(ctx, id) },
		StreamClosedFunc:      sotw.closed,
		DeltaStreamClosedFunc: delta.closed,
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			if err := sotw.request(id, req.GetNode()); err != nil {
				return err
			}
			s.request(req.GetNode(), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			s.sent(req.GetNode(), resp.GetTypeUrl(), resp.GetVersionInfo())
		},
		StreamDeltaRequestFunc: func(id int64, req *discovery.DeltaDiscoveryRequest) error {
			if err := delta.request(id, req.GetNode()); err != nil {
				return err
			}
			s.request(req.GetNode(), req.GetTypeUrl(), "", req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
			return nil
		},
		StreamDeltaResponseFunc: func(_ int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
			s.sent(req.GetNode(), resp.GetTypeUrl(), resp.GetSystemVersionInfo())
		},
		// Envoy never fetches; a one-shot fetch would bypass the stream checks above.
		FetchRequestFunc: func(context.Context, *discovery.DiscoveryRequest) error {
			return s.refuse("fetch", codes.Unimplemented, fmt.Errorf("xDS fetch (REST-like unary) is not served; use a stream"))
		},
	}
}

// rateLimitedLog writes at most one line a second per message; the lines it drops are
// counted into the next one, so a flood cannot flood the log.
type rateLimitedLog struct {
	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (r *rateLimitedLog) warn(log *slog.Logger, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last) < time.Second {
		r.dropped++
		r.mu.Unlock()
		return
	}
	dropped := r.dropped
	r.last, r.dropped = now, 0
	r.mu.Unlock()
	if dropped > 0 {
		args = append(args, "similar_lines_dropped", dropped)
	}
	log.Warn(msg, args...)
}
