package inventory

import (
	"strings"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
)

// TestLegacyDiscoveryIsMerged: discovery rebuilt from client-go's legacy lists keeps what
// they say of each resource (kind, scope, names, verbs, a subresource's own kind), so an
// apiserver that offers only legacy discovery is merged like the others: one such apiserver
// no longer switches the merged /apis off for every client.
func TestLegacyDiscoveryIsMerged(t *testing.T) {
	own := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}}
	legacy := fromResourceLists([]*metav1.APIResourceList{{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{
		{Name: "deployments", SingularName: "deployment", Namespaced: true, Kind: "Deployment", Verbs: []string{"get", "list"}, ShortNames: []string{"deploy"}, Categories: []string{"all"}},
		{Name: "deployments/status", Kind: "Deployment", Verbs: []string{"get"}},
		{Name: "deployments/scale", Group: "autoscaling", Version: "v1", Kind: "Scale", Verbs: []string{"get"}}}}})
	if objects.MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{own}) == nil {
		t.Fatal("no merged view of an apiserver's own aggregated document")
	}
	merged := objects.MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{own, legacy})
	if merged == nil || !strings.Contains(string(merged.JSON), `"deployments"`) {
		t.Fatalf("a legacy-only apiserver is not merged: %v", merged)
	}
	if len(legacy.Items) != 1 || legacy.Items[0].Name != "apps" || len(legacy.Items[0].Versions) != 1 {
		t.Fatalf("regrouped %+v", legacy.Items)
	}
	r := legacy.Items[0].Versions[0].Resources
	if len(r) != 1 || r[0].Resource != "deployments" || r[0].Scope != apidiscoveryv2.ScopeNamespace || r[0].SingularResource != "deployment" ||
		r[0].ResponseKind == nil || *r[0].ResponseKind != (metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}) ||
		len(r[0].ShortNames) != 1 || len(r[0].Categories) != 1 {
		t.Fatalf("apps/v1 resources %+v", r)
	}
	if subs := r[0].Subresources; len(subs) != 2 || subs[1].Subresource != "scale" || subs[1].ResponseKind == nil ||
		*subs[1].ResponseKind != (metav1.GroupVersionKind{Group: "autoscaling", Version: "v1", Kind: "Scale"}) {
		t.Errorf("subresources %+v", subs)
	}
}
