package objects

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// referenceMerge and referenceChoose are the whole-document merge as it was before groups
// were merged one by one (groupMemo): the oracle the per-group merge must equal byte for byte.
func referenceMerge(lists []*apidiscoveryv2.APIGroupDiscoveryList, priority map[string]int32) *topology.Discovery {
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
	referenceChoose(groups, lists)
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

func referenceChoose(groups []*apidiscoveryv2.APIGroupDiscovery, lists []*apidiscoveryv2.APIGroupDiscoveryList) {
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

// randomLists are n aggregated lists of overlapping groups whose resources the lists
// describe alike or not (so that votes split and ties fall to the earliest list), with now
// and then a group listed twice or without versions.
func randomLists(r *rand.Rand, n int) []*apidiscoveryv2.APIGroupDiscoveryList {
	lists := make([]*apidiscoveryv2.APIGroupDiscoveryList, n)
	for i := range lists {
		l := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}}
		for g := range 3 + r.IntN(6) {
			l.Items = append(l.Items, randomGroup(r, fmt.Sprintf("g%d.example.com", r.IntN(8)+g%2)))
		}
		lists[i] = l
	}
	return lists
}

func randomGroup(r *rand.Rand, name string) apidiscoveryv2.APIGroupDiscovery {
	g := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if r.IntN(10) == 0 {
		return g // no versions
	}
	for _, v := range []string{"v1", "v2beta1", "v1alpha1", "foo"}[:1+r.IntN(4)] {
		ver := apidiscoveryv2.APIVersionDiscovery{Version: v}
		for res := range 1 + r.IntN(4) {
			ver.Resources = append(ver.Resources, apidiscoveryv2.APIResourceDiscovery{
				Resource:     fmt.Sprintf("r%d", (res+r.IntN(2))%4),
				ResponseKind: &metav1.GroupVersionKind{Kind: fmt.Sprintf("K%d", r.IntN(2))},
				Scope:        []apidiscoveryv2.ResourceScope{apidiscoveryv2.ScopeNamespace, apidiscoveryv2.ScopeCluster}[r.IntN(2)],
				ShortNames:   []string{fmt.Sprintf("s%d", r.IntN(3))},
				Verbs:        []string{"get", "list", "watch", "create"}[:1+r.IntN(4)],
				Subresources: []apidiscoveryv2.APISubresourceDiscovery{{Subresource: "status", Verbs: []string{"get"}}}[:r.IntN(2)],
			})
		}
		g.Versions = append(g.Versions, ver)
	}
	return g
}

// TestGroupMergeEqualsWholeMerge: merged one group at a time, with the groups of lists that
// did not change taken from the memo, the document is byte for byte what merging it whole
// gives, through a run of changes to one list's group at a time (the lists otherwise the
// same objects, as a fetch keeps the groups whose bytes did not change).
func TestGroupMergeEqualsWholeMerge(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	reused := 0
	for run := range 200 {
		lists := randomLists(r, 1+r.IntN(3))
		var priority map[string]int32
		if run%2 == 0 {
			priority = map[string]int32{"g1.example.com": 100, "g3.example.com": 100, "g5.example.com": 2000}
		}
		memo := &groupMemo{}
		for step := range 6 {
			want := referenceMerge(lists, priority)
			got := memo.merge(lists, priority)
			if (want == nil) != (got == nil) || want != nil && string(want.JSON) != string(got.JSON) {
				t.Fatalf("run %d step %d: merged\n%s\nmerged whole\n%s", run, step, docOf(got), docOf(want))
			}
			if fresh := MergeDiscoveryOrdered(lists, priority); string(fresh.JSON) != string(got.JSON) {
				t.Fatalf("run %d step %d: the memo's merge differs from a fresh one", run, step)
			}
			// One list changes one group (a new list object, its other groups the same).
			i := r.IntN(len(lists))
			changed := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: lists[i].TypeMeta, Items: slices.Clone(lists[i].Items)}
			if len(changed.Items) > 0 {
				j := r.IntN(len(changed.Items))
				changed.Items[j] = randomGroup(r, changed.Items[j].Name)
			}
			lists = slices.Clone(lists)
			lists[i] = changed
			reused += len(memo.groups)
		}
	}
	if reused == 0 {
		t.Fatal("no group was ever kept in the memo")
	}
}

// TestGroupMergeMergesOnlyChangedGroups: a list changing one group merges that group again
// and takes the others' JSON from the memo as it was (the same bytes, not marshalled again).
func TestGroupMergeMergesOnlyChangedGroups(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	a := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: AggregatedKind}}
	for i := range 5 {
		g := randomGroup(r, fmt.Sprintf("g%d.example.com", i))
		g.Versions = append(g.Versions, apidiscoveryv2.APIVersionDiscovery{Version: "v9"}) // never empty
		a.Items = append(a.Items, g)
	}
	memo := &groupMemo{}
	memo.merge([]*apidiscoveryv2.APIGroupDiscoveryList{a}, nil)
	before := map[string][]byte{}
	for name, g := range memo.groups {
		before[name] = g.json
	}
	b := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: a.TypeMeta, Items: slices.Clone(a.Items)}
	b.Items[2] = randomGroup(r, "g2.example.com")
	b.Items[2].Versions = append(b.Items[2].Versions, apidiscoveryv2.APIVersionDiscovery{Version: "v8"})
	memo.merge([]*apidiscoveryv2.APIGroupDiscoveryList{b}, nil)
	for name, g := range memo.groups {
		same := len(g.json) > 0 && len(before[name]) > 0 && &g.json[0] == &before[name][0]
		if same != (name != "g2.example.com") {
			t.Errorf("group %s: JSON kept from the memo: %v", name, same)
		}
	}
}

func docOf(d *topology.Discovery) string {
	if d == nil {
		return "<nil>"
	}
	return string(d.JSON)
}
