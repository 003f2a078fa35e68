package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-multierror"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/cli"
)

// localAPIServerKey is the node metadata key of internal/xds (sidecar mode).
const localAPIServerKey = "kube-mvp.io/local-apiserver"

func (d *DataPlane) node() *corev3.Node {
	cluster := d.opts.NodeCluster
	if cluster == "" {
		cluster = "kube-mvp"
	}
	// Not "envoy": xds-server's Envoy release checks are for Envoy; the release modelled is
	// reported all the same.
	n := &corev3.Node{Id: d.opts.NodeID, Cluster: cluster, UserAgentName: "kube-mvp-test-dataplane",
		UserAgentVersionType: &corev3.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corev3.BuildVersion{
			Version: &typev3.SemanticVersion{MajorNumber: 1, MinorNumber: d.version.minor, Patch: d.version.patch}}}}
	md := map[string]any{}
	for k, v := range d.opts.NodeMetadata {
		md[k] = v
	}
	if d.opts.LocalAPIServer != "" {
		md[localAPIServerKey] = d.opts.LocalAPIServer
	}
	if len(md) > 0 {
		s, err := structpb.NewStruct(md)
		if err != nil {
			d.log.Error("node metadata", "error", err)
		} else {
			n.Metadata = s
		}
	}
	return n
}

// subscription is the state of one resource type on the ADS stream (state of the world).
type subscription struct {
	nonce   string   // nonce of the last response
	names   []string // requested names; nil for the wildcard types LDS and CDS
	started bool     // a request was sent on this stream
}

func (d *DataPlane) startADS(_ context.Context) error {
	if d.opts.XDSCluster != nil {
		return d.startClusterADS()
	}
	creds := insecure.NewCredentials()
	if d.opts.XDSTLS != nil {
		creds = credentials.NewTLS(d.opts.XDSTLS.clientConfig())
	}
	// Envoy takes xDS responses of any size: its gRPC client's max_receive_message_length
	// (GrpcService.EnvoyGrpc) is unlimited unless configured, and our bootstraps set none.
	// gRPC-Go's default of 4 MiB would refuse a large route configuration Envoy accepts.
	conn, err := grpc.NewClient(d.opts.XDSAddress, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)))
	if err != nil {
		return fmt.Errorf("dataplane: ADS client: %w", err)
	}
	client := discovery.NewAggregatedDiscoveryServiceClient(conn)
	d.keepADS(func() error { return d.adsSession(d.ctx, client) }, conn.Close)
	return nil
}

// keepADS runs session, an ADS stream, again and again until the data plane stops, waiting
// between two a backoff that doubles from 100ms up to 2s, then calls closeFn; logArgs go with
// the warning that a stream ended.
func (d *DataPlane) keepADS(session func() error, closeFn func() error, logArgs ...any) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if closeFn != nil {
			defer closeFn()
		}
		backoff := 100 * time.Millisecond
		for d.ctx.Err() == nil {
			err := session()
			if d.ctx.Err() != nil {
				return
			}
			d.log.Warn("ADS stream ended; reconnecting", append(logArgs, "error", err, "backoff", backoff)...)
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}()
}

// adsSession runs one ADS stream. Like Envoy, it subscribes to listeners and clusters
// (wildcard), then to the route configurations, cluster load assignments and secrets that
// those name, and answers every response with an ACK (version_info = the new version,
// response_nonce = its nonce) or a NACK (version_info = the last accepted version and
// error_detail) — the xDS protocol's state-of-the-world ACK/NACK rules.
func (d *DataPlane) adsSession(parent context.Context, client discovery.AggregatedDiscoveryServiceClient) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	stream, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	subs := map[string]*subscription{}
	first := true
	send := func(typeURL string, errDetail error) error {
		s := subs[typeURL]
		req := &discovery.DiscoveryRequest{
			TypeUrl:       typeURL,
			VersionInfo:   d.Versions()[typeURL],
			ResponseNonce: s.nonce,
			ResourceNames: s.names,
		}
		if first {
			req.Node = d.node() // Envoy sends the node on the first request of a stream
			first = false
		}
		if errDetail != nil {
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: errDetail.Error()}
		}
		s.started = true
		return stream.Send(req)
	}
	for _, t := range []string{resource.ClusterType, resource.ListenerType} {
		subs[t] = &subscription{}
		if err := send(t, nil); err != nil {
			return err
		}
	}
	// follow subscribes to (or changes the names of) the non-wildcard types.
	follow := func() error {
		want := d.wantedNames()
		for _, t := range []string{resource.EndpointType, resource.RouteType, resource.SecretType} {
			names := want[t]
			s := subs[t]
			if s == nil {
				if len(names) == 0 {
					continue
				}
				s = &subscription{}
				subs[t] = s
			}
			if s.started && slices.Equal(s.names, names) {
				continue
			}
			if len(names) == 0 {
				// An empty list would be a wildcard request: keep the old subscription.
				continue
			}
			s.names = names
			if err := send(t, nil); err != nil {
				return err
			}
		}
		return nil
	}
	// A new stream (xds-server restarted) asks again for every resource the configuration
	// already names, as Envoy does: a server that has the same listeners and clusters does
	// not answer their requests (same version), and would otherwise never be asked for the
	// routes, endpoints and secrets it has changed meanwhile.
	if err := follow(); err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		s := subs[resp.GetTypeUrl()]
		if s == nil {
			continue // a type we did not ask for
		}
		s.nonce = resp.GetNonce()
		applyErr := d.apply(resp.GetTypeUrl(), resp.GetVersionInfo(), resp.GetResources())
		d.countSubscriptionUpdate(resp.GetTypeUrl(), s.names, applyErr)
		if applyErr != nil {
			d.log.Warn("NACK", "type", resp.GetTypeUrl(), "version", resp.GetVersionInfo(), "error", applyErr)
		}
		if err := send(resp.GetTypeUrl(), applyErr); err != nil {
			return err
		}
		if applyErr == nil {
			if err := follow(); err != nil {
				return err
			}
		}
	}
}

