// Package configdiff is `kubectl mvp config-dump`'s comparison: an Envoy's applied
// configuration (its admin /config_dump?include_eds) against what xds-server holds for that
// node (its admin /debug/config_dump?node=ID) and what xds-server's /debug/syncz says of
// the node's versions and NACKs, one row per resource. Everything here is pure: the caller
// fetches the pages.
//
// Secrets are never shown and never compared by their key material: a Secret is reduced to
// its name, its certificate chain and its validation context as soon as it is read.
package configdiff

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	_ "github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
	// The extension types (filters, transport sockets, ...) xds-server puts into typed_config
	// fields: an Any is read only when its type is registered.
)

// The states of a resource.
const (
	// Equal: both hold it, and what Envoy applied is what xds-server holds.
	Equal = "equal"
	// Differs: both hold it with different contents (Fields names the top-level fields).
	Differs = "differs"
	// OnlyXDSServer: xds-server holds it, Envoy has not applied it (not sent yet, NACKed, or
	// warming: Detail says which, as far as syncz and Envoy tell).
	OnlyXDSServer = "only-xds-server"
	// OnlyEnvoy: Envoy applied it, xds-server no longer holds it (removed, not yet sent).
	OnlyEnvoy = "only-envoy"
	// Warming: Envoy holds it but does not use it yet (a listener or cluster warming up).
	Warming = "warming"
)

// Report is `kubectl mvp config-dump -o json` (docs/operating.md).
type Report struct {
	Nodes []Node `json:"nodes"`
	// Problems are what could not be read or compared, one sentence each.
	Problems []string `json:"problems,omitempty"`
}

// InSync reports whether every Envoy applied exactly what xds-server holds for it: every
// resource equal, none warming, and nothing that could not be read or compared.
func (r *Report) InSync() bool {
	if len(r.Problems) > 0 {
		return false
	}
	for _, n := range r.Nodes {
		for _, res := range n.Resources {
			if res.State != Equal {
				return false
			}
		}
	}
	return true
}

// Node is one Envoy.
type Node struct {
	// Node is the Envoy's node ID (in a cluster, its pod's name); Envoy where it was read
	// (pod or admin URL).
	Node  string `json:"node"`
	Envoy string `json:"envoy,omitempty"`
	// Sync is syncz's word on it: ACK, NACK, pending, disconnected or unknown (syncz does not
	// list the node).
	Sync      string     `json:"sync"`
	Resources []Resource `json:"resources"`
	// Summary counts the resources by state.
	Summary map[string]int `json:"summary"`
}

// Resource is one resource on one node.
type Resource struct {
	// Type is the type URL's last part: Listener, RouteConfiguration, Cluster,
	// ClusterLoadAssignment, Secret.
	Type  string `json:"type"`
	Name  string `json:"name"`
	State string `json:"state"`
	// XDSServer is what xds-server says of the type for this node: the version it sent and
	// the one Envoy acknowledged ("sent v7, acked v6"), "" when it does not hold the resource.
	XDSServer string `json:"xdsServer,omitempty"`
	// EnvoyVersion is the version_info Envoy reports for the resource ("" where Envoy reports
	// none: endpoints); Envoy says whether Envoy holds it at all (active, warming).
	EnvoyVersion string `json:"envoyVersion,omitempty"`
	Envoy        string `json:"envoy,omitempty"`
	// Fields are the top-level fields that differ.
	Fields []string `json:"fields,omitempty"`
	// Detail explains the state: a NACK's reason, Envoy's error for the resource, warming.
	Detail string `json:"detail,omitempty"`
}

// Dump is one side's resources by type URL and name, each reduced to what is compared.
type Dump struct {
	res map[string]map[string]*entry
}

type entry struct {
	msg     proto.Message
	version string // Envoy's version_info
	warming bool   // Envoy: warming, not active
	err     string // Envoy: its last error for this resource
	// next is, beside an active version, the one warming to replace it.
	next *entry
}

func newDump() *Dump {
	return &Dump{res: map[string]map[string]*entry{}}
}

func (d *Dump) put(typeURL, name string, e *entry) {
	if d.res[typeURL] == nil {
		d.res[typeURL] = map[string]*entry{}
	}
	// An active version is shown; a warming one of the same name is what replaces it.
	if old := d.res[typeURL][name]; old != nil && old.warming != e.warming {
		active, next := old, e
		if old.warming {
			active, next = e, old
		}
		active.next, active.err = next, cmp.Or(active.err, next.err)
		d.res[typeURL][name] = active
		return
	}
	d.res[typeURL][name] = e
}

