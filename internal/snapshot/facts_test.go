package snapshot_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/makebeforebreak"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// routeFacts is what a route does, read back from the generated resources.
type routeFacts struct {
	name      string
	prefix    string
	sepPrefix string // path_separated_prefix
	path      string
	regex     string   // safe_regex, matched against the whole path
	headers   []string // header matchers: "name" (present), "!name" (absent), "name~regex", "name=value" (any case), "name==value", "name*=substring"
	cluster   string   // or "header:<name>" for cluster_header, "direct:<status>" for direct_response
	extProc   bool
	failOpen  bool     // ext_proc overrides.failure_mode_allow
	metadata  []string // ext_proc overrides.grpc_initial_metadata, "key=value"
}

func readRoutes(t *testing.T, res *snapshot.Resources) []routeFacts {
	t.Helper()
	if len(res.Routes) != 1 {
		t.Fatalf("%d route configurations, want 1", len(res.Routes))
	}
	rc := res.Routes[0].(*routev3.RouteConfiguration)
	var out []routeFacts
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		f := routeFacts{name: r.GetName(), prefix: r.GetMatch().GetPrefix(),
			sepPrefix: r.GetMatch().GetPathSeparatedPrefix(), path: r.GetMatch().GetPath(),
			regex: r.GetMatch().GetSafeRegex().GetRegex(), extProc: true}
		for _, h := range r.GetMatch().GetHeaders() {
			sm := h.GetStringMatch()
			switch {
			case h.GetPresentMatch() && h.GetInvertMatch():
				f.headers = append(f.headers, "!"+h.GetName())
			case h.GetPresentMatch():
				f.headers = append(f.headers, h.GetName())
			case sm.GetSafeRegex() != nil:
				f.headers = append(f.headers, h.GetName()+"~"+sm.GetSafeRegex().GetRegex())
			case sm.GetExact() != "" && sm.GetIgnoreCase():
				f.headers = append(f.headers, h.GetName()+"="+sm.GetExact())
			case sm.GetExact() != "":
				f.headers = append(f.headers, h.GetName()+"=="+sm.GetExact())
			case sm.GetContains() != "":
				f.headers = append(f.headers, h.GetName()+"*="+sm.GetContains())
			default:
				t.Fatalf("route %s: header matcher %v not understood by this test", r.GetName(), h)
			}
		}
		if c := r.GetRoute().GetCluster(); c != "" {
			f.cluster = c
		} else if d := r.GetDirectResponse(); d != nil {
			f.cluster = fmt.Sprintf("direct:%d", d.GetStatus())
		} else {
			f.cluster = "header:" + r.GetRoute().GetClusterHeader()
		}
		if a := r.GetTypedPerFilterConfig()["envoy.filters.http.ext_proc"]; a != nil {
			var per extprocv3.ExtProcPerRoute
			if err := a.UnmarshalTo(&per); err != nil {
				t.Fatal(err)
			}
			f.extProc = !per.GetDisabled()
			f.failOpen = per.GetOverrides().GetFailureModeAllow().GetValue()
			for _, m := range per.GetOverrides().GetGrpcInitialMetadata() {
				f.metadata = append(f.metadata, m.GetKey()+"="+m.GetValue())
			}
		}
		out = append(out, f)
	}
	return out
}

// readMembers maps each EDS cluster to the hostnames of its endpoints.
func readMembers(res *snapshot.Resources) map[string][]string {
	out := map[string][]string{}
	for _, r := range res.Endpoints {
		cla := r.(*endpointv3.ClusterLoadAssignment)
		hosts := []string{}
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				hosts = append(hosts, e.GetEndpoint().GetHostname())
			}
		}
		slices.Sort(hosts)
		out[cla.GetClusterName()] = hosts
	}
	return out
}

// readSets is, for the EDS cluster named cluster, each serving set its endpoints list (the
// subset key in the load balancer's metadata) with the hostnames of its members, sorted.
func readSets(res *snapshot.Resources, cluster string) map[string][]string {
	out := map[string][]string{}
	for _, r := range res.Endpoints {
		cla := r.(*endpointv3.ClusterLoadAssignment)
		if cla.GetClusterName() != cluster {
			continue
		}
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				sets := e.GetMetadata().GetFilterMetadata()[contract.MetadataNamespaceLB].GetFields()[contract.LBSetKey]
				for _, v := range sets.GetListValue().GetValues() {
					out[v.GetStringValue()] = append(out[v.GetStringValue()], e.GetEndpoint().GetHostname())
				}
			}
		}
	}
	for _, hosts := range out {
		slices.Sort(hosts)
	}
	return out
}

