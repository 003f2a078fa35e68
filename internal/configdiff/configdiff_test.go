package configdiff

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/certgen"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/explain"
	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
)

// side is one side's resources by type URL, before they are dumped.
type side map[string][]proto.Message

// translated is a fixture's real configuration, as xds-server serves it, by type URL.
func translated(t *testing.T) side {
	t.Helper()
	p, err := plan.Build(fixtures.Topology(t, "batch-off"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := snapshot.Build(p, snapshot.Config{Secrets: explain.SecretsAssumed})
	if res == nil {
		t.Fatal(err)
	}
	s := side{}
	for typeURL, list := range map[string][]types.Resource{resourcev3.ListenerType: res.Listeners,
		resourcev3.RouteType: res.Routes, resourcev3.ClusterType: res.Clusters,
		resourcev3.EndpointType: res.Endpoints, resourcev3.SecretType: res.Secrets} {
		for _, r := range list {
			s[typeURL] = append(s[typeURL], proto.Clone(r))
		}
	}
	if len(s[resourcev3.EndpointType]) == 0 || len(s[resourcev3.SecretType]) == 0 {
		t.Fatalf("the fixture's configuration has no endpoints or no secrets: %v", s)
	}
	return s
}

func (s side) clone() side {
	out := side{}
	for k, v := range s {
		for _, m := range v {
			out[k] = append(out[k], proto.Clone(m))
		}
	}
	return out
}

func anyJSON(t *testing.T, m proto.Message) json.RawMessage {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	b, err := protojson.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// xdsServerJSON is s as xds-server's /debug/config_dump lays it out (unredacted: the
// comparison must not rely on xds-server's redaction).
func xdsServerJSON(t *testing.T, s side) []byte {
	t.Helper()
	out := map[string][]json.RawMessage{}
	for key, typeURL := range map[string]string{"listeners": resourcev3.ListenerType,
		"routes": resourcev3.RouteType, "clusters": resourcev3.ClusterType, "endpoints": resourcev3.EndpointType,
		"secrets": resourcev3.SecretType} {
		out[key] = []json.RawMessage{}
		for _, m := range s[typeURL] {
			out[key] = append(out[key], anyJSON(t, m))
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// envoyOptions shape Envoy's dump: warming clusters, and whether Envoy redacts.
type envoyOptions struct {
	warmingClusters []*clusterv3.Cluster
	noRedaction     bool
	noEDS           bool
}

// envoyJSON is s as Envoy's /config_dump?include_eds lays it out: dynamic resources with
// their version_info, secrets redacted, every active cluster's endpoints rebuilt from its
// hosts (Envoy's dumpEndpointConfigs: the default policy, weight 1, health, an empty
// health_check_config, no version).
func envoyJSON(t *testing.T, s side, version string, o envoyOptions) []byte {
	t.Helper()
	pack := func(m proto.Message) *anypb.Any {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	ld := &adminv3.ListenersConfigDump{VersionInfo: version}
	for _, m := range s[resourcev3.ListenerType] {
		l := m.(*listenerv3.Listener)
		ld.DynamicListeners = append(ld.DynamicListeners,
			&adminv3.ListenersConfigDump_DynamicListener{Name: l.GetName(),
				ActiveState: &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: version, Listener: pack(l)}})
	}
	cd := &adminv3.ClustersConfigDump{VersionInfo: version}
	for _, m := range s[resourcev3.ClusterType] {
		cd.DynamicActiveClusters = append(cd.DynamicActiveClusters, &adminv3.ClustersConfigDump_DynamicCluster{VersionInfo: version, Cluster: pack(m)})
	}
	for _, c := range o.warmingClusters {
		cd.DynamicWarmingClusters = append(cd.DynamicWarmingClusters, &adminv3.ClustersConfigDump_DynamicCluster{VersionInfo: version, Cluster: pack(c)})
	}
	rd := &adminv3.RoutesConfigDump{}
	for _, m := range s[resourcev3.RouteType] {
		rd.DynamicRouteConfigs = append(rd.DynamicRouteConfigs, &adminv3.RoutesConfigDump_DynamicRouteConfig{VersionInfo: version, RouteConfig: pack(m)})
	}
	sd := &adminv3.SecretsConfigDump{}
	for _, m := range s[resourcev3.SecretType] {
		sec := proto.Clone(m).(*tlsv3.Secret)
		if pk := sec.GetTlsCertificate().GetPrivateKey(); pk != nil && !o.noRedaction {
			// Envoy keeps the DataSource's kind and replaces its text.
			switch pk.GetSpecifier().(type) {
			case *corev3.DataSource_Filename:
				pk.Specifier = &corev3.DataSource_Filename{Filename: "[redacted]"}
			default:
				pk.Specifier = &corev3.DataSource_InlineBytes{InlineBytes: []byte("[redacted]")}
			}
		}
		sd.DynamicActiveSecrets = append(sd.DynamicActiveSecrets, &adminv3.SecretsConfigDump_DynamicSecret{Name: sec.GetName(), VersionInfo: version, Secret: pack(sec)})
	}
	dump := &adminv3.ConfigDump{Configs: []*anypb.Any{pack(ld), pack(cd), pack(rd), pack(sd)}}
	if !o.noEDS {
		ed := &adminv3.EndpointsConfigDump{}
		for _, m := range s[resourcev3.EndpointType] {
			ed.DynamicEndpointConfigs = append(ed.DynamicEndpointConfigs, &adminv3.EndpointsConfigDump_DynamicEndpointConfig{EndpointConfig: pack(rebuilt(m.(*endpointv3.ClusterLoadAssignment)))})
		}
		dump.Configs = append(dump.Configs, pack(ed))
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(dump)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rebuilt is cla as Envoy's /config_dump shows it.
func rebuilt(cla *endpointv3.ClusterLoadAssignment) *endpointv3.ClusterLoadAssignment {
	out := &endpointv3.ClusterLoadAssignment{ClusterName: cla.GetClusterName(), Policy: &endpointv3.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(140)}}
	for _, l := range cla.GetEndpoints() {
		g := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{}, Priority: l.GetPriority()}
		for _, e := range l.GetLbEndpoints() {
			w := e.GetLoadBalancingWeight().GetValue()
			if w == 0 {
				w = 1
			}
			g.LbEndpoints = append(g.LbEndpoints, &endpointv3.LbEndpoint{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: e.GetEndpoint().GetAddress(),
					Hostname: e.GetEndpoint().GetHostname(), HealthCheckConfig: &endpointv3.Endpoint_HealthCheckConfig{}}},
				Metadata:            e.GetMetadata(),
				HealthStatus:        corev3.HealthStatus_HEALTHY,
				LoadBalancingWeight: wrapperspb.UInt32(w),
			})
		}
		slices.Reverse(g.LbEndpoints) // Envoy's host order is not the assignment's
		out.Endpoints = append(out.Endpoints, g)
	}
	return out
}

func acked(version string) *xdsstatus.NodeStatus {
	s := &xdsstatus.NodeStatus{NodeID: "front", Streams: 1, Types: map[string]*xdsstatus.TypeStatus{}}
	for _, typeURL := range typeOrder {
		s.Types[typeURL] = &xdsstatus.TypeStatus{Sent: version, Acked: version}
	}
	return s
}

func compare(t *testing.T, ours side, envoy []byte, sync *xdsstatus.NodeStatus) (Node, []string) {
	t.Helper()
	x, err := ParseXDSServer(xdsServerJSON(t, ours))
	if err != nil {
		t.Fatal(err)
	}
	e, problems, err := ParseEnvoy(envoy)
	if err != nil {
		t.Fatal(err)
	}
	return Compare("front", x, e, sync), problems
}

func row(t *testing.T, n Node, typ, name string) Resource {
	t.Helper()
	for _, r := range n.Resources {
		if r.Type == typ && r.Name == name {
			return r
		}
	}
	t.Fatalf("no %s %s in %+v", typ, name, n.Resources)
	return Resource{}
}

// TestEqual: a real translated configuration, as Envoy shows it (endpoints rebuilt, the key
// redacted), is equal resource by resource.
func TestEqual(t *testing.T) {
	s := translated(t)
	n, problems := compare(t, s, envoyJSON(t, s, "v1", envoyOptions{}), acked("v1"))
	total := 0
	for _, l := range s {
		total += len(l)
	}
	if len(problems) > 0 || n.Summary[Equal] != total || len(n.Resources) != total || n.Sync != "ACK" {
		t.Fatalf("problems %q, summary %v of %d, sync %s: %+v", problems, n.Summary, total, n.Sync, n.Resources)
	}
	if !(&Report{Nodes: []Node{n}}).InSync() {
		t.Error("InSync: false for a node whose every resource is equal")
	}
	if (&Report{Nodes: []Node{n}, Problems: []string{"an admin page could not be read"}}).InSync() {
		t.Error("InSync: true despite a problem")
	}
	for _, r := range n.Resources {
		wantVersion := "v1"
		if r.Type == "ClusterLoadAssignment" {
			wantVersion = "" // Envoy's rebuilt assignments carry none
		}
		if r.XDSServer != "acked v1" || r.Envoy != "active" || r.EnvoyVersion != wantVersion {
			t.Errorf("%+v: want acked v1, active %q", r, wantVersion)
		}
	}
}

// TestDifferences: each way the two sides can disagree is reported as such.
func TestDifferences(t *testing.T) {
	ours := translated(t)
	theirs := ours.clone()

	cluster := theirs[resourcev3.ClusterType][0].(*clusterv3.Cluster)
	cluster.ConnectTimeout = durationpb.New(42 * time.Second)
	route := ours[resourcev3.RouteType][0].(*routev3.RouteConfiguration).GetName()
	theirs[resourcev3.RouteType] = theirs[resourcev3.RouteType][1:]
	theirs[resourcev3.ClusterType] = append(theirs[resourcev3.ClusterType], &clusterv3.Cluster{Name: "gone", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}})
	cla := theirs[resourcev3.EndpointType][0].(*endpointv3.ClusterLoadAssignment)
	extra := proto.Clone(cla.GetEndpoints()[0].GetLbEndpoints()[0]).(*endpointv3.LbEndpoint)
	extra.GetEndpoint().Address = &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "192.0.2.9",
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 6443}}}}
	cla.GetEndpoints()[0].LbEndpoints = append(cla.GetEndpoints()[0].LbEndpoints, extra)
	warming := &clusterv3.Cluster{Name: "warming-up", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}}
	ours[resourcev3.ClusterType] = append(ours[resourcev3.ClusterType], warming)
	// Envoy warms xds-server's new version of a cluster while the old one serves.
	replaced := ours[resourcev3.ClusterType][1].(*clusterv3.Cluster)
	replacement := proto.Clone(replaced).(*clusterv3.Cluster)
	theirs[resourcev3.ClusterType][1].(*clusterv3.Cluster).ConnectTimeout = durationpb.New(7 * time.Second)

	sync := acked("v2")
	sync.Types[resourcev3.RouteType] = &xdsstatus.TypeStatus{Sent: "v2", Acked: "v1", NackedNext: "v2", NackError: "route: invalid regex", NackedAt: time.Now()}
	n, problems := compare(t, ours, envoyJSON(t, theirs, "v1", envoyOptions{warmingClusters: []*clusterv3.Cluster{warming, replacement}}), sync)
	if len(problems) > 0 {
		t.Errorf("problems %q", problems)
	}
	if r := row(t, n, "Cluster", cluster.GetName()); r.State != Differs || !slices.Equal(r.Fields, []string{"connect_timeout"}) {
		t.Errorf("changed cluster: %+v", r)
	}
	if r := row(t, n, "RouteConfiguration", route); r.State != OnlyXDSServer || !strings.Contains(r.Detail, "Envoy refused version v2: route: invalid regex") || r.Envoy != "" {
		t.Errorf("NACKed route: %+v", r)
	}
	if r := row(t, n, "Cluster", "gone"); r.State != OnlyEnvoy || r.XDSServer != "" || r.Envoy != "active" {
		t.Errorf("removed cluster: %+v", r)
	}
	if r := row(t, n, "Cluster", "warming-up"); r.State != Warming || r.Envoy != "warming" {
		t.Errorf("warming cluster: %+v", r)
	}
	if r := row(t, n, "Cluster", replaced.GetName()); r.State != Warming || r.Envoy != "warming" {
		t.Errorf("cluster warming to replace an older version: %+v", r)
	}
	if r := row(t, n, "ClusterLoadAssignment", cla.GetClusterName()); r.State != Differs || !slices.Equal(r.Fields, []string{"endpoints"}) {
		t.Errorf("endpoints with an extra host: %+v", r)
	}
	if n.Sync != "NACK" || n.Summary[Differs] != 2 || n.Summary[OnlyXDSServer] != 1 || n.Summary[OnlyEnvoy] != 1 || n.Summary[Warming] != 2 {
		t.Errorf("sync %s, summary %v", n.Sync, n.Summary)
	}
	// Each state but equal alone puts the report out of sync.
	for _, st := range []string{Differs, OnlyXDSServer, OnlyEnvoy, Warming} {
		one := Node{Node: n.Node, Sync: n.Sync, Resources: []Resource{{Type: "Cluster", Name: "a", State: Equal}, {Type: "Cluster", Name: "b", State: st}}}
		if (&Report{Nodes: []Node{one}}).InSync() {
			t.Errorf("InSync: true with a resource %s", st)
		}
	}
	var text bytes.Buffer
	Write(&text, &Report{Nodes: []Node{n}})
	for _, want := range []string{"NODE front (xds-server: NACK;", "TYPE", "XDS-SERVER", "only-xds-server", "route: invalid regex", "fields: connect_timeout", "gone"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, text.String())
		}
	}

	// A node syncz does not know, and an Envoy asked without ?include_eds.
	n, problems = compare(t, ours, envoyJSON(t, ours, "v1", envoyOptions{noEDS: true}), nil)
	if n.Sync != "unknown" || len(problems) != 1 || !strings.Contains(problems[0], "include_eds") {
		t.Errorf("sync %s, problems %q", n.Sync, problems)
	}
	if r := row(t, n, "ClusterLoadAssignment", cla.GetClusterName()); r.State != OnlyXDSServer || r.Detail != "syncz does not list this node" {
		t.Errorf("endpoints not dumped: %+v", r)
	}
}

