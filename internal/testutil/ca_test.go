package testutil

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"testing"
)

func TestCAIssues(t *testing.T) {
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("spiffe://example/alice")
	leaf, err := ca.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "alice", Organization: []string{"team"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{u},
	})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the leaf does not verify against its CA: %v", err)
	}
	if leaf.Cert.Subject.CommonName != "alice" || len(leaf.Cert.URIs) != 1 || leaf.Cert.SerialNumber.Cmp(ca.Cert.SerialNumber) == 0 {
		t.Errorf("leaf %v, URIs %v, serial %v (CA's %v)", leaf.Cert.Subject, leaf.Cert.URIs, leaf.Cert.SerialNumber, ca.Cert.SerialNumber)
	}
	if _, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM); err != nil {
		t.Errorf("PEM pair: %v", err)
	}
}

func TestProxyClientPairs(t *testing.T) {
	ps := ProxyClientPairs(t, 2)
	if len(ps) != 2 || bytes.Equal(ps[0].CertPEM, ps[1].CertPEM) || bytes.Equal(ps[0].KeyPEM, ps[1].KeyPEM) {
		t.Fatalf("want two different pairs, got %d", len(ps))
	}
	for _, p := range ps {
		if p.Cert.Subject.CommonName != "front-proxy-client" || p.Cert.Issuer.CommonName != "front-proxy-ca" ||
			len(p.Cert.ExtKeyUsage) != 1 || p.Cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
			t.Errorf("subject %v, issuer %v, extended key usages %v", p.Cert.Subject, p.Cert.Issuer, p.Cert.ExtKeyUsage)
		}
		if _, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM); err != nil {
			t.Errorf("PEM pair: %v", err)
		}
	}
}
