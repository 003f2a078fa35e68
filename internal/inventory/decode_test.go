package inventory

import (
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
	first := aggregatedDoc(t, "a.example.com", "b.example.com", "c.example.com")
	d1, err := decodeAggregated(first, nil)
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
	second := aggregatedDoc(t, "a.example.com", "b.example.com", "c.example.com")
	var l apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(second, &l); err != nil {
		t.Fatal(err)
	}
	l.Items[1].Versions[0].Resources[0].Resource = "widgets9"
	second, _ = json.Marshal(l)
	d2, err := decodeAggregated(second, d1.groups)
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
		if _, err := decodeAggregated([]byte(bad), d1.groups); err == nil {
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
				Subresources: []apidiscoveryv2.APISubresourceDiscovery{{Subresource: "status", ResponseKind: &metav1.GroupVersionKind{Group: group, Version: "v1", Kind: fmt.Sprintf("Widget%05d", j)}, Verbs: []string{"get", "patch", "update"}}},
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

// BenchmarkDecodeAggregated decodes a document of n CRDs, ten to a group: "whole" as the
// fetch did before groups were kept (one json.Unmarshal), "first" with no group known, and
// "fetched" after one group changed.
func BenchmarkDecodeAggregated(b *testing.B) {
	for _, n := range []int{2000, 10000} {
		doc := crdDocument(b, n)
		known, err := decodeAggregated(doc, nil)
		if err != nil {
			b.Fatal(err)
		}
		var l apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(doc, &l); err != nil {
			b.Fatal(err)
		}
		l.Items[7].Versions[0].Resources[0].Resource = "changed"
		changed, _ := json.Marshal(l)
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
						_, err = decodeAggregated(doc, nil)
					case "fetched":
						_, err = decodeAggregated(changed, known.groups)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
