// Package cptls is the control plane's own TLS: the certificates that xds-server, the Envoys
// and extproc present to each other on xds-server's gRPC port (ADS and the routing-table
// stream). They are issued by the control plane's own CA (made by `xds-server certgen`), never
// by the cluster's CAs, and each names the role of its holder in a URI SAN:
//
//	spiffe://kube-mvp/role/xds-server     the gRPC server
//	spiffe://kube-mvp/role/envoy-front    a front-proxy Envoy (ADS client, no local apiserver)
//	spiffe://kube-mvp/role/envoy-sidecar  an Envoy beside one apiserver (ADS client)
//	spiffe://kube-mvp/role/extproc        extproc (routing-table client)
//
// Replicas of one Deployment or DaemonSet share one certificate: the role, not the pod, is
// what the server authorizes.
package cptls

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"
)

// Role is what a control-plane certificate lets its holder do.
type Role string

const (
	RoleXDSServer    Role = "xds-server"
	RoleEnvoyFront   Role = "envoy-front"
	RoleEnvoySidecar Role = "envoy-sidecar"
	RoleExtproc      Role = "extproc"
)

// Roles lists every role, server first.
var Roles = []Role{RoleXDSServer, RoleEnvoyFront, RoleEnvoySidecar, RoleExtproc}

// roleURIPrefix is the URI SAN prefix under which a certificate names its role.
const roleURIPrefix = "spiffe://kube-mvp/role/"

// URI is the URI SAN naming r, e.g. spiffe://kube-mvp/role/extproc.
func (r Role) URI() *url.URL {
	u, _ := url.Parse(roleURIPrefix + string(r))
	return u
}

// String is the role's name.
func (r Role) String() string { return string(r) }

// ParseRole returns the role named s, or an error listing the valid ones.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return "", fmt.Errorf("unknown role %q (want one of %s)", s, strings.Join(names, ", "))
}

// RoleOf is the role a (verified) certificate names. A certificate naming no role, an unknown
// one or more than one has none: the caller refuses it.
func RoleOf(cert *x509.Certificate) (Role, error) {
	var found []Role
	for _, u := range cert.URIs {
		name, ok := strings.CutPrefix(u.String(), roleURIPrefix)
		if !ok {
			continue
		}
		r, err := ParseRole(name)
		if err != nil {
			return "", fmt.Errorf("certificate %q: %w", cert.Subject.CommonName, err)
		}
		found = append(found, r)
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("certificate %q names no kube-mvp role (URI SAN %s<role>)", cert.Subject.CommonName, roleURIPrefix)
	case 1:
		return found[0], nil
	default:
		return "", fmt.Errorf("certificate %q names %d kube-mvp roles; a certificate has exactly one", cert.Subject.CommonName, len(found))
	}
}
