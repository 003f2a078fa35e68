package inventory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
)

func aggregatedDoc(t *testing.T, groups ...string) []byte {
	t.Helper()
	l := apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}}
	for i, g := range groups {
		l.Items = append(l.Items, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: g}, Versions: []apidiscoveryv2.APIVersionDiscovery{{
			Version: "v1", Resources: []apidiscoveryv2.APIResourceDiscovery{{Resource: fmt.Sprintf("widgets%d", i), Verbs: []string{"get", "list"}}},
		}}})
	}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeAggregatedKeepsUnchangedGroups: decoded a group at a time, a document is what
// decoding it whole gives; a group whose bytes are unchanged since the last fetch is handed
// on as it was (the same versions), a changed one is decoded anew.
func TestDecodeAggregatedKeepsUnchangedGroups(t *testing.T) {
	first, firstAt := pruned(t, aggregatedDoc(t, "a.example.com", "b.example.com", "c.example.com"))
	d1, err := decodeAggregated(first, firstAt, nil)
	if err != nil {
		t.Fatal(err)
	}
	var whole apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(first, &whole); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d1.meta, whole.TypeMeta) || !reflect.DeepEqual(d1.items, whole.Items) {
		t.Fatalf("decoded a group at a time: %+v %+v, whole: %+v %+v", d1.meta, d1.items, whole.TypeMeta, whole.Items)
	}

	// b changes (its resource is now widgets9); a and c keep their bytes.
	var l apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(first, &l); err != nil {
		t.Fatal(err)
	}
	l.Items[1].Versions[0].Resources[0].Resource = "widgets9"
	second, secondAt := pruned(t, must(json.Marshal(l)))
	d2, err := decodeAggregated(second, secondAt, d1.groups)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d2.items, l.Items) {
		t.Fatalf("second fetch decoded %+v, want %+v", d2.items, l.Items)
	}
	for i, kept := range []bool{true, false, true} {
		same := &d2.items[i].Versions[0] == &d1.items[i].Versions[0]
		if same != kept {
			t.Errorf("group %s: handed on as before: %v, want %v", d2.items[i].Name, same, kept)
		}
	}

	for _, bad := range []string{`{"kind":"APIGroupDiscoveryList","items":[{"metadata":{"name":1}}]}`, `{"items":[`, `[]`} {
		if _, err := decodeAggregated([]byte(bad), nil, d1.groups); err == nil {
			t.Errorf("%s: decoded without an error", bad)
		}
	}
}

// crdDocument is an aggregated document of n CRDs, ten kinds to a group, as apiservers list
// them.
func crdDocument(b *testing.B, n int) []byte {
	l := apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}}
	for i := 0; i < n; i += 10 {
		group := fmt.Sprintf("g%05d.example.com", i/10)
		v := apidiscoveryv2.APIVersionDiscovery{Version: "v1", Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
		for j := i; j < i+10; j++ {
			v.Resources = append(v.Resources, apidiscoveryv2.APIResourceDiscovery{
				Resource: fmt.Sprintf("widgets%05d", j), SingularResource: fmt.Sprintf("widget%05d", j), Scope: apidiscoveryv2.ScopeNamespace,
				ResponseKind: &metav1.GroupVersionKind{Group: group, Version: "v1", Kind: fmt.Sprintf("Widget%05d", j)},
				Verbs:        []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
				Categories:   []string{"all"},
				Subresources: []apidiscoveryv2.APISubresourceDiscovery{{Subresource: "status",
					ResponseKind: &metav1.GroupVersionKind{Group: group, Version: "v1", Kind: fmt.Sprintf("Widget%05d", j)},
					Verbs:        []string{"get", "patch", "update"}}},
			})
		}
		l.Items = append(l.Items, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: group}, Versions: []apidiscoveryv2.APIVersionDiscovery{v}})
	}
	doc, err := json.Marshal(l)
	if err != nil {
		b.Fatal(err)
	}
	return doc
}