// TestNonEDSEndpointsSkipped: Envoy lists the hosts of every active cluster, a STATIC or
// DNS cluster's too; those are part of the cluster, not an EDS resource of xds-server's.
func TestNonEDSEndpointsSkipped(t *testing.T) {
	ours := translated(t)
	static := &clusterv3.Cluster{Name: "static", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: "static",
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/x.sock"}}},
				}},
			}}}}}}
	ours[resourcev3.ClusterType] = append(ours[resourcev3.ClusterType], static)
	theirs := ours.clone()
	theirs[resourcev3.EndpointType] = append(theirs[resourcev3.EndpointType], static.GetLoadAssignment())
	n, _ := compare(t, ours, envoyJSON(t, theirs, "v1", envoyOptions{}), acked("v1"))
	if n.Summary[Equal] != len(n.Resources) {
		t.Errorf("summary %v: %+v", n.Summary, n.Resources)
	}
}

// TestSecretsNeverPrinted: with a real certgen'd key inline on both sides (an xds-server
// and an Envoy that would not redact it), in equal and differing secrets, no output holds
// the key, in PEM or base64.
func TestSecretsNeverPrinted(t *testing.T) {
	state, _, err := certgen.Renew(time.Now(), certgen.State{}, []certgen.Spec{{Role: cptls.RoleEnvoyFront}, {Role: cptls.RoleExtproc}}, certgen.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	front, other := state.Leaves[cptls.RoleEnvoyFront], state.Leaves[cptls.RoleExtproc]
	if !bytes.Contains(front.KeyPEM, []byte("PRIVATE KEY")) {
		t.Fatalf("no key: %q", front.KeyPEM)
	}
	secret := func(name string, l certgen.Leaf) *tlsv3.Secret {
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: l.CertPEM}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: l.KeyPEM}},
		}}}
	}
	ours, theirs := side{}, side{}
	ours[resourcev3.SecretType] = []proto.Message{secret("same", front), secret("changed", front), secret("xds-only", front)}
	theirs[resourcev3.SecretType] = []proto.Message{secret("same", front), secret("changed", other), secret("envoy-only", other)}
	// Envoy's key differs in "same" too: keys are not compared.
	theirs[resourcev3.SecretType][0].(*tlsv3.Secret).GetTlsCertificate().PrivateKey.Specifier = &corev3.DataSource_InlineBytes{InlineBytes: other.KeyPEM}
	for _, redacting := range []bool{true, false} {
		n, _ := compare(t, ours, envoyJSON(t, theirs, "v1", envoyOptions{noRedaction: !redacting}), acked("v1"))
		if r := row(t, n, "Secret", "same"); r.State != Equal {
			t.Errorf("same certificate, other key: %+v", r)
		}
		if r := row(t, n, "Secret", "changed"); r.State != Differs || !slices.Equal(r.Fields, []string{"tls_certificate"}) {
			t.Errorf("other certificate: %+v", r)
		}
		rep := &Report{Nodes: []Node{n}}
		var text bytes.Buffer
		Write(&text, rep)
		js, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		y, err := yaml.JSONToYAML(js)
		if err != nil {
			t.Fatal(err)
		}
		for _, out := range [][]byte{text.Bytes(), js, y} {
			for _, key := range [][]byte{front.KeyPEM, other.KeyPEM} {
				body := bytes.Split(bytes.TrimSpace(key), []byte("\n"))[1] // a line of the key's base64
				if bytes.Contains(out, body) || bytes.Contains(out, []byte(base64.StdEncoding.EncodeToString(key))[:40]) || bytes.Contains(out, []byte("PRIVATE KEY")) {
					t.Fatalf("the key is in the output:\n%s", out)
				}
			}
		}
	}
}

