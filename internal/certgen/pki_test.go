package certgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

// TestWhatIsMade checks the CA and each role's certificate field by field against the
// package documentation.
func TestWhatIsMade(t *testing.T) {
	s := installed(t)
	ca := signingCA(t, s)
	if ca.Subject.CommonName != "kube-mvp control-plane CA" || !ca.IsCA || !ca.BasicConstraintsValid || ca.MaxPathLen != 0 || !ca.MaxPathLenZero {
		t.Errorf("CA subject %q IsCA %v MaxPathLen %d/%v", ca.Subject, ca.IsCA, ca.MaxPathLen, ca.MaxPathLenZero)
	}
	if ca.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("CA key usage %b", ca.KeyUsage)
	}
	if got := ca.NotAfter.Sub(ca.NotBefore); got != 10*365*24*time.Hour+Backdate {
		t.Errorf("CA lifetime %s", got)
	}
	if ca.Subject.SerialNumber == "" || ca.CheckSignatureFrom(ca) != nil {
		t.Errorf("CA subject serialNumber %q, self-signature %v", ca.Subject.SerialNumber, ca.CheckSignatureFrom(ca))
	}
	checkP256(t, "CA", ca)
	for _, l := range leaves(t, s) {
		c := l.cert
		checkP256(t, string(l.role), c)
		if c.Subject.CommonName != "kube-mvp "+string(l.role) || c.IsCA {
			t.Errorf("%s: subject %q IsCA %v", l.role, c.Subject, c.IsCA)
		}
		if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://kube-mvp/role/"+string(l.role) {
			t.Errorf("%s: URIs %v", l.role, c.URIs)
		}
		wantEKU, wantDNS := x509.ExtKeyUsageClientAuth, []string(nil)
		if l.role == cptls.RoleXDSServer {
			wantEKU, wantDNS = x509.ExtKeyUsageServerAuth, slices.Sorted(slices.Values(dnsNames))
		}
		if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{wantEKU}) || c.KeyUsage != x509.KeyUsageDigitalSignature {
			t.Errorf("%s: key usage %b, extended %v", l.role, c.KeyUsage, c.ExtKeyUsage)
		}
		if !slices.Equal(c.DNSNames, wantDNS) || len(c.IPAddresses) > 0 {
			t.Errorf("%s: DNS names %v IPs %v, want %v", l.role, c.DNSNames, c.IPAddresses, wantDNS)
		}
		if got := c.NotAfter.Sub(c.NotBefore); got != 365*24*time.Hour+Backdate {
			t.Errorf("%s: lifetime %s", l.role, got)
		}
		if !c.NotBefore.Equal(t0.Add(-Backdate)) {
			t.Errorf("%s: NotBefore %s", l.role, c.NotBefore)
		}
	}
}

func checkP256(t *testing.T, what string, c *x509.Certificate) {
	t.Helper()
	if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("%s: key %T, want ECDSA P-256", what, c.PublicKey)
	}
}