// countSubscriptionUpdate counts one response in Envoy's subscription stats
// (source/common/config/utility.h ALL_SUBSCRIPTION_STATS: update_attempt, update_success,
// update_rejected), which is where the admin API shows a rejected update. Under ADS a
// rejected response fails every watch of its type (GrpcMuxImpl::onDiscoveryResponse calls
// onConfigUpdateFailed on each), so each subscription of the type counts it. The scopes are
// Envoy's: listener_manager.lds., cluster_manager.cds., http.<stat_prefix>.rds.<route
// config>. (RdsRouteConfigSubscription), cluster.<name>. (EdsClusterImpl, the cluster's own
// scope) and sds.<secret>. (SdsApi).
func (d *DataPlane) countSubscriptionUpdate(typeURL string, names []string, err error) {
	var scopes []string
	cfg := d.config()
	switch typeURL {
	case resource.ListenerType:
		scopes = []string{"listener_manager.lds."}
	case resource.ClusterType:
		scopes = []string{"cluster_manager.cds."}
	case resource.RouteType:
		for _, n := range names {
			for _, l := range cfg.listeners {
				if l.hcm != nil && l.hcm.rdsName == n {
					scopes = append(scopes, "http."+l.hcm.statPrefix+".rds."+n+".")
				}
			}
		}
	case resource.EndpointType:
		for _, n := range names {
			for _, c := range cfg.clusters {
				if c.edsName == n {
					scopes = append(scopes, "cluster."+c.stat+".")
				}
			}
		}
	case resource.SecretType:
		for _, n := range names {
			scopes = append(scopes, "sds."+n+".")
		}
	}
	outcome := "update_success"
	if err != nil {
		outcome = "update_rejected"
	}
	for _, sc := range slices.Compact(slices.Sorted(slices.Values(scopes))) {
		d.stats.inc(sc + "update_attempt")
		d.stats.inc(sc + outcome)
	}
}

// wantedNames lists, per non-wildcard type, the names the applied listeners and clusters
// refer to, sorted.
func (d *DataPlane) wantedNames() map[string][]string {
	cfg := d.config()
	want := map[string]map[string]bool{resource.RouteType: {}, resource.EndpointType: {}, resource.SecretType: {}}
	for _, l := range cfg.listeners {
		want[resource.RouteType][l.hcm.rdsName] = true
		if l.tls != nil {
			want[resource.SecretType][l.tls.certSecret] = true
			if l.tls.caSecret != "" {
				want[resource.SecretType][l.tls.caSecret] = true
			}
		}
	}
	for _, c := range cfg.clusters {
		if c.edsName != "" {
			want[resource.EndpointType][c.edsName] = true
		}
		if c.tls != nil {
			for _, s := range []string{c.tls.certSecret, c.tls.caSecret} {
				if s != "" {
					want[resource.SecretType][s] = true
				}
			}
		}
	}
	out := map[string][]string{}
	for t, m := range want {
		out[t] = slices.Sorted(maps.Keys(m))
	}
	return out
}