// TestBadInput: pages that are not the admins' are errors or problems, never a panic.
func TestBadInput(t *testing.T) {
	for _, b := range []string{"", "null", "[]", `{"listeners":[{"@type":"type.googleapis.com/nope"}]}`, `{"listeners":[{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"c"}]}`} {
		if _, err := ParseXDSServer([]byte(b)); err == nil && b != "null" {
			t.Errorf("ParseXDSServer(%q): no error", b)
		}
	}
	for _, b := range []string{"", "{}", "[]", `{"configs":3}`} {
		if _, _, err := ParseEnvoy([]byte(b)); err == nil {
			t.Errorf("ParseEnvoy(%q): no error", b)
		}
	}
	d, problems, err := ParseEnvoy([]byte(`{"configs":[{"@type":"type.googleapis.com/envoy.admin.v3.ClustersConfigDump",` +
		`"dynamic_active_clusters":[{"cluster":{"@type":"type.googleapis.com/unknown.Type"}},` +
		`{"cluster":{"@type":"type.googleapis.com/envoy.config.cluster.v3.Cluster","name":"ok"}}]},` +
		`{"@type":"type.googleapis.com/envoy.admin.v3.BootstrapConfigDump","bootstrap":{}}, 7]}`))
	if err != nil || d.Len() != 1 || len(problems) != 2 {
		t.Errorf("ParseEnvoy with an unknown type: %v, %d resources, problems %q", err, d.Len(), problems)
	}
}
