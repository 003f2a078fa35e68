// Package xds serves Envoy its configuration over ADS (state of the world and delta) and
// records, per Envoy node, what was sent and what was acknowledged or rejected.
//
// Every node gets the snapshot of its plan, because a sidecar Envoy (node metadata
// "kube-mvp.io/local-apiserver") routes differently from a front load balancer. Snapshots are
// made by a Translator from the current plans (internal/plan), with the clusters that make
// before break holds (internal/makebeforebreak decides which, and when to drop them); a
// node first seen is given its snapshot before the cache answers its first request.
package xds

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/kube-mvp/kube-mvp/internal/envoyrelease"
	"github.com/kube-mvp/kube-mvp/internal/makebeforebreak"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
)

// LocalAPIServerMetadataKey is the node metadata field that puts an Envoy in sidecar mode: the
// ID or hostname of the apiserver it runs beside (contract.NodeMetadataLocalAPIServer).
const LocalAPIServerMetadataKey = contract.NodeMetadataLocalAPIServer

// Translator turns a (per-node) plan into a snapshot.
type Translator func(*plan.Plan) (*cachev3.Snapshot, error)

// Server is the ADS server.
type Server struct {
	cache     cachev3.SnapshotCache
	translate Translator
	log       *slog.Logger
	now       func() time.Time

	mu sync.Mutex
	// envoys are the current plans; hold what make before break keeps besides them.
	envoys *plan.Envoys
	hold   makebeforebreak.Hold
	holds  *makebeforebreak.Holds
	nodes  map[string]*xdsstatus.NodeStatus
	// built are the current snapshots by local apiserver ("" for front proxies): nodes of
	// one kind share one translation.
	built map[string]*cachev3.Snapshot
	// streams counts open xDS streams (both protocols).
	streams    int
	opts       Options
	refusedLog rateLimitedLog
	// explaining bounds /debug/explain, which translates a plan per request.
	explaining chan struct{}

	stopping atomic.Bool
	// rejected is ConfigRejected as last computed; rejectedMu orders OnRejectedChange calls.
	rejected   bool
	rejectedMu sync.Mutex
}

// ConfigRejected reports whether a connected Envoy's last answer for some resource type was a
// rejection (NACK) not yet followed by an ACK of what was sent since: that Envoy runs an older
// configuration than the plans, and may lack clusters a new routing table names.
func (s *Server) ConfigRejected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rejectedLocked()
}

func (s *Server) rejectedLocked() bool {
	for _, n := range s.nodes {
		for _, ts := range n.Types {
			if ts.NackError != "" {
				return true
			}
		}
	}
	return false
}

// rejectedChanged calls OnRejectedChange if ConfigRejected changed; call it without s.mu.
func (s *Server) rejectedChanged() {
	if s.opts.OnRejectedChange == nil {
		return
	}
	s.rejectedMu.Lock()
	defer s.rejectedMu.Unlock()
	s.mu.Lock()
	now := s.rejectedLocked()
	changed := now != s.rejected
	s.rejected = now
	s.mu.Unlock()
	if changed {
		s.opts.OnRejectedChange()
	}
}

// SetStopping makes /readyz fail from now on: the process serves on while it stops.
func (s *Server) SetStopping() { s.stopping.Store(true) }

// Limits bound the per-client state. A stream over a limit is refused (gRPC
// RESOURCE_EXHAUSTED), logged and counted; the state of a node goes with its last stream.
type Limits struct {
	// MaxNodes is how many distinct Envoy nodes may be connected at once (0: no limit).
	MaxNodes int
	// MaxStreams is how many xDS streams may be open at once (0: no limit).
	MaxStreams int
}

func peerCertificateOf(c *x509.Certificate) *xdsstatus.PeerCertificate {
	if c == nil {
		return nil
	}
	return &xdsstatus.PeerCertificate{Serial: hex.EncodeToString(c.SerialNumber.Bytes()), NotAfter: c.NotAfter.UTC()}
}