// typeOrder are the compared types, in the table's order.
var typeOrder = []string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.SecretType}

// ParseXDSServer reads xds-server's /debug/config_dump: {"listeners":[Any…],"routes":…,
// "clusters":…,"endpoints":…,"secrets":…}.
func ParseXDSServer(b []byte) (*Dump, error) {
	var raw map[string][]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("xds-server's /debug/config_dump is not its JSON: %w", err)
	}
	keys := map[string]string{
		"listeners": resourcev3.ListenerType, "routes": resourcev3.RouteType, "clusters": resourcev3.ClusterType,
		"endpoints": resourcev3.EndpointType, "secrets": resourcev3.SecretType,
	}
	d := newDump()
	for key, typeURL := range keys {
		for i, r := range raw[key] {
			m, err := readAny(r, typeURL)
			if err != nil {
				return nil, fmt.Errorf("xds-server's /debug/config_dump: %s[%d]: %w", key, i, err)
			}
			d.put(typeURL, cachev3.GetResourceName(m), &entry{msg: normalize(m)})
		}
	}
	return d, nil
}

// envoyDump is the part of envoy.admin.v3.ConfigDump compared: the dynamic resources. Static
// ones (the bootstrap's) are not xds-server's; other configs (bootstrap, scoped routes) are
// skipped unread.
type envoyDump struct {
	Configs []json.RawMessage `json:"configs"`
}

type envoyState struct {
	VersionInfo string          `json:"version_info"`
	Listener    json.RawMessage `json:"listener"`
}

type envoyError struct {
	Details string `json:"details"`
}

// text is the error's details, "" when there is none (a nil error_state).
func (e *envoyError) text() string {
	if e == nil {
		return ""
	}
	return e.Details
}

type envoyConfigs struct {
	Type string `json:"@type"`
	// ListenersConfigDump
	DynamicListeners []struct {
		Name         string      `json:"name"`
		ActiveState  *envoyState `json:"active_state"`
		WarmingState *envoyState `json:"warming_state"`
		ErrorState   *envoyError `json:"error_state"`
	} `json:"dynamic_listeners"`
	// ClustersConfigDump
	DynamicActiveClusters  []envoyCluster `json:"dynamic_active_clusters"`
	DynamicWarmingClusters []envoyCluster `json:"dynamic_warming_clusters"`
	// RoutesConfigDump
	DynamicRouteConfigs []struct {
		VersionInfo string          `json:"version_info"`
		RouteConfig json.RawMessage `json:"route_config"`
		ErrorState  *envoyError     `json:"error_state"`
	} `json:"dynamic_route_configs"`
	// SecretsConfigDump
	DynamicActiveSecrets  []envoySecret `json:"dynamic_active_secrets"`
	DynamicWarmingSecrets []envoySecret `json:"dynamic_warming_secrets"`
	// EndpointsConfigDump (only with ?include_eds)
	DynamicEndpointConfigs []struct {
		VersionInfo    string          `json:"version_info"`
		EndpointConfig json.RawMessage `json:"endpoint_config"`
	} `json:"dynamic_endpoint_configs"`
}

type envoyCluster struct {
	VersionInfo string          `json:"version_info"`
	Cluster     json.RawMessage `json:"cluster"`
	ErrorState  *envoyError     `json:"error_state"`
}

type envoySecret struct {
	Name        string          `json:"name"`
	VersionInfo string          `json:"version_info"`
	Secret      json.RawMessage `json:"secret"`
	ErrorState  *envoyError     `json:"error_state"`
}

