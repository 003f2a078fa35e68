package objects

import (
	"encoding/json"
	"slices"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	"k8s.io/apimachinery/pkg/version"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Merged discovery. Each apiserver's aggregated discovery (/api and /apis,
// apidiscovery.k8s.io/v2) lists what that apiserver serves. Behind a balancer a client sees
// one of them at random, so during an upgrade kubectl may not know a resource that another
// apiserver serves ("the server doesn't have a resource type"). The merged document is the
// union over every live apiserver; extproc answers GET /apis with it (after an apiserver
// authorized the request).

// AggregatedKind marks a list in aggregated form: an apiserver's own aggregated document, or
// one rebuilt from its legacy discovery with everything the legacy lists say (an apiserver
// that offers only legacy discovery is merged like the others).
const AggregatedKind = "APIGroupDiscoveryList"

// MergeDiscovery merges the aggregated discovery of several apiservers (in a fixed order,
// e.g. by ID) into the /apis document: every group except the core group, every version of
// each, every resource of each version with the union of their verbs and subresources. Where
// apiservers describe one resource differently, the first description wins but for the
// verbs. Groups keep the order of the list that has the most of them, others follow in
// order of appearance; versions are ordered by Kubernetes version priority (v2 before v1
// before v1beta1), resources and subresources by name. The result is the same whatever order
// the apiservers listed things in, but for groups. It is nil when any list is not in
// aggregated form (no merged view is better than a partial one) or there is none.
func MergeDiscovery(lists []*apidiscoveryv2.APIGroupDiscoveryList) *topology.Discovery {
	if len(lists) == 0 {
		return nil
	}
	base := 0
	for i, l := range lists {
		if l == nil || l.Kind != AggregatedKind {
			return nil
		}
		if len(l.Items) > len(lists[base].Items) {
			base = i
		}
	}
	order := append([]*apidiscoveryv2.APIGroupDiscoveryList{lists[base]}, slices.Delete(slices.Clone(lists), base, base+1)...)

	var groups []*apidiscoveryv2.APIGroupDiscovery
	byName := map[string]*apidiscoveryv2.APIGroupDiscovery{}
	for _, l := range order {
		for _, g := range l.Items {
			if g.Name == "" {
				continue // the core group is /api's
			}
			m, ok := byName[g.Name]
			if !ok {
				m = &apidiscoveryv2.APIGroupDiscovery{TypeMeta: g.TypeMeta, ObjectMeta: g.ObjectMeta}
				byName[g.Name] = m
				groups = append(groups, m)
			}
			m.Versions = mergeVersions(m.Versions, g.Versions)
		}
	}
	out := apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: lists[base].TypeMeta}
	for _, g := range groups {
		slices.SortStableFunc(g.Versions, func(a, b apidiscoveryv2.APIVersionDiscovery) int {
			return -version.CompareKubeAwareVersionStrings(a.Version, b.Version)
		})
		out.Items = append(out.Items, *g)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil
	}
	return topology.NewDiscovery(b)
}

func mergeVersions(into, from []apidiscoveryv2.APIVersionDiscovery) []apidiscoveryv2.APIVersionDiscovery {
	for _, v := range from {
		i := slices.IndexFunc(into, func(x apidiscoveryv2.APIVersionDiscovery) bool { return x.Version == v.Version })
		if i < 0 {
			into = append(into, apidiscoveryv2.APIVersionDiscovery{Version: v.Version, Freshness: v.Freshness})
			i = len(into) - 1
		}
		into[i].Resources = mergeResources(into[i].Resources, v.Resources)
	}
	return into
}

func mergeResources(into, from []apidiscoveryv2.APIResourceDiscovery) []apidiscoveryv2.APIResourceDiscovery {
	for _, r := range from {
		i := slices.IndexFunc(into, func(x apidiscoveryv2.APIResourceDiscovery) bool { return x.Resource == r.Resource })
		if i < 0 {
			c := r
			c.Verbs = slices.Clone(r.Verbs)
			c.Subresources = nil
			into = append(into, c)
			i = len(into) - 1
		}
		into[i].Verbs = union(into[i].Verbs, r.Verbs)
		for _, s := range r.Subresources {
			j := slices.IndexFunc(into[i].Subresources, func(x apidiscoveryv2.APISubresourceDiscovery) bool { return x.Subresource == s.Subresource })
			if j < 0 {
				c := s
				c.Verbs = slices.Clone(s.Verbs)
				into[i].Subresources = append(into[i].Subresources, c)
				continue
			}
			into[i].Subresources[j].Verbs = union(into[i].Subresources[j].Verbs, s.Verbs)
		}
		slices.SortFunc(into[i].Subresources, func(a, b apidiscoveryv2.APISubresourceDiscovery) int {
			return strings.Compare(a.Subresource, b.Subresource)
		})
	}
	slices.SortFunc(into, func(a, b apidiscoveryv2.APIResourceDiscovery) int { return strings.Compare(a.Resource, b.Resource) })
	return into
}

func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}