// Options configure New.
type Options struct {
	// Translate makes a plan's Envoy resources.
	Translate Translator
	// Admit, if set, checks plans before Update builds them: one it refuses is held back like
	// one that cannot be built. xds-server checks that extproc's routing table of the plans
	// is within its limits, so Envoy never gets configuration the table does not follow.
	Admit func(*plan.Envoys) error
	// MakeBeforeBreak times the clusters kept for routing tables still in use.
	MakeBeforeBreak makebeforebreak.Options
	// Log; nil means slog.Default().
	Log *slog.Logger
	// OnBuild, if set, is told how every translation went (for metrics).
	OnBuild func(d time.Duration, err error)
	// Limits bound what clients can make the server hold.
	Limits Limits
	// RequireRole makes every stream prove an Envoy role (cptls) with its client certificate
	// and present a node that fits it. Only a server started with plaintext gRPC turns it off.
	RequireRole bool
	// OnRefused, if set, is told about every stream refused (reason: a short label for a
	// metric, such as "role", "node", "max-nodes", "max-streams", "fetch").
	OnRefused func(reason string, err error)
	// OnRejectedChange, if set, is called after ConfigRejected may have changed (a NACK, the
	// ACK that ends it, a node gone), never under the server's lock; read ConfigRejected in it.
	OnRejectedChange func()
}

// New returns a server with no plans; nodes wait until the first Update.
func New(opts Options) *Server {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	s := &Server{translate: opts.Translate, log: opts.Log, nodes: map[string]*xdsstatus.NodeStatus{}, opts: opts, explaining: make(chan struct{}, maxExplaining)}
	// When a hold ends, every node gets its snapshot again.
	s.holds = makebeforebreak.NewHolds(opts.MakeBeforeBreak, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.updateLocked()
	})
	s.now = s.holds.Clock().Now
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

