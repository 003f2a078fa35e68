package dataplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/asn1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/websocket"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	luafilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	"golang.org/x/crypto/cryptobyte"
	"google.golang.org/protobuf/types/known/structpb"
	k8sx509 "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// The identity script (internal/snapshot/identity.lua) run by this data plane's Lua filter,
// against the oracle: what k8s.io/apiserver's x509 authenticator (CommonNameUserConversion,
// with the UID attribute) makes of the same certificate, as Go's crypto/x509 parses it.

const identityFilter = "kube-mvp.identity"

var identityNames = map[string]string{
	"decision_header": "x-kube-mvp-identity", "user_headers": "x-remote-user", "uid_headers": "x-remote-uid",
	"group_headers": "x-remote-group", "credential_id_headers": "x-remote-extra-authentication.kubernetes.io%2fcredential-id",
	"class_header": "x-kube-mvp-request-class",
}

var (
	identityOnce sync.Once
	identityCfg  *luaFilterCfg
	identityErr  error
)

// identityLua is the Lua filter as the snapshot configures it, and a route whose virtual host
// has the header names in its metadata.
func identityLua(t testing.TB) (*luaFilterCfg, *route) {
	identityOnce.Do(func() {
		identityCfg, identityErr = compileLua(identityFilter, &luafilterv3.Lua{
			DefaultSourceCode: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: snapshot.LuaScript}},
			StatPrefix:        "kube_mvp_identity",
		})
	})
	if identityErr != nil {
		t.Fatal(identityErr)
	}
	ctx := map[string]any{}
	for k, v := range identityNames {
		ctx[k] = v
	}
	fc, err := structpb.NewStruct(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vh := &virtualHost{filterMetadata: map[string]*structpb.Struct{identityFilter: fc}}
	return identityCfg, &route{name: "r", vh: vh}
}

type identityRun struct {
	out   luaOutcome
	reply *luaReply
	hdr   headerList
	logs  []string
}

func runIdentity(t testing.TB, cert *x509.Certificate, hdr headerList) identityRun {
	f, rt := identityLua(t)
	req := &luaRequest{hdr: &hdr, pseudo: func(string) (string, bool) { return "", false }, ssl: &luaSSL{peer: cert, validated: cert != nil}}
	var r identityRun
	r.out = f.run(rt, req, func(level, msg string) { r.logs = append(r.logs, level+": "+msg) })
	r.reply, r.hdr = req.reply, hdr
	return r
}

var identityKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

// rawATV is an attribute whose value is any DER (asn1.RawValue picks the string type).
type rawATV struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

// rawRDNSET is one RDN; the "SET" suffix makes encoding/asn1 treat it as SET OF.
type rawRDNSET []rawATV

// certFromRDNs issues a self-signed certificate whose subject is exactly the DER of rdns (values
// may be asn1.RawValue to pick a string type). The certificate Go cannot parse is returned
// with only Raw and RawSubject, which is all the Lua filter reads.
func certFromRDNs(t testing.TB, rdns [][]rawATV) (*x509.Certificate, error) {
	return certFromNames(t, rdns, rdns)
}

// rawName is the DER of a Name made of rdns.
func rawName(t testing.TB, rdns [][]rawATV) []byte {
	seq := make([]rawRDNSET, len(rdns))
	for i, r := range rdns {
		seq[i] = rawRDNSET(r)
	}
	raw, err := asn1.Marshal(seq)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// certFromNames is certFromRDNs with an issuer of its own.
func certFromNames(t testing.TB, issuer, subject [][]rawATV) (*x509.Certificate, error) {
	return certFromRaw(t, rawName(t, issuer), rawName(t, subject))
}

// certFromRaw is certFromNames with the names' DER, which may be any bytes.
func certFromRaw(t testing.TB, rawIssuer, rawSubject []byte) (*x509.Certificate, error) {
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), RawSubject: rawSubject, RawIssuer: rawIssuer,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	parent := &x509.Certificate{RawSubject: tmpl.RawIssuer}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &identityKey.PublicKey, identityKey)
	if err != nil {
		t.Fatal(err)
	}
	c, perr := x509.ParseCertificate(der)
	if perr != nil {
		return &x509.Certificate{Raw: der, RawSubject: rawSubject}, perr
	}
	return c, nil
}

