package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/objects"
)

// Fetching discovery. The merge of what was fetched is objects.MergeDiscovery.

// maxVersionBody bounds /version's answer: a real one is about 300 bytes.
const maxVersionBody = 4 << 10

// fetchVersion returns the apiserver's gitVersion, or "" when it cannot be read or does not
// look like a Kubernetes version (it is shown to people, so nothing else gets through).
func fetchVersion(ctx context.Context, c rest.Interface) string {
	body, err := c.Get().AbsPath("/version").Stream(ctx)
	if err != nil {
		return ""
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, maxVersionBody+1))
	if err != nil || len(b) > maxVersionBody {
		return ""
	}
	var info struct {
		GitVersion string `json:"gitVersion"`
	}
	if json.Unmarshal(b, &info) != nil || !objects.PlausibleVersion(info.GitVersion) {
		return ""
	}
	return info.GitVersion
}

// errNoAggregatedDiscovery: the apiserver does not offer aggregated discovery at all (it
// answers 404 or 406, or the legacy document): only then is legacy discovery read instead.
var errNoAggregatedDiscovery = errors.New("no aggregated discovery")

// Fetched is one apiserver's discovery as a fetch read it. Given back as
// FetchOptions.Previous, its aggregated documents are asked for with If-None-Match, and
// one that did not change (304) is neither sent nor decoded again: when neither changed,
// the fetch gives back Previous.List itself.
type Fetched struct {
	List    *apidiscoveryv2.APIGroupDiscoveryList
	Version string // /version's gitVersion, "" if it could not be read
	// docs are the aggregated documents List was made of, by path (none for legacy
	// discovery); pruned what pruning left out of them, as guard.prunedNotes says it.
	docs   map[string]fetchedDoc
	pruned []string
}

type fetchedDoc struct {
	etag  string
	meta  metav1.TypeMeta
	items []apidiscoveryv2.APIGroupDiscovery
	// groups are the items by the SHA-256 of their JSON: the next fetch decodes only the
	// groups whose bytes changed, and hands on the others as they were, so that the merge
	// (objects.DiscoveryMemo) knows them unchanged too.
	groups map[[sha256.Size]byte]apidiscoveryv2.APIGroupDiscovery
}

// groupsAt is where an aggregated document's groups are (prunedDoc): its last items
// array, '[' to ']', and each group in it.
type groupsAt struct {
	items  [2]int
	groups [][2]int
}

// decodeAggregated decodes an aggregated discovery document. Where at says the groups are
// (pruning knows, for a document with one items key), it takes from known each group whose
// JSON it already holds and decodes the others; otherwise it decodes the whole document. The
// result is what decoding the whole document gives.
func decodeAggregated(body []byte, at *groupsAt, known map[[sha256.Size]byte]apidiscoveryv2.APIGroupDiscovery) (fetchedDoc, error) {
	if at.fit(body) {
		var top struct {
			metav1.TypeMeta `json:",inline"`
			metav1.ListMeta `json:"metadata,omitempty"`
			Items           []json.RawMessage `json:"items"`
		}
		// The document with a 0 for its groups: any other key that decodes as items
		// (encoding/json matches keys case-insensitively) would show.
		doc := make([]byte, 0, len(body)-(at.items[1]-at.items[0])+2)
		doc = append(append(append(doc, body[:at.items[0]+1]...), '0'), body[at.items[1]:]...)
		if err := json.Unmarshal(doc, &top); err != nil {
			return fetchedDoc{}, err
		}
		if len(top.Items) == 1 && string(top.Items[0]) == "0" {
			return decodeGroups(body, top.TypeMeta, at.groups, known)
		}
	}
	var l apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(body, &l); err != nil {
		return fetchedDoc{}, err
	}
	return fetchedDoc{meta: l.TypeMeta, items: l.Items}, nil
}

// decodeGroups decodes the groups at spans of body, those known as they were.
func decodeGroups(body []byte, meta metav1.TypeMeta, spans [][2]int, known map[[sha256.Size]byte]apidiscoveryv2.APIGroupDiscovery) (fetchedDoc, error) {
	d := fetchedDoc{meta: meta, items: make([]apidiscoveryv2.APIGroupDiscovery, len(spans)),
		groups: make(map[[sha256.Size]byte]apidiscoveryv2.APIGroupDiscovery, len(spans))}
	for i, span := range spans {
		item := body[span[0]:span[1]]
		sum := sha256.Sum256(item)
		g, ok := known[sum]
		if !ok {
			if err := json.Unmarshal(item, &g); err != nil {
				return fetchedDoc{}, err
			}
		}
		d.items[i] = g
		d.groups[sum] = g
	}
	return d, nil
}

