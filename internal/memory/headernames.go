package memory

import (
	"slices"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// MaxSeenRequestHeaderNames bounds RequestHeaderNames.Seen: names and prefixes together.
const MaxSeenRequestHeaderNames = 64

// RequestHeaderNames is what xds-server believes about the identity header names, kept across
// rebuilds: the last good configuration and every name ever read, which stays stripped from
// clients whatever the ConfigMap says later (apiservers keep reading their own flags, never
// what the ConfigMap says). The zero value knows nothing.
type RequestHeaderNames struct {
	// Good is the last configuration read without error (defaults filled in); nil: none yet.
	Good *topology.RequestHeaders `json:"good,omitempty"`
	// GoodAt is when Good was first read (GoodSince; zero: unknown), so that of two
	// replicas' last good configurations the later one is persisted.
	GoodAt time.Time `json:"-"`
	// Seen are the exact names and the extra prefixes read so far, oldest first, at most
	// MaxSeenRequestHeaderNames (the oldest not in Good are dropped first).
	Seen []string `json:"seen,omitempty"`
	// SeenPrefixes says which of Seen are extra prefixes.
	SeenPrefixes []string `json:"seenPrefixes,omitempty"`
}

// InUse is n with use (defaults filled in) recorded as in use: its names and extra prefixes
// join Seen, where they are never the ones dropped; and use with Former and
// FormerExtraPrefixes set to the names and prefixes seen and not in it. n is not changed.
func (n RequestHeaderNames) InUse(use topology.RequestHeaders) (RequestHeaderNames, topology.RequestHeaders) {
	next := RequestHeaderNames{Good: n.Good, GoodAt: n.GoodAt, Seen: slices.Clone(n.Seen), SeenPrefixes: slices.Clone(n.SeenPrefixes)}
	for _, name := range use.Names() {
		next.see(name, false, use)
	}
	for _, p := range use.ExtraPrefix {
		next.see(p, true, use)
	}
	use.Former, use.FormerExtraPrefixes = nil, nil
	for _, s := range next.Seen {
		isPrefix := slices.Contains(next.SeenPrefixes, s)
		switch {
		case isPrefix && !slices.Contains(use.ExtraPrefix, s):
			use.FormerExtraPrefixes = append(use.FormerExtraPrefixes, s)
		case !isPrefix && !slices.Contains(use.Names(), s):
			use.Former = append(use.Former, s)
		}
	}
	return next, use
}

func (n *RequestHeaderNames) see(name string, prefix bool, inUse topology.RequestHeaders) {
	list := &n.Seen
	if prefix {
		if !slices.Contains(n.SeenPrefixes, name) {
			n.SeenPrefixes = append(n.SeenPrefixes, name)
		}
	}
	if slices.Contains(*list, name) {
		return
	}
	*list = append(*list, name)
	for len(n.Seen) > MaxSeenRequestHeaderNames {
		i := slices.IndexFunc(n.Seen, func(s string) bool {
			return !slices.Contains(inUse.Names(), s) && !slices.Contains(inUse.ExtraPrefix, s)
		})
		if i < 0 {
			break
		}
		gone := n.Seen[i]
		n.Seen = slices.Delete(n.Seen, i, i+1)
		n.SeenPrefixes = slices.DeleteFunc(n.SeenPrefixes, func(s string) bool { return s == gone })
	}
}
