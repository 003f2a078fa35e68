package extproc

import (
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Client identity: the front-proxy half (README, "Identity" and "Security model").
//
// Envoy terminates the client's TLS and verifies its certificate against the cluster client
// CA; the apiservers then only see Envoy's own proxy client certificate. So that they still
// know who the client is, we forward the identity with the front-proxy ("request header")
// authentication headers, which an apiserver trusts only on a connection that presents a
// certificate signed by --requestheader-client-ca-file:
//
//	X-Remote-User   the user name
//	X-Remote-Uid    the user UID (read only with --requestheader-uid-headers)
//	X-Remote-Group  one header per group, in order
//	X-Remote-Extra-<key>  extra values, <key> percent-encoded and lower-cased
//
// Where the identity comes from. Our listener's HTTP connection manager is configured with
// forward_client_cert_details: SANITIZE_SET and set_current_client_cert_details {subject,
// uri}. SANITIZE_SET means Envoy drops whatever x-forwarded-client-cert (XFCC) header the
// client sent and, on a connection with a verified client certificate, sets a fresh one with
// exactly one element describing that certificate, for example
//
//	Hash=1f2e…;Subject="CN=alice,O=team-b,O=team-a";URI=
//
// Without a client certificate Envoy sets no XFCC at all. Hence an XFCC header that reaches
// us was written by Envoy and describes this connection's certificate; the parser below is
// still strict and fails closed: anything that is not exactly one well-formed element with
// exactly one Subject is rejected (a local 401) and logged.
//
// Where the request goes. Only a request whose identity we set goes to the front-proxy twin
// of the planned cluster (contract.FrontProxyCluster), whose connections present the proxy
// certificate; every other request goes to the planned cluster itself, whose connections
// present no certificate, with its own credentials (Authorization, WebSocket token, or none),
// so the apiserver authenticates it exactly as without a proxy. The proxy certificate never
// turns a request into anyone, anonymous included.
//
// The mapping is Kubernetes' own for client certificates (k8s.io/apiserver
// pkg/authentication/request/x509, CommonNameUserConversion), applied to the subject Envoy
// printed:
//
//   - user  = the subject's CommonName. Go keeps the last CN of the certificate's
//     RDNSequence; Envoy (BoringSSL, XN_FLAG_RFC2253, which includes XN_FLAG_DN_REV) prints
//     the attributes in reverse order, so that is the first CN printed. An empty CN is not
//     authenticated by Kubernetes, and the certificate makes the apiserver's front-proxy
//     authenticator fail: 401 unless a bearer token decides (identityAnonymous).
//   - groups = every O, in certificate order (reverse of printed order).
//   - uid = Kubernetes' UID attribute (1.3.6.1.4.1.57683.2, printed by BoringSSL as the hex of
//     its DER) when exactly one is present, as with the AllowParsingUserUIDFromCertAuth gate
//     (beta, on by default since 1.33). Several, an empty one or one that is not a string make
//     Kubernetes fail the authentication: refused (see identityRefused).
//   - extra authentication.kubernetes.io/credential-id = "X509SHA256=<hex sha256 of the
//     certificate>", which Kubernetes records for every certificate user (audit logs). Envoy's
//     XFCC Hash element is that same digest in lower-case hex.
//
// Values that cannot travel in an HTTP header unchanged (control characters, leading or
// trailing white space, which HTTP servers strip, turning " system:admin" into
// "system:admin") make the whole identity rejected rather than altered: a local 401, even
// with a bearer token, because the apiserver would have authenticated the certificate's
// user, not the token's.

// credentialIDKey is "authentication.kubernetes.io/credential-id" (k8s.io/apiserver
// user.CredentialIDKey) percent-encoded, as the requestheader authenticator path-unescapes
// extra keys; its header is the first extra prefix plus this.
const credentialIDKey = "authentication.kubernetes.io%2fcredential-id"

// identityHeaders are the header names identities are forwarded in: the first of each of the
// routing table's RequestHeaders (Envoy hands us lower-case names; we compare
// case-insensitively anyway).
type identityHeaders struct {
	user, uid, group, credentialID string
}

func newIdentityHeaders(h topology.RequestHeaders) identityHeaders {
	h = h.OrDefault()
	return identityHeaders{user: h.User[0], uid: h.UID[0], group: h.Group[0], credentialID: h.ExtraPrefix[0] + credentialIDKey}
}

// identityResult classifies what a request told about its client.
type identityResult int

const (
	// identityNone: no XFCC header, i.e. no client certificate on the connection.
	identityNone identityResult = iota
	// identityForwarded: a certificate user; identity headers are set.
	identityForwarded
	// identityAnonymous: a certificate with an empty CommonName. The x509 authenticator
	// passes over it, but the front-proxy authenticator that every apiserver behind kube-mvp
	// has fails on a certificate its CA did not sign, and that error makes the apiserver
	// refuse the request (401) unless a bearer token authenticates it: handled as
	// identityRefused.
	identityAnonymous
	// identityRefused: a certificate the apiserver's x509 authenticator rejects (several
	// UIDs, an empty one). The apiserver would then authenticate the request by a bearer
	// token if it has one, and refuse it (401) otherwise, never as anonymous: the request
	// goes on without identity headers only when Envoy's route says it has a token
	// (contract.CallerCertificateAndToken), and is answered 401 otherwise.
	identityRefused
	// identityRejected: an XFCC header we do not trust to mean one thing, or an identity
	// that cannot be forwarded unchanged; answered 401.
	identityRejected
	numIdentityResults
)

func (r identityResult) String() string {
	return [...]string{"none", "forwarded", "anonymous", "refused", "rejected"}[r]
}

// identity is a client certificate's Kubernetes user.
type identity struct {
	user         string
	uid          string
	groups       []string
	credentialID string
}

// identityFromXFCC maps the XFCC header values of one request to an identity. values are all
// the x-forwarded-client-cert headers the request carries, normally zero or one.
func identityFromXFCC(values []string) (identity, identityResult, error) {
	switch len(values) {
	case 0:
		return identity{}, identityNone, nil
	case 1:
	default:
		return identity{}, identityRejected, fmt.Errorf("%d %s headers; SANITIZE_SET leaves at most one", len(values), contract.HeaderXFCC)
	}
	elements, err := splitXFCC(values[0])
	if err != nil {
		return identity{}, identityRejected, err
	}
	if len(elements) != 1 {
		return identity{}, identityRejected, fmt.Errorf("%d %s elements; SANITIZE_SET sets exactly one (a comma in a URI SAN also splits it)", len(elements), contract.HeaderXFCC)
	}
	var subject, hash string
	var subjects, hashes int
	for _, p := range elements[0] {
		switch {
		case strings.EqualFold(p.key, "Subject"):
			subject, subjects = p.value, subjects+1
			if !p.quoted {
				return identity{}, identityRejected, errors.New("the Subject value is not quoted as Envoy writes it")
			}
		case strings.EqualFold(p.key, "Hash"):
			hash, hashes = p.value, hashes+1
		}
	}
	if subjects != 1 {
		return identity{}, identityRejected, fmt.Errorf("%d Subject keys in %s, want 1 (the listener must set set_current_client_cert_details.subject)", subjects, contract.HeaderXFCC)
	}
	if hashes > 1 || (hashes == 1 && !isLowerHex(hash, 64)) {
		return identity{}, identityRejected, fmt.Errorf("%s Hash is not one SHA-256 digest", contract.HeaderXFCC)
	}
	id, res, err := identityFromSubject(subject)
	if res == identityForwarded && hashes == 1 {
		id.credentialID = "X509SHA256=" + hash
	}
	return id, res, err
}

// identityFromSubject applies Kubernetes' CommonNameUserConversion to a subject printed by
// Envoy (RFC 2253, BoringSSL flavour).
func identityFromSubject(dn string) (identity, identityResult, error) {
	avas, err := parseRFC2253(dn)
	if err != nil {
		return identity{}, identityRejected, fmt.Errorf("subject %q: %w", dn, err)
	}
	var id identity
	var uids int
	// The printed order is the reverse of the certificate's; walk it backwards so that
	// "last CN wins" and the group order are the certificate's, as in Go's pkix.Name.
	for i := len(avas) - 1; i >= 0; i-- {
		a := avas[i]
		kind := attributeKind(a.typ)
		if kind == attrOther {
			continue
		}
		if kind == attrUID {
			// Kubernetes' UID attribute has no short name: BoringSSL prints it as its DER.
			uid, err := uidValue(a)
			if err != nil {
				return identity{}, identityRefused, fmt.Errorf("subject %q: %w", dn, err)
			}
			id.uid, uids = uid, uids+1
			continue
		}
		if a.dumped {
			return identity{}, identityRejected, fmt.Errorf("subject %q: %s is not a string", dn, a.typ)
		}
		switch kind {
		case attrCN:
			id.user = a.value
		case attrO:
			// The requestheader authenticator drops empty header values, so an empty O
			// cannot be forwarded; it grants nothing in RBAC either.
			if a.value != "" {
				id.groups = append(id.groups, a.value)
			}
		}
	}
	if id.user == "" {
		return identity{}, identityAnonymous, nil
	}
	if uids > 1 || (uids == 1 && id.uid == "") {
		return identity{}, identityRefused, fmt.Errorf("subject %q: %d UID attributes or an empty one; Kubernetes rejects such a certificate", dn, uids)
	}
	bad := ""
	switch {
	case !forwardableHeaderValue(id.user):
		bad = id.user
	case !forwardableHeaderValue(id.uid):
		bad = id.uid
	}
	for _, g := range id.groups {
		if !forwardableHeaderValue(g) {
			bad = g
		}
	}
	if bad != "" {
		return identity{}, identityRejected, fmt.Errorf("subject %q: value %q cannot be forwarded in a header unchanged", dn, bad)
	}
	return id, identityForwarded, nil
}

// kubernetesUIDOID is the attribute Kubernetes reads a certificate user's UID from
// (k8s.io/apimachinery asn1.X509UID); not LDAP's UID (0.9.2342.19200300.100.1.1), which it
// ignores, as we do.
const kubernetesUIDOID = "1.3.6.1.4.1.57683.2"

// uidValue is the string a UID attribute holds, as Go's encoding/asn1 (which the apiserver's
// x509 parsing uses) decodes it: BoringSSL prints an attribute it has no name for as "#" and
// the hex of its DER. A value Go does not decode to a string fails the apiserver's
// authentication.
func uidValue(a ava) (string, error) {
	if !a.dumped {
		return a.value, nil
	}
	der, err := hex.DecodeString(strings.TrimPrefix(a.value, "#"))
	if err != nil {
		return "", fmt.Errorf("UID %s: %w", a.value, err)
	}
	var v any
	rest, err := asn1.Unmarshal(der, &v)
	if err != nil || len(rest) != 0 {
		return "", fmt.Errorf("UID #%s is not one DER value", a.value)
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("UID #%s is not a string; Kubernetes rejects such a certificate", a.value)
	}
	return s, nil
}

type attrKind int

const (
	attrOther attrKind = iota
	attrCN
	attrO
	attrUID
)

// attributeKind recognises the attribute types that matter, by BoringSSL short name or OID.
func attributeKind(typ string) attrKind {
	switch {
	case strings.EqualFold(typ, "CN") || typ == "2.5.4.3":
		return attrCN
	case strings.EqualFold(typ, "O") || typ == "2.5.4.10":
		return attrO
	case typ == kubernetesUIDOID:
		return attrUID
	}
	return attrOther
}

// forwardableHeaderValue reports whether v survives as an HTTP header value byte for byte:
// no control characters (Envoy rejects the whole mutation for CR, LF or NUL) and no leading
// or trailing white space (servers trim it).
func forwardableHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return v == strings.Trim(v, " \t")
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// xfccPair is one key=value of an XFCC element. A quoted value is kept as written between
// the quotes, escapes included: for Subject that is the RFC 2253 string, whose own escapes
// (\" among them) the DN parser undoes.
type xfccPair struct {
	key, value string
	quoted     bool
}

// splitXFCC splits an XFCC header into elements (separated by ",") of key=value pairs
// (separated by ";"); a value containing any of ",;=" is double-quoted, with a backslash
// escaping the next character (Envoy's HTTP connection manager documentation, "x-forwarded-
// client-cert"). Anything else, white space included, is an error.
func splitXFCC(h string) ([][]xfccPair, error) {
	var elements [][]xfccPair
	var cur []xfccPair
	i := 0
	for {
		start := i
		for i < len(h) && h[i] != '=' && h[i] != ';' && h[i] != ',' && h[i] != '"' {
			i++
		}
		if i == len(h) || h[i] != '=' || i == start {
			return nil, fmt.Errorf("%s: expected key= at byte %d", contract.HeaderXFCC, start)
		}
		p := xfccPair{key: h[start:i]}
		i++
		if i < len(h) && h[i] == '"' {
			i++
			start = i
			for ; i < len(h) && h[i] != '"'; i++ {
				if h[i] == '\\' {
					i++
				}
			}
			if i >= len(h) {
				return nil, fmt.Errorf("%s: unterminated quoted value of %s", contract.HeaderXFCC, p.key)
			}
			p.value, p.quoted = h[start:i], true
			i++
		} else {
			start = i
			for i < len(h) && h[i] != ';' && h[i] != ',' {
				if h[i] == '"' {
					return nil, fmt.Errorf("%s: stray quote in value of %s", contract.HeaderXFCC, p.key)
				}
				i++
			}
			p.value = h[start:i]
		}
		cur = append(cur, p)
		if i == len(h) {
			return append(elements, cur), nil
		}
		switch h[i] {
		case ';':
		case ',':
			elements, cur = append(elements, cur), nil
		default:
			return nil, fmt.Errorf("%s: unexpected %q after value of %s", contract.HeaderXFCC, h[i], p.key)
		}
		i++
	}
}

// ava is one attribute type and value of a distinguished name, in printed order.
type ava struct {
	typ, value string
	// dumped: printed as #<hex of DER>, which BoringSSL does for values that are not strings.
	dumped bool
}

// parseRFC2253 parses a distinguished name as BoringSSL prints it with XN_FLAG_RFC2253:
// attributes "TYPE=value" joined by "," (between RDNs) or "+" (inside a multi-valued RDN),
// no spaces; in values, the characters ,+"\<>; and a leading # or space and a trailing space
// are escaped with a backslash, and control and non-ASCII bytes are written \XX in hex. A
// value that starts with an unescaped # is hex DER. The RDN grouping does not matter to the
// mapping, so the result is flat. Unescaped special characters are errors: BoringSSL never
// writes them, so their presence means the string is not what we think it is.
func parseRFC2253(s string) ([]ava, error) {
	if s == "" {
		return nil, nil
	}
	var avas []ava
	i := 0
	for {
		start := i
		for i < len(s) && s[i] != '=' {
			switch s[i] {
			case ',', '+', '\\', '"', ';', '<', '>':
				return nil, fmt.Errorf("unexpected %q in attribute type at byte %d", s[i], i)
			}
			i++
		}
		if i == len(s) || i == start {
			return nil, fmt.Errorf("attribute without type or '=' at byte %d", start)
		}
		a := ava{typ: s[start:i]}
		i++
		start = i
		if i < len(s) && s[i] == '#' {
			a.dumped = true
			for i++; i < len(s) && s[i] != ',' && s[i] != '+'; i++ {
				if unhex(s[i]) < 0 {
					return nil, fmt.Errorf("%s: bad hex at byte %d", a.typ, i)
				}
			}
			a.value = s[start:i]
		} else {
			var b *strings.Builder
			for i < len(s) && s[i] != ',' && s[i] != '+' {
				c := s[i]
				switch c {
				case '\\':
					if b == nil {
						b = &strings.Builder{}
						b.WriteString(s[start:i])
					}
					if i+1 == len(s) {
						return nil, fmt.Errorf("%s: dangling backslash", a.typ)
					}
					if hi := unhex(s[i+1]); hi >= 0 {
						if i+2 == len(s) || unhex(s[i+2]) < 0 {
							return nil, fmt.Errorf("%s: bad \\XX escape at byte %d", a.typ, i)
						}
						b.WriteByte(byte(hi<<4 | unhex(s[i+2])))
						i += 3
						continue
					}
					if strings.IndexByte(` ,+"\<>;#`, s[i+1]) < 0 {
						return nil, fmt.Errorf("%s: unexpected escape \\%c at byte %d", a.typ, s[i+1], i)
					}
					b.WriteByte(s[i+1])
					i += 2
					continue
				case '"', ';', '<', '>':
					return nil, fmt.Errorf("%s: unescaped %q at byte %d", a.typ, c, i)
				}
				if b != nil {
					b.WriteByte(c)
				}
				i++
			}
			if b != nil {
				a.value = b.String()
			} else {
				a.value = s[start:i]
			}
		}
		avas = append(avas, a)
		if i == len(s) {
			return avas, nil
		}
		i++ // the ',' or '+'
		if i == len(s) {
			return nil, errors.New("trailing separator")
		}
	}
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// clientIdentity is the settled identity of one XFCC value: its result and the identity
// headers to set. Shared between requests: never modified.
type clientIdentity struct {
	res identityResult
	err error
	set []*corev3.HeaderValueOption
}

var noIdentity = &clientIdentity{res: identityNone}

func newClientIdentity(values []string, h identityHeaders) *clientIdentity {
	id, res, err := identityFromXFCC(values)
	ci := &clientIdentity{res: res, err: err}
	if res != identityForwarded {
		return ci
	}
	ci.set = append(ci.set, setHeader(h.user, id.user, false))
	if id.uid != "" {
		ci.set = append(ci.set, setHeader(h.uid, id.uid, false))
	}
	for i, g := range id.groups {
		// The first group replaces, each other adds a header: the requestheader
		// authenticator reads one group per header value.
		ci.set = append(ci.set, setHeader(h.group, g, i > 0))
	}
	if id.credentialID != "" {
		ci.set = append(ci.set, setHeader(h.credentialID, id.credentialID, false))
	}
	return ci
}

// identityCache memoises clientIdentity by XFCC value: a client reuses its certificate for
// many requests (kubelets, controllers), and the XFCC value, which includes the certificate
// hash, determines the identity completely. It keeps two generations of at most max entries
// each; when the current one is full it becomes the previous one and the oldest is dropped,
// so memory stays bounded and entries in use survive.
//
// The identities are built in one table's header names (hdr); a table with other names gets
// a cache of its own.
type identityCache struct {
	hdr       identityHeaders
	names     topology.RequestHeaders
	mu        sync.RWMutex
	cur, prev map[string]*clientIdentity
	max       int
}

func newIdentityCache(max int, names topology.RequestHeaders) *identityCache {
	return &identityCache{hdr: newIdentityHeaders(names), names: names, cur: make(map[string]*clientIdentity), max: max}
}

// get returns the identity for the XFCC header hv (nil: the request has none).
func (c *identityCache) get(hv *corev3.HeaderValue) *clientIdentity {
	if hv == nil {
		return noIdentity
	}
	raw, value := hv.GetRawValue(), hv.GetValue()
	c.mu.RLock()
	var ci *clientIdentity
	if value != "" {
		ci = c.cur[value]
	} else {
		ci = c.cur[string(raw)] // no allocation for a map index
	}
	c.mu.RUnlock()
	if ci != nil {
		return ci
	}
	if value == "" {
		value = string(raw)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ci = c.cur[value]; ci != nil {
		return ci
	}
	if ci = c.prev[value]; ci == nil {
		ci = newClientIdentity([]string{value}, c.hdr)
	}
	if len(c.cur) >= c.max {
		c.prev, c.cur = c.cur, make(map[string]*clientIdentity, c.max)
	}
	c.cur[value] = ci
	return ci
}
