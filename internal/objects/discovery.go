package objects

import (
	"cmp"
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
// apiservers describe one resource differently, the description most of them give wins
// (chooseDescriptions). Groups keep the order of the list that has the most of them, others follow in
// order of appearance; versions are ordered by Kubernetes version priority (v2 before v1
// before v1beta1), resources and subresources by name. The result is the same whatever order
// the apiservers listed things in, but for groups. It is nil when any list is not in
// aggregated form (no merged view is better than a partial one) or there is none.
func MergeDiscovery(lists []*apidiscoveryv2.APIGroupDiscoveryList) *topology.Discovery {
	return MergeDiscoveryOrdered(lists, nil)
}

// MergeDiscoveryOrdered is MergeDiscovery with the groups in Kubernetes' own order when
// priority (group -> its APIServices' highest groupPriorityMinimum) is given: higher priority
// first, then by name, as kube-aggregator orders them; groups it does not name follow, by
// name. Clients resolve short names and unqualified resources by that order, so no apiserver
// decides it (before, the one listing the most groups did).
func MergeDiscoveryOrdered(lists []*apidiscoveryv2.APIGroupDiscoveryList, priority map[string]int32) *topology.Discovery {
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
	chooseDescriptions(groups, lists)
	if priority != nil {
		slices.SortStableFunc(groups, func(a, b *apidiscoveryv2.APIGroupDiscovery) int {
			pa, oka := priority[a.Name]
			pb, okb := priority[b.Name]
			switch {
			case oka != okb:
				if oka {
					return -1
				}
				return 1
			case pa != pb:
				return cmp.Compare(pb, pa)
			}
			return strings.Compare(a.Name, b.Name)
		})
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

// chooseDescriptions gives each merged resource the description (kind, scope, names,
// categories: everything but the verbs and subresources, which are united) that most of the
// lists give it; between equally many, the one of the earliest list (callers pass them by
// apiserver ID). So no single apiserver decides how a resource others serve is described (a
// compromised one gave apps/v1 daemonsets the short name "deploy" and cluster scope by
// listing the most groups), and the result does not depend on the lists' order unless the
// apiservers split evenly.
func chooseDescriptions(groups []*apidiscoveryv2.APIGroupDiscovery, lists []*apidiscoveryv2.APIGroupDiscoveryList) {
	type key struct{ group, version, resource string }
	type tally struct {
		n     int
		first int    // index of the first list giving it
		json  string // the description, the last tie-break (one list may give two)
		desc  apidiscoveryv2.APIResourceDiscovery
	}
	votes := map[key]map[string]*tally{}
	for li, l := range lists {
		for _, g := range l.Items {
			for _, v := range g.Versions {
				for _, r := range v.Resources {
					d := r
					d.Verbs, d.Subresources = nil, nil
					b, err := json.Marshal(d)
					if err != nil {
						continue
					}
					k := key{g.Name, v.Version, r.Resource}
					if votes[k] == nil {
						votes[k] = map[string]*tally{}
					}
					t := votes[k][string(b)]
					if t == nil {
						t = &tally{first: li, json: string(b), desc: d}
						votes[k][string(b)] = t
					}
					t.n++
				}
			}
		}
	}
	for _, g := range groups {
		for vi := range g.Versions {
			v := &g.Versions[vi]
			for ri := range v.Resources {
				r := &v.Resources[ri]
				var best *tally
				for _, t := range votes[key{g.Name, v.Version, r.Resource}] {
					if best == nil || t.n > best.n || t.n == best.n && (t.first < best.first || t.first == best.first && t.json < best.json) {
						best = t
					}
				}
				if best != nil {
					verbs, subs := r.Verbs, r.Subresources
					*r = best.desc
					r.Verbs, r.Subresources = verbs, subs
				}
			}
		}
	}
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
