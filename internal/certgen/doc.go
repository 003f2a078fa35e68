// Package certgen makes and keeps the control plane's own TLS material (internal/cptls): a CA
// and one certificate per role, for mutual TLS on xds-server's gRPC port. It is what
// `xds-server certgen` runs, in a Job at install/upgrade and in a CronJob afterwards. Renew
// does no I/O and reads no clock: it gets the stored state and the time and returns the state
// to store, with a list of what changed and why. KeepSecrets (Kubernetes Secrets) and
// KeepFiles (a directory) read that state, call Renew at the time they are given and store
// what changed (secrets.go, files.go).
//
// # What is made
//
//   - The CA: ECDSA P-256, self-signed, CA:TRUE with MaxPathLen 0 (it signs leaves only), key
//     usage certSign|cRLSign, CN "kube-mvp control-plane CA". Its subject also carries a
//     serialNumber attribute (the certificate's serial in hex) so that the two CAs trusted
//     during a rotation have distinct subjects and every TLS stack finds the right issuer.
//   - One certificate per role: ECDSA P-256, CN "kube-mvp <role>", the role's URI SAN
//     (cptls.Role.URI, e.g. spiffe://kube-mvp/role/extproc), key usage digitalSignature and
//     extended key usage serverAuth for xds-server (plus the DNS SANs asked for: the names
//     Envoy and extproc dial) or clientAuth for envoy-front, envoy-sidecar and extproc.
//   - One trust bundle (every CA currently trusted), handed to every role as its ca.crt.
//
// Every certificate is back-dated by Backdate for clock skew between nodes.
//
// # Lifetimes (Policy; the defaults can be overridden)
//
//	CA                   10 years (DefaultCALifetime)
//	role certificates     1 year  (DefaultCertLifetime), never beyond the signing CA's end
//	propagation delay    24 hours (DefaultPropagationDelay), see CA rotation
//
// # Renewal rules
//
// A role certificate is (re)issued when it is missing or unparseable, its key is missing,
// unparseable or not the certificate's, it was not issued by the current signing CA, it does
// not name exactly what is wanted (role URI, DNS names, extended key usage, common name), it
// is expired or not yet valid, less than 1/3 of its lifetime remains, or it is valid for
// longer than the configured certificate lifetime (the lifetime was shortened). A role whose
// certificate is kept but whose trust bundle differs from the current one gets the bundle.
//
// A renewal can also be asked for (an operator forcing one now, e.g. after a key may have
// leaked): Leaf.RenewRequest re-issues that role's certificate, State.RenewAllRequest every
// role's, as if they were due, from the current signing CA. Neither touches a CA: during
// rotation phase 1 the renewed certificates still come from the old CA, and the rotation
// goes on by its own rules. A certificate re-issued for another reason says that reason.
// The state Renew returns carries no request. (layout.go: how the request is stored.)
//
// # CA rotation without an outage
//
// Servers and clients read their own Secrets, which kubelet refreshes at different moments, so
// a new CA must be trusted everywhere before anything presents a certificate issued by it:
//
//   - Phase 1: when the signing CA has less than 1/3 of its lifetime left, a next CA is made
//     and put into every trust bundle; leaves are still issued by the old CA.
//   - Phase 2: on a later run, once the next CA was made more than the propagation delay ago
//     (measured from its NotBefore plus Backdate), the next CA becomes the signing CA and every
//     certificate is re-issued from it. Phase 2 therefore never happens in the run that began
//     phase 1, nor in another run at the same time, even with a zero delay.
//   - If during phase 1 a role's stored trust bundle lacks the next CA (its Secret was deleted
//     or damaged), its holders may only now learn of it: the next CA is replaced by a new one,
//     so the propagation delay starts again for everyone.
//   - The old CA stays in the trust bundle until it expires, then it is dropped.
//
// A signing CA that is missing, unparseable, without its key, not a CA or expired cannot wait
// for a rotation: the next CA, if there is a usable one, is promoted at once, otherwise a new
// CA is made, and every certificate is re-issued from it. Pods that have not yet loaded the new
// trust bundle then reject the new certificates until kubelet refreshes their Secret (about a
// minute); the change says so. A previous CA certificate that is still valid stays trusted.
//
// Running Renew on its own result, at the same time, changes nothing.
package certgen