// ParseEnvoy reads Envoy's /config_dump?include_eds (envoy.admin.v3.ConfigDump as JSON). A
// resource that cannot be read is a problem, not an error: the rest is still compared.
func ParseEnvoy(b []byte) (*Dump, []string, error) {
	var top envoyDump
	if err := json.Unmarshal(b, &top); err != nil || top.Configs == nil {
		if err == nil {
			err = errors.New(`no "configs"`)
		}
		return nil, nil, fmt.Errorf("the /config_dump read is not an envoy.admin.v3.ConfigDump (is this Envoy's admin?): %w", err)
	}
	d := newDump()
	var problems []string
	add := func(typeURL string, raw json.RawMessage, e *entry) {
		if len(raw) == 0 || string(raw) == "null" {
			return
		}
		m, err := readAny(raw, typeURL)
		if err != nil {
			problems = append(problems, fmt.Sprintf("Envoy's /config_dump: a %s: %v", shortType(typeURL), err))
			return
		}
		e.msg = normalize(m)
		d.put(typeURL, cachev3.GetResourceName(m), e)
	}
	sawEndpoints := false
	// Which clusters take their endpoints over EDS: Envoy lists every active cluster's
	// endpoints, those of clusters with their own load_assignment too.
	edsNames := map[string]bool{}
	var endpoints []json.RawMessage
	for _, c := range top.Configs {
		var cfg envoyConfigs
		if err := json.Unmarshal(c, &cfg); err != nil {
			problems = append(problems, fmt.Sprintf("Envoy's /config_dump: %v", err))
			continue
		}
		switch cfg.Type {
		case "type.googleapis.com/envoy.admin.v3.ListenersConfigDump":
			for _, l := range cfg.DynamicListeners {
				errText := l.ErrorState.text()
				if s := l.ActiveState; s != nil {
					add(resourcev3.ListenerType, s.Listener, &entry{version: s.VersionInfo, err: errText})
				}
				if s := l.WarmingState; s != nil {
					add(resourcev3.ListenerType, s.Listener, &entry{version: s.VersionInfo, warming: true, err: errText})
				}
				if l.ActiveState == nil && l.WarmingState == nil && errText != "" {
					problems = append(problems, fmt.Sprintf("Envoy refused listener %s: %s", l.Name, errText))
				}
			}
		case "type.googleapis.com/envoy.admin.v3.ClustersConfigDump":
			for i, cs := range [][]envoyCluster{cfg.DynamicActiveClusters, cfg.DynamicWarmingClusters} {
				for _, c := range cs {
					add(resourcev3.ClusterType, c.Cluster, &entry{version: c.VersionInfo, warming: i == 1, err: c.ErrorState.text()})
				}
			}
		case "type.googleapis.com/envoy.admin.v3.RoutesConfigDump":
			for _, r := range cfg.DynamicRouteConfigs {
				add(resourcev3.RouteType, r.RouteConfig, &entry{version: r.VersionInfo, err: r.ErrorState.text()})
			}
		case "type.googleapis.com/envoy.admin.v3.SecretsConfigDump":
			for i, ss := range [][]envoySecret{cfg.DynamicActiveSecrets, cfg.DynamicWarmingSecrets} {
				for _, s := range ss {
					add(resourcev3.SecretType, s.Secret, &entry{version: s.VersionInfo, warming: i == 1, err: s.ErrorState.text()})
				}
			}
		case "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump":
			sawEndpoints = true
			for _, ep := range cfg.DynamicEndpointConfigs {
				endpoints = append(endpoints, ep.EndpointConfig)
			}
		}
	}
	for _, e := range d.res[resourcev3.ClusterType] {
		c := e.msg.(*clusterv3.Cluster)
		if c.GetType() == clusterv3.Cluster_EDS {
			edsNames[cmp.Or(c.GetEdsClusterConfig().GetServiceName(), c.GetName())] = true
		}
	}
	for _, raw := range endpoints {
		m, err := readAny(raw, resourcev3.EndpointType)
		if err != nil {
			problems = append(problems, fmt.Sprintf("Envoy's /config_dump: a ClusterLoadAssignment: %v", err))
			continue
		}
		if name := cachev3.GetResourceName(m); edsNames[name] {
			d.put(resourcev3.EndpointType, name, &entry{msg: normalize(m)})
		}
	}
	if !sawEndpoints && len(edsNames) > 0 {
		problems = append(problems, "Envoy's /config_dump has no endpoints (was it asked with ?include_eds?)")
	}
	return d, problems, nil
}

