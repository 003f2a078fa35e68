package snapshot_test

import (
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/oldestenvoy"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// TestOldestEnvoyFixtures: the configuration of every fixture uses only what the oldest
// supported Envoy knows, by oldestenvoy.Check's reflective walk of each resource (Build checks
// the wire form; the two must agree).
func TestOldestEnvoyFixtures(t *testing.T) {
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			res, err := snapshot.Build(mustPlan(t, loadCase(t, name)), testConfig())
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, list := range [][]types.Resource{res.Listeners, res.Routes, res.Clusters, res.Endpoints, res.Secrets} {
				for _, r := range list {
					n++
					for _, err := range oldestenvoy.Check(r) {
						t.Error(err)
					}
				}
			}
			if n == 0 {
				t.Fatal("no resources")
			}
		})
	}
}
