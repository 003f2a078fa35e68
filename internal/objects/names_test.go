package objects_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestNamesKubernetesWouldRefuse: a group, version, resource or subresource name that
// Kubernetes would not accept (as a compromised apiserver, an APIService or a remembered
// entry could give one) is left out with an error naming where it came from and shown in the
// topology; everything else is used, and the merged discovery does not carry it either.
func TestNamesKubernetesWouldRefuse(t *testing.T) {
	bad := []topology.Resource{
		{Group: "evil#x.example.com", Version: "v1", Resource: "things"},
		{Group: "Upper.example.com", Version: "v1", Resource: "things"},
		{Group: "nul\x00.example.com", Version: "v1", Resource: "things"},
		{Group: "a.example.com", Version: "v1/", Resource: "things"},
		{Group: "a.example.com", Version: "1v", Resource: "things"},
		{Group: "a.example.com", Version: "v2", Resource: "Jobs"},
		{Group: "a.example.com", Version: "v2", Resource: "jöbs"},
		{Group: "a.example.com", Version: "v2", Resource: "line\nbreak"},
		{Group: "a.example.com", Version: "v2", Resource: strings.Repeat("x", 100<<10)},
		{Group: "a.example.com", Version: "v2", Resource: "widgets", Subresource: "st atus"},
	}
	good := []topology.Resource{jobs, jobsStatus, pods, {Group: "a.example.com", Version: "v2", Resource: "widgets"}}
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	objs := objects.Objects{
		Leases:    []coordinationv1.Lease{leaseAt(idA, now), leaseAt(idB, now)},
		Discovery: map[string]*apidiscoveryv2.APIGroupDiscoveryList{idA: discoveryOf(append(good, bad...)), idB: discoveryOf([]topology.Resource{pods})},
		// A departed apiserver remembered with a bad name: the same check on read.
		Remembered: memory.Memory{idC: {Hostname: "c", Address: addressOf(idC), LastSeen: now, Served: []topology.Resource{
			{Group: "evil#y.example.com", Version: "v1", Resource: "things"}, {Group: "c.example.com", Version: "v1", Resource: "gadgets"}}}},
		Authentication: &corev1.ConfigMap{Data: map[string]string{"requestheader-username-headers": `["X-Remote-User"]`,
			"requestheader-group-headers":        `["X-Remote-Group"]`,
			"requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`}},
	}
	objs.APIServices = append(objs.APIServices, objects.APIService{})
	objs.APIServices[0].Name = "v1.evil#z.example.com"
	objs.APIServices[0].Spec.Group, objs.APIServices[0].Spec.Version = "evil#z.example.com", "v1"
	objs.APIServices[0].Spec.Service = &struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	}{Namespace: "default", Name: "evil"}

	for _, l := range objs.Discovery {
		l.Kind = objects.AggregatedKind // as fetched: the merge takes only aggregated discovery
	}
	topo, errs := objects.Build(objs, objects.Options{Now: now})
	if topo == nil {
		t.Fatalf("no topology: %v", errs)
	}
	var nameErrs []string
	for _, err := range errs {
		if ne, ok := err.(*objects.NameError); ok {
			nameErrs = append(nameErrs, ne.Error())
		}
	}
	if len(nameErrs) != len(bad)+2 || len(topo.RefusedNames) != len(nameErrs) {
		t.Errorf("%d name errors, %d refused names; want %d (each bad discovery name, the remembered one, the APIService's):\n%s",
			len(nameErrs), len(topo.RefusedNames), len(bad)+2, strings.Join(nameErrs, "\n"))
	}
	for _, want := range []string{"discovery of apiserver " + idA + `: group "evil#x.example.com" left out`,
		"apiserver " + idC, "APIService v1.evil#z.example.com", "(102400 bytes)"} {
		if !strings.Contains(strings.Join(nameErrs, "\n"), want) {
			t.Errorf("no name error says %q:\n%s", want, strings.Join(nameErrs, "\n"))
		}
	}
	for _, r := range bad {
		if _, ok := topo.Served[r]; ok {
			t.Errorf("%.60q is served", r.String())
		}
	}
	for _, r := range append(good, topology.Resource{Group: "c.example.com", Version: "v1", Resource: "gadgets"}) {
		if _, ok := topo.Served[r]; !ok && r != pods {
			t.Errorf("%s is not served: a bad name elsewhere must not cost it", r)
		}
	}
	if topo.Discovery == nil {
		t.Fatal("no merged discovery")
	}
	for _, b := range []string{"evil#x", "Upper.example.com", "Jobs", "st atus", "line\\nbreak"} {
		if strings.Contains(string(topo.Discovery.JSON), b) {
			t.Errorf("the merged discovery carries %q", b)
		}
	}
}

// TestDiscoveryBounds: an apiserver's discovery over the bounds (a CRD with thousands of
// categories, more groups, versions or resources than any cluster has) costs its own
// entries: what is over a bound is left out with one error per bound, the rest is used.
func TestDiscoveryBounds(t *testing.T) {
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	list := discoveryOf([]topology.Resource{jobs, pods})
	list.Kind = objects.AggregatedKind
	var categories []string
	for i := range 8000 {
		categories = append(categories, fmt.Sprintf("category-%d", i))
	}
	bloated := apidiscoveryv2.APIGroupDiscovery{}
	bloated.Name = "bloat.example.com"
	for v := range objects.MaxDiscoveryVersions + 10 {
		bloated.Versions = append(bloated.Versions, apidiscoveryv2.APIVersionDiscovery{Version: fmt.Sprintf("v%d", v+1),
			Resources: []apidiscoveryv2.APIResourceDiscovery{{Resource: "widgets", Categories: categories, Verbs: []string{"get"}}}})
	}
	list.Items = append(list.Items, bloated)
	for g := range objects.MaxDiscoveryGroups {
		list.Items = append(list.Items, apidiscoveryv2.APIGroupDiscovery{})
		list.Items[len(list.Items)-1].Name = fmt.Sprintf("g%d.example.com", g)
	}
	objs := objects.Objects{
		Leases:    []coordinationv1.Lease{leaseAt(idA, now)},
		Discovery: map[string]*apidiscoveryv2.APIGroupDiscoveryList{idA: list},
		Authentication: &corev1.ConfigMap{Data: map[string]string{"requestheader-username-headers": `["X-Remote-User"]`,
			"requestheader-group-headers":        `["X-Remote-Group"]`,
			"requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`}},
	}
	topo, errs := objects.Build(objs, objects.Options{Now: now})
	if topo == nil {
		t.Fatalf("no topology: %v", errs)
	}
	var msgs []string
	for _, err := range errs {
		msgs = append(msgs, err.Error())
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{"more than 2000 groups", "more than 64 versions in a group", "more than 64 short names, categories or verbs"} {
		if !strings.Contains(all, want) {
			t.Errorf("no error says %q:\n%s", want, all)
		}
	}
	if len(errs) != 3 {
		t.Errorf("%d errors, want one per bound:\n%s", len(errs), all)
	}
	for _, r := range []topology.Resource{jobs, {Group: "bloat.example.com", Version: "v64", Resource: "widgets"}} {
		if _, ok := topo.Served[r]; !ok {
			t.Errorf("%s left out; only what is over a bound may be", r)
		}
	}
	if _, ok := topo.Served[topology.Resource{Group: "bloat.example.com", Version: "v65", Resource: "widgets"}]; ok {
		t.Error("the 65th version of a group is used")
	}
	if n := strings.Count(string(topo.Discovery.JSON), "category-"); n != objects.MaxDiscoveryVersions*objects.MaxDiscoveryResourceStrings {
		t.Errorf("the merged discovery carries %d categories, want %d", n, objects.MaxDiscoveryVersions*objects.MaxDiscoveryResourceStrings)
	}
}

// TestDiscoveryMemoBuildsTheSame: a build that reuses the earlier builds' names check
// (objects.Options.Checked, as the watcher's rebuilds do) gives what a build checking afresh
// gives, errors included, each time; a list fetched anew is checked anew.
func TestDiscoveryMemoBuildsTheSame(t *testing.T) {
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	withBad := discoveryOf([]topology.Resource{jobs, pods, {Group: "a.example.com", Version: "v2", Resource: "Jobs"}})
	objs := objects.Objects{
		Leases:    []coordinationv1.Lease{leaseAt(idA, now), leaseAt(idB, now)},
		Discovery: map[string]*apidiscoveryv2.APIGroupDiscoveryList{idA: withBad, idB: withBad},
	}
	checked := &objects.DiscoveryMemo{}
	same := func(what string) {
		t.Helper()
		want, wantErrs := objects.Build(objs, objects.Options{Now: now})
		got, gotErrs := objects.Build(objs, objects.Options{Now: now, Memo: checked})
		if !reflect.DeepEqual(got, want) || fmt.Sprint(gotErrs) != fmt.Sprint(wantErrs) {
			t.Errorf("%s: with the earlier check:\n%+v\n%v\nchecked afresh:\n%+v\n%v", what, got, gotErrs, want, wantErrs)
		}
	}
	same("first build")
	same("rebuild") // the same lists: the check is reused, and the errors name each apiserver
	objs.Discovery[idA] = discoveryOf([]topology.Resource{jobs, pods})
	same("cp-a fetched again, without the bad name")
	if _, errs := objects.Build(objs, objects.Options{Now: now, Memo: checked}); len(errs) != 1 || !strings.Contains(errs[0].Error(), idB) {
		t.Errorf("after cp-a's new list: %v; want only cp-b's bad name", errs)
	}
}

// TestDiscoveryMemoMergesOnlyWhatChanged: the merged document is merged again when a
// discovery list or a group's priority changed, and only then; each time it is what a
// fresh build merges.
func TestDiscoveryMemoMergesOnlyWhatChanged(t *testing.T) {
	objs := crdCluster(30) // three CRD groups, all at priority 1000
	memo := &objects.DiscoveryMemo{}
	build := func(what string) *topology.Discovery {
		t.Helper()
		want, _ := objects.Build(objs, objects.Options{Now: t0})
		got, _ := objects.Build(objs, objects.Options{Now: t0, Memo: memo})
		if got == nil || got.Discovery == nil || !reflect.DeepEqual(got.Discovery, want.Discovery) {
			t.Fatalf("%s: merged with the memo:\n%v\nmerged afresh:\n%v", what, got, want)
		}
		return got.Discovery
	}
	first := build("first build")
	if build("rebuild") != first {
		t.Error("a rebuild with the same lists and priorities merged the document again")
	}
	objs.APIServices[2].Spec.GroupPriorityMinimum = 2000
	raised := build("g00002 raised")
	if raised == first || !strings.Contains(string(raised.JSON), `"items":[{"metadata":{"name":"g00002.example.com"}`) {
		t.Errorf("a raised priority did not reorder the groups: %.200s", raised.JSON)
	}
	objs.Discovery[idA] = objs.Discovery[idA].DeepCopy()
	objs.Discovery[idA].Items[len(objs.Discovery[idA].Items)-1].Name = "fresh.example.com"
	if fetched := build("cp-a fetched again"); !strings.Contains(string(fetched.JSON), "fresh.example.com") {
		t.Error("a new list of cp-a was not merged")
	}
}