// fit reports whether at can be where body's groups are: the items array within body, and
// each group an object within it, in order.
func (at *groupsAt) fit(body []byte) bool {
	if at == nil || len(at.groups) == 0 {
		return false
	}
	open, close := at.items[0], at.items[1]
	if open < 0 || close >= len(body) || open >= close || body[open] != '[' || body[close] != ']' {
		return false
	}
	prev := open + 1
	for _, g := range at.groups {
		if g[0] < prev || g[1] > close || g[0] >= g[1] || body[g[0]] != '{' || body[g[1]-1] != '}' {
			return false
		}
		prev = g[1]
	}
	return true
}

// etags are the ETags to send back, by path.
func (f *Fetched) etags() map[string]string {
	if f == nil {
		return nil
	}
	out := map[string]string{}
	for path, d := range f.docs {
		if d.etag != "" {
			out[path] = d.etag
		}
	}
	return out
}

// notModified: the apiserver answered 304 to If-None-Match (client-go makes it an error).
func notModified(err error) bool {
	var s apierrors.APIStatus
	return errors.As(err, &s) && s.Status().Code == http.StatusNotModified
}

// fetchAggregated reads /api and /apis as aggregated discovery, without peers, into one list.
// An apiserver that does not offer it gives an error wrapping errNoAggregatedDiscovery; any
// other failure (a 429, a 5xx, a timeout) is a failure of this fetch, never a reason to read
// the less precise legacy discovery. A document prev read and the apiserver says is unchanged
// (g sent its ETag) is prev's.
func fetchAggregated(ctx context.Context, c rest.Interface, g *guard, prev *Fetched) (*Fetched, error) {
	out := &Fetched{docs: map[string]fetchedDoc{}}
	changed := prev == nil || prev.List == nil
	for _, path := range []string{"/api", "/apis"} {
		var contentType string
		body, err := c.Get().AbsPath(path).SetHeader("Accept", contract.MediaTypeAggregatedDiscovery+";profile=nopeer").
			Do(ctx).ContentType(&contentType).Raw()
		if notModified(err) {
			d, ok := prev.docsAt(path)
			if !ok {
				return nil, fmt.Errorf("GET %s: 304 Not Modified, but no earlier answer was read", path)
			}
			out.docs[path] = d
			out.pruned = append(out.pruned, prev.prunedAt(path)...)
			continue
		}
		if apierrors.IsNotFound(err) || apierrors.IsNotAcceptable(err) {
			return nil, fmt.Errorf("GET %s: %w (%w)", path, errNoAggregatedDiscovery, err)
		}
		if err != nil {
			return nil, err
		}
		if !strings.HasPrefix(contentType, contract.MediaTypeAggregatedDiscovery) {
			return nil, fmt.Errorf("GET %s: content type %q: %w", path, contentType, errNoAggregatedDiscovery)
		}
		prevDoc, _ := prev.docsAt(path)
		var at *groupsAt
		if items, groups, ok := g.groupsOf(path, body); ok {
			at = &groupsAt{items: items, groups: groups}
		}
		d, err := decodeAggregated(body, at, prevDoc.groups)
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", path, err)
		}
		if d.meta.Kind != objects.AggregatedKind {
			return nil, fmt.Errorf("GET %s: kind %q, want %s", path, d.meta.Kind, objects.AggregatedKind)
		}
		d.etag = g.etagOf(path)
		out.docs[path] = d
		changed = true
	}
	out.pruned = append(out.pruned, g.prunedNotes()...)
	if !changed {
		out.List = prev.List
		return out, nil
	}
	api, apis := out.docs["/api"], out.docs["/apis"]
	out.List = &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: apis.meta}
	out.List.Items = append(append(make([]apidiscoveryv2.APIGroupDiscovery, 0, len(api.items)+len(apis.items)), api.items...), apis.items...)
	return out, nil
}

func (f *Fetched) docsAt(path string) (fetchedDoc, bool) {
	if f == nil {
		return fetchedDoc{}, false
	}
	d, ok := f.docs[path]
	return d, ok
}

// prunedAt are the pruning notes of the document at path.
func (f *Fetched) prunedAt(path string) []string {
	var out []string
	if f != nil {
		for _, n := range f.pruned {
			if strings.HasPrefix(n, path+": ") {
				out = append(out, n)
			}
		}
	}
	return out
}
