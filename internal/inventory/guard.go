package inventory

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/contract"
)

// Why an answer from an apiserver was refused (RefusedError.Reason,
// WatchOptions.OnDiscoveryRefused).
const (
	RefusedRedirect = "redirect"
	RefusedTooLarge = "too-large"
)

// DefaultMaxDiscoveryBody is WatchOptions.MaxDiscoveryBody when zero: over ten times a v1.37
// apiserver's aggregated /apis with 2,000 CRDs (about 700 KB). Fetching and decoding a body
// costs about four times its size at the peak and keeps twice it, so two fetches of this
// size at once (one apiserver's may overlap) still leave room in the chart's 256 MiB.
const DefaultMaxDiscoveryBody = 8 << 20

// RefusedError is an answer from an apiserver that kube-mvp does not take: a redirect (never
// followed: client-go would send its bearer token wherever it points) or a body over the
// limit.
type RefusedError struct {
	Reason string // RefusedRedirect or RefusedTooLarge
	msg    string
}

func (e *RefusedError) Error() string { return e.msg }

// maxLocation bounds how much of a Location (the apiserver's text) goes into logs.
const maxLocation = 256

// redirects are the statuses Go's HTTP client follows.
var redirects = map[int]bool{301: true, 302: true, 303: true, 307: true, 308: true}

func redirectError(req *http.Request, res *http.Response) *RefusedError {
	loc := res.Header.Get("Location")
	if len(loc) > maxLocation {
		loc = loc[:maxLocation] + "…"
	}
	return &RefusedError{Reason: RefusedRedirect, msg: fmt.Sprintf("%s %s answered %d redirecting to %q: redirects from an apiserver are not followed",
		req.Method, req.URL.Path, res.StatusCode, loc)}
}

// NoRedirectClient is client-go's HTTP client for cfg (as kubernetes.NewForConfig makes it),
// except that a redirect is an error naming its Location, and nothing is sent there.
func NoRedirectClient(cfg *rest.Config) (*http.Client, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	hc, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, err
	}
	out := *hc // may be http.DefaultClient: never changed in place
	out.Transport = noRedirects{rt: hc.Transport}
	// Refused below the client, so that client-go gets an error and no response whose
	// body the client has closed (it would log that as a read error).
	out.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		return redirectError(via[len(via)-1], req.Response)
	}
	return &out, nil
}

type noRedirects struct{ rt http.RoundTripper }

func (t noRedirects) RoundTrip(req *http.Request) (*http.Response, error) {
	rt := t.rt
	if rt == nil {
		rt = http.DefaultTransport
	}
	res, err := rt.RoundTrip(req)
	if err != nil || !redirects[res.StatusCode] {
		return res, err
	}
	res.Body.Close()
	return nil, redirectError(req, res)
}

func (t noRedirects) WrappedRoundTripper() http.RoundTripper { return t.rt }

// guard watches every request of one discovery fetch: it bounds each body to max bytes
// (counted after gzip is decoded, which Go's transport does below it), prunes an aggregated
// discovery document into max bytes (pruneAggregated), and remembers the first refusal, a body
// or a redirect, so that it fails the fetch whichever of client-go's paths (aggregated,
// legacy, /version) met it and however client-go wrapped the error.
type guard struct {
	max int64

	// ifNoneMatch are the ETags of the documents the last fetch read, by path: asked for
	// again with If-None-Match, an unchanged one answers 304 and is not sent at all.
	ifNoneMatch map[string]string

	mu      sync.Mutex
	refused *RefusedError
	pruned  []string          // what pruning left out, for the log
	etags   map[string]string // the ETag of each aggregated document read, by path
	docs    map[string]prunedDoc
}

// client is hc (a NoRedirectClient) with the guard's rules; hc is not changed.
func (g *guard) client(hc *http.Client) *http.Client {
	out := *hc
	out.Transport = guardedTransport{rt: hc.Transport, g: g}
	return &out
}

func (g *guard) refuse(e *RefusedError) *RefusedError {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refused == nil {
		g.refused = e
	}
	return e
}

// err is the first refusal, or nil.
func (g *guard) err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refused == nil {
		return nil
	}
	return g.refused
}

