package inventory

import (
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
)

// TestLegacyDiscoveryIsNotMerged: discovery rebuilt from client-go's legacy lists lacks kinds
// and scopes, so objects.MergeDiscovery gives no merged view with it rather than a partial one.
func TestLegacyDiscoveryIsNotMerged(t *testing.T) {
	own := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}}
	legacy := fromResourceLists([]*metav1.APIResourceList{{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{
		{Name: "deployments", Verbs: []string{"get"}}, {Name: "deployments/status", Verbs: []string{"get"}}}}})
	if objects.MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{own}) == nil {
		t.Fatal("no merged view of an apiserver's own aggregated document")
	}
	if objects.MergeDiscovery([]*apidiscoveryv2.APIGroupDiscoveryList{own, legacy}) != nil {
		t.Error("merged with a legacy-only apiserver")
	}
	if len(legacy.Items) != 1 || legacy.Items[0].Name != "apps" || len(legacy.Items[0].Versions) != 1 {
		t.Fatalf("regrouped %+v", legacy.Items)
	}
	if r := legacy.Items[0].Versions[0].Resources; len(r) != 1 || r[0].Resource != "deployments" ||
		len(r[0].Subresources) != 1 || r[0].Subresources[0].Subresource != "status" {
		t.Errorf("apps/v1 resources %+v", r)
	}
}
