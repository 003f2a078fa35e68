package topology

import (
	"slices"
	"strings"

	"github.com/kube-mvp/kube-mvp/internal/contract"
)

// RequestHeaders are the request-header names the apiservers' front-proxy authenticator
// reads (kube-apiserver --requestheader-username-headers, --requestheader-uid-headers,
// --requestheader-group-headers and --requestheader-extra-headers-prefix), lower case.
// kube-mvp strips every one of them from clients, and sets the first of each for the
// callers it authenticates itself. The zero value means the apiservers' defaults
// (DefaultRequestHeaders); the inventory will read the actual names from the cluster.
type RequestHeaders struct {
	User        []string `json:"user"`
	UID         []string `json:"uid"`
	Group       []string `json:"group"`
	ExtraPrefix []string `json:"extraPrefix"`
	// Former are the names and FormerExtraPrefixes the extra prefixes read before and not
	// now: never written, still stripped from clients (an apiserver may still read them:
	// apiservers read their own flags, not the ConfigMap that publishes them).
	Former              []string `json:"former,omitempty"`
	FormerExtraPrefixes []string `json:"formerExtraPrefixes,omitempty"`
}

// Bounds on each list of a RequestHeaders, wherever it is read from (the apiservers'
// authentication ConfigMap, which anyone who may write it in kube-system could make say
// anything, or xds-server's memory): real apiservers use one to three names per flag, union
// over a handful of apiservers.
const (
	MaxRequestHeaderNames      = 16
	MaxRequestHeaderNameLength = 128
)

// IsHeaderName reports whether s is an HTTP header name (an RFC 9110 token).
func IsHeaderName(s string) bool {
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}

// DefaultRequestHeaders are kube-apiserver's (and kubeadm's) X-Remote-User, X-Remote-Uid,
// X-Remote-Group and X-Remote-Extra-.
func DefaultRequestHeaders() RequestHeaders {
	return RequestHeaders{
		User:        []string{contract.HeaderRemoteUser},
		UID:         []string{contract.HeaderRemoteUID},
		Group:       []string{contract.HeaderRemoteGroup},
		ExtraPrefix: []string{contract.HeaderRemoteExtraPrefix},
	}
}

// OrDefault is h, lower-cased, with every empty list replaced by its default.
func (h RequestHeaders) OrDefault() RequestHeaders {
	d := DefaultRequestHeaders()
	norm := func(names, def []string) []string {
		var out []string
		for _, n := range names {
			if n = strings.ToLower(strings.TrimSpace(n)); n != "" && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		if len(out) == 0 {
			return def
		}
		return out
	}
	return RequestHeaders{User: norm(h.User, d.User), UID: norm(h.UID, d.UID), Group: norm(h.Group, d.Group), ExtraPrefix: norm(h.ExtraPrefix, d.ExtraPrefix),
		Former: norm(h.Former, nil), FormerExtraPrefixes: norm(h.FormerExtraPrefixes, nil)}
}

// StripNames are every exact name clients lose: the defaults, the names in use and the
// former ones, distinct, in that order.
func (h RequestHeaders) StripNames() []string {
	var out []string
	for _, n := range slices.Concat(DefaultRequestHeaders().Names(), h.Names(), h.Former) {
		if n = strings.ToLower(n); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// StripPrefixes are every extra prefix whose headers clients lose: the default, the
// prefixes in use and the former ones, distinct, in that order.
func (h RequestHeaders) StripPrefixes() []string {
	var out []string
	for _, p := range slices.Concat(DefaultRequestHeaders().ExtraPrefix, h.ExtraPrefix, h.FormerExtraPrefixes) {
		if p = strings.ToLower(p); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// Names are every exact header name (user, uid and group), in that order.
func (h RequestHeaders) Names() []string {
	return slices.Concat(h.User, h.UID, h.Group)
}
