package objects

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

func aggregated(groups ...apidiscoveryv2.APIGroupDiscovery) *apidiscoveryv2.APIGroupDiscoveryList {
	return &apidiscoveryv2.APIGroupDiscoveryList{
		TypeMeta: metav1.TypeMeta{Kind: "APIGroupDiscoveryList", APIVersion: "apidiscovery.k8s.io/v2"},
		Items:    groups,
	}
}

func group(name string, versions ...apidiscoveryv2.APIVersionDiscovery) apidiscoveryv2.APIGroupDiscovery {
	return apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: name}, Versions: versions}
}

func gv(version string, resources ...apidiscoveryv2.APIResourceDiscovery) apidiscoveryv2.APIVersionDiscovery {
	return apidiscoveryv2.APIVersionDiscovery{Version: version, Resources: resources, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
}

func res(name, kind string, verbs []string, subs ...string) apidiscoveryv2.APIResourceDiscovery {
	r := apidiscoveryv2.APIResourceDiscovery{Resource: name, Verbs: verbs, Scope: apidiscoveryv2.ScopeNamespace,
		ResponseKind: &metav1.GroupVersionKind{Kind: kind}}
	for _, s := range subs {
		r.Subresources = append(r.Subresources, apidiscoveryv2.APISubresourceDiscovery{Subresource: s, Verbs: []string{"get", "update"}})
	}
	return r
}

// TestMergeDiscovery: the union of what every apiserver serves, core group left to /api,
// verbs and subresources united, versions by priority, independent of the input order but
// for groups.
func TestMergeDiscovery(t *testing.T) {
	core := group("", gv("v1", res("pods", "Pod", []string{"get", "list"})))
	a := aggregated(core,
		group("apps", gv("v1", res("deployments", "Deployment", []string{"get", "list"}, "status"))),
		group("batch", gv("v1", res("jobs", "Job", []string{"create", "get", "list"}, "status"))),
		group("autoscaling", gv("v1", res("horizontalpodautoscalers", "HorizontalPodAutoscaler", []string{"get"}))),
	)
	b := aggregated(core, // batch/v1 turned off, a newer autoscaling version and a new resource
		group("apps", gv("v1",
			res("statefulsets", "StatefulSet", []string{"get"}),
			res("deployments", "Deployment", []string{"get", "list", "watch"}, "scale"))),
		group("autoscaling", gv("v2", res("horizontalpodautoscalers", "HorizontalPodAutoscaler", []string{"get"})),
			gv("v1", res("horizontalpodautoscalers", "HorizontalPodAutoscaler", []string{"get", "watch"}))),
	)
	m := MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{b, a})
	if m == nil {
		t.Fatal("no merged document")
	}
	if again := MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{a, b}); again == nil || string(again.JSON) != string(m.JSON) || again.ETag != m.ETag {
		t.Errorf("the merge depends on the input order")
	}
	var got apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(m.JSON, &got); err != nil {
		t.Fatal(err)
	}
	if got.Kind != "APIGroupDiscoveryList" || got.APIVersion != "apidiscovery.k8s.io/v2" {
		t.Errorf("type %v", got.TypeMeta)
	}
	var names []string
	for _, g := range got.Items {
		names = append(names, g.Name)
	}
	if !slices.Equal(names, []string{"apps", "batch", "autoscaling"}) { // a's order: it has the most groups
		t.Fatalf("groups %v", names)
	}
	apps := got.Items[0].Versions[0].Resources
	if len(apps) != 2 || apps[0].Resource != "deployments" || apps[1].Resource != "statefulsets" {
		t.Fatalf("apps/v1 resources %+v", apps)
	}
	if !slices.Equal(apps[0].Verbs, []string{"get", "list", "watch"}) || apps[0].ResponseKind.Kind != "Deployment" {
		t.Errorf("deployments %+v", apps[0])
	}
	if len(apps[0].Subresources) != 2 || apps[0].Subresources[0].Subresource != "scale" || apps[0].Subresources[1].Subresource != "status" {
		t.Errorf("deployments subresources %+v", apps[0].Subresources)
	}
	if jobs := got.Items[1].Versions[0].Resources; len(jobs) != 1 || jobs[0].Resource != "jobs" {
		t.Errorf("batch/v1 %+v", jobs)
	}
	if vs := got.Items[2].Versions; len(vs) != 2 || vs[0].Version != "v2" || vs[1].Version != "v1" ||
		!slices.Equal(vs[1].Resources[0].Verbs, []string{"get", "watch"}) {
		t.Errorf("autoscaling versions %+v", vs)
	}
	if len(m.ETag) != 66 || m.ETag[0] != '"' {
		t.Errorf("ETag %s", m.ETag)
	}

	// An apiserver whose discovery was rebuilt from legacy discovery (no kind): no merged view.
	legacy := &apidiscoveryv2.APIGroupDiscoveryList{Items: []apidiscoveryv2.APIGroupDiscovery{group("apps", gv("v1", res("deployments", "Deployment", []string{"get"})))}}
	if MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{a, legacy}) != nil {
		t.Error("merged with a legacy-only apiserver")
	}
	if MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{a, nil}) != nil || MergeDiscovery(nil) != nil {
		t.Error("merged with a missing document")
	}
}

