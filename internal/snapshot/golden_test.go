package snapshot_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var update = flag.Bool("update", false, "rewrite testdata/<case>/<type>.yaml from the current output (make golden)")

// goldenTypes are the golden files of a case, testdata/<case>/<type>.yaml: one per resource
// type, the keys of the JSON form.
var goldenTypes = []string{"listeners", "routes", "clusters", "endpoints", "secrets"}

// routeSpecGolden is a case's route table as data (snapshot.RouteSpecYAML), beside its goldens.
const routeSpecGolden = "routespec.yaml"

func testConfig() snapshot.Config {
	return snapshot.Config{
		ExtProcAddress: "unix:/run/kube-mvp/extproc.sock",
		// The chart's layout: one mounted Secret per directory.
		Secrets: snapshot.SecretFiles{
			ServingCert:     "/etc/kube-mvp/serving/tls.crt",
			ServingKey:      "/etc/kube-mvp/serving/tls.key",
			ClientCA:        "/etc/kube-mvp/client-ca/ca.crt",
			ProxyClientCert: "/etc/kube-mvp/proxy-client/tls.crt",
			ProxyClientKey:  "/etc/kube-mvp/proxy-client/tls.key",
			PeerCA:          "/etc/kube-mvp/peer-ca/ca.crt",
		},
	}
}

// loadCase is the topology of a fixture (internal/fixtures).
func loadCase(t testing.TB, name string) *topology.Topology { return fixtures.Topology(t, name) }

// mustPlan is the plan of topo, as xds-server makes it before translating.
func mustPlan(t testing.TB, topo *topology.Topology) *plan.Plan {
	t.Helper()
	p, err := plan.Build(topo)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGolden translates the plan of every fixture (internal/fixtures) and compares each resource type with
// testdata/<case>/<type>.yaml (listeners, routes, clusters, endpoints, secrets), and the
// route table as data with testdata/<case>/routespec.yaml; make golden
// (go test ./internal/snapshot -run TestGolden -update) rewrites them. The plan each case is
// translated from is internal/plan's golden, testdata/<case>.plan.yaml there.
func TestGolden(t *testing.T) {
	names := fixtures.Names(t)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			p := mustPlan(t, loadCase(t, name))
			res, err := snapshot.Build(p, testConfig())
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			if _, err := res.Snapshot(); err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			byType, err := res.ToYAMLByType()
			if err != nil {
				t.Fatal(err)
			}
			if len(byType) != len(goldenTypes) {
				t.Fatalf("ToYAMLByType: %d types, want %d (%v)", len(byType), len(goldenTypes), goldenTypes)
			}
			for _, typ := range goldenTypes {
				got, ok := byType[typ]
				if !ok {
					t.Fatalf("ToYAMLByType has no %s", typ)
				}
				fixtures.Golden(t, filepath.Join("testdata", name, typ+".yaml"), got, *update)
			}
			spec, err := snapshot.RouteSpecYAML(p, testConfig())
			if err != nil {
				t.Fatal(err)
			}
			var parsed []map[string]any
			if err := yaml.UnmarshalStrict(spec, &parsed); err != nil || len(parsed) == 0 {
				t.Fatalf("RouteSpecYAML is no YAML list (%v):\n%s", err, spec)
			}
			fixtures.Golden(t, filepath.Join("testdata", name, routeSpecGolden), spec, *update)
		})
	}
	t.Run("no stale goldens", func(t *testing.T) {
		checkNoStaleGoldens(t, names)
	})
}

// checkNoStaleGoldens: testdata holds, besides the fixtures, a directory for each case only,
// each with the golden files of goldenTypes only. With -update it removes the others.
func checkNoStaleGoldens(t *testing.T, names []string) {
	cases := map[string]bool{}
	for _, n := range names {
		cases[n] = true
	}
	types := map[string]bool{routeSpecGolden: true}
	for _, typ := range goldenTypes {
		types[typ+".yaml"] = true
	}
	// stale reports a path that is no golden; -update removes it if it looks like an old
	// golden (YAML files only), never anything else.
	stale := func(path, why string) {
		if !*update {
			t.Errorf("%s %s; remove it (make golden removes old YAML goldens)", path, why)
			return
		}
		if !onlyYAML(t, path) {
			t.Errorf("%s %s and is not only YAML; -update leaves it, remove it by hand", path, why)
			return
		}
		if err := os.RemoveAll(path); err != nil {
			t.Error(err)
		}
	}
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		path := filepath.Join("testdata", e.Name())
		switch {
		case strings.HasSuffix(e.Name(), ".in.yaml"):
		case !e.IsDir():
			stale(path, "is neither a fixture (<case>.in.yaml) nor a case's directory of goldens")
		case !cases[e.Name()]:
			stale(path, "is the goldens of no fixture (<case>.in.yaml)")
		default:
			files, err := os.ReadDir(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				if !types[f.Name()] {
					stale(filepath.Join(path, f.Name()), fmt.Sprintf("is no golden file (%s.yaml, %s)", strings.Join(goldenTypes, ".yaml, "), routeSpecGolden))
				}
			}
		}
	}
}

// onlyYAML: path is a .yaml file, or a directory of .yaml files only.
func onlyYAML(t *testing.T, path string) bool {
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() {
		return strings.HasSuffix(path, ".yaml")
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			return false
		}
	}
	return true
}

// TestJSONRoundTrip: every element of the JSON form decodes strictly (with its "@type") back
// into the very resource it was made from.
func TestJSONRoundTrip(t *testing.T) {
	res, err := snapshot.Build(mustPlan(t, loadCase(t, "new-resource")), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	js, err := res.ToJSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	lists := map[string][]types.Resource{
		"listeners": res.Listeners, "routes": res.Routes, "clusters": res.Clusters,
		"endpoints": res.Endpoints, "secrets": res.Secrets,
	}
	if len(doc) != len(lists)+1 {
		t.Errorf("JSON keys: %d, want %d", len(doc), len(lists)+1)
	}
	var version string
	if err := json.Unmarshal(doc["version"], &version); err != nil || version != res.Version {
		t.Errorf("version %q (%v), want %q", version, err, res.Version)
	}
	for key, want := range lists {
		var elems []json.RawMessage
		if err := json.Unmarshal(doc[key], &elems); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if len(elems) != len(want) {
			t.Fatalf("%s: %d elements, want %d", key, len(elems), len(want))
		}
		for i, e := range elems {
			var a anypb.Any
			if err := (protojson.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(e, &a); err != nil {
				t.Fatalf("%s[%d]: %v", key, i, err)
			}
			got, err := a.UnmarshalNew()
			if err != nil {
				t.Fatalf("%s[%d]: %v", key, i, err)
			}
			if !proto.Equal(got, want[i]) {
				t.Errorf("%s[%d] does not round-trip", key, i)
			}
		}
	}
}
