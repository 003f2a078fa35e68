package memory

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// RequestHeaderNames are kept across restarts in the memory ConfigMap, under one key that
// is no apiserver ID (those are apiserver-<base32>), signed as the memory's entries are, but
// under their own purpose requestHeaderNamesPurpose (neither signature can be moved to the
// other): over the purpose, the key, the value's canonical JSON and signedAt.
// The value's format: docs/security.md#the-signed-entrys-format.
const RequestHeaderNamesKey = "kube-mvp.request-header-names"

const requestHeaderNamesPurpose = "kube-mvp.io/xds-server-request-header-names/v1"

// MaxRequestHeaderNamesBytes bounds the value under RequestHeaderNamesKey. The names
// themselves take at most about 25 KiB (MaxSeenRequestHeaderNames names of at most
// topology.MaxRequestHeaderNameLength in seen and seenPrefixes, four lists of MaxRequestHeaderNames
// in good); the rest is the signature and its certificate.
const MaxRequestHeaderNamesBytes = 48 << 10

// requestHeaderNamesJSON is the canonical form of RequestHeaderNames.
type requestHeaderNamesJSON struct {
	Good         *topology.RequestHeaders `json:"good,omitempty"`
	GoodAt       *time.Time               `json:"goodAt,omitempty"`
	Seen         []string                 `json:"seen,omitempty"`
	SeenPrefixes []string                 `json:"seenPrefixes,omitempty"`
}

type signedRequestHeaderNamesJSON struct {
	requestHeaderNamesJSON
	SignedAt  *time.Time `json:"signedAt,omitempty"`
	Signer    string     `json:"signer,omitempty"`
	Signature string     `json:"signature,omitempty"`
}

func (n RequestHeaderNames) toJSON() requestHeaderNamesJSON {
	j := requestHeaderNamesJSON{Good: n.Good, Seen: n.Seen, SeenPrefixes: n.SeenPrefixes}
	if !n.GoodAt.IsZero() {
		at := n.GoodAt.UTC()
		j.GoodAt = &at
	}
	return j
}

func encodeRequestHeaderNames(n RequestHeaderNames) string {
	b, _ := json.Marshal(n.toJSON()) // strings and a time: cannot fail
	return string(b)
}

func signedRequestHeaderNamesMessage(n RequestHeaderNames, signedAt time.Time) []byte {
	b, _ := json.Marshal(struct {
		Purpose  string          `json:"purpose"`
		Key      string          `json:"key"`
		Names    json.RawMessage `json:"names"`
		SignedAt time.Time       `json:"signedAt"`
	}{requestHeaderNamesPurpose, RequestHeaderNamesKey, json.RawMessage(encodeRequestHeaderNames(n)), signedAt.UTC()})
	return b
}

// IsZero: n knows nothing.
func (n RequestHeaderNames) IsZero() bool {
	return n.Good == nil && n.GoodAt.IsZero() && len(n.Seen) == 0 && len(n.SeenPrefixes) == 0
}

// EncodeSignedRequestHeaderNames is n as the value of RequestHeaderNamesKey, signed by k at
// now. n must be within the bounds ReadRequestHeaderNames checks
// (objects.ObserveRequestHeaderNames keeps it so).
func EncodeSignedRequestHeaderNames(n RequestHeaderNames, k Key, now time.Time) (string, error) {
	now = now.UTC()
	if err := checkRequestHeaderNames(n); err != nil {
		return "", fmt.Errorf("the request-header names are out of bounds: %w", err.Err)
	}
	sig, err := k.sign(signedRequestHeaderNamesMessage(n, now))
	if err != nil {
		return "", fmt.Errorf("signing the request-header names: %w", err)
	}
	b, err := json.Marshal(signedRequestHeaderNamesJSON{requestHeaderNamesJSON: n.toJSON(), SignedAt: &now,
		Signer: base64.StdEncoding.EncodeToString(k.Cert.Raw), Signature: base64.StdEncoding.EncodeToString(sig)})
	if err != nil {
		return "", err
	}
	if len(b) > MaxRequestHeaderNamesBytes {
		return "", fmt.Errorf("the signed request-header names take %d bytes, more than %d", len(b), MaxRequestHeaderNamesBytes)
	}
	return string(b), nil
}

