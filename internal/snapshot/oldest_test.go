package snapshot_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// TestOldestEnvoyProtos: the protos Build checks against are those of xds.MinEnvoyVersion, and
// tools/envoyprotos, which lists them, requires that release of go-control-plane/envoy (so a
// raised minimum with a list not regenerated fails here; `make envoy-protos ENVOY=vX.Y.Z`).
func TestOldestEnvoyProtos(t *testing.T) {
	min := fmt.Sprintf("%d.%d.%d", xds.MinEnvoyVersion[0], xds.MinEnvoyVersion[1], xds.MinEnvoyVersion[2])
	if got := snapshot.OldestEnvoy(); got != min {
		t.Errorf("oldest-envoy-protos.txt lists Envoy %s's protos; xds.MinEnvoyVersion is %s: run make envoy-protos ENVOY=v%s", got, min, min)
	}
	gomod, err := os.ReadFile(filepath.Join("..", "..", "tools", "envoyprotos", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/envoyproxy/go-control-plane/envoy v(\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("tools/envoyprotos/go.mod requires no github.com/envoyproxy/go-control-plane/envoy")
	}
	if string(m[1]) != snapshot.OldestEnvoy() {
		t.Errorf("tools/envoyprotos requires go-control-plane/envoy v%s, the list is of %s: run make envoy-protos", m[1], snapshot.OldestEnvoy())
	}
}

// TestOldestEnvoyFixtures: the configuration of every fixture uses only what the oldest
// supported Envoy knows, by CheckOldestEnvoy's reflective walk of each resource (Build checks
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
					for _, err := range snapshot.CheckOldestEnvoy(r) {
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