// TestRoutingFacts checks, per golden case, what the golden files show byte by byte: which
// group/versions engage ext_proc and which apiservers each cluster holds.
func TestRoutingFacts(t *testing.T) {
	type want struct {
		extProcGVs []string // group/version routes with ext_proc on
		directGVs  []string // group/version routes with ext_proc off
		// aggregatedGVs: routes of aggregated group/versions (ext_proc off), which retry no
		// write an apiserver may have forwarded (TestRetryPolicies).
		aggregatedGVs []string
		members       map[string][]string // EDS cluster or serving set -> endpoint hostnames
		// mergedDiscovery: the live apiservers differ in what they serve, so /apis takes
		// ext_proc (a subset cluster exists).
		mergedDiscovery bool
	}
	all := []string{"cp-a", "cp-b", "cp-c"}
	cases := map[string]want{
		"all-equal": {
			directGVs: []string{"core/v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1"},
			members:   map[string][]string{contract.ClusterDefault: all},
		},
		"batch-off": {
			extProcGVs:      []string{"batch/v1"},
			directGVs:       []string{"core/v1", "apps/v1", "rbac.authorization.k8s.io/v1"},
			mergedDiscovery: true,
			members:         map[string][]string{contract.ClusterDefault: all, "kube-apiservers-only-cp-a+cp-c": {"cp-a", "cp-c"}},
		},
		"new-resource": {
			extProcGVs:      []string{"core/v1", "storage.k8s.io/v1"},
			directGVs:       []string{"apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1"},
			mergedDiscovery: true,
			members:         map[string][]string{contract.ClusterDefault: all, "kube-apiservers-only-cp-a": {"cp-a"}},
		},
		"dangerous": {
			// new-resource with cp-a dangerous: the routes are new-resource's; the
			// front-proxy variants leave cp-a out (below).
			extProcGVs:      []string{"core/v1", "storage.k8s.io/v1"},
			directGVs:       []string{"apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1"},
			mergedDiscovery: true,
			members:         map[string][]string{contract.ClusterDefault: all, "kube-apiservers-only-cp-a": {"cp-a"}},
		},
		"dead-lease": {
			// cp-c alone serves storagemigration: Unavailable, which extproc answers with 503.
			extProcGVs: []string{"storagemigration.k8s.io/v1alpha1"},
			directGVs:  []string{"core/v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1"},
			members:    map[string][]string{contract.ClusterDefault: {"cp-a", "cp-b"}},
		},
		"discovery-only": {
			extProcGVs:      []string{"apps/v1"},
			directGVs:       []string{"core/v1", "batch/v1", "rbac.authorization.k8s.io/v1"},
			mergedDiscovery: true,
			members:         map[string][]string{contract.ClusterDefault: all, "kube-apiservers-only-cp-a+cp-c": {"cp-a", "cp-c"}},
		},
		"sidecar": {
			extProcGVs:      []string{"batch/v1"},
			directGVs:       []string{"core/v1", "apps/v1", "rbac.authorization.k8s.io/v1"},
			mergedDiscovery: true,
			members:         map[string][]string{contract.ClusterLocal: {"cp-b"}, "kube-apiservers-only-cp-a+cp-c": {"cp-a", "cp-c"}},
		},
		"storageversion-only": {
			// Nobody verified is up: what the StorageVersions name answers 503 from extproc.
			extProcGVs: []string{"core/v1", "apps/v1", "batch/v1"},
			// policy/v1beta1 names only an ID no Lease knows: it gets no route and goes to
			// the default apiservers, which 404 it.
			members: map[string][]string{contract.ClusterDefault: {}},
		},
		"crd-apiservice": {
			// A CRD's APIService claims events.k8s.io/v1: its events, which only cp-a
			// serves, are still decided (to cp-a).
			extProcGVs: []string{"events.k8s.io/v1"},
			directGVs:  []string{"core/v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1"},
			// Their APIServices name a service; the CRD group stable.example.com has no route.
			aggregatedGVs:   []string{"metrics.k8s.io/v1beta1", "events.k8s.io/v1alpha9"},
			mergedDiscovery: true,
			members:         map[string][]string{contract.ClusterDefault: {"cp-a", "cp-b"}, "kube-apiservers-only-cp-a": {"cp-a"}},
		},
		"new-crd": {
			// New CRDs no apiserver lists yet (pending: extproc answers 503 with
			// Retry-After), and one only cp-a lists: extproc decides both group/versions.
			extProcGVs:      []string{"fresh.example.com/v1", "stable.example.com/v1"},
			directGVs:       []string{"core/v1"},
			mergedDiscovery: true,
			members:         map[string][]string{contract.ClusterDefault: {"cp-a", "cp-b"}, "kube-apiservers-only-cp-a": {"cp-a"}},
		},
	}
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			w, ok := cases[name]
			if !ok {
				t.Fatalf("no expectations for testdata/%s.in.yaml: add them to TestRoutingFacts", name)
			}
			topo := loadCase(t, name)
			res, err := snapshot.Build(mustPlan(t, topo), testConfig())
			if err != nil {
				t.Fatal(err)
			}
			// Every forwarding route is right after its front-proxy variant: the same match for
			// requests whose identity the Lua filter set, to the variant of its cluster.
			all := readRoutes(t, res)
			var routes []routeFacts
			for i := 0; i < len(all); i++ {
				r := all[i]
				if !strings.HasSuffix(r.name, snapshot.RouteSuffixProxyCert) {
					variantBefore := i > 0 && all[i-1].name == r.name+snapshot.RouteSuffixProxyCert
					// Routes where extproc decides forward nothing themselves: extproc names
					// the front-proxy variant of a cluster for such requests.
					forwards := !r.extProc || r.failOpen
					if variantBefore != (forwards && !strings.HasPrefix(r.name, snapshot.RouteRoutingHeader) && r.name != snapshot.RouteIdentityUndecided && r.name != snapshot.RouteUnclassified) {
						t.Errorf("route %s: front-proxy variant before it %v", r.name, variantBefore)
					}
					routes = append(routes, r)
					continue
				}
				if i+1 == len(all) {
					t.Fatalf("front-proxy route %s is last", r.name)
				}
				next := all[i+1]
				want := next
				want.name += snapshot.RouteSuffixProxyCert
				want.headers = append(slices.Clone(next.headers), contract.HeaderIdentityDecision+"=="+contract.IdentityProxyCert)
				variant := contract.ParseClusterName(next.cluster)
				variant.ProxyCert = true
				want.cluster = variant.String()
				if !equalFacts(r, want) || r.failOpen != next.failOpen {
					t.Errorf("front-proxy route %+v, want %+v", r, want)
				}
			}
			// The class and upgrade variants (TestClassVariants) aside.
			routes = slices.DeleteFunc(routes, func(r routeFacts) bool {
				return isVariantName(r.name)
			})
			def := plan.DefaultCluster(topo.LocalID)

			// Fixed routes first and last, in order. Before all, a request the Lua filter did
			// not finish (no request class: configured identity headers perhaps not stripped)
			// is refused.
			if r := routes[0]; r.name != snapshot.RouteUnclassified || !slices.Equal(r.headers, []string{"!" + contract.HeaderRequestClass}) || r.prefix != "/" || r.cluster != "direct:503" || r.extProc {
				t.Errorf("first route = %+v, want the unclassified route: no request class, a direct 503", r)
			}
			routes = routes[1:]
			if r := routes[0]; r.name != snapshot.RouteRoutingHeader || !slices.Equal(r.headers, []string{contract.HeaderRoutingCluster}) || r.cluster != "header:"+contract.HeaderRoutingCluster || r.extProc {
				t.Errorf("second route = %+v, want the routing-header route with ext_proc off", r)
			}
			// A client certificate whose identity the Lua filter did not decide is refused.
			if r := routes[1]; r.name != snapshot.RouteIdentityUndecided ||
				!slices.Equal(r.headers, []string{contract.HeaderXFCC, "!" + contract.HeaderIdentityDecision}) ||
				r.cluster != "direct:503" || r.extProc {
				t.Errorf("third route = %+v, want the undecided-identity route: XFCC without decision, a direct 503", r)
			}
			// A sidecar's ext_proc streams name its apiserver, so extproc decides by its plan.
			for _, r := range routes {
				if r.extProc && !slices.Equal(r.metadata, localMetadata(topo)) {
					t.Errorf("route %s: ext_proc metadata %v, want %v", r.name, r.metadata, localMetadata(topo))
				}
				// Only merged discovery may do without extproc.
				if r.failOpen != (r.name == snapshot.RouteDiscovery && r.extProc) {
					t.Errorf("route %s: failure_mode_allow %v", r.name, r.failOpen)
				}
			}
			// Merged discovery only when the live apiservers serve different things.
			if r := routes[2]; r.name != snapshot.RouteDiscovery || r.regex != "/apis/?" || r.cluster != def || r.extProc != w.mergedDiscovery || r.headers != nil {
				t.Errorf("third route = %+v, want the discovery route: path /apis or /apis/, ext_proc %v", r, w.mergedDiscovery)
			}
			if r := routes[len(routes)-1]; r.name != snapshot.RouteFallback || r.prefix != "/" || r.headers != nil || r.cluster != def || r.extProc {
				t.Errorf("last route = %+v, want the catch-all route with ext_proc off", r)
			}

			// Paths whose route the raw path cannot tell go to extproc, which decodes them.
			if r := routes[3]; r.name != snapshot.RouteEscapedPath || r.regex != `//.*|.*%.*` || r.cluster != def || !r.extProc || r.headers != nil {
				t.Errorf("fourth route = %+v, want the escaped-path route: a %%-escape or a leading //, ext_proc on", r)
			}

			gvRoutes := map[string]routeFacts{}
			for _, r := range routes[4 : len(routes)-1] {
				gvRoutes[r.name] = r
				if r.cluster != def {
					t.Errorf("route %s goes to %s, want the default cluster %s", r.name, r.cluster, def)
				}
				// The group/version's document and everything under it, nothing else.
				if r.prefix != "" || r.regex != "" || r.path != "" || (r.sepPrefix != "/api/v1" && !strings.HasPrefix(r.sepPrefix, "/apis/")) || strings.HasSuffix(r.sepPrefix, "/") {
					t.Errorf("route %s matches %+v, want path_separated_prefix /api/<v> or /apis/<g>/<v>", r.name, r)
				}
			}
			for _, gv := range w.extProcGVs {
				if r, ok := gvRoutes[gv]; !ok || !r.extProc {
					t.Errorf("route %s: present %v, ext_proc %v; want ext_proc on", gv, ok, r.extProc)
				}
			}
			for _, gv := range append(slices.Clone(w.directGVs), w.aggregatedGVs...) {
				if r, ok := gvRoutes[gv]; !ok || r.extProc {
					t.Errorf("route %s: present %v, ext_proc %v; want ext_proc off", gv, ok, r.extProc)
				}
			}
			if n := len(w.extProcGVs) + len(w.directGVs) + len(w.aggregatedGVs); n != len(gvRoutes) {
				t.Errorf("%d group/version routes %v, want %d", len(gvRoutes), slices.Sorted(maps.Keys(gvRoutes)), n)
			}
			// Every cluster has its front-proxy variant, with the same apiservers but the
			// dangerous ones; the serving-sets cluster holds every live apiserver, and its
			// endpoints list the serving sets (plus a set of one for each of them).
			var dangerous []string
			for _, id := range topo.Dangerous() {
				s, _ := topo.Server(id)
				dangerous = append(dangerous, s.Hostname)
			}
			safe := func(m []string) []string {
				return slices.DeleteFunc(slices.Clone(m), func(h string) bool { return slices.Contains(dangerous, h) })
			}
			wantMembers, wantSets := map[string][]string{}, map[string][]string{}
			for c, m := range w.members {
				if strings.HasPrefix(c, contract.ClusterSubsetPrefix) {
					wantSets[c] = m
					continue
				}
				wantMembers[c], wantMembers[contract.ClusterName{Base: c, ProxyCert: true}.String()] = m, safe(m)
			}
			var live []string
			for _, id := range topo.Live() {
				s, _ := topo.Server(id)
				live = append(live, s.Hostname)
				if one := plan.SubsetClusterName(topo, topology.ServerSet{id}); wantSets[one] == nil {
					wantSets[one] = []string{s.Hostname}
				}
			}
			slices.Sort(live)
			if live == nil {
				live = []string{}
			}
			wantMembers[contract.ClusterServingSets], wantMembers[contract.ClusterName{Base: contract.ClusterServingSets, ProxyCert: true}.String()] = live, safe(live)
			// Each with its HTTP/1.1 variant, for upgrades.
			for c, m := range maps.Clone(wantMembers) {
				wantMembers[contract.ClusterName{Base: c, HTTP1: true}.String()] = m
			}
			if got := readMembers(res); !maps.EqualFunc(got, wantMembers, slices.Equal) {
				t.Errorf("cluster members = %v, want %v", got, wantMembers)
			}
			if got := readSets(res, contract.ClusterServingSets); !maps.EqualFunc(got, wantSets, slices.Equal) {
				t.Errorf("%s: serving sets = %v, want %v", contract.ClusterServingSets, got, wantSets)
			}
			wantSafeSets := map[string][]string{}
			for set, m := range wantSets {
				if m := safe(m); len(m) > 0 {
					wantSafeSets[set] = m
				}
			}
			if got := readSets(res, contract.ClusterName{Base: contract.ClusterServingSets, ProxyCert: true}.String()); !maps.EqualFunc(got, wantSafeSets, slices.Equal) {
				t.Errorf("%s: serving sets = %v, want %v", contract.ClusterName{Base: contract.ClusterServingSets, ProxyCert: true}.String(), got, wantSafeSets)
			}

			// Whatever extproc may decide for any published resource names a defined
			// cluster, or a serving set the serving-sets cluster and its variant have.
			clusters := map[string]bool{}
			for _, c := range res.Clusters {
				clusters[c.(*clusterv3.Cluster).GetName()] = true
			}
			for _, r := range mustPlan(t, topo).Routes.All() {
				switch {
				case r.Outcome == topology.Subset:
					if wantSets[r.Cluster] == nil || !clusters[contract.ClusterServingSets] || !clusters[contract.ClusterName{Base: contract.ClusterServingSets, ProxyCert: true}.String()] {
						t.Errorf("extproc routes %s to serving set %s, which is not defined", r.Resource, r.Cluster)
					}
				case r.Cluster != "" && (!clusters[r.Cluster] || !clusters[contract.ClusterName{Base: r.Cluster, ProxyCert: true}.String()]):
					t.Errorf("extproc routes %s to %s, which is not defined with its front-proxy variant", r.Resource, r.Cluster)
				}
			}
		})
	}
}

