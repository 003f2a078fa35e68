// Package objects is kube-mvp's one path from Kubernetes objects to a topology.Topology:
// Objects (identity Leases, StorageVersions, APIServices, each apiserver's discovery and the
// memory of departed apiservers, kept by internal/memory), Build, which turns them into a
// Topology, MergeDiscovery, and the fixture format (LoadFixture, DecodeFixture,
// APIServerDiscovery), the offline variant of a cluster. When an apiserver counts as live is
// decided in liveness.go alone (its Lease), whether it is verified in verified.go alone (its
// discovery); topology.APIServer.Routable needs both, and an address.
//
// It is separate from internal/inventory, the live watcher, because extproc
// (--source file:FIXTURE), `xds-server translate` and tests need exactly this and nothing of
// the Kubernetes client machinery: this package and everything it imports must not import
// k8s.io/client-go (k8s.io/api and k8s.io/apimachinery types are fine). cmd/extproc's
// TestNoClientGo checks that.
package objects
