// Package snapshot translates a plan (internal/plan) into the Envoy configuration of kube-mvp:
// one listener, one route table, the apiserver clusters and their endpoints, the extproc
// cluster and the TLS secrets, all delivered over ADS. It decides nothing: which clusters
// exist, which group/versions need extproc and where each resource goes are the plan's. It
// is pure: no I/O, no clock; equal inputs give byte-identical resources and equal
// content-hash versions on every replica.
//
// Every Envoy choice and why: docs/envoy-config.md.
package snapshot
