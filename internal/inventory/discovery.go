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

// decodeAggregated decodes an aggregated discovery document, taking from known each group
// whose JSON it already holds. The result is what decoding the whole document gives.
func decodeAggregated(body []byte, known map[[sha256.Size]byte]apidiscoveryv2.APIGroupDiscovery) (fetchedDoc, error) {
	var raw struct {
		metav1.TypeMeta `json:",inline"`
		Items           []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return fetchedDoc{}, err
	}
	d := fetchedDoc{meta: raw.TypeMeta, groups: make(map[[sha256.Size]byte]apidiscoveryv2.APIGroupDiscovery, len(raw.Items))}
	if raw.Items != nil {
		d.items = make([]apidiscoveryv2.APIGroupDiscovery, len(raw.Items))
	}
	for i, item := range raw.Items {
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
		d, err := decodeAggregated(body, prevDoc.groups)
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
