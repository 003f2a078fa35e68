package objects

import (
	"bytes"
	"cmp"
	"encoding/json"
	"slices"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	return (&groupMemo{}).merge(lists, priority)
}

// groupMemo keeps each group's merged JSON with what it was merged from, so that a merge
// after one list changed merges and marshals again only the groups whose entries changed
// (a fetch reuses the decoded groups whose bytes did not change: inventory's Fetch).
type groupMemo struct {
	groups map[string]mergedGroup
}

type mergedGroup struct {
	from []groupEntry
	json []byte
}

// groupEntry is one list's entry of a group: its position in the lists, and the entry
// itself, known by its versions' backing array (a decoded group is never modified; holding
// the pointer keeps the array, so its address is not reused while it is a key here).
type groupEntry struct {
	list     int
	meta     metav1.TypeMeta
	name     string
	versions *apidiscoveryv2.APIVersionDiscovery
	n        int
}

// sameEntries: a and b are the same entries of a group. An entry without versions is never
// the same (nothing tells it from another one), and costs nothing to merge again.
func sameEntries(a, b []groupEntry) bool {
	return slices.Equal(a, b) && !slices.ContainsFunc(a, func(e groupEntry) bool { return e.versions == nil })
}

func entryOf(list int, g *apidiscoveryv2.APIGroupDiscovery) groupEntry {
	e := groupEntry{list: list, meta: g.TypeMeta, name: g.Name, n: len(g.Versions)}
	if e.n > 0 {
		e.versions = &g.Versions[0]
	}
	return e
}

func (m *groupMemo) merge(lists []*apidiscoveryv2.APIGroupDiscoveryList, priority map[string]int32) *topology.Discovery {
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
	// Each group's entries, the list with the most groups first (its group order and its
	// versions' order lead), then the others in order.
	order := []int{base}
	for i := range lists {
		if i != base {
			order = append(order, i)
		}
	}
	var names []string
	entries := map[string][]groupEntry{}
	sources := map[string][]*apidiscoveryv2.APIGroupDiscovery{}
	for _, li := range order {
		items := lists[li].Items
		for gi := range items {
			g := &items[gi]
			if g.Name == "" {
				continue // the core group is /api's
			}
			if _, ok := entries[g.Name]; !ok {
				names = append(names, g.Name)
			}
			entries[g.Name] = append(entries[g.Name], entryOf(li, g))
			sources[g.Name] = append(sources[g.Name], g)
		}
	}
	if priority != nil {
		slices.SortStableFunc(names, func(a, b string) int {
			pa, oka := priority[a]
			pb, okb := priority[b]
			switch {
			case oka != okb:
				if oka {
					return -1
				}
				return 1
			case pa != pb:
				return cmp.Compare(pb, pa)
			}
			return strings.Compare(a, b)
		})
	}
	head, err := json.Marshal(apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: lists[base].TypeMeta, Items: []apidiscoveryv2.APIGroupDiscovery{}})
	if err != nil {
		return nil
	}
	doc := bytes.NewBuffer(make([]byte, 0, m.size()+len(head)))
	doc.Write(head[:len(head)-len("]}")])
	merged := make(map[string]mergedGroup, len(names))
	for i, name := range names {
		g, ok := m.groups[name]
		if !ok || !sameEntries(g.from, entries[name]) {
			if g.json, err = json.Marshal(mergeGroup(sources[name], entries[name])); err != nil {
				return nil
			}
			g.from = entries[name]
		}
		merged[name] = g
		if i > 0 {
			doc.WriteByte(',')
		}
		doc.Write(g.json)
	}
	doc.WriteString("]}")
	m.groups = merged
	if len(names) == 0 {
		// As encoding/json writes a list without items.
		b, err := json.Marshal(apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: lists[base].TypeMeta})
		if err != nil {
			return nil
		}
		return topology.NewDiscovery(b)
	}
	return topology.NewDiscovery(doc.Bytes())
}

