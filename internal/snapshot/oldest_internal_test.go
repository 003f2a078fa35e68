package snapshot

import (
	"maps"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	dynamicmodulesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/dynamic_modules/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/oldestenvoy"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestBuildRefusesNewerThanOldestEnvoy changes Build's output (changeForTest) to use what the
// protos kube-mvp is built with (go-control-plane/envoy v1.40.0) have and Envoy 1.37.0's lack,
// and expects Build to refuse it: no Resources, and an error naming the resource, the path to
// what is new and "not in Envoy 1.37.0". What each case uses is new since:
//   - envoy.config.core.v3.HealthCheck.name (field 27): Envoy 1.40;
//   - envoy.config.cluster.v3.UpstreamConnectionOptions.FirstAddressFamilyVersion PIPE (3) and
//     ExternalProcessor.allow_content_length_header (field 26): after 1.37.0;
//   - envoy.extensions.upstreams.http.dynamic_modules.v3.Config (a typed config type): Envoy 1.38.
func TestBuildRefusesNewerThanOldestEnvoy(t *testing.T) {
	if got := oldestenvoy.Version(); got != "1.37.0" {
		t.Fatalf("oldestenvoy.Version() = %q; this test names fields new since 1.37.0", got)
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, r *Resources)
		want   string
	}{
		{"nothing", func(*testing.T, *Resources) {}, ""},
		{"field of a cluster", func(t *testing.T, r *Resources) {
			c := findCluster(t, r, contract.ClusterDefault)
			c.HealthChecks[0].Name = "apiserver-readyz" // new in 1.40
		}, `cluster "kube-apiservers": health_checks[0].name: field envoy.config.core.v3.HealthCheck.name (number 27) is not in Envoy 1.37.0`},
		{"enum value of a cluster", func(t *testing.T, r *Resources) {
			c := findCluster(t, r, contract.ClusterDefault)
			c.UpstreamConnectionOptions = proto.Clone(c.UpstreamConnectionOptions).(*clusterv3.UpstreamConnectionOptions)
			c.UpstreamConnectionOptions.HappyEyeballsConfig = &clusterv3.UpstreamConnectionOptions_HappyEyeballsConfig{
				FirstAddressFamilyVersion: clusterv3.UpstreamConnectionOptions_PIPE, // new after 1.37.0
			}
		},
			`cluster "kube-apiservers": upstream_connection_options.happy_eyeballs_config.first_address` +
				`_family_version: value PIPE (3) of enum envoy.config.cluster.v3.UpstreamConnectionOptions.` +
				`FirstAddressFamilyVersion is not in Envoy 1.37.0`},

		{"field in a typed config in a typed config", func(t *testing.T, r *Resources) {
			l := r.Listeners[0].(*listenerv3.Listener)
			f := l.FilterChains[0].Filters[0]
			var hcm hcmv3.HttpConnectionManager
			if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
				t.Fatal(err)
			}
			i := filterIndex(t, &hcm, extProcFilterName)
			var ep extprocv3.ExternalProcessor
			if err := hcm.HttpFilters[i].GetTypedConfig().UnmarshalTo(&ep); err != nil {
				t.Fatal(err)
			}
			ep.AllowContentLengthHeader = true // new after 1.37.0
			hcm.HttpFilters[i].ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &ep)}
			f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, &hcm)}
		},
			`listener "kube-apiserver": filter_chains[0].filters[0].typed_config.(envoy.extensions.filt` +
				`ers.network.http_connection_manager.v3.HttpConnectionManager).http_filters[1].typed_config` +
				`.(envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor).allow_content_length_header` +
				`: field envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor.allow_content_length_h` +
				`eader (number 26) is not in Envoy 1.37.0`},

		{"typed config type", func(t *testing.T, r *Resources) {
			c := findCluster(t, r, contract.ClusterDefault)
			c.TypedExtensionProtocolOptions = maps.Clone(c.TypedExtensionProtocolOptions)                                    // the clusters share it
			c.TypedExtensionProtocolOptions["envoy.upstreams.http.dynamic_modules"] = mustAny(t, &dynamicmodulesv3.Config{}) // new in 1.38
		},
			`cluster "kube-apiservers": typed_extension_protocol_options["envoy.upstreams.http.dynamic_` +
				`modules"]: typed config type envoy.extensions.upstreams.http.dynamic_modules.v3.Config is ` +
				`not in Envoy 1.37.0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, p, cfg := testInput(t)
			changeForTest = func(r *Resources) { tc.change(t, r) }
			t.Cleanup(func() { changeForTest = nil })
			res, err := Build(p, cfg)
			if tc.want == "" {
				if err != nil || res == nil {
					t.Fatalf("Build: %v", err)
				}
				return
			}
			if res != nil {
				t.Errorf("Build returned Resources despite %s", tc.want)
			}
			if err == nil || err.Error() != tc.want {
				t.Errorf("Build error:\n%v\nwant exactly:\n%s", err, tc.want)
			}
		})
	}
}

// testInput is the small input both internal tests build on: cp-a and cp-b alive, batch/v1
// jobs served by cp-a alone, every secret file set (the proxy certificate's variants are
// clusters extproc can name too).
func testInput(t *testing.T) (*topology.Topology, *plan.Plan, Config) {
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
	return topo, p, Config{Secrets: SecretFiles{
		ServingCert:     "/etc/kube-mvp/serving/tls.crt",
		ServingKey:      "/etc/kube-mvp/serving/tls.key",
		ClientCA:        "/etc/kube-mvp/client-ca/ca.crt",
		PeerCA:          "/etc/kube-mvp/peer-ca/ca.crt",
		ProxyClientCert: "/etc/kube-mvp/proxy-client/tls.crt",
		ProxyClientKey:  "/etc/kube-mvp/proxy-client/tls.key",
	}}
}

func findCluster(t *testing.T, r *Resources, name string) *clusterv3.Cluster {
	t.Helper()
	for _, c := range r.Clusters {
		if c := c.(*clusterv3.Cluster); c.GetName() == name {
			return c
		}
	}
	t.Fatalf("no cluster %s", name)
	return nil
}

func filterIndex(t *testing.T, hcm *hcmv3.HttpConnectionManager, name string) int {
	t.Helper()
	for i, f := range hcm.GetHttpFilters() {
		if f.GetName() == name {
			if i != 1 {
				t.Fatalf("the want below expects %s at http_filters[1], not [%d]", name, i)
			}
			return i
		}
	}
	t.Fatalf("no HTTP filter %s", name)
	return 0
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