// readAny reads one resource's protojson (an Any with its @type), which must be of typeURL.
func readAny(raw json.RawMessage, typeURL string) (proto.Message, error) {
	a := &anypb.Any{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, a); err != nil {
		return nil, err
	}
	if a.GetTypeUrl() != typeURL {
		return nil, fmt.Errorf("is a %s, not a %s", a.GetTypeUrl(), typeURL)
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	return m, nil
}

// normalize reduces a resource to what both sides must agree on.
//
// A Secret keeps its name, certificate chain and validation context: never its private key
// (xds-server and Envoy redact it, each in its own way), session ticket keys or generic
// secret.
//
// A ClusterLoadAssignment is what Envoy's /config_dump can say of it: Envoy does not keep
// the one it received but rebuilds one from the cluster's hosts (ConfigDumpHandler::
// dumpEndpointConfigs in Envoy's source/server/admin/config_dump_handler.cc), adding the
// hosts' current health, a weight of 1 where none was given, the policy's defaults and an
// empty health_check_config. So endpoints are compared by cluster, and per priority and
// locality by each host's address, hostname, metadata and weight, in address order.
func normalize(m proto.Message) proto.Message {
	switch r := m.(type) {
	case *tlsv3.Secret:
		out := &tlsv3.Secret{Name: r.GetName()}
		if tc := r.GetTlsCertificate(); tc != nil {
			out.Type = &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{CertificateChain: tc.GetCertificateChain()}}
		}
		if vc := r.GetValidationContext(); vc != nil {
			out.Type = &tlsv3.Secret_ValidationContext{ValidationContext: vc}
		}
		return out
	case *endpointv3.ClusterLoadAssignment:
		type group struct {
			priority uint32
			locality *corev3.Locality
			hosts    []*endpointv3.LbEndpoint
		}
		var groups []*group
		for _, l := range r.GetEndpoints() {
			locality := l.GetLocality()
			if proto.Size(locality) == 0 { // Envoy shows the default locality as {}
				locality = nil
			}
			var g *group
			for _, x := range groups {
				if x.priority == l.GetPriority() && proto.Equal(x.locality, locality) {
					g = x
				}
			}
			if g == nil {
				g = &group{priority: l.GetPriority(), locality: locality}
				groups = append(groups, g)
			}
			for _, e := range l.GetLbEndpoints() {
				weight := e.GetLoadBalancingWeight().GetValue()
				if weight == 0 {
					weight = 1
				}
				g.hosts = append(g.hosts, &endpointv3.LbEndpoint{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: e.GetEndpoint().GetAddress(), Hostname: e.GetEndpoint().GetHostname()}},
					Metadata:       e.GetMetadata(),
					// Envoy's rebuilt assignment has no metadata field where the host has none.
					LoadBalancingWeight: wrapperspb.UInt32(weight),
				})
			}
		}
		slices.SortFunc(groups, func(a, b *group) int {
			return cmp.Or(cmp.Compare(a.priority, b.priority), strings.Compare(a.locality.String(), b.locality.String()))
		})
		out := &endpointv3.ClusterLoadAssignment{ClusterName: r.GetClusterName()}
		for _, g := range groups {
			if len(g.hosts) == 0 {
				continue
			}
			slices.SortFunc(g.hosts, func(a, b *endpointv3.LbEndpoint) int {
				return strings.Compare(a.GetEndpoint().GetAddress().String(), b.GetEndpoint().GetAddress().String())
			})
			for _, h := range g.hosts {
				if len(h.GetMetadata().GetFilterMetadata()) == 0 && len(h.GetMetadata().GetTypedFilterMetadata()) == 0 {
					h.Metadata = nil
				}
			}
			out.Endpoints = append(out.Endpoints, &endpointv3.LocalityLbEndpoints{Priority: g.priority, Locality: g.locality, LbEndpoints: g.hosts})
		}
		return out
	}
	return m
}

