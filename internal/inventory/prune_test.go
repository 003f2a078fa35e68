package inventory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
)

func discoveryGroup(name string, versions, resources, strs int) apidiscoveryv2.APIGroupDiscovery {
	g := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for v := range versions {
		ver := apidiscoveryv2.APIVersionDiscovery{Version: fmt.Sprintf("v%d", v+1), Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
		for r := range resources {
			res := apidiscoveryv2.APIResourceDiscovery{Resource: fmt.Sprintf("things%d", r), Scope: apidiscoveryv2.ScopeNamespace,
				ResponseKind: &metav1.GroupVersionKind{Group: name, Version: ver.Version, Kind: "Thing"},
				Verbs:        []string{"get", "list", "watch"}, SingularResource: "thing",
				Subresources: []apidiscoveryv2.APISubresourceDiscovery{{Subresource: "status", Verbs: []string{"get", "patch"},
					ResponseKind: &metav1.GroupVersionKind{Group: name, Version: ver.Version, Kind: "Thing"}}}}
			for i := range strs {
				res.Categories = append(res.Categories, fmt.Sprintf("category-%d-%s", i, strings.Repeat("c", 50)))
			}
			ver.Resources = append(ver.Resources, res)
		}
		g.Versions = append(g.Versions, ver)
	}
	return g
}

func discoveryDoc(t testing.TB, groups ...apidiscoveryv2.APIGroupDiscovery) *apidiscoveryv2.APIGroupDiscoveryList {
	return &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}, Items: groups}
}

func prune(t *testing.T, doc []byte, max int) (*apidiscoveryv2.APIGroupDiscoveryList, []string) {
	t.Helper()
	d, err := pruneAggregated(bytes.NewReader(doc), max)
	out, notes := d.body, d.notes
	if err != nil {
		t.Fatalf("pruneAggregated: %v", err)
	}
	if len(out) > max {
		t.Fatalf("pruned to %d bytes, over the limit of %d", len(out), max)
	}
	var l apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(out, &l); err != nil {
		t.Fatalf("the pruned document does not decode: %v", err)
	}
	return &l, notes
}

// TestPruneKeepsARealDocument: a document within every bound comes out as it went in, however
// it is spaced and escaped.
func TestPruneKeepsARealDocument(t *testing.T) {
	g := discoveryGroup("stable.example.com", 3, 5, 3)
	g.Versions[0].Resources[0].ShortNames = []string{"th", "caf\u00e9", `q"uote\back`, "\u2028"}
	in := discoveryDoc(t, discoveryGroup("", 1, 30, 0), discoveryGroup("apps", 2, 10, 1), g)
	for _, indent := range []bool{false, true} {
		var doc []byte
		if indent {
			doc, _ = json.MarshalIndent(in, "  ", "\t")
		} else {
			doc, _ = json.Marshal(in)
		}
		got, notes := prune(t, doc, 1<<20)
		if len(notes) > 0 {
			t.Errorf("notes for a document within the bounds: %q", notes)
		}
		if !equality.Semantic.DeepEqual(got, in) {
			t.Errorf("indent %v: the pruned document differs from the original", indent)
		}
	}
}

// TestPruneBounds: lists over their bounds keep their first elements; a group that does not fit
// what is left of the limit, or that holds a string no real name has, is left out whole, named
// in a note, and the groups after it are kept.
func TestPruneBounds(t *testing.T) {
	bloated := discoveryGroup("bloated.example.com", 70, 1, 8000)
	long := discoveryGroup("long.example.com", 1, 1, 0)
	long.Versions[0].Resources[0].Resource = strings.Repeat("r", 5000)
	huge := discoveryGroup("huge.example.com", 1, 3000, 0) // about 800 KB
	doc, _ := json.Marshal(discoveryDoc(t, discoveryGroup("apps", 1, 5, 0), bloated, long, huge, discoveryGroup("batch", 1, 2, 0)))
	if len(doc) < 30<<20 {
		t.Fatalf("the document is only %d bytes", len(doc))
	}
	got, notes := prune(t, doc, 512<<10)

	var names []string
	for _, g := range got.Items {
		names = append(names, g.Name)
	}
	if want := "apps bloated.example.com batch"; strings.Join(names, " ") != want {
		t.Errorf("groups kept: %v, want %s", names, want)
	}
	if len(got.Items) == 3 {
		b := got.Items[1]
		if len(b.Versions) != objects.MaxDiscoveryVersions {
			t.Errorf("bloated group: %d versions kept, want %d", len(b.Versions), objects.MaxDiscoveryVersions)
		}
		if c := b.Versions[0].Resources[0].Categories; len(c) != objects.MaxDiscoveryResourceStrings || c[0] != bloated.Versions[0].Resources[0].Categories[0] {
			t.Errorf("bloated group: %d categories kept, want the first %d", len(c), objects.MaxDiscoveryResourceStrings)
		}
	}
	all := strings.Join(notes, "\n")
	for _, want := range []string{
		"more than 64 versions", "more than 64 categories",
		`group "long.example.com" left out: a string longer than 1024 bytes`,
		`group "huge.example.com" left out: over what is left of the body limit`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("notes %q: nothing says %q", notes, want)
		}
	}
	if len(notes) != 4 {
		t.Errorf("%d notes, want one per kind of thing left out: %q", len(notes), notes)
	}
}

