package topology

import (
	"net/url"
	"strings"
)

// ParsePathHeader parses a request from its raw HTTP/2 :path (or HTTP/1 request-target):
// percent-encoded as on the wire, with an optional "?query". The path is decoded exactly as
// Go's HTTP server decodes it into req.URL (url.ParseRequestURI), then handed to ParsePath.
//
// The method does not enter the result: of upstream's fields only the verb depends on it (or
// on the query), and routing reads no verb. The parameter stays for the callers.
//
// A target Go's server would answer with 400 before any handler runs (a control byte, a
// malformed %-escape, an empty or relative target) gives a non-resource RequestInfo: the
// request never reaches the apiserver's filters, so any apiserver is as good as another.
func ParsePathHeader(_, pathHeader string) RequestInfo {
	if pathHeader == "" || pathHeader[0] != '/' {
		// "*", absolute-form and garbage: rare, so let net/url settle them.
		u, err := url.ParseRequestURI(pathHeader)
		if err != nil {
			return RequestInfo{}
		}
		return ParsePath(u.Path)
	}
	// One pass finds the query, escapes in the path and control bytes anywhere.
	pathEnd, escaped := len(pathHeader), false
	for i := 0; i < len(pathHeader); i++ {
		switch c := pathHeader[i]; {
		case c < ' ' || c == 0x7f:
			return RequestInfo{}
		case c == '?' && pathEnd == len(pathHeader):
			pathEnd = i
		case c == '%' && pathEnd == len(pathHeader):
			escaped = true
		}
	}
	path := pathHeader[:pathEnd]
	if escaped {
		// Path unescaping, unlike query unescaping, keeps '+', as req.URL.Path does.
		var err error
		if path, err = url.PathUnescape(path); err != nil {
			return RequestInfo{}
		}
	}
	return ParsePath(path)
}

// ParsePath parses a request path the way kube-apiserver's RequestInfoFactory does
// (APIPrefixes "api" and "apis", GrouplessAPIPrefixes "api"), for the fields RequestInfo
// has. None of them depends on the method or the query.
//
// path must be what the apiserver sees as req.URL.Path, i.e. percent-DECODED: from an
// HTTP/2 :path take everything before the first '?' and url.PathUnescape it ('+' stays '+').
// Decoding changes the result: "/api/v1/namespaces/a%2Fb/pods" is resource "b" to the
// apiserver. ParsePathHeader does this split and decoding.
//
// A group/version's document ("/api/v1", "/apis/batch/v1") is a non-resource request to
// upstream; here it is marked GroupVersionDocument, with its group and version.
//
// Where upstream also returns an error (a "watch" or "proxy" path prefix with nothing
// after it; the apiserver then answers 500) the result is the partial info upstream returns.
func ParsePath(path string) RequestInfo {
	var info RequestInfo
	s := segments{rest: strings.Trim(path, "/")}
	if s.rest == "" {
		return info
	}
	s.n = strings.Count(s.rest, "/") + 1
	if s.n < 3 {
		if s.n == 2 {
			if api, v := cutSlash(s.rest); api == "api" && v != "" {
				return RequestInfo{GroupVersionDocument: true, APIVersion: v}
			}
		}
		return info
	}
	prefix := s.pop()
	if prefix != "api" && prefix != "apis" {
		return info
	}
	if prefix == "apis" {
		if s.n < 3 {
			if s.n == 2 {
				if g, v := cutSlash(s.rest); g != "" && v != "" {
					return RequestInfo{GroupVersionDocument: true, APIGroup: g, APIVersion: v}
				}
			}
			return info
		}
		info.APIGroup = s.pop()
	}
	info.IsResourceRequest = true
	info.APIVersion = s.pop()

	proxy := false
	if head := s.peek(); head == "watch" || head == "proxy" {
		if s.n < 2 {
			return info // upstream's error case: no resource
		}
		proxy = head == "proxy"
		s.pop()
	}

	if s.n > 2 && s.peek() == "namespaces" {
		// /namespaces/{ns}/{status,finalize} is the namespace itself; anything else after
		// the namespace name is a namespaced resource.
		_, afterKeyword := cutSlash(s.rest)
		_, afterNS := cutSlash(afterKeyword)
		if next, _ := cutSlash(afterNS); next != "status" && next != "finalize" {
			s.rest, s.n = afterNS, s.n-2
		}
	}

	// What is left is resource, name, subresource and more; upstream reads no subresource
	// under "proxy".
	info.Resource = s.pop()
	if s.n >= 2 && !proxy {
		s.pop() // the name
		info.Subresource = s.pop()
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
