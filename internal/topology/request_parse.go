package topology

import (
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/labels"
)

// ParsePathHeader parses a request from its method and its raw HTTP/2 :path (or HTTP/1
// request-target): percent-encoded as on the wire, with an optional "?query". The path is
// decoded exactly as Go's HTTP server decodes it into req.URL (url.ParseRequestURI), then
// handed to ParseRequest.
//
// A target Go's server would answer with 400 before any handler runs (a control byte, a
// malformed %-escape, an empty or relative target) gives a non-resource RequestInfo whose
// Path is the undecoded path: the request never reaches the apiserver's filters, so any
// apiserver is as good as another.
//
// CONNECT is parsed like any other method; that matches HTTP/1 CONNECT to a "/path" and
// extended CONNECT (RFC 8441). A plain HTTP/2 CONNECT has no :path at all.
func ParsePathHeader(method, pathHeader string) RequestInfo {
	if pathHeader == "" || pathHeader[0] != '/' {
		// "*", absolute-form and garbage: rare, so let net/url settle them.
		u, err := url.ParseRequestURI(pathHeader)
		if err != nil {
			return rejectedTarget(method, pathHeader)
		}
		return ParseRequest(method, u.Path, u.RawQuery)
	}
	// One pass finds the query, escapes in the path and control bytes anywhere.
	pathEnd, escaped := len(pathHeader), false
	for i := 0; i < len(pathHeader); i++ {
		switch c := pathHeader[i]; {
		case c < ' ' || c == 0x7f:
			return rejectedTarget(method, pathHeader)
		case c == '?' && pathEnd == len(pathHeader):
			pathEnd = i
		case c == '%' && pathEnd == len(pathHeader):
			escaped = true
		}
	}
	path, rawQuery := pathHeader[:pathEnd], ""
	if pathEnd < len(pathHeader) {
		rawQuery = pathHeader[pathEnd+1:]
	}
	if escaped {
		// Path unescaping, unlike query unescaping, keeps '+', as req.URL.Path does.
		var err error
		if path, err = url.PathUnescape(path); err != nil {
			return rejectedTarget(method, pathHeader)
		}
	}
	return ParseRequest(method, path, rawQuery)
}

func rejectedTarget(method, target string) RequestInfo {
	rawPath, _, _ := strings.Cut(target, "?")
	return RequestInfo{Path: rawPath, Verb: lowerMethod(method)}
}

// ParseRequest parses an HTTP request the way kube-apiserver's RequestInfoFactory does
// (APIPrefixes "api" and "apis", GrouplessAPIPrefixes "api").
//
// path must be what the apiserver sees as req.URL.Path, i.e. percent-DECODED: from an
// HTTP/2 :path take everything before the first '?' and url.PathUnescape it ('+' stays '+').
// Decoding changes the result: "/api/v1/namespaces/a%2Fb/pods" is namespace "a", resource
// "b", name "pods" to the apiserver. rawQuery is everything after that '?', still encoded
// (req.URL.RawQuery). ParsePathHeader does this split and decoding.
//
// Where upstream also returns an error (a "watch" or "proxy" path prefix with nothing
// after it; the apiserver then answers 500) the result is the partial info upstream returns.
//
// Upstream drops every query parameter once there are more than 10000 (net/url's default
// limit); a GODEBUG=urlmaxqueryparams override is not followed here.
func ParseRequest(method, path, rawQuery string) RequestInfo {
	info := RequestInfo{Path: path, Verb: lowerMethod(method)}

	s := segments{rest: strings.Trim(path, "/")}
	if s.rest == "" {
		return info
	}
	s.n = strings.Count(s.rest, "/") + 1
	if s.n < 3 {
		return info
	}
	prefix := s.peek()
	if prefix != "api" && prefix != "apis" {
		return info
	}
	s.pop()
	// Upstream records the prefix even when it then gives up on a short /apis path.
	info.APIPrefix = prefix
	if prefix == "apis" {
		if s.n < 3 {
			return info
		}
		info.APIGroup = s.pop()
	}
	info.IsResourceRequest = true
	info.APIVersion = s.pop()

	if head := s.peek(); head == "watch" || head == "proxy" {
		if s.n < 2 {
			return info // upstream's error case: verb stays the HTTP method, no parts
		}
		info.Verb = head
		s.pop()
	} else {
		info.Verb = resourceVerb(method)
	}

	if s.n > 1 && s.peek() == "namespaces" {
		_, afterKeyword := cutSlash(s.rest)
		ns, afterNS := cutSlash(afterKeyword)
		info.Namespace = ns
		// /namespaces/{ns}/{status,finalize} is the namespace itself; anything else after
		// the namespace name is a namespaced resource.
		if s.n > 2 {
			if next, _ := cutSlash(afterNS); next != "status" && next != "finalize" {
				s.rest, s.n = afterNS, s.n-2
			}
		}
	}

	// One allocation: the segments themselves share path's memory.
	info.Parts = make([]string, s.n)
	for i := range info.Parts {
		info.Parts[i] = s.pop()
	}
	info.Resource = info.Parts[0]
	if len(info.Parts) >= 2 {
		info.Name = info.Parts[1]
	}
	if len(info.Parts) >= 3 && info.Verb != "proxy" {
		info.Subresource = info.Parts[2]
	}

	if info.Name == "" {
		switch info.Verb {
		case "get":
			info.Verb, info.Name = listOrWatch(rawQuery)
		case "delete":
			info.Verb = "deletecollection"
		}
	}
	return info
}

