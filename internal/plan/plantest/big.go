// Package plantest makes plans and routing tables of the sizes the limits are about, for the
// tests and benchmarks of the packages that carry them (tablestream, extproc).
package plantest

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// BigTopology is a CRD-heavy cluster: groups×2 versions×10 resources (50,000 for 2,500
// groups), every one with a status subresource and every fifth with scale, served by
// servers apiservers (a fifth of the group/versions by one of 19 subsets, as in a rolling
// upgrade), with the merged discovery a real apiserver would publish for them: realistic
// names, four short names and twelve long categories per resource.
func BigTopology(tb testing.TB, groups, servers int) *topology.Topology {
	tb.Helper()
	var apiservers []topology.APIServer
	var all []string
	for i := range servers {
		host := fmt.Sprintf("cp-%d.prod-eu-west-1.example.internal", i)
		sum := sha256.Sum256([]byte(host))
		// As kube-apiserver names its identity Lease.
		id := "apiserver-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
		apiservers = append(apiservers, topology.APIServer{ID: id, Hostname: host, Address: fmt.Sprintf("10.20.%d.%d:6443", i/250, i%250+1), Alive: true, Verified: true})
		all = append(all, id)
	}
	subsets := [][]string{all}
	for i := 1; len(subsets) < 20 && servers > 1; i++ {
		var s []string
		for j, id := range all {
			if (i>>(j%8))&1 == 1 || j == i%servers {
				s = append(s, id)
			}
		}
		subsets = append(subsets, s)
	}

	nouns := []string{"kafka", "mirror", "maker", "topic", "connector", "bucket", "policy", "gateway", "route", "certificate",
		"issuer", "cluster", "backup", "restore", "snapshot", "pipeline", "trigger", "tenant", "quota", "secret",
		"store", "alert", "rule", "monitor", "probe", "dashboard", "database", "user", "grant", "role"}
	title := func(s string) string { return strings.ToUpper(s[:1]) + s[1:] }
	served := map[topology.Resource][]string{}
	var everywhere []topology.GroupVersion
	list := apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupDiscoveryList", APIVersion: "apidiscovery.k8s.io/v2"}}
	for g := range groups {
		vendor := fmt.Sprintf("%s-%s", nouns[g%len(nouns)], nouns[(g/len(nouns))%len(nouns)])
		team := nouns[(g/7)%len(nouns)] + "s"
		group := fmt.Sprintf("%s.%s.%s-platform.io", nouns[(g*7)%len(nouns)], team, vendor)
		gd := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: group}}
		for vi, version := range []string{"v1", "v1beta1"} {
			set := subsets[0]
			if (g+vi)%5 == 0 && len(subsets) > 1 {
				set = subsets[1+(g+vi)%(len(subsets)-1)]
			}
			vd := apidiscoveryv2.APIVersionDiscovery{Version: version, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
			for r := range 10 {
				a, b := nouns[(g+r)%len(nouns)], nouns[(g+3*r+1)%len(nouns)]
				kind := title(a) + title(b) + fmt.Sprint(r)
				singular := strings.ToLower(kind)
				plural := singular + "s"
				categories := []string{"all", vendor, vendor + "-" + team, team + "-operators", "platform-observability",
					"platform-networking", "platform-security", "platform-storage", "tenant-facing-" + a, "managed-by-" + vendor + "-operator",
					"backup-" + b, "audit-" + team}
				rd := apidiscoveryv2.APIResourceDiscovery{
					Resource: plural, SingularResource: singular, Scope: apidiscoveryv2.ScopeNamespace,
					ResponseKind: &metav1.GroupVersionKind{Group: group, Version: version, Kind: kind},
					Verbs:        []string{"delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"},
					ShortNames:   []string{a[:2] + b[:2], a[:3] + b[:1] + fmt.Sprint(r), a + b[:1], kind[:4]},
					Categories:   categories,
					Subresources: []apidiscoveryv2.APISubresourceDiscovery{{
						Subresource: "status", ResponseKind: &metav1.GroupVersionKind{Group: group, Version: version, Kind: kind},
						Verbs: []string{"get", "patch", "update"},
					}},
				}
				served[topology.Resource{Group: group, Version: version, Resource: plural}] = set
				served[topology.Resource{Group: group, Version: version, Resource: plural, Subresource: "status"}] = set
				if r%5 == 0 {
					rd.Subresources = append(rd.Subresources, apidiscoveryv2.APISubresourceDiscovery{
						Subresource: "scale", ResponseKind: &metav1.GroupVersionKind{Group: "autoscaling", Version: "v1", Kind: "Scale"},
						Verbs: []string{"get", "patch", "update"},
					})
					served[topology.Resource{Group: group, Version: version, Resource: plural, Subresource: "scale"}] = set
				}
				vd.Resources = append(vd.Resources, rd)
			}
			gd.Versions = append(gd.Versions, vd)
		}
		list.Items = append(list.Items, gd)
	}
	topo, err := topology.New(apiservers, served, everywhere)
	if err != nil {
		tb.Fatal(err)
	}
	doc, err := json.Marshal(list)
	if err != nil {
		tb.Fatal(err)
	}
	topo.Discovery = topology.NewDiscovery(doc)
	return topo
}

// Table is the routing table of topo, as xds-server publishes it.
func Table(tb testing.TB, topo *topology.Topology) *plan.Table {
	tb.Helper()
	t, err := plan.TableOf(topo)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// KeysPerGroup is how many keys (resources, subresources and documents) a group of
// BigTopology adds to a table; BytesPerGroup about how many bytes of discovery.
const (
	KeysPerGroup  = 2 * (10 + 10 + 2 + 1)
	BytesPerGroup = 16_500
)

// AtLimits is a table of 10 apiservers (11 plans) with about keys keys and, in all, about
// size bytes as size counts them (tablestream's serialization): BigTopology's groups for the
// keys, then a larger BigTopology's merged discovery for the bytes left.
func AtLimits(tb testing.TB, keys, bytes int, size func(*plan.Table) int) *plan.Table {
	tb.Helper()
	topo := BigTopology(tb, keys/KeysPerGroup, 10)
	topo.Discovery = nil
	routes := size(Table(tb, topo))
	topo.Discovery = BigTopology(tb, max(0, bytes-routes)/BytesPerGroup, 1).Discovery
	return Table(tb, topo)
}

// Sidecar is the ID of a sidecar plan of t (the first apiserver's).
func Sidecar(t *plan.Table) string { return t.APIServers[0].ID }