// TestLocalReplyIsKubernetesStatus: the body Envoy renders for its own failures decodes as a
// metav1.Status (the format strings aside).
func TestLocalReplyIsKubernetesStatus(t *testing.T) {
	res, err := snapshot.Build(mustPlan(t, loadCase(t, "batch-off")), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	l := res.Listeners[0].(*listenerv3.Listener)
	var hcm hcmv3.HttpConnectionManager
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	mappers := hcm.GetLocalReplyConfig().GetMappers()
	if len(mappers) == 0 || hcm.GetLocalReplyConfig().GetBodyFormat() != nil {
		t.Fatalf("want mappers and no top-level body format (extproc's own 503 must pass untouched)")
	}
	for i, m := range mappers {
		// A route timeout (UT) stays a 504, as the apiserver's own Timeout Status; every
		// other failure is a 503 ServiceUnavailable.
		wantCode, wantReason := int32(503), metav1.StatusReasonServiceUnavailable
		if slices.Equal(m.GetFilter().GetResponseFlagFilter().GetFlags(), []string{"UT"}) {
			wantCode, wantReason = 504, metav1.StatusReasonTimeout
		}
		if int32(m.GetStatusCode().GetValue()) != wantCode {
			t.Errorf("mapper %d: status %d, want %d", i, m.GetStatusCode().GetValue(), wantCode)
		}
		f := m.GetBodyFormatOverride()
		if f.GetContentType() != "application/json" {
			t.Errorf("mapper %d: content type %q", i, f.GetContentType())
		}
		b, err := protojson.Marshal(f.GetJsonFormat())
		if err != nil {
			t.Fatal(err)
		}
		var s metav1.Status
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			t.Fatalf("mapper %d: %s does not decode as a Status: %v", i, b, err)
		}
		if s.Kind != "Status" || s.APIVersion != "v1" || s.Status != metav1.StatusFailure || s.Reason != wantReason || s.Code != wantCode || s.Message == "" {
			t.Errorf("mapper %d: %+v", i, s)
		}
	}
}

