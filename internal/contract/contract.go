// Package contract is what xds-server's Envoy configuration (internal/snapshot), extproc
// (internal/extproc) and the inventory must agree on, declared once: the headers kube-mvp
// strips, sets or routes by, the media type of aggregated discovery, and the node metadata
// that makes an Envoy a sidecar, the names of the apiserver clusters extproc routes to, and
// the gRPC metadata Envoy's routes add to an ext_proc stream.
package contract

import "strings"

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

	// HeaderXFCC is set by Envoy's listener on a request whose connection has a verified
	// client certificate; routes match its presence.
	HeaderXFCC = "x-forwarded-client-cert"

	// HeaderIdentityDecision is where Envoy's Lua filter (internal/snapshot/identity.lua)
	// tells the routes what it decided for a request with a client certificate:
	// IdentityProxyCert (identity headers set: the front-proxy variant of the cluster) or
	// IdentityOwnCredentials (the apiserver would reject the certificate but the request has
	// a bearer token: forwarded with its own credentials). The listener strips it from
	// clients and the route configuration removes it before any apiserver.
	HeaderIdentityDecision = "x-kube-mvp-identity"
	IdentityProxyCert      = "front-proxy"
	IdentityOwnCredentials = "own-credentials"

	// HeaderRequestClass is where Envoy's Lua filter (internal/snapshot/request_class.lua)
	// writes every request's class, as the apiserver will treat it; the routes give the
	// classes below their timeout and retry policy by exact match, and every other value
	// (long-running, unclassified) or none takes the route without a class: no timeout, no
	// retry after a reset. The listener strips it from clients and the route configuration
	// removes it before any apiserver.
	HeaderRequestClass = "x-kube-mvp-request-class"
	ClassUpgrade       = "upgrade"
	ClassRead          = "read"
	ClassWatch         = "watch"
	ClassWrite         = "write"

	// CredentialIDExtraKey is the user extra "authentication.kubernetes.io/credential-id"
	// (k8s.io/apiserver user.CredentialIDKey) as a header name suffix: the requestheader
	// authenticator path-unescapes extra keys, so "/" travels as "%2f".
	CredentialIDExtraKey = "authentication.kubernetes.io%2fcredential-id"

	// MediaTypeAggregatedDiscovery is the Accept/Content-Type of aggregated discovery (v2).
	MediaTypeAggregatedDiscovery = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

	// NodeMetadataLocalAPIServer is the Envoy node metadata field that puts an Envoy in
	// sidecar mode: the ID or hostname of the apiserver it runs beside.
	NodeMetadataLocalAPIServer = "kube-mvp.io/local-apiserver"

	// AnnotationEnvoyAdminPort, on the chart's Envoy pods, is the port of Envoy's admin on
	// the pod's loopback (the chart's envoy.adminPort): kubectl mvp config-dump forwards to it.
	AnnotationEnvoyAdminPort = "kube-mvp.io/envoy-admin-port"

	// HealthCheckUser is who Envoy's /readyz health checks ask as (with the front-proxy
	// certificate): a user of its own, which the chart allows GET /readyz and nothing else,
	// so the checks work whatever the cluster's anonymous policy.
	HealthCheckUser = "kube-mvp:health-check"

	// ClusterDefault holds every live apiserver (a front proxy's default cluster).
	ClusterDefault = "kube-apiservers"
	// ClusterLocal, in sidecar mode, holds only the local apiserver.
	ClusterLocal = "kube-apiserver-local"
	// ClusterServingSets holds every apiserver a serving set may name (the live ones and
	// departed ones remembered at a verified address), each listing in its endpoint metadata
	// (MetadataNamespaceLB, key LBSetKey) the serving sets it belongs to. Envoy's subset load
	// balancer picks among the members of the set extproc names per request, in its dynamic
	// metadata: a new serving set is an EDS change within a cluster Envoy has long warmed,
	// whose hosts keep their health, not a new cluster.
	ClusterServingSets = "kube-apiservers-serving"
	// ClusterSubsetPrefix starts the name of a serving set (a strict subset of the live
	// apiservers), followed by the members' hostnames joined by "+", each with ClusterNameDot
	// for its dots (plan.SubsetClusterName).
	ClusterSubsetPrefix = "kube-apiservers-only-"
	// MetadataNamespaceLB is Envoy's namespace for load-balancer subset criteria: endpoint
	// metadata says which sets a host is in, and the router takes a request's dynamic
	// metadata in it as the criteria (source/common/router/router.cc).
	MetadataNamespaceLB = "envoy.lb"
	// LBSetKey is the subset key under MetadataNamespaceLB: a host's value is the list of
	// serving sets it is in (list_as_any), a request's the one set extproc chose.
	LBSetKey = "kube-mvp-set"

	// MetadataLocalAPIServer is the ext_proc stream's gRPC metadata key with which a
	// sidecar Envoy's routes name the apiserver it runs beside (its ID, as xds-server
	// resolved the node's NodeMetadataLocalAPIServer), so extproc decides by that sidecar's
	// plan: the local apiserver is configured once, on the Envoy node.
	MetadataLocalAPIServer = "x-kube-mvp-local-apiserver"
)