var (
	oidCN      = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidO       = asn1.ObjectIdentifier{2, 5, 4, 10}
	oidOU      = asn1.ObjectIdentifier{2, 5, 4, 11}
	oidC       = asn1.ObjectIdentifier{2, 5, 4, 6}
	oidLDAPUID = asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 1}
	oidK8sUID  = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}
	oidOdd     = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}
	// description: a type BoringSSL names (and prints as a string), Kubernetes ignores.
	oidDescription = asn1.ObjectIdentifier{2, 5, 4, 13}
	// An arc of 32 bits: BoringSSL reads it, Go refuses the certificate.
	oidHugeArc = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 1 << 32}
)

// ASN.1 tags of the values the generators write.
const (
	tagUTF8      = 12
	tagPrintable = 19
	tagT61       = 20
	tagIA5       = 22
	tagNumeric   = 18
	tagBMP       = 30
	tagInteger   = 2
	tagVisible   = 26
	tagUniversal = 28
	tagGenTime   = 24
	tagOctets    = 4
)

func val(tag int, b []byte) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassUniversal, Tag: tag, Bytes: b}
}

func bmp(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u>>8), byte(u))
	}
	return b
}

func atv(oid asn1.ObjectIdentifier, v asn1.RawValue) rawATV { return rawATV{Type: oid, Value: v} }
func utf8v(oid asn1.ObjectIdentifier, s string) rawATV      { return atv(oid, val(tagUTF8, []byte(s))) }

// identityExpectation is what the proxy must do with a certificate.
type identityExpectation struct {
	unparseable   bool // Go refuses it: the apiserver's TLS handshake fails
	accepted      bool // the apiserver authenticates the certificate's user
	forwardable   bool // ... and every value survives a header unchanged
	user, uid     string
	groups        []string
	credentialID  string
	apiserverSays string
}

func forwardableValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return v == "" || !(strings.ContainsAny(v[:1], " \t") || strings.ContainsAny(v[len(v)-1:], " \t"))
}

// kubernetesVerdict is the oracle: Go's certificate parsing (crypto/tls fails the handshake
// on a certificate it cannot parse, whatever else the request carries), then the apiserver's
// CommonNameUserConversion.
func kubernetesVerdict(cert *x509.Certificate, perr error) identityExpectation {
	if perr != nil {
		return identityExpectation{unparseable: true, apiserverSays: "unparseable: " + perr.Error()}
	}
	resp, ok, err := k8sx509.CommonNameUserConversion.User([]*x509.Certificate{cert})
	switch {
	case err != nil:
		return identityExpectation{apiserverSays: "error: " + err.Error()}
	case !ok:
		return identityExpectation{apiserverSays: "no user"}
	}
	u := resp.User
	// The apiserver's request-header authenticator drops empty values: an empty O grants
	// nothing and is not forwarded.
	groups := slices.DeleteFunc(slices.Clone(u.GetGroups()), func(g string) bool { return g == "" })
	e := identityExpectation{accepted: true, user: u.GetName(), uid: u.GetUID(), groups: groups,
		credentialID: u.GetExtra()[user.CredentialIDKey][0], apiserverSays: "user " + u.GetName()}
	e.forwardable = forwardableValue(e.user) && forwardableValue(e.uid)
	for _, g := range groups {
		e.forwardable = e.forwardable && forwardableValue(g)
	}
	return e
}

var tokenHeaders = map[string]headerList{
	"none":   nil,
	"bearer": {{"authorization", "Bearer x"}},
	"websocket": {{"connection", "upgrade"}, {"upgrade", "websocket"},
		{"sec-websocket-protocol", "base64.binary.k8s.io, base64url.bearer.authorization.k8s.io.dG9r"}},
}

