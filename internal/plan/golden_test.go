package plan_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/inventory/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var update = flag.Bool("update", false, "rewrite testdata/<case>.plan.yaml from the current plans (make golden)")

// fixtures are the snapshot golden fixtures: this test is the first layer of the same cases
// (fixture -> plan), internal/snapshot's TestGolden the second (plan -> Envoy resources).
const fixtures = "../snapshot/testdata"

// goldenNow and sidecarOf are internal/snapshot/golden_test.go's: the fixtures' Leases are
// judged at the same time, and the same case configures a sidecar.
var goldenNow = time.Date(2026, 11, 23, 10, 0, 10, 0, time.UTC)

var sidecarOf = map[string]string{
	"sidecar": "apiserver-nxibzygiy5v5qmcjmernh6erfe", // cp-b
}

// loadCase builds the topology of <fixtures>/<name>.in.yaml as the inventory would at goldenNow.
func loadCase(t *testing.T, name string) *topology.Topology {
	t.Helper()
	objs, err := objects.LoadFixture(filepath.Join(fixtures, name+".in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	topo, errs := objects.Build(objs, objects.Options{Now: goldenNow})
	for _, err := range errs {
		t.Errorf("inventory: %v", err)
	}
	if topo == nil {
		t.FailNow()
	}
	if id := sidecarOf[name]; id != "" {
		topo = topo.WithLocal(id)
	}
	return topo
}

// TestGolden builds the plan of every <fixtures>/<case>.in.yaml and compares its View (as
// /debug/topology shows it, in YAML) with testdata/<case>.plan.yaml; make golden (go test
// ./internal/plan -run TestGolden -update) rewrites them.
func TestGolden(t *testing.T) {
	ins, err := filepath.Glob(filepath.Join(fixtures, "*.in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) == 0 {
		t.Fatalf("no %s/*.in.yaml", fixtures)
	}
	cases := map[string]bool{}
	for _, in := range ins {
		name := strings.TrimSuffix(filepath.Base(in), ".in.yaml")
		cases[name] = true
		t.Run(name, func(t *testing.T) {
			p, err := plan.Build(loadCase(t, name))
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			got, err := yaml.Marshal(p.View())
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join("testdata", name+".plan.yaml")
			if *update {
				if err := os.WriteFile(out, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("%v (run make golden to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the plan; review the change with\n  make golden && git diff internal/plan/%s\n%s", out, out, firstDiff(string(want), string(got)))
			}
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
				t.Errorf("%s is the plan of no fixture (%s/<case>.in.yaml); remove it (make golden does)", path, fixtures)
			}
		}
	})
}

// firstDiff shows the first differing line.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("first difference at line %d:\n  want: %s\n  got:  %s", i+1, wl, gl)
		}
	}
	return ""
}