// size is the merged groups' JSON, to size the next document.
func (m *groupMemo) size() int {
	n := 0
	for _, g := range m.groups {
		n += len(g.json) + 1
	}
	return n
}

// mergeGroup merges one group's entries (in the merge's order; from[i] is entries[i]):
// every version of each, every resource of each version with the union of its verbs and
// subresources, each resource described as most lists describe it (chooseDescriptions),
// versions in Kubernetes version priority.
func mergeGroup(from []*apidiscoveryv2.APIGroupDiscovery, entries []groupEntry) *apidiscoveryv2.APIGroupDiscovery {
	m := &apidiscoveryv2.APIGroupDiscovery{TypeMeta: from[0].TypeMeta, ObjectMeta: from[0].ObjectMeta}
	for _, g := range from {
		m.Versions = mergeVersions(m.Versions, g.Versions)
	}
	chooseDescriptions(m, from, entries)
	slices.SortStableFunc(m.Versions, func(a, b apidiscoveryv2.APIVersionDiscovery) int {
		return -version.CompareKubeAwareVersionStrings(a.Version, b.Version)
	})
	return m
}

// chooseDescriptions gives each merged resource of group m the description (kind, scope,
// names, categories: everything but the verbs and subresources, which are united) that most
// of the lists give it; between equally many, the one of the earliest list (callers pass
// them by apiserver ID). So no single apiserver decides how a resource others serve is
// described (a compromised one gave apps/v1 daemonsets the short name "deploy" and cluster
// scope by listing the most groups), and the result does not depend on the lists' order
// unless the apiservers split evenly.
func chooseDescriptions(m *apidiscoveryv2.APIGroupDiscovery, from []*apidiscoveryv2.APIGroupDiscovery, entries []groupEntry) {
	type key struct{ version, resource string }
	type tally struct {
		n     int
		first int    // index of the first list giving it
		json  string // the description, the last tie-break (one list may give two)
		desc  apidiscoveryv2.APIResourceDiscovery
	}
	votes := map[key]map[string]*tally{}
	for gi, g := range from {
		li := entries[gi].list
		for _, v := range g.Versions {
			for _, r := range v.Resources {
				d := r
				d.Verbs, d.Subresources = nil, nil
				b, err := json.Marshal(d)
				if err != nil {
					continue
				}
				k := key{v.Version, r.Resource}
				if votes[k] == nil {
					votes[k] = map[string]*tally{}
				}
				t := votes[k][string(b)]
				if t == nil {
					t = &tally{first: li, json: string(b), desc: d}
					votes[k][string(b)] = t
				}
				t.first = min(t.first, li)
				t.n++
			}
		}
	}
	for vi := range m.Versions {
		v := &m.Versions[vi]
		for ri := range v.Resources {
			r := &v.Resources[ri]
			var best *tally
			for _, t := range votes[key{v.Version, r.Resource}] {
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

// ServedBy lists the resources and subresources of one apiserver's discovery, sorted, leaving
// out the group/versions in everywhere: what the memory keeps of it (memory.Remembered.Served).
func ServedBy(list *apidiscoveryv2.APIGroupDiscoveryList, everywhere map[topology.GroupVersion]bool) []topology.Resource {
	var out []topology.Resource
	if list == nil {
		return nil
	}
	for _, g := range list.Items {
		for _, v := range g.Versions {
			if everywhere[topology.GroupVersion{Group: g.Name, Version: v.Version}] {
				continue
			}
			for _, res := range v.Resources {
				if res.Resource == "" || v.Version == "" {
					continue
				}
				r := topology.Resource{Group: g.Name, Version: v.Version, Resource: res.Resource}
				if checkResource("", r) != nil {
					continue // never remembered: Build would leave it out anyway
				}
				out = append(out, r)
				for _, sub := range res.Subresources {
					if sub.Subresource != "" {
						r.Subresource = sub.Subresource
						if checkResource("", r) == nil {
							out = append(out, r)
						}
					}
				}
			}
		}
	}
	slices.SortFunc(out, topology.CompareResources)
	return slices.Compact(out)
}
