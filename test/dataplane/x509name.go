package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// Distinguished names as Envoy sees them: BoringSSL parses them (crypto/x509/x_name.cc,
// x509_name_ex_d2i) and Envoy prints them with X509_NAME_print_ex(XN_FLAG_RFC2253)
// (source/common/tls/utility.cc, getRFC2253NameFromCertificate) for subjectPeerCertificate()
// and the XFCC Subject. References are to BoringSSL 0.20250514.0: crypto/x509/name_print.cc
// do_name_ex and crypto/asn1/a_strex.cc ASN1_STRING_print_ex, do_buf, do_esc_char.

var boringNames = func() map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(boringObjectNames), "\n") {
		oid, sn, _ := strings.Cut(l, " ")
		m[oid] = sn
	}
	return m
}()

// boringATV is one attribute of a name: set is the index of its RDN.
type boringATV struct {
	set   int
	oid   []byte // the OBJECT IDENTIFIER's contents
	tag   cbasn1.Tag
	value []byte // the value's contents
	tlv   []byte // the whole value element
}

// Universal tags of the string types BoringSSL decodes (a_strex.cc string_type_to_encoding).
const (
	tagUTF8String      = 12
	tagNumericString   = 18
	tagPrintableString = 19
	tagT61String       = 20
	tagIA5String       = 22
	tagUTCTime         = 23
	tagGeneralizedTime = 24
	tagVisibleString   = 26 // V_ASN1_ISO64STRING
	tagUniversalString = 28
	tagBMPString       = 30
)

// parseBoringName parses a DER Name (with its SEQUENCE header) into its attributes, refusing
// what BoringSSL refuses among what Go's crypto/x509 accepts: an attribute SEQUENCE with bytes
// after its value (a template SEQUENCE, ASN1_R_SEQUENCE_LENGTH_MISMATCH), and a UTF8String,
// BMPString or UniversalString that is not valid Unicode by CBS_get_utf8, CBS_get_ucs2_be or
// CBS_get_utf32_be (tasn_dec.cc asn1_ex_c2i; noncharacters too, which Go accepts in UTF-8).
// High tag numbers and indefinite lengths, which BoringSSL reads, are refused here as Go does.
func parseBoringName(raw []byte) ([]boringATV, error) {
	in := cryptobyte.String(raw)
	var seq cryptobyte.String
	if !in.ReadASN1(&seq, cbasn1.SEQUENCE) || !in.Empty() {
		return nil, errors.New("malformed Name")
	}
	var out []boringATV
	for set := 0; !seq.Empty(); set++ {
		var rdn cryptobyte.String
		if !seq.ReadASN1(&rdn, cbasn1.SET) {
			return nil, errors.New("malformed RDN")
		}
		for !rdn.Empty() {
			var atv, oid, tlv cryptobyte.String
			var tag cbasn1.Tag
			if !rdn.ReadASN1(&atv, cbasn1.SEQUENCE) || !atv.ReadASN1(&oid, cbasn1.OBJECT_IDENTIFIER) ||
				!validOID(oid) || !atv.ReadAnyASN1Element(&tlv, &tag) {
				return nil, errors.New("malformed attribute")
			}
			if !atv.Empty() {
				return nil, errors.New("data after an attribute's value")
			}
			a := boringATV{set: set, oid: oid, tag: tag, tlv: tlv}
			v := tlv
			if !v.ReadAnyASN1(&v, nil) {
				return nil, errors.New("malformed attribute value")
			}
			a.value = v
			if _, err := decodeBoring(a.tag, a.value); err != nil && !errors.Is(err, errNotString) {
				return nil, err
			}
			out = append(out, a)
		}
	}
	return out, nil
}

// validOID: CBS_is_valid_asn1_oid, non-empty, each arc minimally encoded and terminated.
func validOID(b []byte) bool {
	if len(b) == 0 || b[len(b)-1]&0x80 != 0 {
		return false
	}
	prev := byte(0)
	for _, c := range b {
		if prev&0x80 == 0 && c == 0x80 {
			return false
		}
		prev = c
	}
	return true
}

// oidText is OBJ_obj2txt(always_return_oid): the dotted form in 80 bytes, NUL included, or ""
// when an arc does not fit 64 bits (CBS_asn1_oid_to_text fails).
func oidText(b []byte) string {
	var arcs []uint64
	var v uint64
	for _, c := range b {
		if v > 1<<57-1 {
			return ""
		}
		v = v<<7 | uint64(c&0x7f)
		if c&0x80 == 0 {
			arcs = append(arcs, v)
			v = 0
		}
	}
	var s strings.Builder
	switch first := arcs[0]; {
	case first < 40:
		fmt.Fprintf(&s, "0.%d", first)
	case first < 80:
		fmt.Fprintf(&s, "1.%d", first-40)
	default:
		fmt.Fprintf(&s, "2.%d", first-80)
	}
	for _, a := range arcs[1:] {
		s.WriteString("." + strconv.FormatUint(a, 10))
	}
	if s.Len() > 79 {
		return s.String()[:79]
	}
	return s.String()
}

var errNotString = errors.New("not a string type")