// TestPruneGroupCount: groups past objects.MaxDiscoveryGroups are left out.
func TestPruneGroupCount(t *testing.T) {
	var gs []apidiscoveryv2.APIGroupDiscovery
	for i := range objects.MaxDiscoveryGroups + 10 {
		gs = append(gs, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("g%d.example.com", i)}})
	}
	doc, _ := json.Marshal(discoveryDoc(t, gs...))
	got, notes := prune(t, doc, 8<<20)
	if len(got.Items) != objects.MaxDiscoveryGroups || len(notes) != 1 || !strings.Contains(notes[0], "more than 2000 groups") {
		t.Errorf("%d groups kept, notes %q; want %d and one note", len(got.Items), notes, objects.MaxDiscoveryGroups)
	}
}

// TestPruneRefuses: malformed JSON and a document over the limit outside its groups fail; a
// document pruned without error is valid JSON within the limit (FuzzPrune).
func TestPruneRefuses(t *testing.T) {
	deep := `{"items":[{"metadata":{"name":"x"},"a":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}]}`
	for _, doc := range []string{
		``, `[]`, `{`, `{"items":[}`, `{"a":1,}`, `{"a":1 "b":2}`, `{"items":[{}] x`, `{} {}`,
		"{\"a\":\"\x01\"}", `{"a":"\q"}`, `{"a":tru}`, `{"a":"\u12g4"}`, `{"a":01x}`, `{"a":-}`, `{"a":1.}`,
		`{"items":{}}`, `{"items":[1]}`, `{a:1}`, deep,
		`{"pad":"` + strings.Repeat("x", 2000) + `"}`,
	} {
		d, err := pruneAggregated(strings.NewReader(doc), 1<<20)
		out := d.body
		if err == nil {
			t.Errorf("%.60q: no error, pruned to %.60q", doc, out)
		}
	}
	var top *topOverError
	_, err := pruneAggregated(strings.NewReader(`{"pad":"`+strings.Repeat("x", 2000)+`"}`), 1<<20)
	if !errors.As(err, &top) {
		t.Errorf("a long string outside the groups: %v, want a topOverError", err)
	}
}

func FuzzPrune(f *testing.F) {
	real, _ := json.Marshal(discoveryDoc(f, discoveryGroup("apps", 2, 2, 2), discoveryGroup("", 1, 3, 0)))
	for _, seed := range []string{string(real), `{"items":[]}`, `{"a":[1,2.5e-3,true,false,null,{"b":"\u00e9"}]}`, `{"items":[{"metadata":{"name":"x"}},{}]}`} {
		f.Add([]byte(seed), 300)
	}
	f.Fuzz(func(t *testing.T, doc []byte, max int) {
		if max < 0 || max > 1<<20 {
			return
		}
		d, err := pruneAggregated(bytes.NewReader(doc), max)
		out := d.body
		if err != nil {
			return
		}
		if len(out) > max || !json.Valid(out) {
			t.Fatalf("pruned %q to %q (%d bytes, limit %d): not valid JSON within the limit", doc, out, len(out), max)
		}
	})
}

// repeated reads chunk n times without holding more than chunk.
type repeated struct {
	chunk []byte
	n     int
	off   int
}

func (r *repeated) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	k := copy(p, r.chunk[r.off:])
	if r.off += k; r.off == len(r.chunk) {
		r.off, r.n = 0, r.n-1
	}
	return k, nil
}

// TestPruneMemory: pruning 200 MB of a bloated group (a list of a million categories, a string
// of 100 MB) allocates a few times the limit, not the document.
func TestPruneMemory(t *testing.T) {
	const limit = 1 << 20
	doc := io.MultiReader(
		strings.NewReader(`{"kind":"APIGroupDiscoveryList","items":[{"metadata":{"name":"bloated.example.com"},"versions":[{"version":"v1","resources":[{"resource":"things","categories":[`),
		&repeated{chunk: []byte(`"` + strings.Repeat("c", 98) + `",`), n: 1_000_000},
		strings.NewReader(`"c"]}]}]},{"metadata":{"name":"long.example.com"},"x":"`),
		&repeated{chunk: bytes.Repeat([]byte("x"), 1<<20), n: 100},
		strings.NewReader(`"},{"metadata":{"name":"batch"}}]}`),
	)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d, err := pruneAggregated(doc, limit)
	out, notes := d.body, d.notes
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*limit {
		t.Errorf("%d MiB allocated pruning 200 MB into %d bytes", alloc>>20, limit)
	}
	var l apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(out, &l); err != nil || len(l.Items) != 2 || l.Items[1].Name != "batch" ||
		len(l.Items[0].Versions[0].Resources[0].Categories) != objects.MaxDiscoveryResourceStrings {
		t.Errorf("pruned: %v, %d groups; want bloated.example.com with 64 categories, and batch", err, len(l.Items))
	}
	if len(notes) != 2 {
		t.Errorf("notes: %q, want the categories and the long group", notes)
	}
}
