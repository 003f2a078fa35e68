package plan

import (
	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// A RequestKind is what of a request, besides its route, picks the variant of a cluster it
// goes to (contract.ClusterName): Envoy has every apiserver cluster once per kind.
type RequestKind struct {
	// ProxyCert: the Lua filter set the identity headers from a client certificate it
	// verified, so the request goes to the front-proxy variant, which presents the proxy
	// client certificate; otherwise it carries the caller's own credentials.
	ProxyCert bool
	// Upgrade: the request asks for a protocol upgrade, which only HTTP/1.1 carries to the
	// apiservers.
	Upgrade bool
}

// RequestKinds is every kind, one per variant of a cluster, in Index order: the one list of
// the variants, which snapshot emits and extproc and explain name.
var RequestKinds = [...]RequestKind{{}, {Upgrade: true}, {ProxyCert: true}, {ProxyCert: true, Upgrade: true}}

// Index is k's position in RequestKinds, for tables indexed by kind.
func (k RequestKind) Index() int {
	i := 0
	if k.ProxyCert {
		i += 2
	}
	if k.Upgrade {
		i++
	}
	return i
}

// Cluster is the variant of cluster base that requests of kind k go to.
func (k RequestKind) Cluster(base string) contract.ClusterName {
	return contract.ClusterName{Base: base, ProxyCert: k.ProxyCert, HTTP1: k.Upgrade}
}

// Refusal is why kube-mvp answers a request itself (a 503) instead of forwarding it.
type Refusal uint8

const (
	NotRefused Refusal = iota
	// RefusedUnavailable: the route is Unavailable, no live apiserver serves its resource.
	RefusedUnavailable
	// RefusedProxyCert: the request's identity is kube-mvp's and every apiserver of the
	// route's cluster is dangerous (Route.ProxyCertRefused; the message: ProxyCertRefusal).
	RefusedProxyCert
)

// A Destination is where a route sends a request of one kind.
type Destination struct {
	// Cluster is the Envoy cluster (extproc's x-kube-mvp-cluster); zero when Refused.
	Cluster contract.ClusterName
	// ServingSet, for a Subset route, is the serving set inside Cluster (the serving-sets
	// cluster's) that the request's load-balancer metadata names.
	ServingSet string
	Refused    Refusal
}

// Destination is where r sends a request of kind k: the one rule from a decision to an Envoy
// cluster, which extproc follows per request, explain reports and snapshot checks Envoy has.
func (r Route) Destination(k RequestKind) Destination {
	switch {
	case r.Outcome == topology.Unavailable:
		return Destination{Refused: RefusedUnavailable}
	case k.ProxyCert && len(r.ProxyCertRefused) > 0:
		return Destination{Refused: RefusedProxyCert}
	case r.Outcome == topology.Subset:
		return Destination{Cluster: k.Cluster(contract.ClusterServingSets), ServingSet: r.Cluster}
	}
	return Destination{Cluster: k.Cluster(r.Cluster)}
}
