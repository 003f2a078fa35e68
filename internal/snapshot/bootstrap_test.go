package snapshot_test

import (
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoregistry"
	"sigs.k8s.io/yaml"
)

// TestBootstrap decodes every envoy/*.yaml strictly as an Envoy Bootstrap (an unknown or
// misspelt field is an error, as it is for Envoy), validates it with Envoy's proto rules,
// including the typed configs inside, and checks that it points ADS at a static HTTP/2
// xds-server cluster.
func TestBootstrap(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "envoy", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no envoy/*.yaml")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			js, err := yaml.YAMLToJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			var b bootstrapv3.Bootstrap
			if err := (protojson.UnmarshalOptions{DiscardUnknown: false, Resolver: protoregistry.GlobalTypes}).Unmarshal(js, &b); err != nil {
				t.Fatalf("not a Bootstrap: %v", err)
			}
			if err := b.ValidateAll(); err != nil {
				t.Fatalf("invalid: %v", err)
			}

			ads := b.GetDynamicResources().GetAdsConfig()
			if ads.GetApiType() != corev3.ApiConfigSource_GRPC || ads.GetTransportApiVersion() != corev3.ApiVersion_V3 {
				t.Errorf("ads_config: %v", ads)
			}
			for name, cs := range map[string]*corev3.ConfigSource{"lds_config": b.GetDynamicResources().GetLdsConfig(), "cds_config": b.GetDynamicResources().GetCdsConfig()} {
				if cs.GetAds() == nil || cs.GetResourceApiVersion() != corev3.ApiVersion_V3 {
					t.Errorf("%s is not ADS v3: %v", name, cs)
				}
			}
			if len(ads.GetGrpcServices()) != 1 {
				t.Fatalf("ads_config has %d gRPC services, want 1", len(ads.GetGrpcServices()))
			}
			xds := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
			found := false
			for _, c := range b.GetStaticResources().GetClusters() {
				for key, a := range c.GetTypedExtensionProtocolOptions() {
					if key != "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" {
						t.Errorf("cluster %s: unexpected protocol options %s", c.GetName(), key)
						continue
					}
					var o httpv3.HttpProtocolOptions
					if err := a.UnmarshalTo(&o); err != nil {
						t.Fatalf("cluster %s: %v", c.GetName(), err)
					}
					if err := o.ValidateAll(); err != nil {
						t.Errorf("cluster %s: protocol options: %v", c.GetName(), err)
					}
					if c.GetName() == xds && o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("ADS uses cluster %q, which is not a static HTTP/2 cluster", xds)
			}
			if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" {
				t.Errorf("admin listens on %s, want loopback", a.GetAddress())
			}
		})
	}
}