// segments walks the '/'-separated segments of a trimmed path without splitting it.
type segments struct {
	rest string // the segments not yet taken, still joined by '/'
	n    int    // how many segments rest holds (rest may start with an empty one)
}

func (s *segments) peek() string {
	head, _ := cutSlash(s.rest)
	return head
}

func (s *segments) pop() string {
	head, rest := cutSlash(s.rest)
	s.rest, s.n = rest, s.n-1
	return head
}

// cutSlash is strings.Cut(s, "/") without the general substring search.
func cutSlash(s string) (before, after string) {
	if i := strings.IndexByte(s, '/'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// lowerMethod is strings.ToLower without its allocation for the usual methods.
func lowerMethod(m string) string {
	switch m {
	case "GET":
		return "get"
	case "POST":
		return "post"
	case "PUT":
		return "put"
	case "PATCH":
		return "patch"
	case "DELETE":
		return "delete"
	case "HEAD":
		return "head"
	case "OPTIONS":
		return "options"
	case "CONNECT":
		return "connect"
	}
	return strings.ToLower(m)
}

// resourceVerb maps the (case-sensitive) HTTP method of a resource request to its kube verb.
func resourceVerb(m string) string {
	switch m {
	case "POST":
		return "create"
	case "GET", "HEAD":
		return "get"
	case "PUT":
		return "update"
	case "PATCH":
		return "patch"
	case "DELETE":
		return "delete"
	}
	return ""
}

// The query parameters that can change the outcome of upstream's ListOptions decoding.
const (
	paramWatch = 1 << iota
	paramFieldSelector
	paramLabelSelector
	paramLimit
	paramTimeoutSeconds
)

// maxQueryParams is net/url's default cap; beyond it req.URL.Query() is empty.
const maxQueryParams = 10000

// listParams holds the first decoded value of each parameter that matters, as
// req.URL.Query()[key][0] would give it.
type listParams struct {
	seen                                                       int
	watch, fieldSelector, labelSelector, limit, timeoutSeconds string
}

// listOrWatch decides list vs. watch for a GET on a collection and, like upstream, takes a
// name from fieldSelector=metadata.name=... when the whole ListOptions decodes cleanly.
//
// Upstream decodes every ListOptions parameter; on any error it falls back to a plain
// reading of "watch" and ignores the field selector. The result depends on that error only
// when a usable name is present or when the two readings of "watch" disagree, so only then
// are the other parameters checked.
func listOrWatch(rawQuery string) (verb, name string) {
	if rawQuery == "" || strings.Count(rawQuery, "&") >= maxQueryParams {
		return "list", ""
	}
	var p listParams
	p.scan(rawQuery)

	watch, fallbackWatch := false, false
	if p.seen&paramWatch != 0 {
		// Both readings: the strict conversion folds case with Unicode rules (so "falſe" is
		// false), the fallback only lower-cases.
		watch = p.watch != "0" && !strings.EqualFold(p.watch, "false")
		lower := strings.ToLower(p.watch)
		fallbackWatch = lower != "0" && lower != "false"
	}

	selectorOK := true
	if p.seen&paramFieldSelector != 0 {
		var found bool
		name, found, selectorOK = metadataNameSelector(p.fieldSelector)
		if !found || !isPathSegmentName(name) {
			name = ""
		}
	}
	if !selectorOK || ((name != "" || watch != fallbackWatch) && !p.othersDecode()) {
		return watchVerb(fallbackWatch), ""
	}
	return watchVerb(watch), name
}

func watchVerb(watch bool) string {
	if watch {
		return "watch"
	}
	return "list"
}

// scan mirrors url.ParseQuery for the parameters that matter: pairs are split on '&', a
// pair containing ';' or a bad %-escape in its key or value is dropped, the first value wins.
func (p *listParams) scan(q string) {
	for q != "" {
		var pair string
		pair, q, _ = strings.Cut(q, "&")
		key, value, _ := strings.Cut(pair, "=")
		bit := listParamBit(key)
		if bit == 0 || p.seen&bit != 0 || strings.IndexByte(pair, ';') >= 0 {
			continue
		}
		v, err := url.QueryUnescape(value)
		if err != nil {
			continue
		}
		p.seen |= bit
		switch bit {
		case paramWatch:
			p.watch = v
		case paramFieldSelector:
			p.fieldSelector = v
		case paramLabelSelector:
			p.labelSelector = v
		case paramLimit:
			p.limit = v
		case paramTimeoutSeconds:
			p.timeoutSeconds = v
		}
	}
}

func listParamBit(key string) int {
	if len(key) < len("limit") {
		return 0
	}
	if strings.IndexByte(key, '%') >= 0 {
		// '+' alone cannot matter: it decodes to a space, which no wanted key contains.
		k, err := url.QueryUnescape(key)
		if err != nil {
			return 0
		}
		key = k
	}
	switch key {
	case "watch":
		return paramWatch
	case "fieldSelector":
		return paramFieldSelector
	case "labelSelector":
		return paramLabelSelector
	case "limit":
		return paramLimit
	case "timeoutSeconds":
		return paramTimeoutSeconds
	}
	return 0
}

// othersDecode reports whether the parameters other than fieldSelector convert into
// ListOptions without error (the rest are strings or lenient booleans).
func (p *listParams) othersDecode() bool {
	if p.seen&paramLimit != 0 {
		if _, err := strconv.ParseInt(p.limit, 10, 64); err != nil {
			return false
		}
	}
	if p.seen&paramTimeoutSeconds != 0 {
		if _, err := strconv.ParseInt(p.timeoutSeconds, 10, 64); err != nil {
			return false
		}
	}
	if p.seen&paramLabelSelector != 0 && p.labelSelector != "" {
		// The label grammar and its key/value validation are too large to mirror safely;
		// this runs only when a name or an odd "watch" value depends on it.
		if _, err := labels.Parse(p.labelSelector); err != nil {
			return false
		}
	}
	return true
}

// metadataNameSelector parses sel with fields.ParseSelector's rules and returns the value
// of its metadata.name equality term. Upstream sorts the raw terms before taking the first
// match, so among several matches the lexically smallest raw term wins.
func metadataNameSelector(sel string) (name string, found, ok bool) {
	var best string
	start, escaped := 0, false
	for i := 0; i <= len(sel); i++ {
		if i < len(sel) {
			c := sel[i]
			switch {
			case escaped:
				escaped = false
				continue
			case c == '\\':
				escaped = true
				continue
			case c != ',':
				continue
			}
		}
		term := sel[start:i]
		start = i + 1
		if term == "" {
			continue
		}
		lhs, rhs, equality, valid := splitFieldTerm(term)
		if !valid {
			return "", false, false
		}
		match := equality && lhs == "metadata.name" && (!found || term < best)
		value, valid := unescapeFieldValue(rhs, match)
		if !valid {
			return "", false, false
		}
		if match {
			best, name, found = term, value, true
		}
	}
	return name, found, true
}

// splitFieldTerm splits at the first operator: "!=", "==" or "=", tried in that order at
// each position. The left side is never unescaped.
func splitFieldTerm(term string) (lhs, rhs string, equality, ok bool) {
	for i := 0; i < len(term); i++ {
		switch term[i] {
		case '!':
			if i+1 < len(term) && term[i+1] == '=' {
				return term[:i], term[i+2:], false, true
			}
		case '=':
			if i+1 < len(term) && term[i+1] == '=' {
				return term[:i], term[i+2:], true, true
			}
			return term[:i], term[i+1:], true, true
		}
	}
	return "", "", false, false
}

// unescapeFieldValue validates a field selector value like fields.UnescapeValue and, if
// build is set, returns it unescaped. Like upstream, once any of `\,=` occurs the value is
// rebuilt rune by rune, which turns each invalid UTF-8 byte into U+FFFD.
func unescapeFieldValue(s string, build bool) (string, bool) {
	if strings.IndexAny(s, `\,=`) < 0 {
		return s, true
	}
	var b strings.Builder
	if build {
		b.Grow(len(s))
	}
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch r {
		case '\\':
			if i == len(s) {
				return "", false
			}
			r, size = utf8.DecodeRuneInString(s[i:])
			i += size
			if r != '\\' && r != ',' && r != '=' {
				return "", false
			}
		case ',', '=':
			return "", false
		}
		if build {
			b.WriteRune(r)
		}
	}
	return b.String(), true
}

// isPathSegmentName mirrors k8s.io/apimachinery's content.IsPathSegmentName reporting no error.
func isPathSegmentName(name string) bool {
	return name != "." && name != ".." && strings.IndexByte(name, '/') < 0 && strings.IndexByte(name, '%') < 0
}
