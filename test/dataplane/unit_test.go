package dataplane

import (
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestRFC2253(t *testing.T) {
	ca := newTestCA(t, "ca")
	uid := asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 1}
	unknown := asn1.ObjectIdentifier{1, 2, 3, 4}
	cases := []struct {
		name pkix.Name
		want string
	}{
		// Go puts several O values into one multi-valued RDN (a DER SET, sorted): "+".
		{pkix.Name{CommonName: "alice", Organization: []string{"team-a", "team-b"}}, "CN=alice,O=team-b+O=team-a"},
		{pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}, Country: []string{"DE"}}, "CN=system:node:n1,O=system:nodes,C=DE"},
		{pkix.Name{CommonName: `a,b+c"d\e<f>g;h`}, `CN=a\,b\+c\"d\\e\<f\>g\;h`},
		{pkix.Name{CommonName: " #lead trail "}, `CN=\ #lead trail\ `},
		{pkix.Name{CommonName: "#x"}, `CN=\#x`},
		{pkix.Name{CommonName: "ünï"}, `CN=\C3\BCn\C3\AF`},
		{pkix.Name{CommonName: "bob", ExtraNames: []pkix.AttributeTypeAndValue{{Type: uid, Value: "u-1"}}}, "UID=u-1,CN=bob"},
		{pkix.Name{CommonName: "bob", ExtraNames: []pkix.AttributeTypeAndValue{{Type: unknown, Value: "v"}}}, "1.2.3.4=#130176,CN=bob"},
	}
	for _, tc := range cases {
		kp := ca.issue(t, tc.name, false, nil, nil)
		if got := rfc2253(kp.Cert.RawSubject); got != tc.want {
			t.Errorf("%v: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestRFC2253BoringSSL: subjects of every string type, as X509_NAME_print_ex(XN_FLAG_RFC2253)
// prints them (BoringSSL 0.20250514.0, name_print.cc and a_strex.cc; OpenSSL 3.0's
// `x509 -nameopt RFC2253` prints the same for those it parses, but a lone "#").
func TestRFC2253BoringSSL(t *testing.T) {
	tel := asn1.ObjectIdentifier{2, 5, 4, 20}
	email := asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 1}
	long := asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 11111, 22222, 33333, 44444, 55555, 66666, 77777, 88888, 99999, 11111, 22222, 33333}
	cases := []struct {
		name string
		rdns [][]rawATV
		want string
	}{
		{"PrintableString é: Latin-1", [][]rawATV{{atv(oidCN, val(tagPrintable, []byte("caf\xe9")))}}, `CN=caf\C3\A9`},
		{"UTF8String é", [][]rawATV{{utf8v(oidCN, "café")}}, `CN=caf\C3\A9`},
		{"T61String O", [][]rawATV{{atv(oidO, val(tagT61, []byte("\xe9quipe")))}, {utf8v(oidCN, "t61")}}, `CN=t61,O=\C3\A9quipe`},
		{"IA5String and VisibleString", [][]rawATV{{atv(oidCN, val(tagVisible, []byte("vis\xe9")))}, {atv(oidO, val(tagIA5, []byte("i\x01a")))}}, `O=i\01a,CN=vis\C3\A9`},
		{"NumericString", [][]rawATV{{atv(oidCN, val(tagNumeric, []byte("1\xe9")))}}, `CN=1\C3\A9`},
		{"times are strings", [][]rawATV{{atv(oidCN, val(tagGenTime, []byte("20250101000000Z")))}, {atv(oidCN, val(23, []byte("250101000000Z")))}}, `CN=250101000000Z,CN=20250101000000Z`},
		{"BMPString: U+0000 kept; UniversalString", [][]rawATV{{atv(oidCN, val(tagBMP, append(bmp("bé"), 0, 0)))},
			{atv(oidO, val(tagUniversal, []byte("\x00\x01\xf6\x00")))}}, `O=\F0\9F\98\80,CN=b\C3\A9\00`},
		{"not strings: DER", [][]rawATV{{atv(oidDescription, val(tagOctets, []byte("x")))}, {atv(oidCN,
			val(tagInteger, []byte{5}))}, {atv(oidCN, val(21, []byte("vt")))}, {atv(oidCN, val(27, []byte("gs")))}},
			`CN=#1B026773,CN=#15027674,CN=#020105,description=#040178`},
		{"names BoringSSL knows", [][]rawATV{{utf8v(oidDescription, "a person")}, {utf8v(tel, "+1 555")}, {utf8v(email, "a@b")}, {utf8v(oidLDAPUID, "l")}, {utf8v(oidCN, "dora")}},
			`CN=dora,UID=l,emailAddress=a@b,telephoneNumber=\+1 555,description=a person`},
		{"unknown types: OID and DER", [][]rawATV{{utf8v(oidK8sUID, "u")}, {utf8v(oidOdd, "x")}}, `1.3.6.1.4.1.99999.1=#0C0178,1.3.6.1.4.1.57683.2=#0C0175`},
		{"an OID in 79 characters", [][]rawATV{{utf8v(long, "x")}}, long.String()[:79] + `=#0C0178`},
		// encoding/asn1 sorts a SET's DER: O, description, CN; printed in reverse.
		{"multi-valued RDN, reversed", [][]rawATV{{utf8v(oidO, "z")}, {utf8v(oidCN, "ed"), utf8v(oidDescription, "d"), utf8v(oidO, "g")}}, `CN=ed+description=d+O=g,O=z`},
		{"escapes", [][]rawATV{{utf8v(oidCN, ` #a,b+c"d\e<f>g;h=i `)}}, `CN=\ #a\,b\+c\"d\\e\<f\>g\;h=i\ `},
		{"first and last", [][]rawATV{{utf8v(oidCN, "#")}, {utf8v(oidCN, " ")}, {utf8v(oidCN, "")}, {utf8v(oidCN, "a ")}, {utf8v(oidCN, "\x7f\u00a0")}}, `CN=\7F\C2\A0,CN=a\ ,CN=,CN=\ ,CN=\#`},
	}
	for _, tc := range cases {
		if got := rfc2253(rawName(t, tc.rdns)); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestBoringSSLRefusesNames: what BoringSSL refuses of the names Go accepts, so that Envoy
// fails the handshake.
func TestBoringSSLRefusesNames(t *testing.T) {
	type atvExtra struct {
		Type         asn1.ObjectIdentifier
		Value, Extra asn1.RawValue
	}
	extra, err := asn1.Marshal([]struct {
		A []atvExtra `asn1:"set"`
	}{{[]atvExtra{{oidCN, val(tagUTF8, []byte("a")), val(tagUTF8, []byte("b"))}}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		raw []byte
		ok  bool
	}{
		"plain":                    {rawName(t, [][]rawATV{{utf8v(oidCN, "a")}}), true},
		"UTF8String U+FFFE":        {rawName(t, [][]rawATV{{utf8v(oidCN, "a\uFFFE")}}), false},
		"UTF8String U+FDD0":        {rawName(t, [][]rawATV{{utf8v(oidO, "\uFDD0")}}), false},
		"UTF8String U+10FFFF":      {rawName(t, [][]rawATV{{utf8v(oidO, "\U0010FFFF")}}), false},
		"UTF8String U+FFFD":        {rawName(t, [][]rawATV{{utf8v(oidO, "\uFFFD")}}), true},
		"BMPString odd":            {rawName(t, [][]rawATV{{atv(oidCN, val(tagBMP, []byte{0, 'a', 0}))}}), false},
		"Latin-1 types take bytes": {rawName(t, [][]rawATV{{atv(oidCN, val(tagPrintable, []byte{0xff, 0}))}}), true},
		"data after the value":     {extra, false},
	} {
		_, err := parseBoringName(c.raw)
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", name, err, c.ok)
		}
	}
}

// TestPercentEncode: Envoy's PercentEncoding::urlEncode of a PEM.
func TestPercentEncode(t *testing.T) {
	got := percentEncode([]byte("-----BEGIN CERTIFICATE-----\na+b/c=*_.~\n"))
	if want := "-----BEGIN%20CERTIFICATE-----%0Aa%2Bb%2Fc%3D*_.%7E%0A"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestXFCCValue(t *testing.T) {
	ca := newTestCA(t, "ca")
	local := ca.issue(t, pkix.Name{CommonName: "proxy"}, true, nil, nil, "spiffe://a/proxy", "spiffe://b/proxy")
	peer := ca.issue(t, pkix.Name{CommonName: "alice", Organization: []string{"g"}}, false, nil, nil, "spiffe://c/alice", "spiffe://d/alice")
	sum := sha256.Sum256(peer.Cert.Raw)
	want := "By=spiffe://a/proxy;By=spiffe://b/proxy;Hash=" + hex.EncodeToString(sum[:]) + `;Subject="CN=alice,O=g";URI=spiffe://c/alice;URI=spiffe://d/alice`
	if got := xfccValue(local.Cert, peer.Cert, true, true); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	noURI := ca.issue(t, pkix.Name{CommonName: "bob"}, false, nil, nil)
	if got := xfccValue(nil, noURI.Cert, true, true); !strings.HasSuffix(got, `;Subject="CN=bob";URI=`) || strings.Contains(got, "By=") {
		t.Errorf("got %q", got)
	}
	var _ *x509.Certificate = peer.Cert
}

// compiledGolden compiles the listener and route configuration our snapshot builds.
func compiledGolden(t *testing.T) (*listenerCfg, *routeConfig) {
	res := buildResources(t, "batch-off")
	lc, err := compileListener(res.Listeners[0].(*listenerv3.Listener))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := compileRouteConfig(res.Routes[0].(*routev3.RouteConfiguration))
	if err != nil {
		t.Fatal(err)
	}
	return lc, rc
}

func TestLocalReplyMapping(t *testing.T) {
	lc, _ := compiledGolden(t)
	h := lc.hcm
	// Response flags accumulate over a stream's attempts: retries exhausted (URX) come with
	// the failures of the attempts.
	for _, flags := range [][]string{{"UH"}, {"UF"}, {"UC"}, {"UR"}, {"UO"}, {"UF", "URX"}, {"UC", "URX"}, {"UC", "UF", "URX"}, {"NC"}, {"NR"}} {
		flag := strings.Join(flags, "+")
		lr := h.mapLocalReply(404, "no healthy upstream", "some_details", flags)
		if lr.status != 503 || lr.contentType != "application/json" {
			t.Errorf("%s: %d %s", flag, lr.status, lr.contentType)
		}
		var st map[string]any
		if err := json.Unmarshal(lr.body, &st); err != nil {
			t.Fatalf("%s: %v: %s", flag, err, lr.body)
		}
		if st["kind"] != "Status" || st["code"] != float64(503) || st["message"] != "kube-mvp: no apiserver that can serve this request is available (some_details)" {
			t.Errorf("%s: %s", flag, lr.body)
		}
		if !strings.HasSuffix(string(lr.body), "}\n") || strings.Contains(string(lr.body), "503.0") {
			t.Errorf("%s: body not formatted like Envoy's JSON formatter: %q", flag, lr.body)
		}
		// Retry-After only where no apiserver can have received the request.
		var retryAfter []string
		for _, h := range lr.headers {
			if h.name == "retry-after" {
				retryAfter = append(retryAfter, h.value)
			}
		}
		want := []string{"1"}
		if slices.Contains(flags, "UC") || slices.Contains(flags, "UR") {
			want = nil
		}
		if !slices.Equal(retryAfter, want) {
			t.Errorf("%s: Retry-After %q, want %q", flag, retryAfter, want)
		}
	}
	// A connection closed under a sent request, then a failed connect on the retry: maybe
	// executed, so no Retry-After.
	if lr := h.mapLocalReply(503, "", "d", []string{"UC", "UF"}); len(lr.headers) != 0 {
		t.Errorf("UC+UF: headers %v, want no Retry-After", lr.headers)
	}
	// A route timeout stays a 504, with the apiserver's own Timeout reason.
	lr := h.mapLocalReply(504, "upstream request timeout", "upstream_response_timeout", []string{"UT"})
	if lr.status != 504 || !strings.Contains(string(lr.body), `"reason":"Timeout"`) || !strings.Contains(string(lr.body), `"code":504`) ||
		!strings.Contains(string(lr.body), "the apiserver did not answer in time (upstream_response_timeout)") {
		t.Errorf("UT: %d %s", lr.status, lr.body)
	}
	lr = h.mapLocalReply(500, "", "ext_proc_error_gRPC_error_14", nil)
	if lr.status != 503 || !strings.Contains(string(lr.body), "the routing decision failed (ext_proc_error_gRPC_error_14)") || !slices.Equal(lr.headers, []kv{{"retry-after", "1"}}) {
		t.Errorf("ext_proc failure: %d %s %v", lr.status, lr.body, lr.headers)
	}
	lr = h.mapLocalReply(504, "", "ext_proc_error_per-message_timeout_exceeded", nil)
	if lr.status != 503 || !strings.Contains(string(lr.body), "the routing decision failed (ext_proc_error_per-message_timeout_exceeded)") || !slices.Equal(lr.headers, []kv{{"retry-after", "1"}}) {
		t.Errorf("ext_proc timeout: %d %s %v", lr.status, lr.body, lr.headers)
	}
	// extproc's own 503 Status (an immediate response, no flags) passes untouched, and its
	// own content-type header wins over the text/plain default (not rewritten).
	lr = h.mapLocalReply(503, `{"kind":"Status"}`, "kube_mvp_unavailable", nil)
	if lr.status != 503 || string(lr.body) != `{"kind":"Status"}` || lr.contentType != "text/plain" || lr.rewritten {
		t.Errorf("immediate 503 rewritten: %d %q %q", lr.status, lr.body, lr.contentType)
	}
	// A 403 upgrade refusal is not mapped.
	if lr := h.mapLocalReply(403, "", "upgrade_failed", nil); lr.status != 403 || len(lr.body) != 0 {
		t.Errorf("403: %+v", lr)
	}
}

func TestMutationRules(t *testing.T) {
	lc, _ := compiledGolden(t)
	r := lc.hcm.extProc.rules
	for _, h := range []string{"x-kube-mvp-cluster", "x-kubernetes-peer-proxied", "content-type", "retry-after"} {
		if err := checkMutation(r, h); err != nil {
			t.Errorf("%s disallowed", h)
		}
	}
	// extproc may remove nothing, and set no identity header.
	for _, h := range []string{"authorization", ":path", "host", "x-envoy-foo", "x-remote-",
		"x-kube-mvp-clusterx", "x-remote-user", "x-remote-extra-foo", "x-forwarded-client-cert",
		"x-kube-mvp-request-class"} {
		if checkMutation(r, h) == nil {
			t.Errorf("%s allowed", h)
		}
	}
	// Without rules: routing headers (not :path) and x-envoy-* are refused, others allowed.
	if checkMutation(nil, ":method") == nil || checkMutation(nil, "host") == nil || checkMutation(nil, "x-envoy-x") == nil ||
		checkMutation(nil, "x-foo") != nil || checkMutation(nil, ":path") != nil {
		t.Error("default rules")
	}

	st := &stream{d: &DataPlane{stats: newStats()}, hdr: headerList{{"x-remote-user", "mallory"}, {"authorization", "Bearer t"}}}
	set := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
	}
	// Removals come before sets; disallowed with disallow_is_error fails the mutation.
	ok := &extprocv3.HeaderMutation{RemoveHeaders: []string{"x-kube-mvp-cluster"}, SetHeaders: []*corev3.HeaderValueOption{set("x-kube-mvp-cluster", "c"),
		{Header: &corev3.HeaderValue{Key: "x-kubernetes-peer-proxied", RawValue: []byte("true")}, Append: wrapperspb.Bool(true)}}}
	if err := st.applyMutation(r, ok, "p."); err != nil {
		t.Fatal(err)
	}
	if v, _ := st.hdr.get("x-kube-mvp-cluster"); v != "c" {
		t.Errorf("x-kube-mvp-cluster = %q", v)
	}
	for _, m := range []*extprocv3.HeaderMutation{
		{RemoveHeaders: []string{"x-remote-user"}},
		{SetHeaders: []*corev3.HeaderValueOption{set("x-remote-user", "alice")}},
		{SetHeaders: []*corev3.HeaderValueOption{set("authorization", "x")}},
		{RemoveHeaders: []string{":path"}},
		{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-kube-mvp-cluster", Value: "a", RawValue: []byte("b")}}}},
		{SetHeaders: []*corev3.HeaderValueOption{set("x-kube-mvp-cluster", "a\r\nb")}},
	} {
		if err := st.applyMutation(r, m, "p."); err == nil {
			t.Errorf("mutation %v accepted", m)
		}
	}
	if v, _ := st.hdr.get("authorization"); v != "Bearer t" {
		t.Errorf("authorization = %q", v)
	}
	if v, _ := st.hdr.get("x-remote-user"); v != "mallory" {
		t.Errorf("x-remote-user = %q", v)
	}
}

func TestRouteMatching(t *testing.T) {
	_, rc := compiledGolden(t)
	// Every request the Lua filter finished has a class; one without is refused
	// (request-unclassified), so the cases without one say "unclassified" here, which takes
	// the route itself, as long-running and unclassified requests do.
	unfinished := kv{"x-unfinished", "1"}
	match := func(path string, hdr headerList) string {
		if slices.Contains(hdr, unfinished) {
			hdr = slices.DeleteFunc(slices.Clone(hdr), func(e kv) bool { return e == unfinished })
		} else if _, ok := hdr.get("x-kube-mvp-request-class"); !ok {
			hdr = append(slices.Clone(hdr), kv{"x-kube-mvp-request-class", "unclassified"})
		}
		st := &stream{cfg: &config{routes: map[string]*routeConfig{"r": rc}}, hcm: &hcmCfg{rdsName: "r"}, host: "example:6443", path: path, hdr: hdr}
		return routeName(st.matchRoute())
	}
	token := headerList{{"authorization", "Bearer t"}}
	// cert is a request with a client certificate (the XFCC header Envoy sets) and hdr;
	// decided adds the Lua filter's identity decision; class the request class it sets
	// (request_class.lua: internal/snapshot's TestRequestClass checks which).
	cert := func(hdr ...kv) headerList { return append(headerList{{"x-forwarded-client-cert", "Hash=1"}}, hdr...) }
	decided := func(d string, hdr ...kv) headerList { return cert(append([]kv{{"x-kube-mvp-identity", d}}, hdr...)...) }
	class := func(c string, hdr ...kv) headerList {
		return append(headerList{{"x-kube-mvp-request-class", c}}, hdr...)
	}
	routed := headerList{{"x-kube-mvp-cluster", "x"}}
	cases := []struct {
		path string
		hdr  headerList
		want string
	}{
		{"/api/v1/pods?watch=true", class("watch", token...), "core/v1:watch"},
		{"/api/v1/pods", class("read", token...), "core/v1:read"},
		{"/api/v1/pods", class("write", token...), "core/v1:write"},
		{"/api/v1/pods", class("Read", token...), "core/v1"}, // exact, case-sensitive value
		{"/api/v1/watch/pods", class("long-running", token...), "core/v1"},
		// batch/v1 needs extproc's choice: one route, which forwards nothing itself.
		{"/apis/batch/v1/jobs", class("read", token...), "batch/v1"},
		{"/api/v1/namespaces/d/pods/p/exec", decided("front-proxy", class("long-running", token...)...), "core/v1:front-proxy"},
		{"/api/v1/namespaces/d/pods/p/exec", decided("own-credentials", class("long-running", token...)...), "core/v1"},
		{"/api/v1/namespaces/d/pods/p/exec", class("upgrade", kv{"upgrade", "SPDY/3.1"}), "core/v1:upgrade"},
		{"/api/v1/namespaces/d/pods/p/exec", decided("front-proxy", kv{"upgrade", "websocket"}), "core/v1:upgrade:front-proxy"},
		{"/api/v1/pods?watch=true", class("watch", routed...), "extproc-decided:watch"},
		{"/api/v1/pods", class("read", routed...), "extproc-decided:read"},
		{"/api/v1/pods", class("write", routed...), "extproc-decided:write"},
		// Upgrades, long-running requests and paths extproc decoded take the route itself:
		// no timeout, no retry after a reset.
		{"/api/v1/namespaces/d/pods/p/exec", class("upgrade", append(routed, kv{"upgrade", "SPDY/3.1"})...), "extproc-decided"},
		{"/apis/batch%2Fv1/watch/jobs", class("unclassified", routed...), "extproc-decided"},
		{"/debug/pprof/profile", class("long-running", token...), "default"},
		{"/apis/batch/v1/jobs", routed, "extproc-decided"},
		// A certificate without the Lua filter's decision is refused, whatever else comes.
		{"/api/v1/pods", cert(), "client-certificate-undecided"},
		{"/api/v1/pods", headerList{{"x-kube-mvp-cluster", "x"}, {"x-forwarded-client-cert", "Hash=1"}}, "extproc-decided"},
		{"/api/v1/pods", token, "core/v1"},
		// path_separated_prefix (PathSeparatedPrefixRouteEntryImpl::matches,
		// source/common/router/config_impl.cc): the prefix itself, or followed by '/';
		// query and fragment cut off first (Http::PathUtil::removeQueryAndFragment).
		{"/api/v1", token, "core/v1"},
		{"/apis/batch/v1", token, "batch/v1"},
		{"/apis/batch/v1/", token, "batch/v1"},
		{"/apis/batch/v1?timeout=32s", token, "batch/v1"},
		{"/apis/batch/v1#frag", token, "batch/v1"},
		{"/apis/batch/v1beta1/jobs", token, "default"},
		{"/apis/batch/v1beta1", token, "default"},
		{"/apis/batch", token, "default"},
		// With normalize_path and merge_slashes false and KEEP_UNCHANGED escaped slashes, the
		// path is matched as received: these match no group/version route, so the
		// escaped-path route sends them to extproc, which decodes them as the apiserver does.
		{"/apis/batch%2Fv1/namespaces/x/jobs", token, "escaped-path"},
		{"/apis/batch%2fv1", token, "escaped-path"},
		{"/apis/b%61tch/v1/jobs", class("read", token...), "escaped-path"},
		{"//apis/batch/v1/jobs", token, "escaped-path"},
		{"/api/v1/pods?fieldSelector=a%3Db", class("read", token...), "core/v1:read"}, // an escape in the query only
		// Dot-segments are not resolved: the apiserver reads them literally too.
		{"/apis/batch/v1/../../apps/v1/deployments", token, "batch/v1"},
		{"/apis/apps/v1/./x/../../../batch/v1/jobs", token, "apps/v1"},
		{"/healthz", class("read", token...), "default:read"},
		{"/healthz", nil, "default"}, // no credentials: the line-rate routes, as a bearer token
		{"/api/v1/pods", nil, "core/v1"},
		{"/apis/batch/v1/jobs", nil, "batch/v1"},
		{"/api/v1/pods", headerList{{"sec-websocket-protocol", "base64url.bearer.authorization.k8s.io.dA"}}, "core/v1"},
		{"/apis", class("read", token...), "discovery:read"},
		// The Lua filter's decisions: its identity goes to the front-proxy variant of the route
		// the request would take anyway; own credentials take that route itself.
		{"/api/v1/pods", decided("front-proxy"), "core/v1:front-proxy"},
		{"/api/v1/pods?watch=1", decided("front-proxy", class("watch")...), "core/v1:watch:front-proxy"},
		{"/api/v1/pods", decided("front-proxy", class("read")...), "core/v1:read:front-proxy"},
		{"/apis/batch/v1/jobs", decided("front-proxy"), "batch/v1"}, // extproc decides, and names the variant
		{"/apis", decided("front-proxy"), "discovery:front-proxy"},
		{"/apis/batch%2Fv1/jobs", decided("front-proxy"), "escaped-path"},
		{"/healthz", decided("front-proxy"), "default:front-proxy"},
		{"/api/v1/pods", decided("own-credentials", token...), "core/v1"},
		{"/api/v1/pods", decided("FRONT-PROXY"), "core/v1"}, // exact, case-sensitive value
		{"/api/v1/pods", headerList{{"x-kube-mvp-identity", "front-proxy"}}, "core/v1:front-proxy"},
		// The Lua filter did not finish: whatever else the request carries, refused.
		{"/api/v1/pods", headerList{unfinished}, "request-unclassified"},
		{"/api/v1/pods", decided("front-proxy", unfinished), "request-unclassified"},
		{"/apis/batch/v1/jobs", headerList{{"x-kube-mvp-cluster", "x"}, unfinished}, "request-unclassified"},
	}
	for _, tc := range cases {
		if got := match(tc.path, tc.hdr); got != tc.want {
			t.Errorf("%s %v: route %s, want %s", tc.path, tc.hdr, got, tc.want)
		}
	}
	vhs := []*virtualHost{{name: "star", domains: []string{"*"}}, {name: "suffix",
		domains: []string{"*.example.com"}}, {name: "exact", domains: []string{"api.example.com"}}, {name: "prefix",
		domains: []string{"api.*"}}}
	for host, want := range map[string]string{"api.example.com": "exact", "x.example.com": "suffix", "api.other": "prefix", "other": "star"} {
		if got := selectVirtualHost(vhs, host); got.name != want {
			t.Errorf("host %s: %s, want %s", host, got.name, want)
		}
	}
	_ = net.IPv4len
}

// TestSetRequestTarget: the upstream request line carries the downstream :path unchanged, as
// Envoy's router forwards it (no path rewrite, no normalization configured).
func TestSetRequestTarget(t *testing.T) {
	for _, target := range []string{
		"/apis/batch/v1/jobs?watch=1",
		"/apis/batch%2Fv1/namespaces/x/jobs",
		"/apis/b%61tch/v1",
		"//apis/batch/v1/jobs",
		"//apis/batch%2Fv1?x=%2F",
		"/api/v1/namespaces/default/pods/p/proxy/a/../b/./c//d%2Fe",
		"/api/v1/pods?",
		"/",
	} {
		u := &url.URL{Scheme: "https", Host: "10.0.0.1:6443"}
		setRequestTarget(u, target)
		if got := u.RequestURI(); got != target {
			t.Errorf("request-target %q written as %q", target, got)
		}
		req := &http.Request{Method: "GET", URL: u, Host: "h", Header: http.Header{}}
		var b strings.Builder
		if err := req.Write(&b); err != nil {
			t.Fatal(err)
		}
		if line, _, _ := strings.Cut(b.String(), "\r\n"); line != "GET "+target+" HTTP/1.1" {
			t.Errorf("request line %q, want GET %s HTTP/1.1", line, target)
		}
	}
}

// TestTCPKeepalive: upstream connections get TCP keepalive only as
// upstream_connection_options.tcp_keepalive says (Envoy sets none by default; Go's dialer
// would, every 15 s), with each unset field left to the system.
func TestTCPKeepalive(t *testing.T) {
	none, err := compileCluster(&clusterv3.Cluster{Name: "c", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}})
	if err != nil {
		t.Fatal(err)
	}
	if d := none.dialer(); d.KeepAlive >= 0 || d.KeepAliveConfig.Enable {
		t.Errorf("without tcp_keepalive: dialer %+v, want keepalive off", d)
	}
	set, err := compileCluster(&clusterv3.Cluster{Name: "c", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		UpstreamConnectionOptions: &clusterv3.UpstreamConnectionOptions{TcpKeepalive: &corev3.TcpKeepalive{
			KeepaliveTime: wrapperspb.UInt32(30), KeepaliveProbes: wrapperspb.UInt32(3)}}})
	if err != nil {
		t.Fatal(err)
	}
	want := net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: -1, Count: 3}
	if d := set.dialer(); d.KeepAliveConfig != want {
		t.Errorf("with tcp_keepalive: %+v, want %+v", d.KeepAliveConfig, want)
	}
}
