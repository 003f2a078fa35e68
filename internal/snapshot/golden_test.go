package snapshot_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kube-mvp/kube-mvp/internal/inventory/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var update = flag.Bool("update", false, "rewrite testdata/<case>.out.yaml from the current output")

// goldenNow is when the golden fixtures' Leases are judged: 10 s after cp-a's last renewal.
var goldenNow = time.Date(2026, 11, 23, 10, 0, 10, 0, time.UTC)

// sidecarOf names, per case, the apiserver whose sidecar Envoy the case configures.
var sidecarOf = map[string]string{
	"sidecar": "apiserver-nxibzygiy5v5qmcjmernh6erfe", // cp-b
}

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

// loadCase builds the topology of testdata/<name>.in.yaml as the inventory would at goldenNow.
func loadCase(t testing.TB, name string) *topology.Topology {
	t.Helper()
	objs, err := objects.LoadFixture(filepath.Join("testdata", name+".in.yaml"))
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

// mustPlan is the plan of topo, as xds-server makes it before translating.
func mustPlan(t testing.TB, topo *topology.Topology) *plan.Plan {
	t.Helper()
	p, err := plan.Build(topo)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func goldenCases(t *testing.T) []string {
	ins, err := filepath.Glob(filepath.Join("testdata", "*.in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) == 0 {
		t.Fatal("no testdata/*.in.yaml")
	}
	var names []string
	for _, in := range ins {
		names = append(names, strings.TrimSuffix(filepath.Base(in), ".in.yaml"))
	}
	return names
}

// TestGolden translates every testdata/<case>.in.yaml and compares the result with
// <case>.out.yaml; go test ./internal/snapshot -update rewrites the outputs.
func TestGolden(t *testing.T) {
	for _, name := range goldenCases(t) {
		t.Run(name, func(t *testing.T) {
			res, err := snapshot.Build(mustPlan(t, loadCase(t, name)), testConfig())
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			if _, err := res.Snapshot(); err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			got, err := res.ToYAML()
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join("testdata", name+".out.yaml")
			if *update {
				if err := os.WriteFile(out, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/snapshot -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the output; review the change with\n  go test ./internal/snapshot -run 'TestGolden/%s' -update && git diff %s\n%s", out, name, out, firstDiff(string(want), string(got)))
			}
		})
	}
}

// firstDiff shows the first differing line, with a little context.
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
			return "first difference at line " + itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl
		}
	}
	return ""
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
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
