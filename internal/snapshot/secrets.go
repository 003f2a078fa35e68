package snapshot

import (
	"path/filepath"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// secrets returns the SDS secrets that Config names, sorted by name. Each refers to its files
// by path and watches the file's directory: a mounted Secret changes by swapping a symlink in
// that directory, which a watch on the file itself would miss.
func (b *builder) secrets() []*tlsv3.Secret {
	s := b.cfg.Secrets
	var out []*tlsv3.Secret
	file := func(path string) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: path}}
	}
	watch := func(path string) *corev3.WatchedDirectory {
		return &corev3.WatchedDirectory{Path: filepath.Dir(path)}
	}
	ca := func(name, path string) *tlsv3.Secret {
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: file(path), WatchedDirectory: watch(path)},
		}}
	}
	pair := func(name, cert, key string) *tlsv3.Secret {
		tc := &tlsv3.TlsCertificate{CertificateChain: file(cert), PrivateKey: file(key)}
		// Envoy watches one directory per pair and reads both files on a change.
		if filepath.Dir(cert) == filepath.Dir(key) {
			tc.WatchedDirectory = watch(cert)
		}
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: tc}}
	}
	if s.ClientCA != "" {
		out = append(out, ca(SecretClientCA, s.ClientCA))
	}
	if s.PeerCA != "" {
		out = append(out, ca(SecretPeerCA, s.PeerCA))
	}
	if s.ProxyClientCert != "" {
		out = append(out, pair(SecretProxyClientCert, s.ProxyClientCert, s.ProxyClientKey))
	}
	if s.ServingCert != "" {
		out = append(out, pair(SecretServingCert, s.ServingCert, s.ServingKey))
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
		// No session resumption, neither by ticket (stateless) nor by session ID (stateful):
		// every connection is a full handshake whose client certificate is verified. On a
		// resumed session BoringSSL does not run the verification callback, so Envoy's
		// peerCertificateValidated() (SslHandshakerImpl, source/common/tls/ssl_handshaker.cc)
		// is false while the certificate still counts as presented (envoyproxy/envoy#21235,
		// #42668), and identity.lua sends such a request to the client-certificate-undecided
		// route. ServerContextImpl's constructor (source/common/tls/server_context_impl.cc)
		// applies the two fields as SSL_OP_NO_TICKET and SSL_SESS_CACHE_OFF. This stays right
		// should a later Envoy re-verify on resumption: a full handshake is always verified.
		SessionTicketKeysType:            &tlsv3.DownstreamTlsContext_DisableStatelessSessionResumption{DisableStatelessSessionResumption: true},
		DisableStatefulSessionResumption: true,
	}
}

// upstreamTLS is the TLS of the apiserver clusters: SNI and a DNS SAN check on
// UpstreamServerName against the peer CA and, for the front-proxy clusters (withProxyCert),
// the proxy client certificate, which the apiservers trust for front-proxy (X-Remote-*)
// authentication. ALPN offers exactly the cluster's protocol (alpn: "h2" or "http/1.1"), so
// the apiserver speaks what the cluster's codec expects.
func (b *builder) upstreamTLS(withProxyCert bool, alpn string) *tlsv3.UpstreamTlsContext {
	common := &tlsv3.CommonTlsContext{AlpnProtocols: []string{alpn}}
	if withProxyCert {
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
