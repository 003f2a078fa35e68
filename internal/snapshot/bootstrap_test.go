package snapshot_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/oldestenvoy"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// TestBootstrap decodes every envoy/*.yaml strictly as an Envoy Bootstrap (an unknown or
// misspelt field is an error, as it is for Envoy), validates it with Envoy's proto rules,
// including the typed configs inside, and checks that it points ADS at a static HTTP/2
// xds-server cluster, keeps the admin API on loopback, and (sidecar.yaml) names the local
// apiserver in the node metadata field xds-server reads.
func TestBootstrap(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "envoy", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	for _, want := range []string{"front.yaml", "sidecar.yaml"} {
		if !slices.Contains(names, want) {
			t.Errorf("envoy/%s is missing (have %v)", want, names)
		}
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b := decodeBootstrap(t, raw)
			for _, err := range oldestenvoy.Check(b) {
				t.Error(err)
			}

			if got := b.GetDynamicResources().GetAdsConfig().GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName(); got != "xds-server" {
				t.Errorf("ADS cluster %q, want xds-server", got)
			}
			if b.GetNode().GetCluster() != "kube-mvp" || b.GetNode().GetId() == "" {
				t.Errorf("node %v: want an id and cluster kube-mvp", b.GetNode())
			}
			local := b.GetNode().GetMetadata().GetFields()[xds.LocalAPIServerMetadataKey]
			switch filepath.Base(f) {
			case "sidecar.yaml":
				if local.GetStringValue() == "" {
					t.Errorf("node metadata %s is not a non-empty string: %v", xds.LocalAPIServerMetadataKey, b.GetNode().GetMetadata())
				}
			default:
				if local != nil {
					t.Errorf("a front proxy must not name a local apiserver: %v", local)
				}
			}
		})
	}
}

// TestBootstrapOldestEnvoy: a bootstrap using what Envoy 1.37.0 lacks is refused by the check
// TestBootstrap applies: the memory allocator's soft_memory_limit_bytes (MemoryAllocatorManager
// field 3, new after 1.37.0), which would suit the chart's memory limit.
func TestBootstrapOldestEnvoy(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "envoy", "front.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b := decodeBootstrap(t, raw)
	b.MemoryAllocatorManager = &bootstrapv3.MemoryAllocatorManager{SoftMemoryLimitBytes: wrapperspb.UInt64(100 << 20)}
	errs := oldestenvoy.Check(b)
	want := "memory_allocator_manager.soft_memory_limit_bytes: field envoy.config.bootstrap.v3.MemoryAllocatorManager.soft_memory_limit_bytes (number 3) is not in Envoy " + oldestenvoy.Version()
	if len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("got %v, want exactly %s", errs, want)
	}
}

// bootstrapSDSDir is where the bootstraps expect envoy/sds/*.yaml.
const bootstrapSDSDir = "/etc/kube-mvp/bootstrap/"

// checkXDSClusterTLS: the xds-server cluster speaks mutual TLS, its certificate and CA by SDS
// from the files of envoy/sds/, and requires the xds-server role's URI SAN (internal/cptls).
func checkXDSClusterTLS(t *testing.T, c *clusterv3.Cluster) {
	t.Helper()
	var tc tlsv3.UpstreamTlsContext
	if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&tc); err != nil {
		t.Fatalf("cluster %s: no UpstreamTlsContext: %v", c.GetName(), err)
	}
	if err := tc.ValidateAll(); err != nil {
		t.Errorf("cluster %s: %v", c.GetName(), err)
	}
	common := tc.GetCommonTlsContext()
	certs := common.GetTlsCertificateSdsSecretConfigs()
	if len(certs) != 1 || certs[0].GetSdsConfig().GetPathConfigSource().GetPath() != bootstrapSDSDir+"xds-client-cert.yaml" {
		t.Errorf("cluster %s: client certificate %v, want SDS from %sxds-client-cert.yaml", c.GetName(), certs, bootstrapSDSDir)
	}
	cv := common.GetCombinedValidationContext()
	if cv.GetValidationContextSdsSecretConfig().GetSdsConfig().GetPathConfigSource().GetPath() != bootstrapSDSDir+"xds-ca.yaml" {
		t.Errorf("cluster %s: CA %v, want SDS from %sxds-ca.yaml", c.GetName(), cv, bootstrapSDSDir)
	}
	sans := cv.GetDefaultValidationContext().GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_URI || sans[0].GetMatcher().GetExact() != cptls.RoleXDSServer.URI().String() {
		t.Errorf("cluster %s: SAN matchers %v, want exactly URI %s", c.GetName(), sans, cptls.RoleXDSServer.URI())
	}
}

