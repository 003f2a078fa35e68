// Package inventory is the only part of kube-mvp that talks to the Kubernetes API. Its
// Watcher watches identity Leases, StorageVersions and APIServices with client-go informers,
// fetches each live apiserver's discovery, and turns what it saw into a topology.Topology
// with objects.Build. RESTConfig builds the client configuration, with the HTTP/2 health
// check that liveness relies on.
//
// Everything that needs no connection to a cluster — the objects Build reads, Build itself,
// the merge of discovery documents and the fixture format — lives in the subpackage
// internal/objects, so that extproc and offline tools reach the same
// objects → topology path without linking client-go.
package inventory
