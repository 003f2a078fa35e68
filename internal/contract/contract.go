// Package contract is what xds-server's Envoy configuration (internal/snapshot), extproc
// (internal/extproc) and the inventory must agree on, declared once: the headers kube-mvp
// strips, sets or routes by, the media type of aggregated discovery, and the node metadata
// that makes an Envoy a sidecar. Cluster names are topology's (topology.ClusterName).
package contract

const (
	// HeaderRoutingCluster is the request header in which extproc names the cluster for Envoy's
	// cluster_header route. Envoy strips any client-supplied one before routing.
	HeaderRoutingCluster = "x-kube-mvp-cluster"

	// HeaderRemotePrefix covers every front-proxy identity header the apiservers read
	// (--requestheader-*-headers defaults): stripped from clients by prefix.
	HeaderRemotePrefix      = "x-remote-"
	HeaderRemoteUser        = "x-remote-user"
	HeaderRemoteGroup       = "x-remote-group"
	HeaderRemoteUID         = "x-remote-uid"
	HeaderRemoteExtraPrefix = "x-remote-extra-"

	// HeaderPeerProxied is upstream's loop guard between apiservers.
	HeaderPeerProxied = "x-kubernetes-peer-proxied"

	// HeaderXFCC carries the verified client certificate from Envoy to extproc.
	HeaderXFCC = "x-forwarded-client-cert"

	// MediaTypeAggregatedDiscovery is the Accept/Content-Type of aggregated discovery (v2).
	MediaTypeAggregatedDiscovery = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

	// NodeMetadataLocalAPIServer is the Envoy node metadata field that puts an Envoy in
	// sidecar mode: the ID or hostname of the apiserver it runs beside.
	NodeMetadataLocalAPIServer = "kube-mvp.io/local-apiserver"
)
