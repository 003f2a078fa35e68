package snapshot

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// secrets returns the SDS secrets that Config provides, sorted by name.
func (b *builder) secrets() []*tlsv3.Secret {
	s := b.cfg.Secrets
	var out []*tlsv3.Secret
	inline := func(pem []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: pem}}
	}
	if len(s.ClientCA) > 0 {
		out = append(out, &tlsv3.Secret{Name: SecretClientCA, Type: &tlsv3.Secret_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inline(s.ClientCA)},
		}})
	}
	if len(s.PeerCA) > 0 {
		out = append(out, &tlsv3.Secret{Name: SecretPeerCA, Type: &tlsv3.Secret_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inline(s.PeerCA)},
		}})
	}
	if len(s.ProxyClientCert) > 0 {
		out = append(out, &tlsv3.Secret{Name: SecretProxyClientCert, Type: &tlsv3.Secret_TlsCertificate{
			TlsCertificate: &tlsv3.TlsCertificate{CertificateChain: inline(s.ProxyClientCert), PrivateKey: inline(s.ProxyClientKey)},
		}})
	}
	if len(s.ServingCert) > 0 {
		out = append(out, &tlsv3.Secret{Name: SecretServingCert, Type: &tlsv3.Secret_TlsCertificate{
			TlsCertificate: &tlsv3.TlsCertificate{CertificateChain: inline(s.ServingCert), PrivateKey: inline(s.ServingKey)},
		}})
	}
	return out // already in name order: client-ca, peer-ca, proxy-client-cert, serving-cert
}

func sdsSecret(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: ads()}
}

// downstreamTLS is the listener's TLS: the serving certificate, and when a client CA is given,
// client certificates verified against it but not required (bearer-token clients present
// none). A presented certificate that does not verify fails the handshake.
func (b *builder) downstreamTLS() *tlsv3.DownstreamTlsContext {
	common := &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret(SecretServingCert)},
		// kubectl and client-go speak HTTP/2; upgrades (exec, attach, port-forward) use HTTP/1.1.
		AlpnProtocols: []string{"h2", "http/1.1"},
	}
	if len(b.cfg.Secrets.ClientCA) > 0 {
		common.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig{
			ValidationContextSdsSecretConfig: sdsSecret(SecretClientCA),
		}
	}
	return &tlsv3.DownstreamTlsContext{
		CommonTlsContext:         common,
		RequireClientCertificate: wrapperspb.Bool(false),
	}
}

// upstreamTLS is the TLS of every apiserver cluster: SNI and a DNS SAN check on
// UpstreamServerName against the peer CA, and the proxy client certificate, which the
// apiservers trust for front-proxy (X-Remote-*) authentication. ALPN offers only HTTP/1.1,
// which SPDY upgrades need.
func (b *builder) upstreamTLS() *tlsv3.UpstreamTlsContext {
	common := &tlsv3.CommonTlsContext{AlpnProtocols: []string{"http/1.1"}}
	if len(b.cfg.Secrets.ProxyClientCert) > 0 {
		common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecret(SecretProxyClientCert)}
	}
	if len(b.cfg.Secrets.PeerCA) > 0 {
		common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{
			CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext: &tlsv3.CertificateValidationContext{
					MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
						SanType: tlsv3.SubjectAltNameMatcher_DNS,
						Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: b.cfg.UpstreamServerName}},
					}},
				},
				ValidationContextSdsSecretConfig: sdsSecret(SecretPeerCA),
			},
		}
	}
	return &tlsv3.UpstreamTlsContext{Sni: b.cfg.UpstreamServerName, CommonTlsContext: common}
}
