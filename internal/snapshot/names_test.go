package snapshot_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// fqdnTopology is the topology of fixture name with every apiserver's hostname made an FQDN
// (<hostname>.example.com), as control-plane nodes' often are.
func fqdnTopology(t *testing.T, name string) *topology.Topology {
	t.Helper()
	raw, err := os.ReadFile(fixtures.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(kubernetes\.io/hostname: *"?)([a-z0-9-]+)`)
	text := re.ReplaceAllString(string(raw), "${1}${2}.example.com")
	if text == string(raw) {
		t.Fatalf("fixture %s: no hostname label to make an FQDN", name)
	}
	// The apiserver IDs follow their hostnames (objects.APIServerIDFor).
	var renames []string
	for _, m := range re.FindAllStringSubmatch(string(raw), -1) {
		renames = append(renames, objects.APIServerIDFor(m[2]), objects.APIServerIDFor(m[2]+".example.com"))
	}
	text = strings.NewReplacer(renames...).Replace(text)
	objs, err := objects.DecodeFixture(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	topo, warnings := objects.Build(objs, objects.Options{})
	if topo == nil {
		t.Fatalf("fixture %s: no topology: %v", name, warnings)
	}
	return topo
}

// TestClusterNamesHaveNoDots: with FQDN hostnames, no generated cluster name contains a dot
// (Envoy extracts the cluster_name stat tag from "cluster.<name>.", so a dot would split a
// cluster's stats), the subset clusters name their members' hostnames with
// contract.ClusterNameDot for '.', which maps back to the hostnames, and the names stay
// distinct. Envoy accepts dotted cluster names (it only mangles their stats), so this is
// the product's check, not a NACK of the data plane.
func TestClusterNamesHaveNoDots(t *testing.T) {
	total := 0
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			topo := fqdnTopology(t, name)
			envoys, err := plan.ForEveryEnvoy(topo)
			if err != nil {
				t.Fatal(err)
			}
			plans := []*plan.Plan{envoys.Front}
			for _, p := range envoys.Local {
				plans = append(plans, p)
			}
			subsets := 0
			for _, p := range plans {
				res, err := snapshot.Build(p, testConfig())
				if err != nil {
					t.Fatal(err)
				}
				seen := map[string]bool{}
				for _, r := range res.Clusters {
					n := r.(*clusterv3.Cluster).GetName()
					if strings.Contains(n, ".") {
						t.Errorf("cluster name %q has a dot", n)
					}
					if seen[n] {
						t.Errorf("cluster name %q twice", n)
					}
					seen[n] = true
				}
				for _, r := range res.Endpoints {
					if n := r.(*endpointv3.ClusterLoadAssignment).GetClusterName(); strings.Contains(n, ".") {
						t.Errorf("endpoints of %q: the name has a dot", n)
					}
				}
				for _, c := range p.Clusters {
					if c.Role != plan.RoleSubset {
						continue
					}
					subsets++
					var want []string
					for _, id := range c.Members {
						s, _ := topo.Server(id)
						want = append(want, s.Hostname)
					}
					got := strings.Split(strings.ReplaceAll(strings.TrimPrefix(c.Name, contract.ClusterSubsetPrefix), contract.ClusterNameDot, "."), "+")
					for _, h := range want {
						if !strings.HasSuffix(h, ".example.com") {
							t.Fatalf("hostname %q is no FQDN: the test would prove nothing", h)
						}
						found := false
						for _, g := range got {
							found = found || g == h
						}
						if !found {
							t.Errorf("subset cluster %q: hostname %q does not map back (got %q)", c.Name, h, got)
						}
					}
				}
			}
			t.Logf("%d subset cluster names checked", subsets)
			total += subsets
		})
	}
	if total == 0 {
		t.Error("no fixture has a subset cluster: the hostnames in names were never checked")
	}
}
