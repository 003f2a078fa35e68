package dataplane

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"strings"
)

// xfccValue builds the x-forwarded-client-cert element Envoy sets with
// forward_client_cert_details SANITIZE_SET (HTTP connection manager documentation,
// "x-forwarded-client-cert"): key=value pairs joined by ";", in Envoy's order: one By per URI
// SAN of Envoy's own (serving) certificate, Hash (hex SHA-256 of the peer certificate's DER),
// then the set_current_client_cert_details in Envoy's fixed order — Subject (always present
// when requested, double-quoted, rfc2253's form), URI (one per URI SAN of the peer
// certificate; "URI=" when it has none). Only a connection whose client presented a
// (verified) certificate gets one.
func xfccValue(local, peer *x509.Certificate, subject, uri bool) string {
	var parts []string
	if local != nil {
		for _, u := range local.URIs {
			parts = append(parts, "By="+u.String())
		}
	}
	sum := sha256.Sum256(peer.Raw)
	parts = append(parts, "Hash="+hex.EncodeToString(sum[:]))
	if subject {
		parts = append(parts, `Subject="`+rfc2253(peer.RawSubject)+`"`)
	}
	if uri {
		for _, u := range peer.URIs {
			parts = append(parts, "URI="+u.String())
		}
		if len(peer.URIs) == 0 {
			parts = append(parts, "URI=")
		}
	}
	return strings.Join(parts, ";")
}
