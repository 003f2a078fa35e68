package dataplane

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// xfccValue builds the x-forwarded-client-cert element Envoy sets with
// forward_client_cert_details SANITIZE_SET (HTTP connection manager documentation,
// "x-forwarded-client-cert"): key=value pairs joined by ";", in Envoy's order: one By per URI
// SAN of Envoy's own (serving) certificate, Hash (hex SHA-256 of the peer certificate's DER),
// then the set_current_client_cert_details in Envoy's fixed order — Subject (always present
// when requested, double-quoted, the RFC 2253 form), URI (one per URI SAN of the peer
// certificate; "URI=" when it has none). Only a connection whose client presented a
// (verified) certificate gets one.
func xfccValue(local, peer *x509.Certificate, subject, uri bool) string {
	var parts []string
	if local != nil {
		for _, u := range local.URIs {
			parts = append(parts, "By="+u.String())
		}
	}
	sum := sha256.Sum256(peer.Raw)
	parts = append(parts, "Hash="+hex.EncodeToString(sum[:]))
	if subject {
		parts = append(parts, `Subject="`+rfc2253(peer.RawSubject)+`"`)
	}
	if uri {
		for _, u := range peer.URIs {
			parts = append(parts, "URI="+u.String())
		}
		if len(peer.URIs) == 0 {
			parts = append(parts, "URI=")
		}
	}
	return strings.Join(parts, ";")
}

type rawATV struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

// rawRDNSET is one RDN; the "SET" suffix makes encoding/asn1 treat it as SET OF.
type rawRDNSET []rawATV

// shortNames are BoringSSL's short names of the attribute types (XN_FLAG_FN_SN).
var shortNames = map[string]string{
	"2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.9": "street", "2.5.4.10": "O",
	"2.5.4.11": "OU", "2.5.4.5": "serialNumber", "2.5.4.4": "SN", "2.5.4.42": "GN", "2.5.4.12": "title",
	"2.5.4.17": "postalCode", "2.5.4.46": "dnQualifier", "2.5.4.43": "initials", "2.5.4.44": "generationQualifier",
	"2.5.4.65": "pseudonym", "2.5.4.15": "businessCategory", "2.5.4.41": "name",
	"0.9.2342.19200300.100.1.25": "DC", "0.9.2342.19200300.100.1.1": "UID", "1.2.840.113549.1.9.1": "emailAddress",
}

// rfc2253 prints a DER distinguished name as BoringSSL's X509_NAME_print_ex with
// XN_FLAG_RFC2253, which Envoy uses for the XFCC Subject: attributes in reverse order
// (XN_FLAG_DN_REV), "," between RDNs and "+" inside one, short names or the dotted OID,
// values converted to UTF-8 with the RFC 2253 specials escaped by a backslash, control
// characters and bytes >= 0x80 written \XX, and values that are not strings or whose type
// has no short name dumped as #<hex DER>.
func rfc2253(raw []byte) string {
	var seq []rawRDNSET
	if _, err := asn1.Unmarshal(raw, &seq); err != nil {
		return ""
	}
	var b strings.Builder
	for i := len(seq) - 1; i >= 0; i-- {
		for j := len(seq[i]) - 1; j >= 0; j-- {
			switch {
			case b.Len() == 0:
			case j == len(seq[i])-1:
				b.WriteByte(',') // the first attribute printed of an RDN, after another's
			default:
				b.WriteByte('+')
			}
			printATV(&b, seq[i][j])
		}
	}
	return b.String()
}

// printATV prints one attribute of a distinguished name for rfc2253.
func printATV(b *strings.Builder, a rawATV) {
	oid := a.Type.String()
	sn, known := shortNames[oid]
	if !known {
		sn = oid
	}
	b.WriteString(sn)
	b.WriteByte('=')
	s, isString := decodeASN1String(a.Value)
	if !known || !isString {
		b.WriteByte('#')
		b.WriteString(strings.ToUpper(hex.EncodeToString(a.Value.FullBytes)))
		return
	}
	escape2253(b, s)
}

func decodeASN1String(v asn1.RawValue) (string, bool) {
	if v.Class != asn1.ClassUniversal {
		return "", false
	}
	switch v.Tag {
	case asn1.TagUTF8String, asn1.TagPrintableString, asn1.TagIA5String, asn1.TagNumericString, 26 /* VisibleString */ :
		return string(v.Bytes), true
	case asn1.TagT61String: // BoringSSL reads T61String as Latin-1
		r := make([]rune, len(v.Bytes))
		for i, c := range v.Bytes {
			r[i] = rune(c)
		}
		return string(r), true
	case asn1.TagBMPString:
		if len(v.Bytes)%2 != 0 {
			return "", false
		}
		u := make([]uint16, len(v.Bytes)/2)
		for i := range u {
			u[i] = binary.BigEndian.Uint16(v.Bytes[2*i:])
		}
		return string(utf16.Decode(u)), true
	case 28: // UniversalString
		if len(v.Bytes)%4 != 0 {
			return "", false
		}
		var b strings.Builder
		for i := 0; i < len(v.Bytes); i += 4 {
			b.WriteRune(rune(binary.BigEndian.Uint32(v.Bytes[i:])))
		}
		return b.String(), true
	}
	return "", false
}

func escape2253(b *strings.Builder, s string) {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 0x80 || c < 0x20 || c == 0x7f:
			fmt.Fprintf(b, "\\%02X", c)
		case strings.IndexByte(`,+"\<>;`, c) >= 0:
			b.WriteByte('\\')
			b.WriteByte(c)
		case (c == '#' || c == ' ') && i == 0:
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == ' ' && i == len(s)-1:
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
}
