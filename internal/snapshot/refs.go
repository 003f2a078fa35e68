package snapshot

import (
	"fmt"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// checkReferences checks, on the finished resources (decoding the typed configs again rather
// than trusting how they were made), what Snapshot.Consistent does not:
//
//   - every cluster a route names exists, and so does every cluster extproc may name
//     (producible: cluster name → a resource that leads there);
//   - the ext_proc filter's gRPC cluster exists;
//   - every SDS secret that a listener or cluster refers to exists;
//   - every EDS cluster has its ClusterLoadAssignment and every assignment its cluster;
//   - names are unique within each type.
func checkReferences(res *Resources, producible map[string]string) []error {
	var errs []error
	errorf := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	names := func(kind string, list []types.Resource) map[string]bool {
		set := map[string]bool{}
		for _, r := range list {
			n := cachev3.GetResourceName(r)
			if set[n] {
				errorf("%s %q is defined twice", kind, n)
			}
			set[n] = true
		}
		return set
	}
	clusters := names("cluster", res.Clusters)
	secrets := names("secret", res.Secrets)
	endpoints := names("endpoints of cluster", res.Endpoints)
	names("listener", res.Listeners)
	names("route configuration", res.Routes)

	needSecret := func(who string, s *tlsv3.SdsSecretConfig) {
		if s != nil && !secrets[s.GetName()] {
			errorf("%s refers to SDS secret %q, which is not defined", who, s.GetName())
		}
	}
	needSecrets := func(who string, c *tlsv3.CommonTlsContext) {
		for _, s := range c.GetTlsCertificateSdsSecretConfigs() {
			needSecret(who, s)
		}
		needSecret(who, c.GetValidationContextSdsSecretConfig())
		needSecret(who, c.GetCombinedValidationContext().GetValidationContextSdsSecretConfig())
	}

	for _, r := range res.Listeners {
		l := r.(*listenerv3.Listener)
		for _, fc := range l.GetFilterChains() {
			if ts := fc.GetTransportSocket(); ts != nil {
				var tls tlsv3.DownstreamTlsContext
				if err := ts.GetTypedConfig().UnmarshalTo(&tls); err != nil {
					errorf("listener %s: transport socket: %v", l.GetName(), err)
				} else {
					needSecrets("listener "+l.GetName(), tls.GetCommonTlsContext())
				}
			}
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					errorf("listener %s: filter %s: %v", l.GetName(), f.GetName(), err)
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var ep extprocv3.ExternalProcessor
					if hf.GetTypedConfig().MessageIs(&ep) {
						if err := hf.GetTypedConfig().UnmarshalTo(&ep); err != nil {
							errorf("listener %s: http filter %s: %v", l.GetName(), hf.GetName(), err)
						} else if c := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); !clusters[c] {
							errorf("listener %s: ext_proc filter uses cluster %q, which is not defined", l.GetName(), c)
						}
					}
				}
			}
		}
	}

	for _, r := range res.Routes {
		rc := r.(*routev3.RouteConfiguration)
		for _, vh := range rc.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				a := rt.GetRoute()
				if a == nil {
					continue
				}
				var named []string
				if c := a.GetCluster(); c != "" {
					named = append(named, c)
				}
				for _, wc := range a.GetWeightedClusters().GetClusters() {
					named = append(named, wc.GetName())
				}
				for _, c := range named {
					if !clusters[c] {
						errorf("route %q of route configuration %s goes to cluster %q, which is not defined", rt.GetName(), rc.GetName(), c)
					}
				}
			}
		}
	}
	prod := make([]string, 0, len(producible))
	for c := range producible {
		prod = append(prod, c)
	}
	slices.Sort(prod)
	for _, c := range prod {
		if !clusters[c] {
			errorf("extproc can route %s to cluster %q, which is not defined", producible[c], c)
		}
	}

	for _, r := range res.Clusters {
		c := r.(*clusterv3.Cluster)
		if ts := c.GetTransportSocket(); ts != nil {
			var tls tlsv3.UpstreamTlsContext
			if err := ts.GetTypedConfig().UnmarshalTo(&tls); err != nil {
				errorf("cluster %s: transport socket: %v", c.GetName(), err)
			} else {
				needSecrets("cluster "+c.GetName(), tls.GetCommonTlsContext())
			}
		}
		if c.GetType() == clusterv3.Cluster_EDS {
			name := c.GetEdsClusterConfig().GetServiceName()
			if name == "" {
				name = c.GetName()
			}
			if !endpoints[name] {
				errorf("EDS cluster %s has no endpoints resource %q", c.GetName(), name)
			}
			if _, ok := c.GetEdsClusterConfig().GetEdsConfig().GetConfigSourceSpecifier().(*corev3.ConfigSource_Ads); !ok {
				errorf("EDS cluster %s does not take its endpoints from ADS", c.GetName())
			}
		}
	}
	for _, r := range res.Endpoints {
		e := r.(*endpointv3.ClusterLoadAssignment)
		if !clusters[e.GetClusterName()] {
			errorf("endpoints resource %q has no cluster", e.GetClusterName())
		}
	}
	return errs
}
