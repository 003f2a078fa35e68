package oldestenvoy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	dynamicmodulesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/dynamic_modules/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/oldestenvoy"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// TestOldestEnvoyProtos: the protos Check checks against are those of xds.MinEnvoyVersion, and
// tools/envoyprotos, which lists them, requires that release of go-control-plane/envoy (so a
// raised minimum with a list not regenerated fails here; `make envoy-protos ENVOY=vX.Y.Z`).
func TestOldestEnvoyProtos(t *testing.T) {
	min := fmt.Sprintf("%d.%d.%d", xds.MinEnvoyVersion[0], xds.MinEnvoyVersion[1], xds.MinEnvoyVersion[2])
	if got := oldestenvoy.Version(); got != min {
		t.Errorf("oldest-envoy-protos.txt lists Envoy %s's protos; xds.MinEnvoyVersion is %s: run make envoy-protos ENVOY=v%s", got, min, min)
	}
	gomod, err := os.ReadFile(filepath.Join("..", "..", "tools", "envoyprotos", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/envoyproxy/go-control-plane/envoy v(\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("tools/envoyprotos/go.mod requires no github.com/envoyproxy/go-control-plane/envoy")
	}
	if string(m[1]) != oldestenvoy.Version() {
		t.Errorf("tools/envoyprotos requires go-control-plane/envoy v%s, the list is of %s: run make envoy-protos", m[1], oldestenvoy.Version())
	}
}

// TestWireAndReflectionAgree: the fast check of the wire form and the reflective walk that
// names the path agree, on snapshot.Build's resources before and after a change the oldest
// Envoy lacks in each kind of place (a field, an enum value, a map value, a list element, a
// typed config's type and content).
func TestWireAndReflectionAgree(t *testing.T) {
	res, err := snapshot.Build(testPlan(t), testConfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := oldestenvoy.NewChecker()
	if err != nil {
		t.Fatal(err)
	}
	agree := func(t *testing.T, m proto.Message, wantOK bool) {
		t.Helper()
		wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		wireOK := c.WireOnly(m, wire)
		errs := c.ReflectOnly(m)
		if wireOK != (len(errs) == 0) || wireOK != wantOK {
			t.Errorf("%s: wire form fine %v, reflective walk %v, want fine %v", cachev3.GetResourceName(m), wireOK, errs, wantOK)
		}
	}
	var base *clusterv3.Cluster
	for _, list := range [][]types.Resource{res.Listeners, res.Routes, res.Clusters, res.Endpoints, res.Secrets} {
		for _, m := range list {
			agree(t, m, true)
			if c, ok := m.(*clusterv3.Cluster); ok && c.GetName() == contract.ClusterDefault {
				base = c
			}
		}
	}
	if base == nil {
		t.Fatalf("no cluster %s", contract.ClusterDefault)
	}
	for name, change := range map[string]func(c *clusterv3.Cluster){
		"field": func(c *clusterv3.Cluster) {
			c.OutlierDetection = &clusterv3.OutlierDetection{DetectDegradedHosts: wrapperspb.Bool(true)}
		}, // 1.38
		"list": func(c *clusterv3.Cluster) { c.HealthChecks[0].Name = "x" }, // 1.40
		"map value": func(c *clusterv3.Cluster) {
			c.TypedExtensionProtocolOptions["x"] = mustAny(t, &dynamicmodulesv3.Config{})
		}, // 1.38
		"enum value": func(c *clusterv3.Cluster) { c.LbPolicy = clusterv3.Cluster_LbPolicy(42) }, // no Envoy's
		"typed config content": func(c *clusterv3.Cluster) {
			c.TypedExtensionProtocolOptions["x"] = mustAny(t, &clusterv3.Cluster{OutlierDetection: &clusterv3.OutlierDetection{DetectDegradedHosts: wrapperspb.Bool(true)}})
		},
	} {
		t.Run(name, func(t *testing.T) {
			cl := proto.Clone(base).(*clusterv3.Cluster)
			change(cl)
			agree(t, cl, false)
		})
	}
}

// testPlan: cp-a and cp-b alive, batch/v1 jobs served by cp-a alone.
func testPlan(t *testing.T) *plan.Plan {
	t.Helper()
	topo, err := topology.New([]topology.APIServer{
		{ID: "apiserver-tqsyvnc7rs47fayzipsuqpfg4m", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "apiserver-imkgstwjs6opnbwk2ixluu6fiq", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true},
	}, map[topology.Resource][]string{{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-tqsyvnc7rs47fayzipsuqpfg4m"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.Build(topo)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testConfig sets every secret file (the proxy certificate's variants are clusters too).
var testConfig = snapshot.Config{Secrets: snapshot.SecretFiles{
	ServingCert:     "/etc/kube-mvp/serving/tls.crt",
	ServingKey:      "/etc/kube-mvp/serving/tls.key",
	ClientCA:        "/etc/kube-mvp/client-ca/ca.crt",
	PeerCA:          "/etc/kube-mvp/peer-ca/ca.crt",
	ProxyClientCert: "/etc/kube-mvp/proxy-client/tls.crt",
	ProxyClientKey:  "/etc/kube-mvp/proxy-client/tls.key",
}}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
