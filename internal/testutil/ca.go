package testutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"testing"
	"time"
)

// CA is a certificate authority for tests: an ECDSA P-256 key and a self-signed certificate.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// Leaf is a certificate a CA issued, parsed and in PEM, with its key in PKCS #8 PEM.
type Leaf struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// NewCA makes a CA whose certificate's subject is CN=cn.
func NewCA(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	cert, certPEM, err := sign(tmpl, tmpl, key, key)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", cn, err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// Issue signs a new key's certificate with what tmpl says (subject, extended key usages,
// names); Issue sets the serial number, the validity and the key usage (digital signature).
func (ca *CA) Issue(tmpl *x509.Certificate) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	t := *tmpl
	t.KeyUsage = x509.KeyUsageDigitalSignature
	cert, certPEM, err := sign(&t, ca.Cert, key, ca.Key)
	if err != nil {
		return Leaf{}, fmt.Errorf("certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{Cert: cert, CertPEM: certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}, nil
}

// IssueRawSubject signs a client-authentication certificate whose subject is exactly
// rawSubject (DER), which crypto/x509 need not be able to parse: the certificate is returned
// as a tls.Certificate, never parsed.
func (ca *CA) IssueRawSubject(rawSubject []byte) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{RawSubject: rawSubject, SerialNumber: serial, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// ProxyClientPairs issues n front-proxy-client certificate pairs (client authentication) of
// one new CA, front-proxy-ca, as kubeadm's renewals make them.
func ProxyClientPairs(t testing.TB, n int) []Leaf {
	t.Helper()
	ca, err := NewCA("front-proxy-ca")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]Leaf, n)
	for i := range out {
		if out[i], err = ca.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// sign makes the certificate of key described by tmpl, signed by parent's signer, with a
// random serial number, valid from an hour ago (for clock skew) until two days from now.
func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, signer crypto.Signer) (*x509.Certificate, []byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, now.Add(-time.Hour), now.Add(48*time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