// TestLeafCutAtCAEnd: a certificate never outlives its CA.
func TestLeafCutAtCAEnd(t *testing.T) {
	p := Policy{CALifetime: 90 * 24 * time.Hour, CertLifetime: 80 * 24 * time.Hour, PropagationDelay: time.Hour}
	s, _ := renew(t, t0, State{}, allRoles, p)
	now := t0.Add(50 * 24 * time.Hour) // CA: 40 days left, not yet rotating (30 days)
	s = withLeaf(s, cptls.RoleExtproc, func(l *Leaf) { l.CertPEM = nil })
	s, _ = renew(t, now, s, allRoles, p)
	c, err := parseCert(s.Leaves[cptls.RoleExtproc].CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if ca := signingCA(t, s); !c.NotAfter.Equal(ca.NotAfter) {
		t.Errorf("extproc valid until %s, CA until %s", stamp(c.NotAfter), stamp(ca.NotAfter))
	}
}

func TestPolicyValidate(t *testing.T) {
	if errs := DefaultPolicy().Validate(); len(errs) > 0 {
		t.Errorf("defaults: %v", errs)
	}
	for _, c := range []struct {
		p      Policy
		fields []string
	}{
		{Policy{}, []string{"CALifetime", "CertLifetime"}},
		{Policy{CALifetime: 24 * time.Hour, CertLifetime: 24 * time.Hour, PropagationDelay: -time.Second}, []string{"CertLifetime", "PropagationDelay"}},
		{Policy{CALifetime: 30 * 24 * time.Hour, CertLifetime: time.Hour, PropagationDelay: 10 * 24 * time.Hour}, []string{"PropagationDelay"}},
		{Policy{CALifetime: 30 * 24 * time.Hour, CertLifetime: 31 * 24 * time.Hour}, []string{"CertLifetime"}},
	} {
		var fields []string
		for _, err := range c.p.Validate() {
			pe, ok := err.(*PolicyError)
			if !ok {
				t.Fatalf("%T", err)
			}
			fields = append(fields, pe.Field)
		}
		if !slices.Equal(fields, c.fields) {
			t.Errorf("%+v: problems with %v, want %v", c.p, fields, c.fields)
		}
		if _, _, err := Renew(t0, State{}, allRoles, c.p); err == nil {
			t.Errorf("%+v: Renew accepted it", c.p)
		}
	}
}

func TestValidateSpecs(t *testing.T) {
	for _, c := range []struct {
		specs []Spec
		want  []string
	}{
		{allRoles, nil},
		{nil, nil},
		{[]Spec{{Role: "admin"}}, []string{`unknown role "admin"`}},
		{[]Spec{{Role: cptls.RoleExtproc}, {Role: cptls.RoleExtproc}}, []string{"more than once"}},
		{[]Spec{{Role: cptls.RoleEnvoyFront, DNSNames: []string{"a"}}}, []string{"is a client"}},
		{[]Spec{{Role: cptls.RoleXDSServer, DNSNames: []string{"ok.example", "Bad_Name", "", "x..y"}}}, []string{`"Bad_Name" is not a DNS name`, `"" is not`, `"x..y" is not`}},
	} {
		errs := ValidateSpecs(c.specs)
		if len(errs) != len(c.want) {
			t.Errorf("%v: %v, want %d problems", c.specs, errs, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(errs[i].Error(), w) {
				t.Errorf("%v: %v, want %q", c.specs, errs[i], w)
			}
		}
		if len(c.want) > 0 {
			if _, _, err := Renew(t0, State{}, c.specs, DefaultPolicy()); err == nil {
				t.Errorf("%v: Renew accepted it", c.specs)
			}
		}
	}
	if _, _, err := Renew(time.Time{}, State{}, allRoles, DefaultPolicy()); err == nil {
		t.Error("Renew without a time")
	}
}

// TestRenewGarbage: whatever bytes are stored, Renew repairs them without an error or panic.
func TestRenewGarbage(t *testing.T) {
	base := installed(t)
	junk := [][]byte{
		nil,
		[]byte("garbage"),
		[]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"),
		[]byte("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"),
		[]byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"),
		[]byte("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"),
		[]byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
		base.Leaves[cptls.RoleExtproc].CertPEM, // a leaf where a CA or key belongs
		base.CA.KeyPEM,
	}
	fields := []func(*State, []byte){
		func(s *State, b []byte) { s.CA.CertPEM = b },
		func(s *State, b []byte) { s.CA.KeyPEM = b },
		func(s *State, b []byte) { s.NextCA.CertPEM = b },
		func(s *State, b []byte) { s.NextCA.KeyPEM = b },
		func(s *State, b []byte) { s.BundlePEM = b },
		func(s *State, b []byte) {
			l := s.Leaves[cptls.RoleXDSServer]
			l.CertPEM = b
			s.Leaves[cptls.RoleXDSServer] = l
		},
		func(s *State, b []byte) {
			l := s.Leaves[cptls.RoleXDSServer]
			l.KeyPEM = b
			s.Leaves[cptls.RoleXDSServer] = l
		},
		func(s *State, b []byte) {
			l := s.Leaves[cptls.RoleXDSServer]
			l.BundlePEM = b
			s.Leaves[cptls.RoleXDSServer] = l
		},
	}
	for i, set := range fields {
		for j, b := range junk {
			s := clone(base)
			set(&s, b)
			next, _, err := Renew(t0.Add(time.Hour), s, allRoles, DefaultPolicy())
			if err != nil {
				t.Errorf("field %d, junk %d: %v", i, j, err)
				continue
			}
			checkState(t, t0.Add(time.Hour), next)
		}
	}
}
