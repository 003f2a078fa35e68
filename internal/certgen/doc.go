// Package certgen makes and keeps the control plane's own TLS material (internal/cptls): a CA
// and one certificate per role, for mutual TLS on xds-server's gRPC port. It is what
// `xds-server certgen` runs, in a Job at install/upgrade and in a CronJob afterwards. Renew
// does no I/O and reads no clock: it gets the stored state and the time and returns the state
// to store, with a list of what changed and why. KeepSecrets (Kubernetes Secrets) and
// KeepFiles (a directory) read that state, call Renew at the time they are given and store
// what changed (secrets.go, files.go). Running Renew on its own result, at the same time,
// changes nothing.
//
// What is made, the lifetimes, the renewal rules and the CA rotation without an outage:
// docs/operating.md#what-certgen-makes.
package certgen
