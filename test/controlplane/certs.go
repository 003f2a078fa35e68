package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// Names every test control plane uses.
const (
	// UpstreamServerName is the SAN upstream's peer proxy (and our Envoy config) checks on
	// apiserver serving certificates.
	UpstreamServerName = "kubernetes.default.svc"
	// ProxyClientCN is the front-proxy client identity, listed in --requestheader-allowed-names.
	ProxyClientCN = "front-proxy-client"
	// AdminUser is the admin client certificate's user, in group system:masters.
	AdminUser = "kube-mvp-admin"
)

// CA is a certificate authority that can issue certificates.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// KeyPair is a certificate and key in PEM.
type KeyPair struct {
	CertPEM, KeyPEM []byte
}

// TLS returns kp as a tls.Certificate.
func (kp KeyPair) TLS() (tls.Certificate, error) { return tls.X509KeyPair(kp.CertPEM, kp.KeyPEM) }

// PKI is every certificate a control plane needs, written to Dir.
type PKI struct {
	Dir string
	// ServerCA signs the apiservers' serving certificates (upstream's --peer-ca-file).
	ServerCA *CA
	// ClientCA signs client certificates that apiservers accept (--client-ca-file).
	ClientCA *CA
	// FrontProxyCA signs the proxy client certificate (--requestheader-client-ca-file).
	FrontProxyCA *CA
	Serving      KeyPair
	Admin        KeyPair
	ProxyClient  KeyPair
}

// Paths of the files NewPKI writes.
func (p *PKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// NewPKI generates the whole PKI into dir; servingIPs are added to the apiservers' serving
// certificate.
func NewPKI(dir string, servingIPs ...net.IP) (*PKI, error) {
	p := &PKI{Dir: dir}
	var err error
	if p.ServerCA, err = newCA("kube-mvp-test-server-ca"); err != nil {
		return nil, err
	}
	if p.ClientCA, err = newCA("kube-mvp-test-client-ca"); err != nil {
		return nil, err
	}
	if p.FrontProxyCA, err = newCA("kube-mvp-test-front-proxy-ca"); err != nil {
		return nil, err
	}
	if p.Serving, err = p.ServerCA.Issue(pkix.Name{CommonName: "kube-apiserver"}, serverUsage,
		[]string{"localhost", "kubernetes", "kubernetes.default", UpstreamServerName, UpstreamServerName + ".cluster.local"},
		append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, servingIPs...)); err != nil {
		return nil, err
	}
	if p.Admin, err = p.ClientCA.Issue(pkix.Name{CommonName: AdminUser, Organization: []string{"system:masters"}}, clientUsage, nil, nil); err != nil {
		return nil, err
	}
	if p.ProxyClient, err = p.FrontProxyCA.Issue(pkix.Name{CommonName: ProxyClientCN}, clientUsage, nil, nil); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"server-ca.crt":      p.ServerCA.CertPEM,
		"client-ca.crt":      p.ClientCA.CertPEM,
		"front-proxy-ca.crt": p.FrontProxyCA.CertPEM,
		"serving.crt":        p.Serving.CertPEM,
		"serving.key":        p.Serving.KeyPEM,
		"admin.crt":          p.Admin.CertPEM,
		"admin.key":          p.Admin.KeyPEM,
		"proxy-client.crt":   p.ProxyClient.CertPEM,
		"proxy-client.key":   p.ProxyClient.KeyPEM,
		"sa.key":             pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saKeyDER}),
		"sa.pub":             pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),

		// A --client-ca-file that also trusts the front-proxy CA: an apiserver with it takes
		// the proxy certificate as a client certificate of its own when it does not accept
		// it as a front proxy's.
		"client-and-front-proxy-ca.crt": slices.Concat(p.ClientCA.CertPEM, p.FrontProxyCA.CertPEM),
	}
	for name, b := range files {
		if err := os.WriteFile(p.Path(name), b, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

var (
	serverUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	clientUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
)

func newCA(cn string) (*CA, error) {
	ca, err := testutil.NewCA(cn)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: ca.Cert, Key: ca.Key, CertPEM: ca.CertPEM}, nil
}

// Issue signs a new leaf certificate.
func (ca *CA) Issue(subject pkix.Name, usage []x509.ExtKeyUsage, dnsNames []string, ips []net.IP) (KeyPair, error) {
	leaf, err := (&testutil.CA{Cert: ca.Cert, Key: ca.Key, CertPEM: ca.CertPEM}).Issue(&x509.Certificate{
		Subject: subject, ExtKeyUsage: usage, DNSNames: dnsNames, IPAddresses: ips,
	})
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertPEM: leaf.CertPEM, KeyPEM: leaf.KeyPEM}, nil
}

// ClientCert issues a client certificate that the apiservers accept for user in groups.
func (p *PKI) ClientCert(user string, groups ...string) (KeyPair, error) {
	return p.ClientCA.Issue(pkix.Name{CommonName: user, Organization: groups}, clientUsage, nil, nil)
}
