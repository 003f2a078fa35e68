package snapshot

import (
	"errors"
	"fmt"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kube-mvp/kube-mvp/internal/oldestenvoy"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Resource names. The apiserver clusters are named by the plan (contract.Cluster*), because
// extproc names them too.
const (
	ListenerName       = "kube-apiserver"
	RouteConfigName    = "kube-apiserver"
	VirtualHostName    = "kube-apiserver"
	ExtProcClusterName = "kube-mvp-extproc"

	SecretServingCert     = "kube-mvp-serving-cert"
	SecretClientCA        = "kube-mvp-client-ca"
	SecretProxyClientCert = "kube-mvp-proxy-client-cert"
	SecretPeerCA          = "kube-mvp-peer-ca"

	// MetadataNamespace keys kube-mvp's metadata on routes, clusters and endpoints.
	MetadataNamespace = "kube-mvp"
)

// Envoy extension names (the well-known names under which Envoy registers them).
const (
	extProcFilterName        = "envoy.filters.http.ext_proc"
	identityFilterName       = "kube-mvp.identity" // the Lua filter running LuaScript
	routerFilterName         = "envoy.filters.http.router"
	hcmFilterName            = "envoy.filters.network.http_connection_manager"
	tlsTransportSocketName   = "envoy.transport_sockets.tls"
	httpProtocolOptionsKey   = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	earlyHeaderMutationName  = "envoy.http.early_header_mutation.header_mutation"
	previousHostsPredicateNm = "envoy.retry_host_predicates.previous_hosts"
)

// Resources is one complete Envoy configuration, every list sorted by resource name. Treat it
// as immutable: resources share sub-messages (the upstream TLS context of every apiserver
// cluster is one message), and the versions are computed once.
type Resources struct {
	Listeners []types.Resource
	Routes    []types.Resource
	Clusters  []types.Resource
	Endpoints []types.Resource
	Secrets   []types.Resource
	// TypeVersions holds the content hash of each type's resources, by type URL.
	TypeVersions map[resource.Type]string
	// Version is the content hash of everything: equal inputs give equal versions on every
	// replica.
	Version string
}

// AddressError reports an apiserver whose endpoint was left out because its address cannot be
// an EDS endpoint. It is the one kind of error after which Build still returns Resources.
type AddressError struct {
	APIServer string // ID
	Hostname  string
	Address   string
	Reason    string
}

func (e *AddressError) Error() string {
	who := "apiserver " + e.APIServer
	if e.Hostname != "" {
		who += " (hostname " + e.Hostname + ")"
	}
	return fmt.Sprintf("%s: address %q %s; its endpoint is left out of every cluster", who, e.Address, e.Reason)
}

// Build translates a plan into Envoy resources. It is pure: the output depends only on p
// and cfg, byte for byte. It decides nothing: every cluster, route and outcome is p's.
//
// Every problem is reported, not only the first: the error is then an errors.Join of the
// problems (Unwrap() []error), printed one per line.
// When every problem is an *AddressError (an apiserver whose endpoint had to be left out),
// Build returns the Resources without those endpoints together with that error, so a caller
// can choose degraded service over none; any other error means no Resources.
func Build(p *plan.Plan, cfg Config) (*Resources, error) {
	if p == nil || p.Topology == nil {
		return nil, errors.New("snapshot: no plan")
	}
	c, errs := cfg.check()
	if len(errs) > 0 {
		// Building from a bad config would only add noise to the report.
		return nil, joined(errs)
	}
	b := &builder{p: p, t: p.Topology, cfg: c}
	res := &Resources{}
	secrets := b.secrets()
	for _, s := range secrets {
		res.Secrets = append(res.Secrets, s)
	}
	res.Listeners = []types.Resource{b.listener()}
	res.Routes = []types.Resource{b.routeConfiguration()}
	clusters, endpoints := b.clusters()
	for _, c := range clusters {
		res.Clusters = append(res.Clusters, c)
	}
	for _, e := range endpoints {
		res.Endpoints = append(res.Endpoints, e)
	}
	if changeForTest != nil {
		changeForTest(res)
	}
	b.validateTop(res)
	if len(b.errs) == 0 {
		b.errs = append(b.errs, checkReferences(res, b.producible())...)
	}
	fatal := slices.ContainsFunc(b.errs, func(err error) bool {
		var ae *AddressError
		return !errors.As(err, &ae)
	})
	if fatal {
		return nil, joined(b.errs)
	}
	if err := res.computeVersions(b.wire); err != nil {
		return nil, err
	}
	return res, joined(b.errs)
}

// changeForTest, set only by tests, changes the translated resources before they are checked,
// to show what the checks refuse.
var changeForTest func(*Resources)

// joined is errs as one error printed one per line, or nil if there are none.
func joined(errs []error) error {
	return errors.Join(errs...)
}

// builder carries one translation.
type builder struct {
	p    *plan.Plan
	t    *topology.Topology // p's, for apiserver names and addresses
	cfg  config
	errs []error
	// wire holds each resource's deterministic wire form (validateTop), hashed for versions.
	wire map[types.Resource][]byte
}

func (b *builder) errorf(format string, args ...any) {
	b.errs = append(b.errs, fmt.Errorf(format, args...))
}

// producible maps every cluster that extproc may name by the plan's routes (for each request
// kind Envoy has a cluster for: plan.Route.Destination) to one resource that leads there, for
// checkReferences' error messages.
func (b *builder) producible() map[string]string {
	out := map[string]string{}
	// Routes that go alike name the same clusters: each such set once (a plan has thousands
	// of routes and a handful of destinations).
	type alike struct {
		outcome topology.Outcome
		cluster string
		refused bool
	}
	seen := map[alike]bool{}
	add := func(r plan.Route, what func() string) {
		a := alike{r.Outcome, r.Cluster, len(r.ProxyCertRefused) > 0}
		if seen[a] {
			return
		}
		seen[a] = true
		for _, k := range b.requestKinds() {
			d := r.Destination(k)
			if d.Refused != plan.NotRefused {
				continue
			}
			name := d.Cluster.String()
			if _, ok := out[name]; ok {
				continue
			}
			out[name] = what()
			if k.Upgrade {
				out[name] += " as an upgrade"
			}
			if k.ProxyCert {
				out[name] += " with a client certificate"
			}
		}
	}
	add(b.p.Routes.Default, func() string { return "non-resource requests" })
	for _, r := range b.p.Routes.All() {
		if r.Resource.IsDocument() {
			continue // named below, after the resources: a resource is the clearer example
		}
		add(r, r.Resource.String)
	}
	for _, gv := range b.p.GroupVersions {
		add(gv.Document, func() string { return "the " + gv.GroupVersion.String() + " document" })
	}
	return out
}

// requestKinds are the kinds of request (plan.RequestKinds) that Envoy has a variant of each
// apiserver cluster for: with a proxy client certificate every one, otherwise those with the
// caller's own credentials.
func (b *builder) requestKinds() []plan.RequestKind {
	if len(b.cfg.Secrets.ProxyClientCert) > 0 {
		return plan.RequestKinds[:]
	}
	return slices.DeleteFunc(slices.Clone(plan.RequestKinds[:]), func(k plan.RequestKind) bool { return k.ProxyCert })
}

// validated is every generated Envoy message: PGV generates ValidateAll for each.
type validated interface {
	proto.Message
	ValidateAll() error
}

// pack validates m and packs it into an Any with deterministic marshalling, so that equal
// configurations have equal bytes (and hashes).
func (b *builder) pack(what string, m validated) *anypb.Any {
	if err := m.ValidateAll(); err != nil {
		b.errorf("%s: %w", what, err)
	}
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		b.errorf("%s: packing: %w", what, err)
	}
	return a
}