// decodeBoring decodes a value to code points by its type (string_type_to_encoding): Latin-1
// ("MBSTRING_ASC") for NumericString, PrintableString, T61String, IA5String, UTCTime,
// GeneralizedTime and VisibleString whatever their bytes; UTF-8, UCS-2 and UTF-32 with
// BoringSSL's validity (crypto/bytestring/unicode.cc). Other types are errNotString.
func decodeBoring(tag cbasn1.Tag, v []byte) ([]rune, error) {
	switch tag {
	case tagNumericString, tagPrintableString, tagT61String, tagIA5String, tagUTCTime, tagGeneralizedTime, tagVisibleString:
		r := make([]rune, len(v))
		for i, c := range v {
			r[i] = rune(c)
		}
		return r, nil
	case tagUTF8String:
		var r []rune
		for len(v) > 0 {
			c, n := utf8.DecodeRune(v)
			if c == utf8.RuneError && n <= 1 || !boringCodePoint(uint32(c)) {
				return nil, errors.New("invalid UTF8String")
			}
			r, v = append(r, c), v[n:]
		}
		return r, nil
	case tagBMPString, tagUniversalString:
		w := 2
		if tag == tagUniversalString {
			w = 4
		}
		if len(v)%w != 0 {
			return nil, errors.New("invalid BMPString or UniversalString")
		}
		var r []rune
		for ; len(v) > 0; v = v[w:] {
			c := uint32(binary.BigEndian.Uint16(v))
			if w == 4 {
				c = binary.BigEndian.Uint32(v)
			}
			if !boringCodePoint(c) {
				return nil, errors.New("invalid BMPString or UniversalString")
			}
			r = append(r, rune(c))
		}
		return r, nil
	}
	return nil, errNotString
}

// boringCodePoint is unicode.cc is_valid_code_point: no surrogates, no noncharacters.
func boringCodePoint(c uint32) bool {
	return c <= 0x10ffff && c&0xfffe != 0xfffe && (c < 0xfdd0 || c > 0xfdef) && (c < 0xd800 || c > 0xdfff)
}

// rfc2253 prints a DER distinguished name as X509_NAME_print_ex(XN_FLAG_RFC2253) does: the
// attributes in reverse order (XN_FLAG_DN_REV), "+" between two of one RDN and "," otherwise;
// each as the type's short name (the dotted OID for a type BoringSSL does not know), "=", and
// the value: the whole value element in hex after "#" for an unknown type or a value that is
// not a string (DUMP_UNKNOWN_FIELDS, DUMP_UNKNOWN, DUMP_DER), else its code points as UTF-8
// (UTF8_CONVERT), byte by byte: bytes >= 0x80 and control characters as \XX, `\` and `"`
// escaped by a backslash, so are `,+<>;`, a first " " or "#" and a last " ". A name BoringSSL
// would not parse prints as "" (Envoy never gets to print it).
func rfc2253(raw []byte) string {
	atvs, err := parseBoringName(raw)
	if err != nil {
		return ""
	}
	var b strings.Builder
	for i := len(atvs) - 1; i >= 0; i-- {
		a := atvs[i]
		if i < len(atvs)-1 {
			if a.set == atvs[i+1].set {
				b.WriteByte('+')
			} else {
				b.WriteByte(',')
			}
		}
		oid := oidText(a.oid)
		sn, known := boringNames[oid]
		if !known {
			sn = oid
		}
		b.WriteString(sn)
		b.WriteByte('=')
		r, err := decodeBoring(a.tag, a.value)
		if !known || err != nil {
			fmt.Fprintf(&b, "#%X", a.tlv)
			continue
		}
		escapeRFC2253(&b, r)
	}
	return b.String()
}

// escapeRFC2253 is do_buf with UTF8_CONVERT and do_esc_char with ESC_2253, ESC_CTRL and
// ESC_MSB (not ESC_QUOTE): every UTF-8 byte is escaped on its own.
func escapeRFC2253(b *strings.Builder, r []rune) {
	for i, c := range r {
		u := utf8.AppendRune(nil, c)
		for j, x := range u {
			first, last := i == 0 && j == 0, i == len(r)-1 && j == len(u)-1
			switch {
			case x > 0x7f || x < 0x20 || x == 0x7f:
				fmt.Fprintf(b, `\%02X`, x)
			case x == '\\' || x == '"' || strings.IndexByte(",+<>;", x) >= 0,
				first && (x == ' ' || x == '#'), last && x == ' ':
				b.WriteByte('\\')
				b.WriteByte(x)
			default:
				b.WriteByte(x)
			}
		}
	}
}

// boringAcceptsNames: BoringSSL parses the issuer and subject of a certificate Go parsed
// (else Envoy fails the handshake: SSL_R_... from d2i_X509, a decode error alert).
func boringAcceptsNames(rawIssuer, rawSubject []byte) error {
	if _, err := parseBoringName(rawIssuer); err != nil {
		return fmt.Errorf("issuer: %w", err)
	}
	if _, err := parseBoringName(rawSubject); err != nil {
		return fmt.Errorf("subject: %w", err)
	}
	return nil
}
