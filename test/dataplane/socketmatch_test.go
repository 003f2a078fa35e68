package dataplane

import (
	"fmt"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// The data plane as Envoy with transport_socket_matches: which transport socket (which
// client certificate) a caller cluster's requests and health checks use.

// waitStat waits (bounded) until the counter name reaches at least n.
func (e *env) waitStat(t *testing.T, name string, n uint64) {
	t.Helper()
	testutil.WaitFor(t, t.Context(), 15*time.Second, fmt.Sprintf("%s >= %d", name, n), func() error {
		if got := e.stat(name); got < n {
			return fmt.Errorf("%s = %d", name, got)
		}
		return nil
	})
}

// TestCallerClusterHealthChecksPresentProxyCertificate: a caller cluster (the plan's name)
// presents no client certificate on its requests, but its health checks take, by
// transport_socket_match_criteria, the transport socket that presents the proxy client
// certificate. The fake apiservers answer /readyz 200 only to that certificate, so the
// caller cluster's checks succeed only if they present it.
func TestCallerClusterHealthChecksPresentProxyCertificate(t *testing.T) {
	e := newEnv(t, envOptions{})
	const caller = "cluster.kube-apiservers."
	e.waitStat(t, caller+"health_check.success", 3) // one per apiserver
	if n := e.stat(caller + "health_check.failure"); n != 0 {
		t.Errorf("%d failed health checks of the caller cluster kube-apiservers, want none", n)
	}
	for name, f := range e.apiservers {
		checks := f.readyzChecks()
		if len(checks) == 0 {
			t.Errorf("%s: no health check arrived", name)
		}
		for _, c := range checks {
			if c.ClientCert != proxyClientCert || c.Header.Get("X-Remote-User") != "kube-mvp:health-check" {
				t.Errorf("%s: a health check presented client certificate %q and user %q; want %q, kube-mvp:health-check",
					name, c.ClientCert, c.Header.Get("X-Remote-User"), proxyClientCert)
			}
		}
	}
	// The same cluster's requests present no certificate.
	before := e.stat(caller + "upstream_rq_total")
	r := e.do(e.client(nil), "GET", "/api/v1/namespaces", nil)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := e.stat(caller + "upstream_rq_total"); got != before+1 {
		t.Errorf("the request did not go to the caller cluster kube-apiservers (upstream_rq_total %d -> %d)", before, got)
	}
	if r.seen.ClientCert != "" {
		t.Errorf("a request of the caller cluster presented client certificate %q, want none", r.seen.ClientCert)
	}
}

// TestTransportSocketMatchNeedsEveryLabel: a transport_socket_matches entry is used only
// when every one of its labels is in the criteria with an equal value. With one label the
// health check's criteria lack, the caller cluster's health checks take the cluster's own
// transport socket (no client certificate), which the fake apiservers answer with 401, while
// the front-proxy variant's checks, on its own transport socket, still succeed.
func TestTransportSocketMatchNeedsEveryLabel(t *testing.T) {
	e := newEnv(t, envOptions{editResources: func(res *snapshot.Resources) error {
		for _, r := range res.Clusters {
			c := r.(*clusterv3.Cluster)
			for _, m := range c.GetTransportSocketMatches() {
				// A copy: the snapshot shares the struct with the health check's criteria.
				labels := proto.Clone(m.GetMatch()).(*structpb.Struct)
				labels.Fields["also"] = structpb.NewStringValue("this")
				m.Match = labels
			}
		}
		return nil
	}})
	e.waitStat(t, "cluster.kube-apiservers.health_check.failure", 3)
	e.waitStat(t, "cluster.kube-apiservers/front-proxy.health_check.success", 3)
	if n := e.stat("cluster.kube-apiservers.health_check.success"); n != 0 {
		t.Errorf("%d successful health checks of the caller cluster: its checks used the proxy certificate", n)
	}
	without := 0
	for _, f := range e.apiservers {
		for _, c := range f.readyzChecks() {
			if c.ClientCert == "" {
				without++
			}
		}
	}
	if without == 0 {
		t.Errorf("every health check presented a client certificate")
	}
}

// TestResolveTransportSocket: the health check's transport socket is Envoy's: the first of
// the cluster's transport_socket_matches whose every label is in the criteria with an equal
// value, else the cluster's transport_socket; without criteria, the host's own socket (here
// the cluster's). Envoy: TransportSocketMatcherImpl::resolve
// (source/common/upstream/transport_socket_match_impl.cc) takes the first match for which
// Config::Metadata::metadataLabelMatch (source/common/config/metadata.cc) holds: every label
// of the match must be a field of the metadata's envoy.transport_socket_match struct with an
// equal value (an empty label set matches anything), and falls back to the default (the
// cluster's transport_socket); HostImplBase::createHealthCheckConnection
// (source/common/upstream/upstream_impl.cc) resolves a health check's socket with the
// criteria as that metadata.
func TestResolveTransportSocket(t *testing.T) {
	socket := func(cert string) *corev3.TransportSocket {
		ctx := &tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{}}
		if cert != "" {
			ctx.CommonTlsContext.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{{Name: cert}}
		}
		a, err := anypb.New(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: a}}
	}
	labels := func(kv ...any) *structpb.Struct {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	match := func(name string, l *structpb.Struct) *clusterv3.Cluster_TransportSocketMatch {
		return &clusterv3.Cluster_TransportSocketMatch{Name: name, Match: l, TransportSocket: socket(name)}
	}
	// The snapshot's caller cluster with other matches and criteria; the cluster's own
	// socket presents no certificate ("").
	base := buildResources(t, "batch-off")
	var caller *clusterv3.Cluster
	for _, r := range base.Clusters {
		if c := r.(*clusterv3.Cluster); c.GetName() == "kube-apiservers" {
			caller = c
		}
	}
	if caller == nil {
		t.Fatal("no cluster kube-apiservers")
	}
	ab := []*clusterv3.Cluster_TransportSocketMatch{match("a", labels("k", "a", "x", "1")), match("b", labels("k", "b"))}
	cases := []struct {
		name     string
		matches  []*clusterv3.Cluster_TransportSocketMatch
		criteria *structpb.Struct
		want     string // the certificate secret of the resolved socket; "" the cluster's
	}{
		{"no criteria: the cluster's", ab, nil, ""},
		{"every label: match", ab, labels("k", "a", "x", "1"), "a"},
		{"criteria may hold more", ab, labels("k", "a", "x", "1", "y", "2"), "a"},
		{"a label missing from the criteria: no match", ab, labels("k", "a"), ""},
		{"a label with another value: no match", ab, labels("k", "a", "x", "2"), ""},
		{"a label of another type: no match", ab, labels("k", "a", "x", 1.0), ""},
		{"the next entry", ab, labels("k", "b", "x", "1"), "b"},
		{"empty criteria: no match", ab, labels(), ""},
		{"an empty match matches anything", []*clusterv3.Cluster_TransportSocketMatch{match("b", labels("k", "b")), match("any", labels())}, labels("k", "a"), "any"},
		{"the first match wins", []*clusterv3.Cluster_TransportSocketMatch{match("b", labels("k", "b")), match("b2", labels("k", "b"))}, labels("k", "b"), "b"},
		{"no matches: the cluster's", nil, labels("k", "b"), ""},
	}
	for _, tc := range cases {
		c := proto.Clone(caller).(*clusterv3.Cluster)
		c.TransportSocket = socket("")
		c.TransportSocketMatches = tc.matches
		c.HealthChecks[0].TransportSocketMatchCriteria = tc.criteria
		cc, err := compileCluster(c)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if cc.hc.tls == nil || cc.tls == nil {
			t.Fatalf("%s: no transport socket", tc.name)
		}
		if cc.hc.tls.certSecret != tc.want {
			t.Errorf("%s: the health check presents %q, want %q", tc.name, cc.hc.tls.certSecret, tc.want)
		}
		if cc.tls.certSecret != "" {
			t.Errorf("%s: the cluster's requests present %q, want none", tc.name, cc.tls.certSecret)
		}
	}
}