// pruned is doc as the fetch's transport hands it on, and where its groups are.
func pruned(t testing.TB, doc []byte) ([]byte, *groupsAt) {
	t.Helper()
	d, err := pruneAggregated(bytes.NewReader(doc), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	return d.body, &groupsAt{items: d.items, groups: d.groups}
}

// TestDecodeAggregatedAtPrunedGroups: where pruning says the groups are, they are decoded
// from there, and the result is what decoding the whole document gives, for documents whose
// items key comes first, last, twice, or is matched by another key as encoding/json
// matches keys (case-insensitively).
func TestDecodeAggregatedAtPrunedGroups(t *testing.T) {
	groups := `[{"metadata":{"name":"a.example.com"},"versions":[{"version":"v1","resources":[{"resource":"as","verbs":["get"]}]}]},` +
		`{"metadata":{"name":"b.example.com"},"versions":[{"version":"v1"}]}]`
	for i, doc := range []string{
		`{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":` + groups + `}`,
		`{"items":` + groups + `,"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2"}`,
		// More than one key decodes as items: the whole document is decoded.
		`{"kind":"APIGroupDiscoveryList","items":[{"metadata":{"name":"c.example.com"}}],"items":` + groups + `}`,
		`{"kind":"APIGroupDiscoveryList","items":` + groups + `,"ITEMS":[]}`,
		`{"kind":"APIGroupDiscoveryList","Items":[{"metadata":{"name":"c.example.com"}}],"items":` + groups + `}`,
		`{"kind":"APIGroupDiscoveryList","items":` + groups + `,"Items":[{"metadata":{"name":"c.example.com"}}]}`,
		`{"kind":"APIGroupDiscoveryList","items":` + groups + `,"item\u017f":null}`,
	} {
		body, at := pruned(t, []byte(doc))
		if fits := at.fit(body); fits != (i < 2) {
			t.Errorf("%s: pruning says where the groups are: %v", doc, fits)
		}
		got, err := decodeAggregated(body, at, nil)
		if err != nil {
			t.Fatal(err)
		}
		var whole apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(body, &whole); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.meta, whole.TypeMeta) || !reflect.DeepEqual(got.items, whole.Items) {
			t.Errorf("%s:\ndecoded where pruning put the groups: %+v %+v\ndecoded whole: %+v %+v", doc, got.meta, got.items, whole.TypeMeta, whole.Items)
		}
	}
	// Positions that do not fit the document are not used.
	body, at := pruned(t, []byte(`{"kind":"APIGroupDiscoveryList","items":`+groups+`}`))
	for _, bad := range []*groupsAt{
		nil, {items: at.items}, {items: [2]int{at.items[0] + 1, at.items[1]}, groups: at.groups},
		{items: at.items, groups: [][2]int{at.groups[1], at.groups[0]}}, {items: at.items, groups: [][2]int{{at.groups[0][0], at.groups[0][1] - 1}}},
		{items: [2]int{at.items[0], len(body)}, groups: at.groups},
	} {
		if bad.fit(body) {
			t.Errorf("%+v fits %s", bad, body)
		}
	}
}

// BenchmarkDecodeAggregated decodes a document of n CRDs, ten to a group: "whole" as the
// fetch did before groups were kept (one json.Unmarshal), "first" with no group known, and
// "fetched" after one group changed (each where pruning put the groups).
func BenchmarkDecodeAggregated(b *testing.B) {
	for _, n := range []int{2000, 10000} {
		doc, at := pruned(b, crdDocument(b, n))
		known, err := decodeAggregated(doc, at, nil)
		if err != nil {
			b.Fatal(err)
		}
		var l apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(doc, &l); err != nil {
			b.Fatal(err)
		}
		l.Items[7].Versions[0].Resources[0].Resource = "changed"
		changed, changedAt := pruned(b, must(json.Marshal(l)))
		for _, kind := range []string{"whole", "first", "fetched"} {
			b.Run(fmt.Sprintf("%d/%s", n, kind), func(b *testing.B) {
				b.SetBytes(int64(len(doc)))
				for range b.N {
					var err error
					switch kind {
					case "whole":
						var l apidiscoveryv2.APIGroupDiscoveryList
						err = json.Unmarshal(doc, &l)
					case "first":
						_, err = decodeAggregated(doc, at, nil)
					case "fetched":
						_, err = decodeAggregated(changed, changedAt, known.groups)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkPruneAggregated prunes a document of 2,000 CRDs, as every fetch whose document
// changed does.
func BenchmarkPruneAggregated(b *testing.B) {
	doc := crdDocument(b, 2000)
	b.SetBytes(int64(len(doc)))
	for range b.N {
		if _, err := pruneAggregated(bytes.NewReader(doc), 64<<20); err != nil {
			b.Fatal(err)
		}
	}
}