// ReadRequestHeaderNames checks a value written by EncodeSignedRequestHeaderNames and returns
// the names it holds, or a *Rejected (with the reasons of Read) and nothing: its
// size, its names (as RequestHeadersFrom reads them, lower-case, Seen at most
// MaxSeenRequestHeaderNames, SeenPrefixes among Seen), no time after trust.Now plus
// ClockSkew, and its signature. Unsigned values are never accepted (trust.AllowUnsigned
// is for entries written before entries were signed; these names never were).
func ReadRequestHeaderNames(value string, trust Trust) (RequestHeaderNames, error) {
	if len(value) > MaxRequestHeaderNamesBytes {
		return RequestHeaderNames{}, rejected(RejectBounds, "%s: %d bytes, at most %d", RequestHeaderNamesKey, len(value), MaxRequestHeaderNamesBytes)
	}
	var j signedRequestHeaderNamesJSON
	if err := json.Unmarshal([]byte(value), &j); err != nil {
		return RequestHeaderNames{}, rejected(RejectMalformed, "%s: %v", RequestHeaderNamesKey, err)
	}
	n := RequestHeaderNames{Good: j.Good, Seen: j.Seen, SeenPrefixes: j.SeenPrefixes}
	if j.GoodAt != nil {
		n.GoodAt = *j.GoodAt
	}
	if err := checkRequestHeaderNames(n); err != nil {
		return RequestHeaderNames{}, rejected(err.Reason, "%s: %v", RequestHeaderNamesKey, err.Err)
	}
	if j.SignedAt == nil && j.Signer == "" && j.Signature == "" {
		return RequestHeaderNames{}, rejected(RejectUnsigned, "%s carries no signature", RequestHeaderNamesKey)
	}
	if j.SignedAt == nil || j.Signer == "" || j.Signature == "" {
		return RequestHeaderNames{}, rejected(RejectSignature, "%s: signedAt, signer and signature go together", RequestHeaderNamesKey)
	}
	latest := trust.Now.Add(ClockSkew)
	signedAt := *j.SignedAt
	if signedAt.After(latest) {
		return RequestHeaderNames{}, rejected(RejectFuture, "%s: signedAt %s is in the future", RequestHeaderNamesKey, signedAt.UTC().Format(time.RFC3339))
	}
	if n.GoodAt.After(signedAt.Add(ClockSkew)) {
		return RequestHeaderNames{}, rejected(RejectFuture, "%s: goodAt %s is after its signing time %s", RequestHeaderNamesKey, n.GoodAt.UTC().Format(time.RFC3339), signedAt.UTC().Format(time.RFC3339))
	}
	v := verifier{roots: trust.Roots, chains: map[string]error{}}
	cert, err := v.signer(j.Signer, signedAt)
	if err != nil {
		return RequestHeaderNames{}, rejected(RejectSigner, "%s: %v", RequestHeaderNamesKey, err)
	}
	sig, err := base64.StdEncoding.DecodeString(j.Signature)
	if err != nil {
		return RequestHeaderNames{}, rejected(RejectSignature, "%s: signature: %v", RequestHeaderNamesKey, err)
	}
	alg, err := signatureAlgorithm(cert)
	if err != nil {
		return RequestHeaderNames{}, rejected(RejectSigner, "%s: %v", RequestHeaderNamesKey, err)
	}
	if err := cert.CheckSignature(alg, signedRequestHeaderNamesMessage(n, signedAt), sig); err != nil {
		return RequestHeaderNames{}, rejected(RejectSignature, "%s: the signature does not match its content: %v", RequestHeaderNamesKey, err)
	}
	return n, nil
}

