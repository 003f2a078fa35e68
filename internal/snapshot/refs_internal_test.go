package snapshot

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
)

func testResources(t *testing.T) (*Resources, map[string]string) {
	t.Helper()
	topo, p, cfg := testInput(t)
	res, err := Build(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res, (&builder{p: p, t: topo, cfg: config{Config: cfg}}).producible()
}

func without(list []types.Resource, name string) []types.Resource {
	var out []types.Resource
	for _, r := range list {
		if cachev3.GetResourceName(r) != name {
			out = append(out, r)
		}
	}
	return out
}

// TestCheckReferences corrupts a good configuration in the ways the reference check exists
// for, and expects each to be named.
func TestCheckReferences(t *testing.T) {
	res, producible := testResources(t)
	if errs := checkReferences(res, producible); len(errs) != 0 {
		t.Fatalf("good configuration: %v", errs)
	}
	for _, tc := range []struct {
		name    string
		corrupt func(r *Resources)
		want    []string
	}{
		{"secret missing", func(r *Resources) { r.Secrets = without(r.Secrets, SecretPeerCA) },
			[]string{`cluster kube-apiservers refers to SDS secret "kube-mvp-peer-ca"`, `cluster kube-apiservers-serving refers to SDS secret "kube-mvp-peer-ca"`}},
		{"serving secret missing", func(r *Resources) { r.Secrets = without(r.Secrets, SecretServingCert) },
			[]string{`listener kube-apiserver refers to SDS secret "kube-mvp-serving-cert"`}},
		{"serving-sets cluster missing", func(r *Resources) {
			r.Clusters = without(r.Clusters, contract.ClusterServingSets)
			r.Endpoints = without(r.Endpoints, contract.ClusterServingSets)
		}, []string{`extproc can route batch/v1/jobs to cluster "kube-apiservers-serving"`}},
		{"default cluster missing", func(r *Resources) { r.Clusters = without(r.Clusters, contract.ClusterDefault) },
			[]string{`route "default" of route configuration kube-apiserver goes to cluster "kube-apiservers"`, `endpoints resource "kube-apiservers" has no cluster`}},
		{"extproc cluster missing", func(r *Resources) { r.Clusters = without(r.Clusters, ExtProcClusterName) },
			[]string{`ext_proc filter uses cluster "kube-mvp-extproc"`}},
		{"endpoints missing", func(r *Resources) { r.Endpoints = without(r.Endpoints, contract.ClusterDefault) },
			[]string{`EDS cluster kube-apiservers has no endpoints resource`}},
		{"duplicate", func(r *Resources) { r.Clusters = append(r.Clusters, r.Clusters[0].(*clusterv3.Cluster)) },
			[]string{`cluster "kube-apiservers" is defined twice`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, producible := testResources(t)
			tc.corrupt(res)
			var msgs []string
			for _, err := range checkReferences(res, producible) {
				msgs = append(msgs, err.Error())
			}
			all := strings.Join(msgs, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("errors do not mention %s:\n%s", w, all)
				}
			}
		})
	}
}
