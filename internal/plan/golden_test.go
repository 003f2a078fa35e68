package plan_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/plan"
)

var update = flag.Bool("update", false, "rewrite testdata/<case>.plan.yaml from the current plans (make golden)")

// TestGolden builds the plan of every fixture (internal/fixtures) and compares its View (as
// /debug/topology shows it, in YAML) with testdata/<case>.plan.yaml; make golden (go test
// ./internal/plan -run TestGolden -update) rewrites them.
func TestGolden(t *testing.T) {
	cases := map[string]bool{}
	for _, name := range fixtures.Names(t) {
		cases[name] = true
		t.Run(name, func(t *testing.T) {
			p, err := plan.Build(fixtures.Topology(t, name))
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			got, err := yaml.Marshal(p.View())
			if err != nil {
				t.Fatal(err)
			}
			fixtures.Golden(t, filepath.Join("testdata", name+".plan.yaml"), got, *update)
		})
	}
	t.Run("no stale goldens", func(t *testing.T) {
		entries, err := os.ReadDir("testdata")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			path := filepath.Join("testdata", e.Name())
			name, isPlan := strings.CutSuffix(e.Name(), ".plan.yaml")
			switch {
			case e.IsDir() || !isPlan:
				t.Errorf("%s is no golden plan (<case>.plan.yaml); remove it", path)
			case cases[name]:
			case *update:
				if err := os.Remove(path); err != nil {
					t.Error(err)
				}
			default:
				t.Errorf("%s is the plan of no fixture (%s/<case>.in.yaml); remove it (make golden does)", path, fixtures.Dir())
			}
		}
	})
}