// apply validates, compiles and applies one response's resources; an error is the NACK
// detail and leaves the previous configuration in place.
func (d *DataPlane) apply(typeURL, version string, anys []*anypb.Any) error {
	var msgs []proto.Message
	var errs []error
	for _, a := range anys {
		if a.GetTypeUrl() != typeURL {
			errs = append(errs, fmt.Errorf("resource of type %s in a %s response", a.GetTypeUrl(), typeURL))
			continue
		}
		m, err := newResource(typeURL)
		if err != nil {
			return err
		}
		if err := a.UnmarshalTo(m); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := d.checkUnknownFields(m); err != nil {
			errs = append(errs, err)
			continue
		}
		msgs = append(msgs, m)
	}
	if len(errs) > 0 {
		return d.nack(errs)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("closed")
	}
	next, cerrs := d.cfg.withType(typeURL, version, msgs)
	if len(cerrs) > 0 {
		return d.nackLocked(cerrs)
	}
	prev := d.cfg
	d.cfg = next
	var serr error
	switch typeURL {
	case resource.ListenerType:
		serr = d.syncListenersLocked()
	case resource.ClusterType, resource.EndpointType, resource.SecretType:
		// Secrets too: a cluster whose TLS secrets were missing is warming (see checkHost)
		// and starts health checking when they arrive.
		d.syncClustersLocked()
	}
	if serr != nil {
		d.cfg = prev
		return d.nackLocked([]error{serr})
	}
	d.versions[typeURL] = version
	d.checkReadyLocked()
	return nil
}

func (d *DataPlane) nack(errs []error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nackLocked(errs)
}

func (d *DataPlane) nackLocked(errs []error) error {
	err := multierror.Append(&multierror.Error{ErrorFormat: cli.Lines}, errs...).ErrorOrNil()
	d.nacks = append(d.nacks, err.Error())
	d.stats.inc("dataplane.xds.nacks")
	return err
}

// checkReadyLocked closes readyCh once listeners and clusters are applied, every route
// configuration, load assignment and secret they refer to is applied too, and every cluster
// warmed.
func (d *DataPlane) checkReadyLocked() {
	if d.ready {
		return
	}
	if _, ok := d.versions[resource.ListenerType]; !ok {
		return
	}
	if _, ok := d.versions[resource.ClusterType]; !ok {
		return
	}
	cfg := d.cfg
	for _, l := range cfg.listeners {
		if cfg.routes[l.hcm.rdsName] == nil || d.listeners[l.name] == nil {
			return
		}
		if l.tls != nil && (cfg.secrets[l.tls.certSecret] == nil || (l.tls.caSecret != "" && cfg.secrets[l.tls.caSecret] == nil)) {
			return
		}
	}
	for _, c := range cfg.clusters {
		if c.edsName != "" && cfg.endpoints[c.edsName] == nil {
			return
		}
		if c.tls != nil && ((c.tls.certSecret != "" && cfg.secrets[c.tls.certSecret] == nil) || (c.tls.caSecret != "" && cfg.secrets[c.tls.caSecret] == nil)) {
			return
		}
	}
	// And, as Envoy's server initialization waits for the cluster manager's
	// (ClusterManagerInitHelper, source/common/upstream/cluster_manager_impl.cc: the CDS
	// clusters' initialization is part of the server's init), every cluster warmed.
	for _, c := range d.clusters {
		c.mu.Lock()
		warm := c.warm
		c.mu.Unlock()
		if !warm {
			return
		}
	}
	d.ready = true
	close(d.readyCh)
}

// loadStatic applies a `xds-server translate -o json` dump: each type as one response at the
// dump's version, listeners last (as Envoy warms them after their dependencies).
func (d *DataPlane) loadStatic(raw []byte) error {
	var dump map[string]json.RawMessage
	if err := json.Unmarshal(raw, &dump); err != nil {
		return fmt.Errorf("dataplane: config JSON: %w", err)
	}
	var version string
	if v, ok := dump["version"]; ok {
		_ = json.Unmarshal(v, &version)
	}
	keys := map[string]string{resource.SecretType: "secrets", resource.EndpointType: "endpoints", resource.ClusterType: "clusters", resource.RouteType: "routes", resource.ListenerType: "listeners"}
	var errs []error
	for _, t := range []string{resource.SecretType, resource.ClusterType, resource.EndpointType, resource.RouteType, resource.ListenerType} {
		var items []json.RawMessage
		if v, ok := dump[keys[t]]; ok {
			if err := json.Unmarshal(v, &items); err != nil {
				return fmt.Errorf("dataplane: config JSON %s: %w", keys[t], err)
			}
		}
		var anys []*anypb.Any
		for _, it := range items {
			a := &anypb.Any{}
			if err := protojson.Unmarshal(it, a); err != nil {
				return fmt.Errorf("dataplane: config JSON %s: %w", keys[t], err)
			}
			anys = append(anys, a)
		}
		if err := d.apply(t, version, anys); err != nil {
			errs = append(errs, fmt.Errorf("%s rejected: %w", keys[t], err))
		}
	}
	if len(errs) > 0 {
		d.log.Warn("static configuration rejected", "error", multierror.Append(&multierror.Error{ErrorFormat: cli.Lines}, errs...).ErrorOrNil())
	}
	return nil
}