// checkIdentity runs the script on cert with each kind of token and checks it against the
// oracle.
func checkIdentity(t testing.TB, cert *x509.Certificate, perr error) {
	t.Helper()
	want := kubernetesVerdict(cert, perr)
	subject := rfc2253(cert.RawSubject)
	for kind, tok := range tokenHeaders {
		// A client's own identity headers must never survive.
		hdr := append(slices.Clone(tok), kv{"x-remote-group", "system:masters"}, kv{"x-remote-user", "mallory"})
		r := runIdentity(t, cert, hdr)
		if r.out.err != nil {
			t.Fatalf("%s (%s): script error %v", subject, kind, r.out.err)
		}
		decision, _ := r.hdr.get("x-kube-mvp-identity")
		switch {
		case want.accepted && want.forwardable:
			if r.reply != nil || decision != "front-proxy" {
				t.Fatalf("%s (%s): apiserver: %s; got reply %+v decision %q", subject, kind, want.apiserverSays, r.reply, decision)
			}
			got := map[string][]string{}
			for _, e := range r.hdr {
				if strings.HasPrefix(e.name, "x-remote-") {
					got[e.name] = append(got[e.name], e.value)
				}
			}
			wantH := map[string][]string{"x-remote-user": {want.user},
				"x-remote-extra-authentication.kubernetes.io%2fcredential-id": {want.credentialID}}
			if want.uid != "" {
				wantH["x-remote-uid"] = []string{want.uid}
			}
			if len(want.groups) > 0 {
				wantH["x-remote-group"] = want.groups
			}
			if !mapsEqual(got, wantH) {
				t.Fatalf("%s (%s): headers\n got %q\nwant %q", subject, kind, got, wantH)
			}
		case want.accepted: // not forwardable
			if r.reply == nil || r.reply.status != 401 {
				t.Fatalf("%s (%s): unforwardable identity (%s): want 401, got reply %+v decision %q", subject, kind, want.apiserverSays, r.reply, decision)
			}
		default: // the apiserver refuses the certificate: a token decides, unless Go cannot parse it
			if kind == "none" || want.unparseable {
				if r.reply == nil || r.reply.status != 401 {
					t.Fatalf("%s: apiserver: %s; want 401, got reply %+v decision %q", subject, want.apiserverSays, r.reply, decision)
				}
			} else if r.reply != nil || decision != "own-credentials" {
				t.Fatalf("%s (%s): apiserver: %s; want own-credentials, got reply %+v decision %q", subject, kind, want.apiserverSays, r.reply, decision)
			}
			for _, e := range r.hdr {
				if e.name == "x-remote-user" && e.value != "mallory" {
					t.Fatalf("%s (%s): identity header set on a refused certificate: %v", subject, kind, r.hdr)
				}
			}
		}
		if r.reply != nil && (r.reply.status != 401 || !strings.Contains(r.reply.body, `"code":401`)) {
			t.Fatalf("%s: reply %+v", subject, r.reply)
		}
	}
}