func (g *guard) tooLarge(req *http.Request, limit int64) *RefusedError {
	return g.refuse(&RefusedError{Reason: RefusedTooLarge,
		msg: fmt.Sprintf("the answer to %s %s is larger than the limit of %d bytes", req.Method, req.URL.Path, limit)})
}

// maxETag bounds an ETag kept and sent back (an apiserver's is a quoted hash, under 100
// bytes).
const maxETag = 256

// usableETag: an ETag short and plain enough to send back (printable ASCII): any other
// would fail every later request of this apiserver's discovery, so it is not kept.
func usableETag(etag string) bool {
	if etag == "" || len(etag) > maxETag {
		return false
	}
	for i := range len(etag) {
		if etag[i] < 0x21 || etag[i] > 0x7e {
			return false
		}
	}
	return true
}

// etagOf is the ETag of the aggregated document read at path, or "".
func (g *guard) etagOf(path string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.etags[path]
}

// groupsOf is where the groups are in body, the aggregated document read at path, as
// pruning wrote it; ok is false unless body is what pruning gave.
func (g *guard) groupsOf(path string, body []byte) (items [2]int, groups [][2]int, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d, found := g.docs[path]
	if !found || !bytes.Equal(d.body, body) || d.groups == nil {
		return items, nil, false
	}
	return d.items, d.groups, true
}

// prunedNotes is what pruning left out of this fetch's answers.
func (g *guard) prunedNotes() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pruned
}

type guardedTransport struct {
	rt http.RoundTripper
	g  *guard
}

func (t guardedTransport) WrappedRoundTripper() http.RoundTripper { return t.rt }

func (t guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if etag := t.g.ifNoneMatch[req.URL.Path]; etag != "" && req.Method == http.MethodGet {
		req = req.Clone(req.Context())
		req.Header.Set("If-None-Match", etag)
	}
	res, err := t.rt.RoundTrip(req)
	if r := (*RefusedError)(nil); errors.As(err, &r) {
		t.g.refuse(r)
	}
	if err != nil {
		return res, err
	}
	// An aggregated document is read up to pruneReadFactor times the limit and pruned into it.
	aggregated := res.StatusCode == http.StatusOK && strings.HasPrefix(res.Header.Get("Content-Type"), contract.MediaTypeAggregatedDiscovery)
	limit := t.g.max
	if aggregated {
		limit *= pruneReadFactor
	}
	if res.ContentLength > limit {
		res.Body.Close()
		return nil, t.g.tooLarge(req, limit)
	}
	body := &boundedBody{rc: res.Body, left: limit, tooLarge: func() error { return t.g.tooLarge(req, limit) }}
	if !aggregated {
		res.Body = body
		return res, nil
	}
	defer body.Close()
	pruned, err := pruneAggregated(body, int(t.g.max))
	if top := (*topOverError)(nil); errors.As(err, &top) {
		return nil, t.g.refuse(&RefusedError{Reason: RefusedTooLarge,
			msg: fmt.Sprintf("the answer to %s %s is over the limit of %d bytes: %v", req.Method, req.URL.Path, t.g.max, top)})
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	t.g.mu.Lock()
	for _, n := range pruned.notes {
		t.g.pruned = append(t.g.pruned, req.URL.Path+": "+n)
	}
	if t.g.docs == nil {
		t.g.docs = map[string]prunedDoc{}
	}
	t.g.docs[req.URL.Path] = pruned
	if etag := res.Header.Get("ETag"); usableETag(etag) {
		if t.g.etags == nil {
			t.g.etags = map[string]string{}
		}
		t.g.etags[req.URL.Path] = etag
	}
	t.g.mu.Unlock()
	res.Body = io.NopCloser(bytes.NewReader(pruned.body))
	res.ContentLength = int64(len(pruned.body))
	res.Header.Del("Content-Length")
	return res, nil
}

// boundedBody reads at most left bytes; one more is an error, so that whoever reads it never
// holds more than the limit.
type boundedBody struct {
	rc       io.ReadCloser
	left     int64
	tooLarge func() error
	err      error
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	if int64(n) <= b.left {
		b.left -= int64(n)
		return n, err
	}
	n, b.left = int(b.left), 0
	b.err = b.tooLarge()
	return n, b.err
}

func (b *boundedBody) Close() error { return b.rc.Close() }
