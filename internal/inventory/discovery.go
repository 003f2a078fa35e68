package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// fetchAggregated reads /api and /apis as aggregated discovery, without peers, into one list.
// An apiserver that does not offer it gives an error wrapping errNoAggregatedDiscovery; any
// other failure (a 429, a 5xx, a timeout) is a failure of this fetch, never a reason to read
// the less precise legacy discovery.
func fetchAggregated(ctx context.Context, c rest.Interface) (*apidiscoveryv2.APIGroupDiscoveryList, error) {
	out := &apidiscoveryv2.APIGroupDiscoveryList{}
	for _, path := range []string{"/api", "/apis"} {
		var contentType string
		body, err := c.Get().AbsPath(path).SetHeader("Accept", contract.MediaTypeAggregatedDiscovery+";profile=nopeer").
			Do(ctx).ContentType(&contentType).Raw()
		if apierrors.IsNotFound(err) || apierrors.IsNotAcceptable(err) {
			return nil, fmt.Errorf("GET %s: %w (%w)", path, errNoAggregatedDiscovery, err)
		}
		if err != nil {
			return nil, err
		}
		if !strings.HasPrefix(contentType, contract.MediaTypeAggregatedDiscovery) {
			return nil, fmt.Errorf("GET %s: content type %q: %w", path, contentType, errNoAggregatedDiscovery)
		}
		var l apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(body, &l); err != nil {
			return nil, fmt.Errorf("GET %s: %w", path, err)
		}
		if l.Kind != objects.AggregatedKind {
			return nil, fmt.Errorf("GET %s: kind %q, want %s", path, l.Kind, objects.AggregatedKind)
		}
		out.TypeMeta = l.TypeMeta
		out.Items = append(out.Items, l.Items...)
	}
	return out, nil
}