func mapsEqual(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func identityCases() map[string][][]rawATV {
	return map[string][][]rawATV{
		"CN and groups":    {{utf8v(oidO, "system:masters")}, {utf8v(oidO, "team-b")}, {utf8v(oidCN, "alice")}},
		"groups around CN": {{utf8v(oidO, "g1")}, {utf8v(oidCN, "bob")}, {utf8v(oidO, "g2")}, {utf8v(oidOU, "ignored")}},
		"printable strings": {{atv(oidC, val(tagPrintable, []byte("US")))}, {atv(oidO, val(tagPrintable,
			[]byte("kubeadm:cluster-admins")))}, {atv(oidCN, val(tagPrintable, []byte("kubernetes-admin")))}},
		"two CNs: the last wins":    {{utf8v(oidCN, "first")}, {utf8v(oidO, "g")}, {utf8v(oidCN, "second")}},
		"multi-valued RDN":          {{utf8v(oidO, "m1"), utf8v(oidCN, "carol"), utf8v(oidO, "m2")}, {utf8v(oidO, "m3")}},
		"escapes":                   {{utf8v(oidO, `a,b+c"d\e<f>g;h=i`)}, {utf8v(oidCN, `#x=y z`)}},
		"leading hash, inner space": {{utf8v(oidCN, "#hash name with spaces")}},
		"non-ASCII":                 {{utf8v(oidO, "Équipe Ωmega")}, {utf8v(oidCN, "zoë 日本 😀")}},
		"BMP and T61 names":         {{atv(oidO, val(tagBMP, bmp("grüppe")))}, {atv(oidCN, val(tagT61, []byte("t61 \xe9l\xe8ve")))}},
		"UID":                       {{utf8v(oidK8sUID, "uid-1234")}, {utf8v(oidO, "g")}, {utf8v(oidCN, "dave")}},
		"UID non-ASCII":             {{utf8v(oidK8sUID, "ü-uid")}, {utf8v(oidCN, "gina")}},
		"UID printable":             {{atv(oidK8sUID, val(tagPrintable, []byte("P-1")))}, {utf8v(oidCN, "gina")}},
		"UID printable, bad char":   {{atv(oidK8sUID, val(tagPrintable, []byte("a@b")))}, {utf8v(oidCN, "gina")}},
		"UID IA5":                   {{atv(oidK8sUID, val(tagIA5, []byte("ia5@x")))}, {utf8v(oidCN, "gina")}},
		"UID numeric":               {{atv(oidK8sUID, val(tagNumeric, []byte("12 34")))}, {utf8v(oidCN, "gina")}},
		"UID numeric, bad":          {{atv(oidK8sUID, val(tagNumeric, []byte("12a")))}, {utf8v(oidCN, "gina")}},
		"UID T61 Latin-1":           {{atv(oidK8sUID, val(tagT61, []byte("caf\xe9")))}, {utf8v(oidCN, "gina")}},
		"UID BMP":                   {{atv(oidK8sUID, val(tagBMP, bmp("ω-uid")))}, {utf8v(oidCN, "gina")}},
		"UID BMP terminated":        {{atv(oidK8sUID, val(tagBMP, append(bmp("u"), 0, 0)))}, {utf8v(oidCN, "gina")}},
		"UID BMP surrogates":        {{atv(oidK8sUID, val(tagBMP, bmp("😀")))}, {utf8v(oidCN, "gina")}},
		"UID visible string":        {{atv(oidK8sUID, val(tagVisible, []byte("v")))}, {utf8v(oidCN, "gina")}},
		"UID integer":               {{atv(oidK8sUID, val(tagInteger, []byte{1}))}, {utf8v(oidCN, "gina")}},
		"UID invalid UTF-8":         {{atv(oidK8sUID, val(tagUTF8, []byte{0xff}))}, {utf8v(oidCN, "gina")}},
		"two UIDs":                  {{utf8v(oidK8sUID, "u1")}, {utf8v(oidK8sUID, "u2")}, {utf8v(oidCN, "gina")}},
		"empty UID":                 {{utf8v(oidK8sUID, "")}, {utf8v(oidCN, "gina")}},
		"UID with a space":          {{utf8v(oidK8sUID, " u")}, {utf8v(oidCN, "gina")}},
		"LDAP UID is not the UID":   {{utf8v(oidLDAPUID, "ldap")}, {utf8v(oidLDAPUID, "ldap2")}, {utf8v(oidCN, "ivan")}},
		"unknown attribute":         {{utf8v(oidOdd, "whatever")}, {utf8v(oidCN, "erin")}},
		"empty CN":                  {{utf8v(oidO, "system:masters")}, {utf8v(oidCN, "")}},
		"no CN":                     {{utf8v(oidO, "system:masters")}},
		"empty subject":             {},
		"empty O":                   {{utf8v(oidO, "")}, {utf8v(oidO, "real")}, {utf8v(oidCN, "frank")}},
		"CN not a string":           {{atv(oidCN, val(tagInteger, []byte{5}))}},
		"O not a string":            {{atv(oidO, val(tagInteger, []byte{5}))}, {utf8v(oidCN, "x")}},
		"leading space in CN":       {{utf8v(oidCN, " system:admin")}},
		"trailing space in O":       {{utf8v(oidO, "g ")}, {utf8v(oidCN, "x")}},
		"tab inside CN":             {{utf8v(oidCN, "a\tb")}},
		"control character in O":    {{utf8v(oidO, "bad\ngroup")}, {utf8v(oidCN, "harry")}},
		"DEL in CN":                 {{utf8v(oidCN, "a\x7fb")}},
		// String types and bytes BoringSSL takes (and prints alike), Go does not, or reads
		// differently.
		"PrintableString CN with é":      {{atv(oidCN, val(tagPrintable, []byte("caf\xe9")))}},
		"PrintableString CN with @":      {{atv(oidCN, val(tagPrintable, []byte("a@b")))}},
		"IA5String CN with é":            {{atv(oidCN, val(tagIA5, []byte("caf\xe9")))}},
		"VisibleString CN":               {{atv(oidCN, val(tagVisible, []byte("vis")))}},
		"UniversalString CN":             {{atv(oidCN, val(tagUniversal, []byte("\x00\x00\x00a")))}},
		"GeneralizedTime CN":             {{atv(oidCN, val(tagGenTime, []byte("20250101000000Z")))}},
		"NumericString CN":               {{atv(oidCN, val(tagNumeric, []byte("12 34")))}},
		"T61String O with é":             {{atv(oidO, val(tagT61, []byte("\xe9quipe")))}, {utf8v(oidCN, "t61")}},
		"T61String CN with é":            {{atv(oidCN, val(tagT61, []byte("caf\xe9")))}},
		"UTF8String CN café":             {{utf8v(oidCN, "café")}},
		"UTF8String CN U+FFFE":           {{utf8v(oidCN, "a\uFFFEb")}}, // BoringSSL refuses it first
		"BMPString CN, terminated":       {{atv(oidCN, val(tagBMP, append(bmp("bob"), 0, 0)))}},
		"description":                    {{utf8v(oidDescription, "a person")}, {utf8v(oidCN, "dora")}},
		"description, VisibleString":     {{atv(oidDescription, val(tagVisible, []byte("x")))}, {utf8v(oidCN, "dora")}},
		"description, PrintableString é": {{atv(oidDescription, val(tagPrintable, []byte("\xe9")))}, {utf8v(oidCN, "dora")}},
		"description, OCTET STRING":      {{atv(oidDescription, val(tagOctets, []byte("x")))}, {utf8v(oidCN, "dora")}},
		"type with a 32-bit arc":         {{utf8v(oidHugeArc, "x")}, {utf8v(oidCN, "dora")}},
		"multi-valued, description":      {{utf8v(oidCN, "ed"), utf8v(oidDescription, "d"), utf8v(oidO, "g")}},
	}
}

func TestLuaIdentityMatchesKubernetes(t *testing.T) {
	for name, rdns := range identityCases() {
		t.Run(name, func(t *testing.T) {
			cert, perr := certFromRDNs(t, rdns)
			checkIdentity(t, cert, perr)
		})
	}
}

// identityRDNs decodes fuzz input into a subject: each attribute is a kind byte (type and
// string type), a length byte and that many value bytes; a kind byte with its high bit set
// puts the attribute in the previous RDN (multi-valued).
func identityRDNs(data []byte) [][]rawATV {
	types := []asn1.ObjectIdentifier{oidCN, oidO, oidK8sUID, oidOU, oidLDAPUID, oidOdd, oidDescription}
	tags := []int{tagUTF8, tagPrintable, tagIA5, tagNumeric, tagT61, tagBMP, tagInteger, tagVisible}
	var rdns [][]rawATV
	for len(data) >= 2 {
		kind, n := data[0], int(data[1])
		data = data[2:]
		if n > len(data) {
			n = len(data)
		}
		b := slices.Clone(data[:n])
		data = data[n:]
		a := atv(types[int(kind&0x7)%len(types)], val(tags[int(kind>>3)&0x7], b))
		if kind&0x80 != 0 && len(rdns) > 0 {
			rdns[len(rdns)-1] = append(rdns[len(rdns)-1], a)
		} else {
			rdns = append(rdns, []rawATV{a})
		}
	}
	return rdns
}

func FuzzIdentityScript(f *testing.F) {
	enc := func(atvs ...[]byte) []byte {
		var out []byte
		for _, a := range atvs {
			out = append(out, a...)
		}
		return out
	}
	a := func(kind byte, s string) []byte { return append([]byte{kind, byte(len(s))}, s...) }
	// kind: bits 0-2 the type (0 CN, 1 O, 2 UID, 3 OU, 4 LDAP UID, 5 unknown, 6 description),
	// bits 3-5 the string type, bit 7 same RDN.
	f.Add(enc(a(1, "system:masters"), a(0, "alice")))
	f.Add(enc(a(1, "g1"), a(0x80, "bob"), a(0x81, "g2")))
	f.Add(enc(a(1, `a,b+c"d\e<f>g;h`), a(0, "#x y ")))
	f.Add(enc(a(1, "Équipe"), a(0x10, "zoë"), a(0x11, "grüppe"), a(0x18, "ia5")))
	f.Add(enc(a(2, "uid-1"), a(0, "dave")))
	f.Add(enc(a(2, "u1"), a(2, "u2"), a(0, "gina")))
	f.Add(enc(a(2, ""), a(0, "gina")))
	f.Add(enc(a(2|8, "P@1"), a(0, "gina")))
	f.Add(enc(a(2|0x20, "caf\xe9"), a(0, "gina")))
	f.Add(enc(a(2|0x28, "\xd8\x3d\xde\x00"), a(0, "gina")))
	f.Add(enc(a(2|0x30, "\x01"), a(0, "gina")))
	f.Add(enc(a(2|0x38, "vis"), a(0, "gina")))
	f.Add(enc(a(1, ""), a(0, "")))
	f.Add(enc(a(0, " lead"), a(1, "ctl\n")))
	f.Add(enc(a(4, "ldap"), a(5, "odd"), a(0, "erin"), a(0, "second")))
	f.Add(enc(a(3, "ou"), a(1, "g\t"), a(0, "tab\tinside")))
	f.Fuzz(func(t *testing.T, data []byte) {
		cert, perr := certFromRDNs(t, identityRDNs(data))
		checkIdentity(t, cert, perr)
	})
}

// FuzzIdentityRawSubject: any bytes as the subject's DER (the issuer a plain name); the
// script forwards exactly what Go parses and the apiserver accepts.
func FuzzIdentityRawSubject(f *testing.F) {
	f.Add(rawName(f, [][]rawATV{{utf8v(oidO, "g")}, {utf8v(oidCN, "a")}}))
	f.Add(rawName(f, [][]rawATV{{utf8v(oidCN, "a"), atv(oidO, val(tagT61, []byte("\xe9")))}}))
	f.Add(rawName(f, [][]rawATV{{atv(oidCN, val(tagPrintable, []byte("caf\xe9")))}}))
	f.Add(rawName(f, [][]rawATV{{utf8v(oidHugeArc, "x")}, {utf8v(oidCN, "a")}}))
	f.Add([]byte{0x30, 0x81, 0x05, 0x31, 0x03, 0x30, 0x01, 0x06})
	f.Add([]byte{0x30, 0x00})
	issuer := rawName(f, [][]rawATV{{utf8v(oidCN, "ca")}})
	f.Fuzz(func(t *testing.T, raw []byte) {
		if s, el := cryptobyte.String(raw), cryptobyte.String(nil); !s.ReadAnyASN1Element(&el, nil) || !s.Empty() {
			// The fields after it would not parse: BoringSSL refuses the certificate.
			t.Skip("not one DER element")
		}
		cert, perr := certFromRaw(t, issuer, raw)
		checkIdentity(t, cert, perr)
	})
}

// TestLuaIdentityIssuer: Go parses the issuer's name too; one it refuses fails the handshake
// with the apiserver, however good the subject.
func TestLuaIdentityIssuer(t *testing.T) {
	subject := [][]rawATV{{utf8v(oidO, "g")}, {utf8v(oidCN, "alice")}}
	for name, issuer := range map[string][][]rawATV{
		"good issuer":            {{utf8v(oidCN, "some CA")}},
		"PrintableString with é": {{atv(oidCN, val(tagPrintable, []byte("CA \xe9")))}},
		"VisibleString":          {{atv(oidO, val(tagVisible, []byte("CA")))}},
	} {
		t.Run(name, func(t *testing.T) {
			cert, perr := certFromNames(t, issuer, subject)
			checkIdentity(t, cert, perr)
		})
	}
}

// TestLuaWebSocketTokenAsTheApiserver: with a certificate the apiserver refuses, the script
// forwards a WebSocket request with its own credentials exactly when the apiserver's
// WebSocket authenticator (k8s.io/apiserver websocket.ProtocolAuthenticator, here with a
// token authenticator that accepts any token) finds a token to try; otherwise it answers 401,
// as the apiserver does for the certificate (an empty token is no token: forwarded without
// the certificate, it would have run as system:anonymous).
func TestLuaWebSocketTokenAsTheApiserver(t *testing.T) {
	cert, perr := certFromRDNs(t, [][]rawATV{{utf8v(oidO, "system:masters")}, {utf8v(oidCN, "")}})
	if perr != nil {
		t.Fatal(perr)
	}
	anyToken := authenticator.TokenFunc(func(_ context.Context, token string) (*authenticator.Response, bool, error) {
		return &authenticator.Response{User: &user.DefaultInfo{Name: "token"}}, true, nil
	})
	ws := websocket.NewProtocolAuthenticator(anyToken)
	const p = "base64url.bearer.authorization.k8s.io."
	for _, c := range []struct{ upgrade, connection, protocols string }{
		{"websocket", "Upgrade", "base64.binary.k8s.io, " + p + "dG9r"},
		{"websocket", "Upgrade", "base64.binary.k8s.io, " + p},                // empty token
		{"websocket", "Upgrade", p + "dG9r"},                                  // no other subprotocol
		{"websocket", "Upgrade", "x," + p + "dG9r," + p + "dG9r"},             // two tokens
		{"websocket", "Upgrade", "x, " + p + "dG9r="},                         // padded
		{"websocket", "Upgrade", "x, " + p + "d"},                             // a length Go refuses
		{"websocket", "Upgrade", "x, " + p + "_w"},                            // not UTF-8
		{"websocket", "Upgrade", "x, " + p + "dG9+"},                          // not URL-safe
		{"websocket", "Upgrade", "x,\u00a0" + p + "dG9r\u00a0 "},              // Unicode space trimmed
		{"websocket", "Upgrade", ", " + p + "dG9r"},                           // an empty other entry
		{"WebSocket", "keep-alive, Upgrade", "x, " + p + "dG9r"},              // any case; a list
		{"web\u017focket", "xupgradex", "x, " + p + "dG9r"},                   // EqualFold; a substring
		{"websocket", "keep-alive", "x, " + p + "dG9r"},                       // not an upgrade
		{"h2c", "Upgrade", "x, " + p + "dG9r"},                                // not a WebSocket
		{"websocket", "Upgrade", "x, " + p + "dG9yZW4"},                       // unpadded, 7 bytes
		{"websocket", "Upgrade", "x, " + p + "dG9r" + strings.Repeat("A", 3)}, // trailing bits
	} {
		req := &http.Request{Header: http.Header{"Upgrade": {c.upgrade}, "Connection": {c.connection}, "Sec-Websocket-Protocol": {c.protocols}}}
		_, wantToken, _ := ws.AuthenticateRequest(req)
		r := runIdentity(t, cert, headerList{{"upgrade", c.upgrade}, {"connection", c.connection}, {"sec-websocket-protocol", c.protocols}})
		decision, _ := r.hdr.get("x-kube-mvp-identity")
		switch {
		case r.out.err != nil:
			t.Errorf("%+v: script error %v", c, r.out.err)
		case wantToken && (r.reply != nil || decision != "own-credentials"):
			t.Errorf("%+v: the apiserver tries the token; got reply %+v decision %q", c, r.reply, decision)
		case !wantToken && (r.reply == nil || r.reply.status != 401):
			t.Errorf("%+v: the apiserver finds no token (401 for the certificate); got reply %+v decision %q", c, r.reply, decision)
		}
	}
}

// runIdentityWith is runIdentity with other header names in the virtual host's metadata,
// for a GET of pods.
func runIdentityWith(t testing.TB, names map[string]string, cert *x509.Certificate, hdr headerList) identityRun {
	f, _ := identityLua(t)
	ctx := map[string]any{}
	for k, v := range names {
		ctx[k] = v
	}
	fc, err := structpb.NewStruct(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rt := &route{name: "r", vh: &virtualHost{filterMetadata: map[string]*structpb.Struct{identityFilter: fc}}}
	pseudo := map[string]string{":method": "GET", ":path": "/api/v1/namespaces/default/pods"}
	req := &luaRequest{hdr: &hdr, pseudo: func(k string) (string, bool) { v, ok := pseudo[k]; return v, ok }, ssl: &luaSSL{peer: cert, validated: cert != nil}}
	var r identityRun
	r.out = f.run(rt, req, func(level, msg string) { r.logs = append(r.logs, level+": "+msg) })
	r.reply, r.hdr = req.reply, hdr
	return r
}

// TestLuaStripsConfiguredNames: the names the apiservers' --requestheader-* flags give come
// from a ConfigMap, so the listener cannot strip them without a drain on every change: the
// script strips them (exact names and extra prefixes, from the route configuration) before
// anything else, writes a certificate user's identity under every configured name of each
// kind, and sets the request class last. A token caller's spoofed headers are all gone; a
// certificate user's groups appear once per group name.
func TestLuaStripsConfiguredNames(t *testing.T) {
	names := map[string]string{
		"decision_header": "x-kube-mvp-identity", "class_header": "x-kube-mvp-request-class",
		"user_headers": "x-attacker-user,x-login", "uid_headers": "x-id", "group_headers": "x-attacker-group,x-teams",
		"credential_id_headers": "x-attr-authentication.kubernetes.io%2fcredential-id",
		"strip_names":           "x-attacker-user,x-login,x-id,x-attacker-group,x-teams,x-former",
		"strip_prefixes":        "x-attr-,x-old-attr-",
	}
	spoofed := func() headerList {
		// Lower case, as Envoy's header map holds every name.
		return headerList{{"x-login", "system:admin"}, {"x-teams", "system:masters"}, {"x-former", "root"}, {"x-attr-scopes", "all"},
			{"x-old-attr-a", "b"}, {"x-attr-x", "y"}, {"accept", "application/json"}}
	}
	r := runIdentityWith(t, names, nil, spoofed())
	if r.out.err != nil || r.reply != nil {
		t.Fatalf("token caller: %v %+v", r.out.err, r.reply)
	}
	if want := (headerList{{"accept", "application/json"}, {"x-kube-mvp-request-class", "read"}}); !slices.Equal(r.hdr, want) {
		t.Errorf("token caller's headers %v, want %v", r.hdr, want)
	}

	alice, err := certFromRDNs(t, [][]rawATV{{utf8v(oidO, "team-a")}, {utf8v(oidO, "team-b")}, {utf8v(oidCN, "alice")}})
	if err != nil {
		t.Fatal(err)
	}
	r = runIdentityWith(t, names, alice, spoofed())
	if r.out.err != nil || r.reply != nil {
		t.Fatalf("certificate user: %v %+v", r.out.err, r.reply)
	}
	for name, want := range map[string][]string{
		"x-attacker-user": {"alice"}, "x-login": {"alice"}, "x-attacker-group": {"team-a", "team-b"}, "x-teams": {"team-a", "team-b"},
		"x-former": nil, "x-attr-scopes": nil, "x-old-attr-a": nil, "x-attr-x": nil, "x-id": nil,
		"x-kube-mvp-identity": {"front-proxy"}, "x-kube-mvp-request-class": {"read"},
	} {
		if got := r.hdr.values(name); !slices.Equal(got, want) {
			t.Errorf("certificate user: %s = %q, want %q", name, got, want)
		}
	}
	if got := r.hdr.values("x-attr-authentication.kubernetes.io%2fcredential-id"); len(got) != 1 || !strings.HasPrefix(got[0], "X509SHA256=") {
		t.Errorf("credential ID %q", got)
	}
}

// TestLuaHeaderIteration: pairs() over the headers as Envoy's HeaderMapWrapper allows it
// (source/extensions/filters/http/lua/wrappers.cc luaPairs, checkModifiable): every entry,
// pseudo-headers first; no change and no second iteration until the loop reached its end.
func TestLuaHeaderIteration(t *testing.T) {
	run := func(script string) (luaOutcome, headerList) {
		t.Helper()
		f, err := compileLua("lua", &luafilterv3.Lua{DefaultSourceCode: inline(script)})
		if err != nil {
			t.Fatal(err)
		}
		hdr := headerList{{"a", "1"}, {"b", "2"}, {"a", "3"}}
		req := &luaRequest{hdr: &hdr, pseudo: func(k string) (string, bool) {
			return map[string]string{":path": "/p", ":method": "GET"}[k], k == ":path" || k == ":method"
		}}
		out := f.run(&route{name: "r", vh: &virtualHost{}}, req, func(string, string) {})
		return out, hdr
	}
	out, hdr := run(`function envoy_on_request(h)
  local seen = {}
  for k, v in pairs(h:headers()) do seen[#seen + 1] = k .. "=" .. v end
  h:headers():add("seen", table.concat(seen, ";"))
end`)
	if out.err != nil || hdr.values("seen")[0] != ":path=/p;:method=GET;a=1;b=2;a=3" {
		t.Errorf("iteration: %v %v", out.err, hdr)
	}
	for script, want := range map[string]string{
		`function envoy_on_request(h) for k in pairs(h:headers()) do h:headers():remove(k) end end`:                                      "header map cannot be modified while iterating",
		`function envoy_on_request(h) for k in pairs(h:headers()) do break end h:headers():remove("a") end`:                              "header map cannot be modified while iterating",
		`function envoy_on_request(h) for k in pairs(h:headers()) do for j in pairs(h:headers()) do end end end`:                         "cannot create a second iterator before completing the first",
		`function envoy_on_request(h) for k in pairs(h:headers()) do end for k in pairs(h:headers()) do end h:headers():remove("a") end`: "",
	} {
		out, _ := run(script)
		if (want == "") != (out.err == nil) || (out.err != nil && !strings.Contains(out.err.Error(), want)) {
			t.Errorf("%s: error %v, want %q", script, out.err, want)
		}
	}
}