// TestMergedDescriptionsByMajority: a resource that apiservers describe differently gets the
// description most of them give, whatever list has the most groups; verbs are still united.
// An even split goes to the earliest list (by apiserver ID).
func TestMergedDescriptionsByMajority(t *testing.T) {
	honest := res("daemonsets", "DaemonSet", []string{"get", "list"})
	liar := honest
	liar.Scope, liar.ShortNames, liar.Verbs = apidiscoveryv2.ScopeCluster, []string{"deploy"}, []string{"get", "delete"}
	// The liar lists the most groups (which used to make its descriptions the merged ones).
	bloated := aggregated(group("apps", gv("v1", liar)), group("a.example.com", gv("v1", res("as", "A", nil))), group("b.example.com", gv("v1", res("bs", "B", nil))))
	daemonsets := func(lists ...*apidiscoveryv2.APIGroupDiscoveryList) apidiscoveryv2.APIResourceDiscovery {
		t.Helper()
		var doc apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(MergeDiscovery(lists).JSON, &doc); err != nil {
			t.Fatal(err)
		}
		for _, g := range doc.Items {
			if g.Name == "apps" {
				return g.Versions[0].Resources[0]
			}
		}
		t.Fatal("no apps group")
		return apidiscoveryv2.APIResourceDiscovery{}
	}
	honestList := func() *apidiscoveryv2.APIGroupDiscoveryList { return aggregated(group("apps", gv("v1", honest))) }
	for _, order := range [][]*apidiscoveryv2.APIGroupDiscoveryList{
		{bloated, honestList(), honestList()}, {honestList(), bloated, honestList()}, {honestList(), honestList(), bloated},
	} {
		d := daemonsets(order...)
		if d.Scope != apidiscoveryv2.ScopeNamespace || len(d.ShortNames) != 0 || !slices.Equal(d.Verbs, []string{"delete", "get", "list"}) {
			t.Errorf("two of three apiservers describe daemonsets honestly; merged: scope %s, short names %v, verbs %v", d.Scope, d.ShortNames, d.Verbs)
		}
	}
	// One against one: the earlier list's, not the one with the most groups.
	if d := daemonsets(honestList(), bloated); d.Scope != apidiscoveryv2.ScopeNamespace || len(d.ShortNames) != 0 {
		t.Errorf("an even split went to the list with the most groups: scope %s, short names %v", d.Scope, d.ShortNames)
	}
}

// TestAggregatedRoutesBounded: an APIService gets a route of its own only once an apiserver
// with a Lease lists its group/version (its backend answers), and at most
// MaxAggregatedGroupVersions do; the rest are errors naming them.
func TestAggregatedRoutesBounded(t *testing.T) {
	var apiservices []topology.GroupVersion
	list := aggregated()
	for i := range MaxAggregatedGroupVersions + 50 {
		name := fmt.Sprintf("g%03d.example.com", i)
		apiservices = append(apiservices, topology.GroupVersion{Group: name, Version: "v1"}, topology.GroupVersion{Group: name, Version: "v2"}) // v2: no backend
		list.Items = append(list.Items, group(name, gv("v1", res("things", "Thing", []string{"get"}))))
	}
	unleased := aggregated(group("g999.example.com", gv("v2", res("things", "Thing", nil))))
	apiservices = append(apiservices, topology.GroupVersion{Group: "g999.example.com", Version: "v2"})
	routes, errs := aggregatedRoutes(apiservices, map[string]*apidiscoveryv2.APIGroupDiscoveryList{"a": list, "gone": unleased}, map[string]bool{"a": true})
	if len(routes) != MaxAggregatedGroupVersions || len(errs) != 50 {
		t.Fatalf("%d routes, %d errors; want %d and 50", len(routes), len(errs), MaxAggregatedGroupVersions)
	}
	for _, r := range routes {
		if r.Version != "v1" {
			t.Errorf("%s has a route; nothing lists it (or only an apiserver without a Lease)", r)
		}
	}
	if !strings.Contains(errs[0].Error(), "g256.example.com/v1") {
		t.Errorf("first error %q; want it to name the first group/version over the bound", errs[0])
	}
}

// TestMergedGroupOrderByPriority: with the APIServices' group priorities the merged groups
// are in kube-aggregator's order (higher first, then by name), whatever order the list with
// the most groups gives; groups no APIService names follow, by name.
func TestMergedGroupOrderByPriority(t *testing.T) {
	r := res("things", "Thing", []string{"get"})
	bloated := aggregated(group("z.example.com", gv("v1", r)), group("apps", gv("v1", r)), group("a.example.com", gv("v1", r)), group("unnamed.example.com", gv("v1", r)))
	honest := aggregated(group("apps", gv("v1", r)), group("a.example.com", gv("v1", r)))
	m := MergeDiscoveryOrdered([]*apidiscoveryv2.APIGroupDiscoveryList{honest, bloated}, map[string]int32{"apps": 17800, "a.example.com": 1000, "z.example.com": 1000})
	var doc apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(m.JSON, &doc); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range doc.Items {
		got = append(got, g.Name)
	}
	if want := []string{"apps", "a.example.com", "z.example.com", "unnamed.example.com"}; !slices.Equal(got, want) {
		t.Errorf("groups %v, want %v", got, want)
	}
}