// Update makes e the current plans and gives every known node its new snapshot, with the
// serving sets and clusters make before break holds (see internal/makebeforebreak): serving
// sets that older routing tables may still name linger, and apiservers that became live join the
// default cluster only once every table in use knows them.
//
// Every plan in use (the front proxy's and each connected sidecar's) is built before any node
// gets one. When one cannot be built, nothing changes and the error says why: every node
// keeps its snapshot, and the caller must keep extproc's routing table too, since a table
// naming serving sets Envoy never received sends requests into clusters Envoy does not have
// (a 503 for each).
func (s *Server) Update(e *plan.Envoys) error {
	if s.opts.Admit != nil {
		if err := s.opts.Admit(e); err != nil {
			return fmt.Errorf("the plans are not admitted: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, prevHold, prevBuilt := s.envoys, s.hold, s.built
	s.envoys = e
	s.hold = s.holds.Observe(e, s.sidecarsLocked())
	s.built = map[string]*cachev3.Snapshot{}
	if err := s.buildInUseLocked(); err != nil {
		s.envoys, s.built = prev, prevBuilt
		s.hold = prevHold
		if prev != nil {
			// The holds saw e; they follow the plans in force again (a serving set e dropped
			// does not start lingering).
			s.hold = s.holds.Observe(prev, s.sidecarsLocked())
		}
		return err
	}
	for _, n := range s.nodes {
		s.setSnapshotLocked(n)
	}
	return nil
}

// buildInUseLocked builds the snapshot of every plan in use into s.built: the front proxy's
// and that of each apiserver a sidecar is connected beside.
func (s *Server) buildInUseLocked() error {
	for _, local := range append([]string{""}, s.sidecarsLocked()...) {
		if _, ok := s.built[local]; ok {
			continue
		}
		snap, err := s.buildLocked(local)
		if err != nil {
			what := "the front proxy's plan"
			if local != "" {
				what = "the plan of the sidecars beside " + local
			}
			return fmt.Errorf("%s cannot be built: %w", what, err)
		}
		s.built[local] = snap
	}
	return nil
}

// buildLocked translates the plan for local ("" the front proxy) with the current hold.
func (s *Server) buildLocked(local string) (*cachev3.Snapshot, error) {
	start := s.now()
	snap, err := s.translate(s.hold.Apply(s.envoys.For(local)))
	if s.opts.OnBuild != nil {
		s.opts.OnBuild(s.now().Sub(start), err)
	}
	return snap, err
}

func (s *Server) updateLocked() {
	s.hold = s.holds.Observe(s.envoys, s.sidecarsLocked())
	s.built = map[string]*cachev3.Snapshot{}
	for _, n := range s.nodes {
		s.setSnapshotLocked(n)
	}
}

// sidecarsLocked are the apiservers beside which sidecars are connected now: their plans are
// in use, besides the front proxy's.
func (s *Server) sidecarsLocked() []string {
	var ids []string
	for _, n := range s.nodes {
		if n.LocalAPIServer == "" {
			continue
		}
		if id, err := s.envoys.Front.Topology.ResolveLocal(n.LocalAPIServer); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// Hold is what make before break keeps in the snapshots besides the plans.
func (s *Server) Hold() makebeforebreak.Hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hold
}

// Plans returns the current plans (nil before the first Update).
func (s *Server) Plans() *plan.Envoys {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.envoys
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
	e, hold := s.Plans(), s.Hold()
	if e == nil {
		return nil, fmt.Errorf("no topology yet")
	}
	return s.translate(hold.Apply(e.Front))
}

// Status returns a copy of every node's status, sorted by node ID.
func (s *Server) Status() []xdsstatus.NodeStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]xdsstatus.NodeStatus, 0, len(s.nodes))
	for _, n := range s.nodes {
		c := *n
		c.Types = make(map[string]*xdsstatus.TypeStatus, len(n.Types))
		for k, v := range n.Types {
			ts := *v
			c.Types[k] = &ts
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b xdsstatus.NodeStatus) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out
}

// setSnapshotLocked translates for one node, or reuses the translation of an equal node, and
// hands the result to the cache.
func (s *Server) setSnapshotLocked(n *xdsstatus.NodeStatus) {
	if s.envoys == nil {
		return
	}
	local := ""
	if n.LocalAPIServer != "" {
		var err error
		if local, err = s.envoys.Front.Topology.ResolveLocal(n.LocalAPIServer); err != nil {
			local = ""
			n.SnapshotError = fmt.Sprintf("node metadata %s=%q: %v; serving it front-proxy config", LocalAPIServerMetadataKey, n.LocalAPIServer, err)
		}
	}
	snap, ok := s.built[local]
	if !ok {
		var err error
		snap, err = s.buildLocked(local)
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
func (s *Server) nodeLocked(node *core.Node) *xdsstatus.NodeStatus {
	return s.nodes[node.GetId()]
}

// localAPIServer is the sidecar metadata of a node, "" for a front proxy.
func localAPIServer(node *core.Node) string {
	return node.GetMetadata().GetFields()[LocalAPIServerMetadataKey].GetStringValue()
}

// MinEnvoyVersion is the oldest Envoy kube-mvp supports: the oldest release Envoy itself still
// supports (docs/compatibility.md#envoy-releases). snapshot.Build refuses anything newer than
// this release's protos (internal/oldestenvoy/oldest-envoy-protos.txt): raise both together, with
// `make envoy-protos ENVOY=vX.Y.Z`, and move EnvoyReleases.
var MinEnvoyVersion = [3]uint32{1, envoyrelease.Oldest().Minor, 0}

// checkEnvoyVersion refuses an Envoy older than MinEnvoyVersion, by the build version every
// Envoy sends with its node; other clients (and an Envoy that sends none) pass.
func checkEnvoyVersion(node *core.Node) error {
	v := node.GetUserAgentBuildVersion().GetVersion()
	if node.GetUserAgentName() != "envoy" || v == nil {
		return nil
	}
	got := [3]uint32{v.GetMajorNumber(), v.GetMinorNumber(), v.GetPatch()}
	if slices.Compare(got[:], MinEnvoyVersion[:]) < 0 {
		return fmt.Errorf("node %q is Envoy %d.%d.%d; kube-mvp supports Envoy %d.%d.%d and newer (the releases Envoy itself supports): upgrade Envoy",
			node.GetId(), got[0], got[1], got[2], MinEnvoyVersion[0], MinEnvoyVersion[1], MinEnvoyVersion[2])
	}
	return nil
}

// join counts a new stream of node, opened with a certificate of role, creating the node's
// state (and giving it its snapshot) on its first stream. It refuses a node that does not
// fit the role, one whose ID another role holds, an Envoy older than MinEnvoyVersion, and new
// nodes beyond Limits.MaxNodes.
func (s *Server) join(role cptls.Role, cert *xdsstatus.PeerCertificate, node *core.Node) error {
	if node.GetId() == "" {
		return s.refuse("node", codes.InvalidArgument, fmt.Errorf("the first request of a stream names no node id"))
	}
	if err := checkEnvoyVersion(node); err != nil {
		return s.refuse("envoy-version", codes.FailedPrecondition, err)
	}
	local := localAPIServer(node)
	if s.opts.RequireRole {
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
		n.Certificate = cert
		return nil
	}
	if s.opts.Limits.MaxNodes > 0 && len(s.nodes) >= s.opts.Limits.MaxNodes {
		return s.refuse("max-nodes", codes.ResourceExhausted, fmt.Errorf("node %q refused: %d nodes are connected (the limit)", node.GetId(), len(s.nodes)))
	}
	n = &xdsstatus.NodeStatus{NodeID: node.GetId(), Role: role, Cluster: node.GetCluster(), LocalAPIServer: local, Streams: 1, Certificate: cert, Types: map[string]*xdsstatus.TypeStatus{}}
	if v := node.GetUserAgentBuildVersion().GetVersion(); node.GetUserAgentName() == "envoy" && v != nil {
		n.EnvoyVersion = fmt.Sprintf("%d.%d.%d", v.GetMajorNumber(), v.GetMinorNumber(), v.GetPatch())
		n.EnvoySupport = envoyrelease.Support(v.GetMajorNumber(), v.GetMinorNumber(), v.GetPatch(), s.now())
		if n.EnvoySupport != "" {
			s.log.Warn("Envoy release not supported", "node", n.NodeID, "version", n.EnvoyVersion, "why", n.EnvoySupport)
		}
	}
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
	defer s.rejectedChanged()
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
	if s.opts.OnRefused != nil {
		s.opts.OnRefused(reason, err)
	}
	return status.Error(code, err.Error())
}

func (s *Server) typeLocked(node *core.Node, typeURL string) *xdsstatus.TypeStatus {
	n := s.nodeLocked(node)
	if n == nil {
		return &xdsstatus.TypeStatus{} // not (or no longer) joined: nothing to record
	}
	ts, ok := n.Types[typeURL]
	if !ok {
		ts = &xdsstatus.TypeStatus{}
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
	defer s.rejectedChanged()
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.typeLocked(node, typeURL)
	switch {
	case errDetail != "":
		ts.NackedAt, ts.NackError, ts.NackedNext, ts.Acked = s.now(), errDetail, ts.Sent, version
		if n := s.nodeLocked(node); n != nil {
			n.Nacks++
		}
		s.log.Warn("Envoy rejected config", "node", node.GetId(), "type", typeURL, "error", errDetail)
	case nonce != "":
		ts.Acked = version
		if version == ts.Sent || version == "" { // "": a delta stream's ACK carries no version
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
	cert *xdsstatus.PeerCertificate
	node *core.Node // nil until the first request
}

func (t *streamTracker) open(ctx context.Context, id int64) error {
	role, err := cptls.PeerRole(ctx)
	if t.s.opts.RequireRole && err != nil {
		return t.s.refuse("role", codes.PermissionDenied, err)
	}
	t.s.mu.Lock()
	full := t.s.opts.Limits.MaxStreams > 0 && t.s.streams >= t.s.opts.Limits.MaxStreams
	if !full {
		t.s.streams++
	}
	n := t.s.streams
	t.s.mu.Unlock()
	if full {
		return t.s.refuse("max-streams", codes.ResourceExhausted, fmt.Errorf("%d xDS streams are open (the limit)", n))
	}
	t.mu.Lock()
	cert, _ := cptls.PeerCertificate(ctx)
	t.streams[id] = &trackedStream{role: role, cert: peerCertificateOf(cert)}
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
	if err := t.s.join(st.role, st.cert, node); err != nil {
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