func equalFacts(a, b routeFacts) bool {
	return a.name == b.name && a.prefix == b.prefix && a.path == b.path && a.regex == b.regex && slices.Equal(a.headers, b.headers) &&
		a.cluster == b.cluster && a.extProc == b.extProc && slices.Equal(a.metadata, b.metadata)
}

// TestProxyCertificateOnlyWithOurIdentity: the proxy client certificate is presented only by
// the front-proxy variants (where extproc sends the requests whose identity it set) and by the
// health checks; a plan's own cluster, where every other request goes, presents none, so the
// apiserver authenticates those requests' own credentials. Without a proxy certificate there
// are no variants.
func TestProxyCertificateOnlyWithOurIdentity(t *testing.T) {
	noProxyCert := testConfig()
	noProxyCert.Secrets.ClientCA, noProxyCert.Secrets.ProxyClientCert, noProxyCert.Secrets.ProxyClientKey = "", "", ""
	for name, cfg := range map[string]snapshot.Config{"with proxy certificate": testConfig(), "without": noProxyCert} {
		t.Run(name, func(t *testing.T) {
			p := mustPlan(t, loadCase(t, "batch-off"))
			res, err := snapshot.Build(p, cfg)
			if err != nil {
				t.Fatal(err)
			}
			byName := map[string]*clusterv3.Cluster{}
			for _, r := range res.Clusters {
				byName[r.(*clusterv3.Cluster).GetName()] = r.(*clusterv3.Cluster)
			}
			certOf := func(ts *corev3.TransportSocket) string {
				var tls tlsv3.UpstreamTlsContext
				if err := ts.GetTypedConfig().UnmarshalTo(&tls); err != nil {
					t.Fatal(err)
				}
				if c := tls.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs(); len(c) == 1 {
					return c[0].GetName()
				}
				return ""
			}
			withCert := cfg.Secrets.ProxyClientCert != ""
			names := []string{contract.ClusterServingSets}
			for _, pc := range p.Clusters {
				if pc.Role == plan.RoleDefault || pc.Role == plan.RoleLocal {
					names = append(names, pc.Name)
				}
			}
			alpnOf := func(ts *corev3.TransportSocket) []string {
				var tls tlsv3.UpstreamTlsContext
				if err := ts.GetTypedConfig().UnmarshalTo(&tls); err != nil {
					t.Fatal(err)
				}
				return tls.GetCommonTlsContext().GetAlpnProtocols()
			}
			// healthCheckSocket is the socket c's health checks resolve to as Envoy's
			// TransportSocketMatcher would: the first match whose labels all equal the
			// criteria's, else the cluster's own.
			healthCheckSocket := func(c *clusterv3.Cluster) *corev3.TransportSocket {
				crit := c.GetHealthChecks()[0].GetTransportSocketMatchCriteria()
				if crit == nil {
					return c.GetTransportSocket()
				}
				for _, m := range c.GetTransportSocketMatches() {
					ok := true
					for k, v := range m.GetMatch().GetFields() {
						if !proto.Equal(crit.GetFields()[k], v) {
							ok = false
						}
					}
					if ok {
						return m.GetTransportSocket()
					}
				}
				return c.GetTransportSocket()
			}
			wantCheckCert := ""
			if withCert {
				wantCheckCert = snapshot.SecretProxyClientCert
			}
			for _, base := range names {
				for _, name := range []string{base, contract.ClusterName{Base: base, HTTP1: true}.String()} {
					alpn := []string{"h2"}
					if name != base {
						alpn = []string{"http/1.1"}
					}
					c := byName[name]
					if c == nil {
						t.Fatalf("cluster %s missing", name)
					}
					if got := certOf(c.GetTransportSocket()); got != "" || !slices.Equal(alpnOf(c.GetTransportSocket()), alpn) {
						t.Errorf("%s presents %q to the apiservers with ALPN %v; want no client certificate, ALPN %v", name, got, alpnOf(c.GetTransportSocket()), alpn)
					}
					variantName := contract.ParseClusterName(name)
					variantName.ProxyCert = true
					variant := byName[variantName.String()]
					if withCert != (variant != nil) {
						t.Fatalf("with a proxy certificate %v: front-proxy variant of %s %v", withCert, name, variant != nil)
					}
					check := []*clusterv3.Cluster{c}
					if variant != nil {
						if certOf(variant.GetTransportSocket()) != snapshot.SecretProxyClientCert || !slices.Equal(alpnOf(variant.GetTransportSocket()), alpn) {
							t.Errorf("front-proxy variant of %s: want one presenting %s with ALPN %v", name, snapshot.SecretProxyClientCert, alpn)
						}
						check = append(check, variant)
					}
					// Health checks speak HTTP/1.1 whatever the cluster speaks, with the proxy
					// certificate when there is one (they ask as the health-check user).
					for _, c := range check {
						hc := healthCheckSocket(c)
						if certOf(hc) != wantCheckCert || !slices.Equal(alpnOf(hc), []string{"http/1.1"}) {
							t.Errorf("%s: health checks present %q with ALPN %v; want %q and http/1.1", c.GetName(), certOf(hc), alpnOf(hc), wantCheckCert)
						}
					}
				}
			}
		})
	}
}

