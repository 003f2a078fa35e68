package certgen

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

const (
	// CACommonName is the common name of every CA certgen makes.
	CACommonName = "kube-mvp control-plane CA"
	// Backdate is how far before its issue time a certificate becomes valid, for clock skew.
	Backdate = 5 * time.Minute
)

// KeyPair is a PEM certificate and its PEM private key.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

func (k KeyPair) empty() bool { return len(k.CertPEM) == 0 && len(k.KeyPEM) == 0 }

// authority is a parsed, usable CA.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
	pair KeyPair
}

// CommonName is the common name of a role's certificate, e.g. "kube-mvp extproc".
func CommonName(r cptls.Role) string { return "kube-mvp " + string(r) }

// usage is the extended key usage of r's certificate.
func usage(r cptls.Role) x509.ExtKeyUsage {
	if r == cptls.RoleXDSServer {
		return x509.ExtKeyUsageServerAuth
	}
	return x509.ExtKeyUsageClientAuth
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("random serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // positive, never zero
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// newCA makes a self-signed CA valid from now-Backdate to now+lifetime.
func newCA(now time.Time, lifetime time.Duration) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: CACommonName, SerialNumber: hex.EncodeToString(serial.Bytes())},
		NotBefore:             now.Add(-Backdate).UTC(),
		NotAfter:              now.Add(lifetime).UTC(),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	return &authority{cert: cert, key: key, pair: KeyPair{CertPEM: encodeCert(der), KeyPEM: keyPEM}}, nil
}

// issue makes spec's certificate, signed by ca, valid from now-Backdate to now+lifetime or
// the CA's end, whichever comes first.
func (ca *authority) issue(spec Spec, now time.Time, lifetime time.Duration) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("%s key: %w", spec.Role, err)
	}
	serial, err := newSerial()
	if err != nil {
		return KeyPair{}, err
	}
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: CommonName(spec.Role)},
		NotBefore:             now.Add(-Backdate).UTC(),
		NotAfter:              notAfter.UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{usage(spec.Role)},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{spec.Role.URI()},
		DNSNames:              sortedNames(spec.DNSNames),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("%s certificate: %w", spec.Role, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("%s key: %w", spec.Role, err)
	}
	return KeyPair{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

func sortedNames(names []string) []string {
	if len(names) == 0 {
		return nil
	}
	s := slices.Clone(names)
	slices.Sort(s)
	return slices.Compact(s)
}

// firstBlock returns the first PEM block of b whose type is one of types; what names them
// in the error when there is none.
func firstBlock(b []byte, what string, types ...string) (*pem.Block, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, errors.New("missing")
	}
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("no PEM %s block", what)
		}
		if slices.Contains(types, block.Type) {
			return block, nil
		}
	}
}

// parseCert returns the first CERTIFICATE block of b.
func parseCert(b []byte) (*x509.Certificate, error) {
	block, err := firstBlock(b, "CERTIFICATE", "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("unparseable: %v", err)
	}
	return c, nil
}

// parseKey returns the private key of the first key block of b (PKCS #8, SEC 1 or PKCS #1).
func parseKey(b []byte) (crypto.Signer, error) {
	block, err := firstBlock(b, "private key", "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	var k any
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("unparseable %s: %v", block.Type, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T cannot sign", k)
	}
	return s, nil
}

// keyMatches reports whether key is the private key of cert.
func keyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(cert.PublicKey)
}

// parseCA returns the usable CA in kp at now, or why it is not usable.
func parseCA(kp KeyPair, now time.Time) (*authority, *x509.Certificate, string) {
	cert, err := parseCert(kp.CertPEM)
	if err != nil {
		return nil, nil, "certificate " + err.Error()
	}
	key, err := parseKey(kp.KeyPEM)
	switch {
	case err != nil:
		return nil, cert, "key " + err.Error()
	case !keyMatches(cert, key):
		return nil, cert, "its key does not match its certificate"
	case !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0:
		return nil, cert, "its certificate is not a CA certificate (CA:TRUE with certSign)"
	case !now.Before(cert.NotAfter):
		return nil, cert, "expired at " + stamp(cert.NotAfter)
	case now.Before(cert.NotBefore):
		return nil, cert, "not valid before " + stamp(cert.NotBefore)
	}
	return &authority{cert: cert, key: key, pair: kp}, cert, ""
}

// parseBundle returns the certificates of a PEM bundle and how many blocks were unusable.
func parseBundle(b []byte) (certs []*x509.Certificate, bad int) {
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return certs, bad
		}
		if block.Type != "CERTIFICATE" {
			bad++
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			bad++
			continue
		}
		certs = append(certs, c)
	}
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// caName names a CA in logs by the start of its serial number and its end.
func caName(c *x509.Certificate) string {
	s := serialHex(c)
	if len(s) > 8 {
		s = s[:8]
	}
	return fmt.Sprintf("CA %s (valid until %s)", s, stamp(c.NotAfter))
}

func serialHex(c *x509.Certificate) string { return hex.EncodeToString(c.SerialNumber.Bytes()) }