// validateTop validates every top-level resource (typed configs inside were validated when
// packed: PGV does not look inside an Any), and checks that the oldest supported Envoy knows
// everything each one uses, typed configs included (oldestenvoy.Check), on its wire form, which
// it keeps in b.wire for the versions.
func (b *builder) validateTop(res *Resources) {
	b.wire = map[types.Resource][]byte{}
	oldest, err := oldestenvoy.NewChecker()
	if err != nil {
		b.errs = append(b.errs, err)
	}
	for _, list := range [][]types.Resource{res.Listeners, res.Routes, res.Clusters, res.Endpoints, res.Secrets} {
		for _, r := range list {
			v, ok := r.(validated)
			if !ok {
				b.errorf("%T is not a validatable Envoy resource", r)
				continue
			}
			if err := v.ValidateAll(); err != nil {
				b.errorf("%s %q: %w", kindOf(r), cachev3.GetResourceName(r), err)
			}
			wire, err := deterministic.Marshal(v)
			if err != nil {
				b.errorf("%s %q: %w", kindOf(r), cachev3.GetResourceName(r), err)
				continue
			}
			b.wire[r] = wire
			if oldest == nil {
				continue
			}
			for _, err := range oldest.CheckWire(v, wire) {
				b.errorf("%s %q: %w", kindOf(r), cachev3.GetResourceName(r), err)
			}
		}
	}
}

func kindOf(r types.Resource) string {
	switch r.(type) {
	case *listenerv3.Listener:
		return "listener"
	case *routev3.RouteConfiguration:
		return "route configuration"
	case *clusterv3.Cluster:
		return "cluster"
	case *endpointv3.ClusterLoadAssignment:
		return "endpoints of cluster"
	case *tlsv3.Secret:
		return "secret"
	}
	return fmt.Sprintf("%T", r)
}

// ads is the config source of every dynamic resource: the ADS stream Envoy's bootstrap opens.
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ResourceApiVersion:    corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}
