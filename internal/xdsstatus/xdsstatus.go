// Package xdsstatus is what xds-server says of each connected Envoy on /debug/syncz: the types
// its ADS server fills in and kubectl mvp reads, apart from the server so that readers do not
// import it.
package xdsstatus

import (
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

// NodeStatus is what /debug/syncz shows for one Envoy.
type NodeStatus struct {
	NodeID         string     `json:"nodeID"`
	Role           cptls.Role `json:"role,omitempty"`
	Cluster        string     `json:"cluster,omitempty"`
	LocalAPIServer string     `json:"localAPIServer,omitempty"`
	Streams        int        `json:"openStreams"`
	// Certificate is the client certificate of the node's latest stream: a renewed one shows
	// here once the node connects again.
	Certificate   *PeerCertificate       `json:"certificate,omitempty"`
	Snapshot      string                 `json:"snapshotVersion,omitempty"`
	SnapshotError string                 `json:"snapshotError,omitempty"`
	Types         map[string]*TypeStatus `json:"types"`
	// Nacks counts the configurations the node rejected since its state was made.
	Nacks uint64 `json:"nacks"`
	// EnvoyVersion is the build version an Envoy sends with its node ("1.40.0"), and
	// EnvoySupport what kube-mvp says of it when it is not a supported release (envoyrelease).
	EnvoyVersion string `json:"envoyVersion,omitempty"`
	EnvoySupport string `json:"envoySupport,omitempty"`
}

// PeerCertificate identifies a client certificate: its serial number (hex) and expiry.
type PeerCertificate struct {
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"notAfter"`
}

// TypeStatus is the state of one resource type on one node.
type TypeStatus struct {
	Sent       string    `json:"sent,omitempty"`
	Acked      string    `json:"acked,omitempty"`
	NackedAt   time.Time `json:"nackedAt,omitzero"`
	NackError  string    `json:"nackError,omitempty"`
	NackedNext string    `json:"nackedVersion,omitempty"`
}