// checkRequestHeaderNames: n is what objects.ObserveRequestHeaderNames could have made;
// else why not (RejectBounds or RejectMalformed).
func checkRequestHeaderNames(n RequestHeaderNames) *Rejected {
	name := func(what, s string) *Rejected {
		if len(s) > topology.MaxRequestHeaderNameLength {
			return rejected(RejectBounds, "%s: a name of %d characters, at most %d", what, len(s), topology.MaxRequestHeaderNameLength)
		}
		if !topology.IsHeaderName(s) || strings.ToLower(s) != s {
			return rejected(RejectMalformed, "%s: %q is not a lower-case HTTP header name", what, s)
		}
		return nil
	}
	list := func(what string, names []string, most int) *Rejected {
		if len(names) > most {
			return rejected(RejectBounds, "%s lists %d names, at most %d", what, len(names), most)
		}
		for i, s := range names {
			if err := name(what, s); err != nil {
				return err
			}
			if slices.Contains(names[:i], s) {
				return rejected(RejectMalformed, "%s lists %q twice", what, s)
			}
		}
		return nil
	}
	if g := n.Good; g != nil {
		if len(g.Former) > 0 || len(g.FormerExtraPrefixes) > 0 {
			return rejected(RejectMalformed, "good lists former names")
		}
		for _, l := range []struct {
			what  string
			names []string
		}{{"good user", g.User}, {"good uid", g.UID}, {"good group", g.Group}, {"good extraPrefix", g.ExtraPrefix}} {
			if err := list(l.what, l.names, topology.MaxRequestHeaderNames); err != nil {
				return err
			}
		}
	}
	if err := list("seen", n.Seen, MaxSeenRequestHeaderNames); err != nil {
		return err
	}
	if err := list("seenPrefixes", n.SeenPrefixes, MaxSeenRequestHeaderNames); err != nil {
		return err
	}
	for _, p := range n.SeenPrefixes {
		if !slices.Contains(n.Seen, p) {
			return rejected(RejectMalformed, "seenPrefixes: %q is not among seen", p)
		}
	}
	return nil
}

// MergeRequestHeaderNames is what a process knows (mine) with what was persisted (by it
// before a restart, or by another replica): every name seen by either, bounded as
// objects.ObserveRequestHeaderNames bounds them (the oldest not in use dropped first), and
// mine's good configuration if any, else the persisted one. Neither argument is changed.
func MergeRequestHeaderNames(mine, persisted RequestHeaderNames) RequestHeaderNames {
	out := RequestHeaderNames{Good: mine.Good, GoodAt: mine.GoodAt, Seen: slices.Clone(mine.Seen), SeenPrefixes: slices.Clone(mine.SeenPrefixes)}
	if out.Good == nil && persisted.Good != nil {
		good := *persisted.Good
		out.Good, out.GoodAt = &good, persisted.GoodAt
	}
	inUse := topology.DefaultRequestHeaders()
	if out.Good != nil {
		inUse = out.Good.OrDefault()
	}
	for _, s := range persisted.Seen {
		out.see(s, slices.Contains(persisted.SeenPrefixes, s), inUse)
	}
	return out
}

// NeedsWrite reports whether n says something persisted does not: a name it lacks, or a
// good configuration it lacks or that is older than n's (by GoodAt, then by encoding: two
// replicas with different last good configurations do not overwrite each other for ever).
func (n RequestHeaderNames) NeedsWrite(persisted RequestHeaderNames) bool {
	for _, s := range n.Seen {
		if !slices.Contains(persisted.Seen, s) || slices.Contains(n.SeenPrefixes, s) != slices.Contains(persisted.SeenPrefixes, s) {
			return true
		}
	}
	switch {
	case n.Good == nil:
		return false
	case persisted.Good == nil:
		return true
	case sameRequestHeaders(*n.Good, *persisted.Good):
		return false
	case n.GoodAt.Equal(persisted.GoodAt):
		a, _ := json.Marshal(n.Good)
		b, _ := json.Marshal(persisted.Good)
		return string(a) < string(b)
	}
	return n.GoodAt.After(persisted.GoodAt)
}

// GoodSince is n (what objects.ObserveRequestHeaderNames returned from prev) with GoodAt set
// to now if its good configuration differs from prev's, so that the latest good
// configuration is recognized.
func (n RequestHeaderNames) GoodSince(prev RequestHeaderNames, now time.Time) RequestHeaderNames {
	if n.Good != nil && (prev.Good == nil || !sameRequestHeaders(*n.Good, *prev.Good)) {
		n.GoodAt = now.UTC().Truncate(time.Second)
	}
	return n
}

func sameRequestHeaders(a, b topology.RequestHeaders) bool {
	return slices.Equal(a.User, b.User) && slices.Equal(a.UID, b.UID) && slices.Equal(a.Group, b.Group) && slices.Equal(a.ExtraPrefix, b.ExtraPrefix) &&
		slices.Equal(a.Former, b.Former) && slices.Equal(a.FormerExtraPrefixes, b.FormerExtraPrefixes)
}
