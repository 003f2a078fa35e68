package controlplane

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Defaults is what a cluster of one Kubernetes minor release does out of the box, in the
// respects kube-mvp depends on. Read from the source of each pinned release:
//
//   - k8s.io/apiserver pkg/features/kube_features.go (the versioned feature gate specs):
//     UnknownVersionInteroperabilityProxy is alpha (off) from 1.28 and beta (on) from 1.36;
//     StorageVersionAPI is alpha (off) from 1.20, still in 1.37; APIServerIdentity is beta
//     (on) from 1.26.
//   - k8s.io/kubernetes pkg/controlplane/apiserver/server.go: the identity Lease gets the
//     kubernetes.io/peer-advertise-address annotation only while
//     UnknownVersionInteroperabilityProxy is enabled (1.35, 1.36 and 1.37 alike).
//   - internal.apiserver.k8s.io/v1alpha1 (the StorageVersion API) is an alpha API: served only
//     when --runtime-config asks for it.
//
// TestClusterDefaultsFacts checks these against the real binaries.
type Defaults struct {
	// PeerAdvertiseAddress: the identity Lease names the apiserver's address (the annotation).
	// Where it does not, xds-server needs --apiserver-addresses.
	PeerAdvertiseAddress bool
	// StorageVersionAPI: internal.apiserver.k8s.io/v1alpha1 is served and filled in.
	StorageVersionAPI bool
}

// defaultsByMinor covers the minor releases of Versions.
var defaultsByMinor = map[int]Defaults{
	35: {PeerAdvertiseAddress: false, StorageVersionAPI: false},
	36: {PeerAdvertiseAddress: true, StorageVersionAPI: false},
	37: {PeerAdvertiseAddress: true, StorageVersionAPI: false},
}

// DefaultsOf returns the cluster defaults of version (vMAJOR.MINOR.PATCH).
func DefaultsOf(version string) (Defaults, error) {
	minor, err := minorOf(version)
	if err != nil {
		return Defaults{}, err
	}
	d, ok := defaultsByMinor[minor]
	if !ok {
		return Defaults{}, fmt.Errorf("controlplane: no cluster defaults recorded for %s (add them to defaultsByMinor from its source)", version)
	}
	return d, nil
}

func minorOf(version string) (int, error) {
	rest, ok := strings.CutPrefix(version, "v1.")
	minor, _, ok2 := strings.Cut(rest, ".")
	n, err := strconv.Atoi(minor)
	if !ok || !ok2 || err != nil {
		return 0, fmt.Errorf("version %q is not v1.MINOR.PATCH", version)
	}
	return n, nil
}

// LeaseHasAddress reports whether this server's identity Lease carries its address (the
// peer-advertise annotation) as it is started now: always with the test gates on; with
// ClusterDefaults only where the release turns UnknownVersionInteroperabilityProxy on by
// default. A --feature-gates flag in Args replaces the test gates: then the release's default
// holds unless the flag names the gate.
func (s *Server) LeaseHasAddress() bool {
	d, err := DefaultsOf(s.Spec.Version)
	gate := err == nil && d.PeerAdvertiseAddress
	if !s.Spec.ClusterDefaults {
		gate = true
	}
	for _, a := range s.Spec.Args {
		if gates, ok := strings.CutPrefix(a, "--feature-gates="); ok {
			gate = err == nil && d.PeerAdvertiseAddress
			for g := range strings.SplitSeq(gates, ",") {
				if v, ok := strings.CutPrefix(g, "UnknownVersionInteroperabilityProxy="); ok {
					gate = v == "true"
				}
			}
		}
	}
	return gate
}

// AddressesFlag is the value for xds-server's --apiserver-addresses that a user of this
// control plane must give: HOSTNAME=HOST:PORT for every server whose identity Lease carries no
// address (see LeaseHasAddress), sorted; empty when every Lease does.
func (cp *ControlPlane) AddressesFlag() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []string
	for name, s := range cp.servers {
		if !s.LeaseHasAddress() {
			out = append(out, name+"="+s.Address())
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