// TestLingeringCluster: a cluster only the plan's Hold.Lingering asks for is defined, with
// nothing saying it lingers, and holds those of its apiservers that are live.
func TestLingeringCluster(t *testing.T) {
	topo := loadCase(t, "dead-lease")
	var dead, live string
	for _, s := range topo.APIServers {
		if s.Alive && live == "" {
			live = s.ID
		}
		if !s.Alive {
			dead = s.ID
		}
	}
	if dead == "" || live == "" {
		t.Fatal("dead-lease has no dead and live apiserver")
	}
	const name = "kube-apiservers-only-old"
	res, err := snapshot.Build(makebeforebreak.Hold{Lingering: map[string]topology.ServerSet{name: {dead, live}}}.Apply(mustPlan(t, topo)), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	// A lingering set is a serving set like any other (no cluster of its own), with its
	// members that are still live.
	for _, c := range res.Clusters {
		if c.(*clusterv3.Cluster).GetName() == name {
			t.Errorf("serving set %s is a cluster", name)
		}
	}
	members, ok := readSets(res, contract.ClusterServingSets)[name]
	if s, _ := topo.Server(live); !ok || len(members) != 1 || members[0] != s.Hostname {
		t.Errorf("members of lingering set %s: %v, want only the live %s", name, members, s.Hostname)
	}
}

// TestJoiningApiserver: an apiserver in makebeforebreak.Hold.Joining is out of the default cluster but in
// the serving sets; when every live one is joining, none is held back.
func TestJoiningApiserver(t *testing.T) {
	topo := loadCase(t, "batch-off") // batch/v1 on cp-a and cp-c; cp-b without it
	ids := map[string]string{}
	for _, s := range topo.APIServers {
		ids[s.Hostname] = s.ID
	}
	res, err := snapshot.Build(makebeforebreak.Hold{Joining: map[string]bool{ids["cp-a"]: true}}.Apply(mustPlan(t, topo)), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	m := readMembers(res)
	if got := m[contract.ClusterDefault]; !slices.Equal(got, []string{"cp-b", "cp-c"}) {
		t.Errorf("default cluster %v, want cp-b and cp-c (cp-a joining)", got)
	}
	if got := readSets(res, contract.ClusterServingSets)["kube-apiservers-only-cp-a+cp-c"]; !slices.Equal(got, []string{"cp-a", "cp-c"}) {
		t.Errorf("serving set %v, want cp-a and cp-c", got)
	}
	all := map[string]bool{}
	for _, id := range topo.Live() {
		all[id] = true
	}
	res, err = snapshot.Build(makebeforebreak.Hold{Joining: all}.Apply(mustPlan(t, topo)), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if got := readMembers(res)[contract.ClusterDefault]; len(got) != len(topo.Live()) {
		t.Errorf("every apiserver joining: default cluster %v, want all %d", got, len(topo.Live()))
	}
}

// localMetadata is the ext_proc gRPC metadata a sidecar's routes add: its apiserver's ID.
func localMetadata(topo *topology.Topology) []string {
	if topo.LocalID == "" {
		return nil
	}
	return []string{contract.MetadataLocalAPIServer + "=" + topo.LocalID}
}

// TestClassVariants: every route that forwards requests itself comes after its variants, one per
// request class the Lua filter writes that has a policy of its own — ":read" (timeout,
// "reset" retried too), ":watch" (no timeout, "reset" retried too), ":write" (timeout) — and,
// where ext_proc is off and the cluster is the route's own, ":upgrade" first (an Upgrade
// header: the HTTP/1.1 variant of its cluster, no timeout). Each variant is the route with one
// header matcher more (the class's exact value; the Upgrade header's presence), the same
// filter configuration and cluster, no metadata. The route itself takes every other request
// (long-running, unclassified, no class): no timeout, no retry after a reset. Routes that
// forward nothing themselves (extproc decides, a direct response) have no variants. No route
// matches a regex but the fixed discovery and escaped-path ones.
func TestClassVariants(t *testing.T) {
	cfg := testConfig()
	cfg.UpstreamRequestTimeout = 70 * time.Second
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			res, err := snapshot.Build(mustPlan(t, loadCase(t, name)), cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The front-proxy variants (TestRoutingFacts) aside.
			routes := slices.DeleteFunc(slices.Clone(res.Routes[0].(*routev3.RouteConfiguration).GetVirtualHosts()[0].GetRoutes()), func(r *routev3.Route) bool {
				return strings.HasSuffix(r.GetName(), snapshot.RouteSuffixProxyCert)
			})
			type variant struct {
				suffix, class string
				timeout       bool
				reset         bool
			}
			classes := []variant{
				{snapshot.RouteSuffixRead, contract.ClassRead, true, true},
				{snapshot.RouteSuffixWatch, contract.ClassWatch, false, true},
				{snapshot.RouteSuffixWrite, contract.ClassWrite, true, false},
			}
			resets := func(r *routev3.Route) bool {
				return slices.Contains(strings.Split(r.GetRoute().GetRetryPolicy().GetRetryOn(), ","), "reset")
			}
			i := 0
			for i < len(routes) {
				// Collect the variants before the route they belong to.
				j := i
				for j < len(routes) && isVariantName(routes[j].GetName()) {
					j++
				}
				if j == len(routes) {
					t.Fatalf("variants %s… at the end", routes[i].GetName())
				}
				base := routes[j]
				n := base.GetName()
				variants := routes[i:j]
				i = j + 1
				if base.GetMatch().GetSafeRegex() != nil && n != snapshot.RouteDiscovery && n != snapshot.RouteEscapedPath {
					t.Errorf("route %s matches a regex", n)
				}
				for _, h := range base.GetMatch().GetHeaders() {
					if h.GetStringMatch().GetSafeRegex() != nil {
						t.Errorf("route %s matches a header regex", n)
					}
				}
				var pr extprocv3.ExtProcPerRoute
				a := base.GetTypedPerFilterConfig()["envoy.filters.http.ext_proc"]
				extProc := a == nil || a.UnmarshalTo(&pr) != nil || !pr.GetDisabled()
				failOpen := pr.GetOverrides().GetFailureModeAllow().GetValue()
				if base.GetDirectResponse() != nil || (extProc && !failOpen) {
					if len(variants) != 0 {
						t.Errorf("route %s forwards nothing itself but has variants %v", n, names(variants))
					}
					continue
				}
				if got := base.GetRoute().GetTimeout().AsDuration(); got != 0 || resets(base) {
					t.Errorf("route %s: timeout %v, retries resets %v; want neither", n, got, resets(base))
				}
				want := slices.Clone(classes)
				if !extProc && base.GetRoute().GetCluster() != "" {
					want = append([]variant{{suffix: snapshot.RouteSuffixUpgrade}}, want...)
				}
				if len(variants) != len(want) {
					t.Errorf("route %s: variants %v, want %d", n, names(variants), len(want))
					continue
				}
				for k, w := range want {
					tw := variants[k]
					if tw.GetName() != n+w.suffix {
						t.Errorf("route %s: variant %s, want %s", n, tw.GetName(), n+w.suffix)
						continue
					}
					hs := tw.GetMatch().GetHeaders()
					if len(hs) != len(base.GetMatch().GetHeaders())+1 {
						t.Errorf("%s: headers %v", tw.GetName(), hs)
						continue
					}
					last := hs[len(hs)-1]
					c := proto.Clone(tw).(*routev3.Route)
					c.Name, c.Match.Headers, c.Metadata = n, hs[:len(hs)-1], base.GetMetadata()
					c.GetRoute().Timeout, c.GetRoute().RetryPolicy = base.GetRoute().GetTimeout(), base.GetRoute().GetRetryPolicy()
					if w.class == "" { // upgrade
						if last.GetName() != "upgrade" || !last.GetPresentMatch() || tw.GetRoute().GetCluster() != (contract.ClusterName{Base: base.GetRoute().GetCluster(), HTTP1: true}).String() {
							t.Errorf("%s: matches %v, goes to %s; want an Upgrade header, the HTTP/1.1 variant", tw.GetName(), last, tw.GetRoute().GetCluster())
						}
						c.GetRoute().ClusterSpecifier = base.GetRoute().GetClusterSpecifier()
					} else if last.GetName() != contract.HeaderRequestClass || last.GetStringMatch().GetExact() != w.class || last.GetInvertMatch() {
						t.Errorf("%s: matches %v, want %s = %s", tw.GetName(), last, contract.HeaderRequestClass, w.class)
					}
					if !proto.Equal(c, base) {
						t.Errorf("%s differs from %s in more than its name, one header, timeout, retry policy and cluster", tw.GetName(), n)
					}
					if got := tw.GetRoute().GetTimeout().AsDuration(); (got == cfg.UpstreamRequestTimeout) != w.timeout || (got != 0 && got != cfg.UpstreamRequestTimeout) {
						t.Errorf("%s: timeout %v", tw.GetName(), got)
					}
					if resets(tw) != w.reset {
						t.Errorf("%s: retries resets %v, want %v", tw.GetName(), resets(tw), w.reset)
					}
					if tw.GetMetadata() != nil {
						t.Errorf("%s has metadata: only the route it is a variant of carries it", tw.GetName())
					}
				}
			}
		})
	}
}

func isVariantName(name string) bool {
	for _, s := range []string{snapshot.RouteSuffixUpgrade, snapshot.RouteSuffixRead, snapshot.RouteSuffixWatch, snapshot.RouteSuffixWrite} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

func names(rs []*routev3.Route) []string {
	var n []string
	for _, r := range rs {
		n = append(n, r.GetName())
	}
	return n
}
