package extproc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var (
	oidCN      = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidO       = asn1.ObjectIdentifier{2, 5, 4, 10}
	oidOU      = asn1.ObjectIdentifier{2, 5, 4, 11}
	oidC       = asn1.ObjectIdentifier{2, 5, 4, 6}
	oidLDAPUID = asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 1}
	// oidUID is Kubernetes' (k8s.io/apimachinery asn1.X509UID), which BoringSSL has no name for.
	oidUID   = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}
	oidEmail = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 1}
	oidOdd   = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}
)

var shortNames = map[string]string{
	oidCN.String(): "CN", oidO.String(): "O", oidOU.String(): "OU", oidC.String(): "C",
	oidLDAPUID.String(): "UID", oidEmail.String(): "emailAddress",
}

// printRFC2253 prints a certificate subject the way Envoy does for XFCC Subject: BoringSSL's
// X509_NAME_print_ex with XN_FLAG_RFC2253, i.e. attributes in reverse order (XN_FLAG_DN_REV),
// "," between RDNs and "+" inside one, short names (an OID for unknown types, whose value is
// then "#" and the hex of its DER), values converted to UTF-8 and escaped: ,+"\<>; and a
// leading # or space and a trailing space with a backslash, control characters and bytes
// above 0x7f as \XX.
func printRFC2253(t *testing.T, raw []byte) string {
	t.Helper()
	var rdns pkix.RDNSequence
	if _, err := asn1.Unmarshal(raw, &rdns); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		atv pkix.AttributeTypeAndValue
		set int
	}
	var flat []entry
	for i, rdn := range rdns {
		for _, atv := range rdn {
			flat = append(flat, entry{atv, i})
		}
	}
	var b strings.Builder
	for i := len(flat) - 1; i >= 0; i-- {
		e := flat[i]
		if i < len(flat)-1 {
			if flat[i+1].set == e.set {
				b.WriteByte('+')
			} else {
				b.WriteByte(',')
			}
		}
		name, known := shortNames[e.atv.Type.String()]
		if !known {
			der, err := asn1.Marshal(e.atv.Value)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s=#%s", e.atv.Type, strings.ToUpper(hex.EncodeToString(der)))
			continue
		}
		b.WriteString(name + "=")
		v := e.atv.Value.(string)
		for j := 0; j < len(v); j++ {
			c := v[j]
			switch {
			case c > 0x7f || c < 0x20 || c == 0x7f:
				fmt.Fprintf(&b, "\\%02X", c)
			case strings.IndexByte(`,+"\<>;`, c) >= 0, j == 0 && (c == '#' || c == ' '), j == len(v)-1 && c == ' ':
				b.WriteByte('\\')
				b.WriteByte(c)
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String()
}

var testKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

// kubernetesUser is what k8s.io/apiserver's x509 CommonNameUserConversion reads from a
// client certificate, as Go's crypto/x509 parsed it (the package itself cannot be imported
// here: it pulls in component-base and OpenTelemetry): no user for an empty CommonName; the
// name is Subject.CommonName, the groups Subject.Organization, the UID the one UID attribute
// (several or an empty one fail the authentication), the credential ID the SHA-256 of the
// certificate.
func kubernetesUser(cert *x509.Certificate) (name, uid string, groups []string, credentialID string, ok bool, err error) {
	if cert.Subject.CommonName == "" {
		return "", "", nil, "", false, nil
	}
	var uids []string
	for _, n := range cert.Subject.Names {
		if n.Type.Equal(oidUID) {
			s, isString := n.Value.(string)
			if !isString {
				return "", "", nil, "", false, errors.New("UID is not a string")
			}
			uids = append(uids, s)
		}
	}
	switch {
	case len(uids) > 1:
		return "", "", nil, "", false, fmt.Errorf("expected 1 UID, found %v", uids)
	case len(uids) == 1 && uids[0] == "":
		return "", "", nil, "", false, errors.New("empty UID")
	case len(uids) == 1:
		uid = uids[0]
	}
	sum := sha256.Sum256(cert.Raw)
	return cert.Subject.CommonName, uid, cert.Subject.Organization, "X509SHA256=" + hex.EncodeToString(sum[:]), true, nil
}

// certWithSubject issues a self-signed certificate whose subject is exactly rdns.
func certWithSubject(t *testing.T, rdns pkix.RDNSequence) *x509.Certificate {
	t.Helper()
	raw, err := asn1.Marshal(rdns)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), RawSubject: raw,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &testKey.PublicKey, testKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func rdn(kv ...any) pkix.RelativeDistinguishedNameSET {
	var set pkix.RelativeDistinguishedNameSET
	for i := 0; i+1 < len(kv); i += 2 {
		set = append(set, pkix.AttributeTypeAndValue{Type: kv[i].(asn1.ObjectIdentifier), Value: kv[i+1]})
	}
	return set
}

// TestIdentityMatchesKubernetes issues certificates, prints their subjects as Envoy does, and
// checks that the identity we forward is the one Kubernetes' x509 authenticator
// (CommonNameUserConversion) derives from the certificate itself, as Go's crypto/x509 parses
// it: attribute order, multi-valued RDNs and string decoding are Go's, not ours.
func TestIdentityMatchesKubernetes(t *testing.T) {
	cases := []struct {
		name string
		rdns pkix.RDNSequence
	}{
		{"CN and groups in certificate order", pkix.RDNSequence{rdn(oidO, "system:masters"), rdn(oidO, "team-b"), rdn(oidCN, "alice")}},
		{"groups before and after CN", pkix.RDNSequence{rdn(oidO, "g1"), rdn(oidCN, "bob"), rdn(oidO, "g2"), rdn(oidOU, "ignored")}},
		{"typical kubeadm admin", pkix.RDNSequence{rdn(oidC, "US"), rdn(oidO, "kubeadm:cluster-admins"), rdn(oidCN, "kubernetes-admin")}},
		{"node identity", pkix.RDNSequence{rdn(oidO, "system:nodes"), rdn(oidCN, "system:node:worker-1")}},
		{"two CNs: the last in the certificate wins", pkix.RDNSequence{rdn(oidCN, "first"), rdn(oidO, "g"), rdn(oidCN, "second")}},
		{"multi-valued RDN", pkix.RDNSequence{rdn(oidO, "m1", oidCN, "carol", oidO, "m2"), rdn(oidO, "m3")}},
		{"escaped specials", pkix.RDNSequence{rdn(oidO, `a,b+c"d\e<f>g;h`), rdn(oidCN, `#x=y z`)}},
		{"escaped leading hash and inner spaces", pkix.RDNSequence{rdn(oidCN, "#hash name with spaces")}},
		{"UTF-8 names", pkix.RDNSequence{rdn(oidO, "Équipe Ωmega"), rdn(oidCN, "zoë 日本")}},
		{"UID attribute", pkix.RDNSequence{rdn(oidUID, "uid-1234"), rdn(oidO, "g"), rdn(oidCN, "dave")}},
		{"unknown attribute types are dumped and ignored", pkix.RDNSequence{rdn(oidOdd, "whatever"), rdn(oidCN, "erin"), rdn(oidEmail, "erin@example.com")}},
		{"empty CN: not authenticated", pkix.RDNSequence{rdn(oidO, "system:masters"), rdn(oidCN, "")}},
		{"no CN: not authenticated", pkix.RDNSequence{rdn(oidO, "system:masters")}},
		{"empty subject", pkix.RDNSequence{}},
		{"empty O is dropped (header authenticator drops empty values)", pkix.RDNSequence{rdn(oidO, ""), rdn(oidO, "real"), rdn(oidCN, "frank")}},
		{"two UIDs: Kubernetes fails it", pkix.RDNSequence{rdn(oidUID, "u1"), rdn(oidUID, "u2"), rdn(oidCN, "gina")}},
		{"empty UID: Kubernetes fails it", pkix.RDNSequence{rdn(oidUID, ""), rdn(oidCN, "gina")}},
		{"UTF-8 UID", pkix.RDNSequence{rdn(oidUID, "ü-uid"), rdn(oidCN, "gina")}},
		{"LDAP UID is not Kubernetes' UID: ignored", pkix.RDNSequence{rdn(oidLDAPUID, "ldap-uid"), rdn(oidCN, "ivan")}},
		{"two LDAP UIDs: ignored", pkix.RDNSequence{rdn(oidLDAPUID, "a"), rdn(oidLDAPUID, "b"), rdn(oidCN, "ivan")}},
		{"leading space in CN: rejected, not trimmed", pkix.RDNSequence{rdn(oidCN, " system:admin")}},
		{"control character in O: rejected", pkix.RDNSequence{rdn(oidO, "bad\ngroup"), rdn(oidCN, "harry")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cert := certWithSubject(t, c.rdns)
			sum := sha256.Sum256(cert.Raw)
			xfcc := fmt.Sprintf(`By=spiffe://kube-mvp/envoy;Hash=%x;Subject="%s";URI=`, sum, printRFC2253(t, cert.RawSubject))
			got, res, err := identityFromXFCC([]string{xfcc})

			name, uid, groups, credentialID, ok, kerr := kubernetesUser(cert)
			switch {
			case kerr != nil:
				// The apiserver's own rejection: refused (401 unless a bearer token decides).
				if res != identityRefused {
					t.Errorf("Kubernetes fails the certificate (%v); we gave %v %+v", kerr, res, got)
				}
				return
			case !ok:
				if res != identityAnonymous {
					t.Errorf("Kubernetes does not authenticate the certificate; we gave %v %+v (%v)", res, got, err)
				}
				return
			}
			if !forwardableHeaderValue(name) || slices.ContainsFunc(groups, func(g string) bool { return !forwardableHeaderValue(g) }) {
				if res != identityRejected {
					t.Errorf("unforwardable identity %q %q; we gave %v %+v", name, groups, res, got)
				}
				return
			}
			if res != identityForwarded || err != nil {
				t.Fatalf("%s: %v %v, want forwarded", xfcc, res, err)
			}
			wantGroups := slices.DeleteFunc(slices.Clone(groups), func(g string) bool { return g == "" })
			if got.user != name || got.uid != uid || !slices.Equal(got.groups, wantGroups) {
				t.Errorf("%s\n got user %q uid %q groups %q\nwant user %q uid %q groups %q", xfcc, got.user, got.uid, got.groups, name, uid, wantGroups)
			}
			if got.credentialID != credentialID {
				t.Errorf("credential ID %q, want %q", got.credentialID, credentialID)
			}
		})
	}
}

// TestXFCCStrictness: what does not look exactly like one element written by our listener
// forwards no identity.
func TestXFCCStrictness(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	ok := `Hash=` + hash + `;Subject="CN=alice,O=devs";URI=`
	cases := []struct {
		name   string
		values []string
		want   identityResult
		user   string
	}{
		{"no header", nil, identityNone, ""},
		{"as Envoy writes it", []string{ok}, identityForwarded, "alice"},
		{"keys are case-insensitive", []string{`hash=` + hash + `;SUBJECT="CN=alice"`}, identityForwarded, "alice"},
		{"without Hash", []string{`Subject="CN=alice"`}, identityForwarded, "alice"},
		{"By before, DNS after", []string{`By=spiffe://a/b;Hash=` + hash + `;Subject="CN=alice";URI=spiffe://c/d;DNS=a.example;DNS=b.example`}, identityForwarded, "alice"},
		{"escaped quote and backslash in the subject", []string{`Subject="CN=a\"b\\"`}, identityForwarded, `a"b\`},
		{"two headers", []string{ok, ok}, identityRejected, ""},
		{"two elements (appended by another proxy)", []string{ok + "," + ok}, identityRejected, ""},
		{"comma in an unquoted URI looks like two elements", []string{`Subject="CN=alice";URI=spiffe://x/a,b`}, identityRejected, ""},
		{"Subject injected through a URI SAN", []string{`Subject="CN=alice";URI=x;Subject="CN=system:admin,O=system:masters"`}, identityRejected, ""},
		{"quote in an unquoted value", []string{`Subject="CN=alice";URI=x";Subject="CN=root`}, identityRejected, ""},
		{"no Subject (listener misconfigured)", []string{`Hash=` + hash + `;URI=spiffe://x`}, identityRejected, ""},
		{"unquoted Subject", []string{`Subject=CN=alice`}, identityRejected, ""},
		{"unterminated quote", []string{`Subject="CN=alice`}, identityRejected, ""},
		{"bad Hash", []string{`Hash=xyz;Subject="CN=alice"`}, identityRejected, ""},
		{"two Hashes", []string{`Hash=` + hash + `;Hash=` + hash + `;Subject="CN=alice"`}, identityRejected, ""},
		{"empty element", []string{``}, identityRejected, ""},
		{"trailing separator", []string{ok + ";"}, identityRejected, ""},
		{"space after separator", []string{`Hash=` + hash + `; Subject="CN=alice"`}, identityRejected, ""},
		{"empty subject", []string{`Subject=""`}, identityAnonymous, ""},
		{"escaped quotes in the DN", []string{`Subject="CN=a\"b\",O=x"`}, identityForwarded, `a"b"`},
		{"unescaped semicolon in the DN", []string{`Subject="CN=a;b"`}, identityRejected, ""},
		{"backslash before the closing quote", []string{`Subject="CN=a\"`}, identityRejected, ""},
		{"bad hex escape in the DN", []string{`Subject="CN=a\4"`}, identityRejected, ""},
		{"escape BoringSSL never writes", []string{`Subject="CN=a\Ub"`}, identityRejected, ""},
		{"CN dumped as DER", []string{`Subject="CN=#0C03616263"`}, identityRejected, ""},
		{"escaped newline in the CN", []string{`Subject="CN=a\0Ab"`}, identityRejected, ""},
		{"trailing separator in the DN", []string{`Subject="CN=a,"`}, identityRejected, ""},
		{"attribute without value separator", []string{`Subject="CN"`}, identityRejected, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, res, err := identityFromXFCC(c.values)
			if res != c.want || id.user != c.user {
				t.Errorf("%q: %v %q (%v), want %v %q", c.values, res, id.user, err, c.want, c.user)
			}
			if (res == identityRejected) != (err != nil) {
				t.Errorf("result %v with error %v", res, err)
			}
		})
	}
}

func FuzzIdentityFromXFCC(f *testing.F) {
	for _, s := range []string{
		`Hash=` + strings.Repeat("0", 64) + `;Subject="CN=alice,O=devs";URI=`,
		`Subject="CN=a\,b+O=c\\22,O=#0C0161"`,
		`By=x,Subject=""`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, res, err := identityFromXFCC([]string{s})
		if (res == identityRejected) != (err != nil) {
			t.Fatalf("%q: result %v with error %v", s, res, err)
		}
		if res == identityForwarded {
			for _, v := range append([]string{id.user, id.uid}, id.groups...) {
				if !forwardableHeaderValue(v) {
					t.Fatalf("%q: forwarded unforwardable %q", s, v)
				}
			}
			if id.user == "" {
				t.Fatalf("%q: forwarded an empty user", s)
			}
		}
	})
}

func TestIdentityCache(t *testing.T) {
	c := newIdentityCache(2, topology.RequestHeaders{})
	hv := func(v string, raw bool) *corev3.HeaderValue {
		if raw {
			return &corev3.HeaderValue{Key: contract.HeaderXFCC, RawValue: []byte(v)}
		}
		return &corev3.HeaderValue{Key: contract.HeaderXFCC, Value: v}
	}
	if c.get(nil) != noIdentity {
		t.Error("no header: want noIdentity")
	}
	a := c.get(hv(`Subject="CN=a"`, true))
	if a.res != identityForwarded || len(a.set) != 1 || string(a.set[0].GetHeader().GetRawValue()) != "a" {
		t.Fatalf("a: %+v", a)
	}
	if c.get(hv(`Subject="CN=a"`, false)) != a || c.get(hv(`Subject="CN=a"`, true)) != a {
		t.Error("a not served from the cache, by value or raw_value")
	}
	c.get(hv(`Subject="CN=b"`, true))
	c.get(hv(`Subject="CN=c"`, true)) // the first generation {a, b} is now the previous one
	if c.get(hv(`Subject="CN=a"`, true)) != a {
		t.Error("a lost after one rotation")
	}
	for _, n := range []string{"d", "e", "f", "g"} {
		c.get(hv(`Subject="CN=`+n+`"`, true))
	}
	if len(c.cur)+len(c.prev) > 4 {
		t.Errorf("cache holds %d entries, bound is 4", len(c.cur)+len(c.prev))
	}
	if c.get(hv(`Subject="CN=a"`, true)) == a {
		t.Error("a still cached after falling out of both generations")
	}
	if r := c.get(hv(`Subject="CN=a,"`, true)); r.res != identityRejected || r.err == nil || r.set != nil {
		t.Errorf("rejected identity: %+v", r)
	}
}