// TestBootstrapSDSFiles: envoy/sds/*.yaml are what Envoy reads for a path_config_source (a
// DiscoveryResponse of one Secret), naming the files of a mounted control-plane TLS Secret.
func TestBootstrapSDSFiles(t *testing.T) {
	want := cptls.DirFiles("/etc/kube-mvp/xds-tls")
	for file, check := range map[string]func(*tlsv3.Secret) bool{
		"xds-client-cert.yaml": func(s *tlsv3.Secret) bool {
			tc := s.GetTlsCertificate()
			return s.GetName() == "xds-client-cert" && tc.GetCertificateChain().GetFilename() == want.Cert &&
				tc.GetPrivateKey().GetFilename() == want.Key && tc.GetWatchedDirectory().GetPath() == filepath.Dir(want.Cert)
		},
		"xds-ca.yaml": func(s *tlsv3.Secret) bool {
			vc := s.GetValidationContext()
			return s.GetName() == "xds-ca" && vc.GetTrustedCa().GetFilename() == want.CA && vc.GetWatchedDirectory().GetPath() == filepath.Dir(want.CA)
		},
	} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "envoy", "sds", file))
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			t.Fatal(err)
		}
		var dr discoveryv3.DiscoveryResponse
		if err := (protojson.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(js, &dr); err != nil {
			t.Fatalf("%s: not a DiscoveryResponse: %v", file, err)
		}
		if len(dr.GetResources()) != 1 {
			t.Fatalf("%s: %d resources, want 1", file, len(dr.GetResources()))
		}
		var s tlsv3.Secret
		if err := dr.GetResources()[0].UnmarshalTo(&s); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, err := range oldestenvoy.Check(&dr) {
			t.Errorf("%s: %v", file, err)
		}
		if err := s.ValidateAll(); err != nil || !check(&s) {
			t.Errorf("%s: %v (%v)", file, &s, err)
		}
	}
}

// decodeBootstrap decodes an Envoy bootstrap YAML strictly, validates it and the typed configs
// inside it (the static listeners' HTTP connection managers and their filters, the clusters'
// protocol options), and checks the parts every kube-mvp bootstrap shares: ADS (v3, gRPC) to
// a static HTTP/2 cluster, LDS and CDS from ADS, admin on 127.0.0.1.
func decodeBootstrap(t *testing.T, raw []byte) *bootstrapv3.Bootstrap {
	t.Helper()
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
	xdsCluster := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
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
			if c.GetName() == xdsCluster && o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
				found = true
				checkXDSClusterTLS(t, c)
			}
		}
	}
	if !found {
		t.Errorf("ADS uses cluster %q, which is not a static HTTP/2 cluster", xdsCluster)
	}
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" {
		t.Errorf("admin listens on %s, want loopback", a.GetAddress())
	}

	// Static listeners (the probe listener): validate the typed configs Envoy would load.
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Errorf("listener %s filter %s: %v", l.GetName(), f.GetName(), err)
					continue
				}
				if err := hcm.ValidateAll(); err != nil {
					t.Errorf("listener %s: %v", l.GetName(), err)
				}
				for _, hf := range hcm.GetHttpFilters() {
					var r routerv3.Router
					if err := hf.GetTypedConfig().UnmarshalTo(&r); err != nil {
						t.Errorf("listener %s http filter %s: %v", l.GetName(), hf.GetName(), err)
					} else if err := r.ValidateAll(); err != nil {
						t.Errorf("listener %s router: %v", l.GetName(), err)
					}
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.GetRoutes() {
						if c := r.GetRoute().GetCluster(); !hasCluster(&b, c) {
							t.Errorf("listener %s routes to unknown cluster %q", l.GetName(), c)
						}
					}
				}
			}
		}
	}
	return &b
}

func hasCluster(b *bootstrapv3.Bootstrap, name string) bool {
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return true
		}
	}
	return false
}