// Compare is one node's rows: xds-server's dump for the node against Envoy's, with syncz's
// status of the node (nil: syncz does not list it).
func Compare(node string, xdsServer, envoy *Dump, sync *xdsstatus.NodeStatus) Node {
	n := Node{Node: node, Sync: syncState(sync), Resources: []Resource{}, Summary: map[string]int{}}
	for _, typeURL := range typeOrder {
		ours, theirs := xdsServer.res[typeURL], envoy.res[typeURL]
		names := slices.Sorted(maps.Keys(ours))
		for name := range theirs {
			if _, ok := ours[name]; !ok {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		ts := typeStatus(sync, typeURL)
		for _, name := range names {
			x, e := ours[name], theirs[name]
			r := Resource{Type: shortType(typeURL), Name: name}
			if x != nil {
				r.XDSServer = versions(ts)
			}
			if e != nil {
				r.EnvoyVersion, r.Envoy, r.Detail = e.version, "active", e.err
				if e.warming {
					r.Envoy = "warming"
				}
			}
			switch {
			case x != nil && e == nil:
				r.State = OnlyXDSServer
				r.Detail = missingWhy(ts, sync, typeURL)
			case x == nil:
				r.State = OnlyEnvoy
				if r.Detail == "" {
					r.Detail = "xds-server no longer holds it (or has not sent its removal yet)"
				}
			case proto.Equal(x.msg, e.msg) && e.warming:
				r.State = Warming
			case e.next != nil && proto.Equal(x.msg, e.next.msg):
				// The active version is older; xds-server's is warming up to replace it.
				r.State, r.Envoy, r.EnvoyVersion = Warming, "warming", e.next.version
			case proto.Equal(x.msg, e.msg):
				r.State = Equal
			default:
				r.State = Differs
				r.Fields = differingFields(x.msg, e.msg)
				if r.Detail == "" {
					r.Detail = differsWhy(ts, e)
				}
			}
			n.Summary[r.State]++
			n.Resources = append(n.Resources, r)
		}
	}
	return n
}

func syncState(s *xdsstatus.NodeStatus) string {
	if s == nil {
		return "unknown"
	}
	state := "ACK"
	for _, ts := range s.Types {
		if ts.NackError != "" {
			state = "NACK"
		} else if ts.Sent != ts.Acked && state == "ACK" {
			state = "pending"
		}
	}
	if s.Streams == 0 {
		state = "disconnected"
	}
	return state
}

func typeStatus(s *xdsstatus.NodeStatus, typeURL string) *xdsstatus.TypeStatus {
	if s == nil {
		return nil
	}
	return s.Types[typeURL]
}

func versions(ts *xdsstatus.TypeStatus) string {
	switch {
	case ts == nil:
		return "held"
	case ts.Sent == "":
		return "not sent"
	case ts.Sent == ts.Acked:
		return "acked " + ts.Acked
	case ts.Acked == "":
		return "sent " + ts.Sent + ", not acked"
	}
	return "sent " + ts.Sent + ", acked " + ts.Acked
}

// missingWhy says why Envoy lacks a resource xds-server holds, from syncz.
func missingWhy(ts *xdsstatus.TypeStatus, sync *xdsstatus.NodeStatus, typeURL string) string {
	switch {
	case sync == nil:
		return "syncz does not list this node"
	case ts != nil && ts.NackError != "":
		return fmt.Sprintf("Envoy refused version %s: %s", ts.NackedNext, ts.NackError)
	case ts == nil || ts.Sent == "":
		if typeURL == resourcev3.EndpointType {
			return "not sent (Envoy has not asked for it, or its cluster is not active yet)"
		}
		return "not sent (Envoy has not asked for it)"
	case ts.Sent != ts.Acked:
		return "sent, not acknowledged yet"
	}
	return "acknowledged but not applied (warming, or Envoy dropped it)"
}

func differsWhy(ts *xdsstatus.TypeStatus, e *entry) string {
	switch {
	case ts != nil && ts.NackError != "":
		return fmt.Sprintf("Envoy refused version %s and keeps %s: %s", ts.NackedNext, cmp.Or(e.version, "an older one"), ts.NackError)
	case ts != nil && ts.Sent != ts.Acked:
		return "sent, not acknowledged yet"
	}
	return ""
}

// differingFields names the top-level fields that differ (names only, never values: a
// Secret's are its certificate and trust).
func differingFields(a, b proto.Message) []string {
	ra, rb := a.ProtoReflect(), b.ProtoReflect()
	var out []string
	fields := ra.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if ra.Has(f) != rb.Has(f) || (ra.Has(f) && !ra.Get(f).Equal(rb.Get(f))) {
			out = append(out, string(f.Name()))
		}
	}
	return out
}

// shortType is a type URL's last part.
func shortType(typeURL string) string {
	return typeURL[strings.LastIndexByte(typeURL, '.')+1:]
}

// Sort puts the nodes in name order.
func (r *Report) Sort() {
	slices.SortFunc(r.Nodes, func(a, b Node) int { return strings.Compare(a.Node, b.Node) })
}
