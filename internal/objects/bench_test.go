package objects_test

import (
	"fmt"
	"slices"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
)

// crdCluster is what xds-server's inventory holds for two live apiservers that both serve n
// CRDs, crdsPerGroup to a group (as big providers install them: many groups of a few kinds),
// with the APIService the apiservers create for each CRD group/version.
func crdCluster(n int) objects.Objects {
	const crdsPerGroup = 10
	list := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}}
	for _, g := range []string{"", "apps", "batch", "policy", "rbac.authorization.k8s.io"} {
		list.Items = append(list.Items, apidiscoveryv2.APIGroupDiscovery{
			ObjectMeta: metav1.ObjectMeta{Name: g},
			Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: "v1", Resources: []apidiscoveryv2.APIResourceDiscovery{
				{Resource: "things", Scope: apidiscoveryv2.ScopeNamespace, Verbs: []string{"get", "list", "watch"}, Subresources: []apidiscoveryv2.APISubresourceDiscovery{{Subresource: "status"}}},
			}}},
		})
	}
	var services []objects.APIService
	for i := 0; i < n; i += crdsPerGroup {
		group := fmt.Sprintf("g%05d.example.com", i/crdsPerGroup)
		v := apidiscoveryv2.APIVersionDiscovery{Version: "v1"}
		for j := i; j < min(n, i+crdsPerGroup); j++ {
			v.Resources = append(v.Resources, apidiscoveryv2.APIResourceDiscovery{
				Resource: fmt.Sprintf("widgets%05d", j), Scope: apidiscoveryv2.ScopeNamespace,
				ResponseKind: &metav1.GroupVersionKind{Group: group, Version: "v1", Kind: fmt.Sprintf("Widget%05d", j)},
				Verbs:        []string{"create", "delete", "get", "list", "patch", "update", "watch"},
				Subresources: []apidiscoveryv2.APISubresourceDiscovery{{Subresource: "status"}},
			})
		}
		list.Items = append(list.Items, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: group}, Versions: []apidiscoveryv2.APIVersionDiscovery{v}})
		var s objects.APIService
		s.Name = "v1." + group
		s.Labels = map[string]string{objects.AutomanagedLabel: "true"}
		s.Spec.Group, s.Spec.Version, s.Spec.GroupPriorityMinimum = group, "v1", 1000
		services = append(services, s)
	}
	return objects.Objects{
		Leases:      []coordinationv1.Lease{leaseAt(idA, t0), leaseAt(idB, t0)},
		Discovery:   map[string]*apidiscoveryv2.APIGroupDiscoveryList{idA: list, idB: list.DeepCopy()},
		APIServices: services,
	}
}

// BenchmarkBuildWithCRDs is one rebuild of the inventory (objects.Build) with n CRDs,
// reporting its time per CRD. "first" checks every discovery list's names and merges every
// group, as the first build does; "again" is a rebuild with nothing fetched since (a Lease
// renewal, the re-judging tick: the watcher's objects.DiscoveryMemo); "fetched" follows a
// fetch of one apiserver's discovery in which one group changed (a CRD burst: the fetch keeps
// the groups whose bytes did not change).
func BenchmarkBuildWithCRDs(b *testing.B) {
	for _, n := range []int{200, 1000, 2000, 10000} {
		for _, kind := range []string{"first", "again", "fetched"} {
			b.Run(fmt.Sprintf("%d/%s", n, kind), func(b *testing.B) {
				objs := crdCluster(n)
				opts := objects.Options{Now: t0}
				if kind != "first" {
					opts.Memo = &objects.DiscoveryMemo{}
					objects.Build(objs, opts)
				}
				b.ResetTimer()
				for i := range b.N {
					if kind == "fetched" {
						b.StopTimer()
						objs.Discovery[idA] = withOneGroupFetchedAgain(objs.Discovery[idA], i)
						b.StartTimer()
					}
					if topo, errs := objects.Build(objs, opts); topo == nil || len(errs) > 0 {
						b.Fatal(errs)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/crd")
			})
		}
	}
}

// withOneGroupFetchedAgain is list as a new fetch gives it when the i-th group (cycling)
// changed: a new list, that group decoded anew, every other group the same.
func withOneGroupFetchedAgain(list *apidiscoveryv2.APIGroupDiscoveryList, i int) *apidiscoveryv2.APIGroupDiscoveryList {
	out := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: list.TypeMeta, Items: slices.Clone(list.Items)}
	j := i % len(out.Items)
	out.Items[j] = *out.Items[j].DeepCopy()
	return out
}