// ClusterNameDot stands for '.' in a hostname or apiserver ID inside a cluster name
// (ClusterNamePart). Envoy reads a stat name as dot-separated tokens and extracts the
// cluster_name tag from "cluster.<name>.", so a dot in a cluster name (an FQDN, common for
// control-plane nodes) would split its stats; no generated cluster name contains one. '~'
// occurs in no hostname (a kubernetes.io/hostname label value: letters, digits, '-', '_',
// '.') and no apiserver ID (a Lease name: a DNS subdomain), nor in '+' or "/front-proxy",
// so the mapping is reversible and names stay distinct.
const ClusterNameDot = "~"

// ClusterNamePart is a hostname or apiserver ID as it appears inside a cluster name: every
// '.' replaced by ClusterNameDot. strings.ReplaceAll(part, ClusterNameDot, ".") reverses it.
func ClusterNamePart(hostnameOrID string) string {
	return strings.ReplaceAll(hostnameOrID, ".", ClusterNameDot)
}

// A ClusterName is the name Envoy knows an apiserver cluster by: a plan's cluster (Base:
// ClusterDefault, ClusterLocal, ClusterServingSets) and which of its variants. A plan's cluster
// names the apiservers; Envoy has each up to four times: as named, HTTP/2, with connections
// that present no client certificate, so the apiserver authenticates the caller's own
// credentials exactly as without a proxy; with ProxyCert, presenting the proxy client
// certificate, for requests carrying the identity headers kube-mvp sets for a client
// certificate it verified; and with HTTP1, speaking HTTP/1.1 for upgrade requests (SPDY and
// WebSocket exec, attach, port-forward, proxy, WebSocket watches), which cannot travel over
// HTTP/2 to the apiservers. Which variant a request takes is plan.RequestKind's (the one list
// of them) and plan.Route.Destination's: snapshot emits them, extproc names them.
type ClusterName struct {
	Base      string
	ProxyCert bool // "<base>/front-proxy"
	HTTP1     bool // "<base>/http1", after "/front-proxy"
}

// The suffixes of a ClusterName's variants. "/" appears in no hostname or apiserver ID, so a
// variant never collides with a plan's name.
const (
	clusterProxyCertSuffix = "/front-proxy"
	clusterHTTP1Suffix     = "/http1"
)

// String is the name Envoy sees: "kube-apiservers", "kube-apiservers/front-proxy",
// "kube-apiservers/http1", "kube-apiservers/front-proxy/http1".
func (c ClusterName) String() string {
	switch {
	case c.ProxyCert && c.HTTP1:
		return c.Base + clusterProxyCertSuffix + clusterHTTP1Suffix
	case c.ProxyCert:
		return c.Base + clusterProxyCertSuffix
	case c.HTTP1:
		return c.Base + clusterHTTP1Suffix
	}
	return c.Base
}

// ParseClusterName reverses String: ParseClusterName(c.String()) == c for every c whose Base
// has no variant's suffix.
func ParseClusterName(name string) ClusterName {
	var c ClusterName
	name, c.HTTP1 = strings.CutSuffix(name, clusterHTTP1Suffix)
	c.Base, c.ProxyCert = strings.CutSuffix(name, clusterProxyCertSuffix)
	return c
}
