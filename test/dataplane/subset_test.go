package dataplane

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// dynMetaProc is an ext_proc server that answers the request headers with CONTINUE and, as
// the response's dynamic_metadata, the JSON object of the request header
// x-test-dynamic-metadata (namespace -> Struct), if any.
type dynMetaProc struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (dynMetaProc) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := s.Recv()
	if err != nil {
		return nil
	}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	if js, ok := headerOf(req.GetRequestHeaders(), "x-test-dynamic-metadata"); ok {
		var m map[string]any
		if err := json.Unmarshal([]byte(js), &m); err != nil {
			return err
		}
		if resp.DynamicMetadata, err = structpb.NewStruct(m); err != nil {
			return err
		}
	}
	if err := s.Send(resp); err != nil {
		return nil
	}
	_, _ = s.Recv() // until the data plane ends the stream
	return nil
}

const subsetCluster = "subset-test"

// subsetEnv is an env whose resources, once stage > 0, carry an extra cluster "subset-test"
// (a copy of kube-apiservers with its own EDS resource, lb_subset_config lb, health checks
// of path /subset-probe edited by hc) whose endpoints carry the envoy.lb metadata meta[server]
// (none when absent), and, first in every virtual host, a route to it for requests with the
// header x-subset-test, with metadata_match {"envoy.lb": match} when match is set. Its ext_proc
// server is dynMetaProc; the filter accepts the dynamic metadata namespaces receiving.
type subsetEnv struct {
	*env
	mu    sync.Mutex
	stage int
	lb    *clusterv3.Cluster_LbSubsetConfig
	meta  map[string]*structpb.Struct
	match *structpb.Struct
	hc    func(*corev3.HealthCheck)
}

func newSubsetEnv(t *testing.T, receiving []string) *subsetEnv {
	s := &subsetEnv{meta: map[string]*structpb.Struct{}}
	s.env = newEnv(t, envOptions{
		extProc: dynMetaProc{},
		editExtProc: func(ep *extprocfilterv3.ExternalProcessor) {
			ep.MetadataOptions = nil // the product's own (envoy.lb) is not this test's
			if receiving != nil {
				ep.MetadataOptions = &extprocfilterv3.MetadataOptions{ReceivingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{Untyped: receiving}}
			}
		},
		editResources: s.edit,
	})
	return s
}

func (s *subsetEnv) edit(res *snapshot.Resources) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stage == 0 {
		return nil
	}
	tc := testCluster{name: subsetCluster, probePath: "/subset-probe", header: "x-subset-test", version: fmt.Sprintf("-subset%d", s.stage),
		keep: func(addr string, ep *endpointv3.LbEndpoint) bool {
			for name, f := range s.apiservers {
				if f.addr() != addr || s.meta[name] == nil {
					continue
				}
				if ep.Metadata == nil {
					ep.Metadata = &corev3.Metadata{}
				}
				if ep.Metadata.FilterMetadata == nil {
					ep.Metadata.FilterMetadata = map[string]*structpb.Struct{}
				}
				ep.Metadata.FilterMetadata[envoyLB] = s.meta[name]
			}
			return true
		}}
	if s.match != nil {
		tc.metadataMatch = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{envoyLB: s.match}}
	}
	nc, err := tc.add(res)
	if err != nil {
		return err
	}
	nc.LbSubsetConfig = s.lb
	if s.hc != nil {
		s.hc(nc.HealthChecks[0])
	}
	return nil
}

// push applies change to the env's settings, sends the resources of the next stage and waits
// until the data plane applied them (without a NACK).
func (s *subsetEnv) push(t *testing.T, change func()) {
	t.Helper()
	s.mu.Lock()
	if change != nil {
		change()
	}
	s.stage++
	want := fmt.Sprintf("-subset%d", s.stage)
	s.mu.Unlock()
	plans, err := plan.ForEveryEnvoy(s.topo)
	if err != nil {
		t.Fatal(err)
	}
	s.xds.Update(plans)
	testutil.WaitFor(t, t.Context(), 15*time.Second, "stage applied", func() error {
		if n := s.dp.NACKs(); len(n) > 0 {
			t.Fatalf("NACKs: %q", n)
		}
		for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.RouteType} {
			if v := s.dp.Versions()[typ]; !strings.HasSuffix(v, want) {
				return fmt.Errorf("%s version %q", typ, v)
			}
		}
		return nil
	})
}

// serving waits until the subset cluster serves with every host of healthy healthy and every
// other one unhealthy.
func (s *subsetEnv) serving(t *testing.T, healthy ...string) {
	t.Helper()
	testutil.WaitFor(t, t.Context(), 15*time.Second, "the subset cluster serving", func() error {
		for name, f := range s.apiservers {
			present, _, h := s.hostState(subsetCluster, f.addr())
			want := strings.Contains(" "+strings.Join(healthy, " ")+" ", " "+name+" ")
			if !present || h != want {
				return fmt.Errorf("%s: present %t, healthy %t", name, present, h)
			}
		}
		return nil
	})
}

func lbStruct(kv ...any) *structpb.Struct {
	m := map[string]any{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

// subsetRequest is the headers of a request to the subset cluster whose ext_proc answer sets
// the dynamic metadata dm (namespace -> fields), none when nil.
func subsetRequest(dm map[string]map[string]any) map[string]string {
	h := map[string]string{"x-subset-test": "1"}
	if dm != nil {
		b, _ := json.Marshal(dm)
		h["x-test-dynamic-metadata"] = string(b)
	}
	return h
}

// spreadSubset sends n requests with hdr and counts the servers that answered (status 200),
// "503" for each 503.
func (s *subsetEnv) spreadSubset(t *testing.T, n int, hdr map[string]string) map[string]int {
	t.Helper()
	c := s.client(nil)
	out := map[string]int{}
	for range n {
		r := s.do(c, "GET", "/api/v1/namespaces/default/configmaps", hdr)
		switch r.status {
		case 200:
			out[r.seen.Server]++
		case http.StatusServiceUnavailable:
			out["503"]++
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	return out
}

// The subset cluster's hosts: cp-a in subset role=a, cp-b in role=b, cp-c (list_as_any) in
// both, and zone=z1 for cp-a and cp-c.
func subsetMeta() map[string]*structpb.Struct {
	return map[string]*structpb.Struct{
		"cp-a": lbStruct("role", "a", "zone", "z1"),
		"cp-b": lbStruct("role", "b"),
		"cp-c": lbStruct("role", []any{"a", "b"}, "zone", "z1"),
	}
}

func roleSelectors(fallback clusterv3.Cluster_LbSubsetConfig_LbSubsetFallbackPolicy,
	selector clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_LbSubsetSelectorFallbackPolicy) *clusterv3.Cluster_LbSubsetConfig {
	return &clusterv3.Cluster_LbSubsetConfig{
		FallbackPolicy: fallback,
		ListAsAny:      true,
		SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{
			{Keys: []string{"role"}, FallbackPolicy: selector},
			{Keys: []string{"zone", "role"}},
		},
	}
}

// TestSubsetFromExtProcMetadata: the subset load balancer (Envoy's SubsetLoadBalancer) picks
// among the hosts of the subset that the request's criteria name: the route's metadata_match
// merged with the envoy.lb dynamic metadata ext_proc set (only in a namespace listed in
// receiving_namespaces); a host with a list value (list_as_any) is in each subset it lists.
// Without a matching subset, the selector's fallback_policy, else the top-level one, decides:
// NO_FALLBACK is no host (503, UH).
func TestSubsetFromExtProcMetadata(t *testing.T) {
	lbDM := func(kv ...any) map[string]map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return map[string]map[string]any{envoyLB: m}
	}
	const (
		noFallback  = clusterv3.Cluster_LbSubsetConfig_NO_FALLBACK
		anyEndpoint = clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT
		notDefined  = clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NOT_DEFINED
		selNo       = clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK
		selAny      = clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_ANY_ENDPOINT
	)
	for _, tc := range []struct {
		name      string
		receiving []string
		lb        *clusterv3.Cluster_LbSubsetConfig
		match     *structpb.Struct // the route's metadata_match envoy.lb
		dm        map[string]map[string]any
		want      []string // the servers that may answer ("503": none)
		every     bool     // each of want answers some request
		stat      string   // a lb_subsets_* stat that must grow
	}{
		{name: "subset a", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, notDefined),
			dm: lbDM("role", "a"), want: []string{"cp-a", "cp-c"}, every: true, stat: "lb_subsets_selected"},
		{name: "subset b", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, notDefined),
			dm: lbDM("role", "b"), want: []string{"cp-b", "cp-c"}, every: true, stat: "lb_subsets_selected"},
		{name: "two keys", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, notDefined),
			dm: lbDM("role", "b", "zone", "z1"), want: []string{"cp-c"}, every: true, stat: "lb_subsets_selected"},
		{name: "dynamic metadata overrides the route's", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, notDefined),
			match: lbStruct("role", "a"), dm: lbDM("role", "b"), want: []string{"cp-b", "cp-c"}, every: true, stat: "lb_subsets_selected"},
		{name: "the route's criteria alone", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, notDefined),
			match: lbStruct("role", "b"), want: []string{"cp-b", "cp-c"}, every: true, stat: "lb_subsets_selected"},
		{name: "namespace not received", receiving: []string{"other.ns"}, lb: roleSelectors(noFallback, notDefined),
			dm: lbDM("role", "a"), want: []string{"503"}},
		{name: "namespace not received, any endpoint", receiving: []string{"other.ns"}, lb: roleSelectors(anyEndpoint, notDefined),
			dm: lbDM("role", "b"), want: []string{"cp-a", "cp-b", "cp-c"}, every: true, stat: "lb_subsets_fallback"},
		{name: "no receiving namespaces", lb: roleSelectors(noFallback, notDefined),
			dm: lbDM("role", "a"), want: []string{"503"}},
		{name: "unknown subset, no fallback", receiving: []string{envoyLB}, lb: roleSelectors(anyEndpoint, selNo),
			dm: lbDM("role", "nope"), want: []string{"503"}},
		{name: "unknown subset, selector any endpoint", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, selAny),
			dm: lbDM("role", "nope"), want: []string{"cp-a", "cp-b", "cp-c"}, every: true},
		{name: "unknown subset, top-level no fallback", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, notDefined),
			dm: lbDM("role", "nope"), want: []string{"503"}},
		{name: "no selector for the keys, top-level any endpoint", receiving: []string{envoyLB}, lb: roleSelectors(anyEndpoint, selNo),
			dm: lbDM("zone", "z1"), want: []string{"cp-a", "cp-b", "cp-c"}, every: true, stat: "lb_subsets_fallback"},
		{name: "no criteria, any endpoint", receiving: []string{envoyLB}, lb: roleSelectors(anyEndpoint, selNo),
			want: []string{"cp-a", "cp-b", "cp-c"}, every: true, stat: "lb_subsets_fallback"},
		{name: "no criteria, no fallback", receiving: []string{envoyLB}, lb: roleSelectors(noFallback, selAny),
			want: []string{"503"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSubsetEnv(t, tc.receiving)
			s.push(t, func() { s.lb, s.meta, s.match = tc.lb, subsetMeta(), tc.match })
			s.serving(t, "cp-a", "cp-b", "cp-c")
			sp := "cluster." + subsetCluster + "."
			none := s.stat(sp + "upstream_cx_none_healthy")
			before := s.stat(sp + tc.stat)
			got := s.spreadSubset(t, 30, subsetRequest(tc.dm))
			for k, n := range got {
				if !strings.Contains(" "+strings.Join(tc.want, " ")+" ", " "+k+" ") {
					t.Errorf("%s answered %d of 30 requests; want only %v (all: %v)", k, n, tc.want, got)
				}
			}
			if tc.every {
				// 30 requests over at most three hosts: one never picked is a bug, not luck
				// (least request with random choices: (2/3)^30).
				for _, w := range tc.want {
					if got[w] == 0 {
						t.Errorf("%s answered none of 30 requests (all: %v)", w, got)
					}
				}
			}
			if got["503"] > 0 {
				if d := s.stat(sp+"upstream_cx_none_healthy") - none; d != uint64(got["503"]) {
					t.Errorf("upstream_cx_none_healthy grew by %d, want %d (no host: UH)", d, got["503"])
				}
			}
			if tc.stat != "" {
				if d := s.stat(sp+tc.stat) - before; d < 30 {
					t.Errorf("%s grew by %d, want at least 30", tc.stat, d)
				}
			}
		})
	}
}

// TestSubsetHealthAndEDS: health is evaluated within the subset (panic threshold 0): an
// unhealthy host of the subset is skipped while another is healthy, and the subset gives no
// host once none is. An EDS update that moves a host into a subset takes effect at once, with
// no warming (not a new cluster), and the host keeps its health.
func TestSubsetHealthAndEDS(t *testing.T) {
	s := newSubsetEnv(t, []string{envoyLB})
	s.apiservers["cp-b"].refuse(&refusal{status: http.StatusServiceUnavailable})
	s.push(t, func() {
		s.lb = roleSelectors(clusterv3.Cluster_LbSubsetConfig_NO_FALLBACK, clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NOT_DEFINED)
		s.meta = map[string]*structpb.Struct{"cp-a": lbStruct("role", "a"), "cp-b": lbStruct("role", "b"), "cp-c": lbStruct("role", "b")}
		s.hc = func(h *corev3.HealthCheck) {
			h.Interval, h.NoTrafficInterval = durationpb.New(time.Hour), durationpb.New(time.Hour)
		}
	})
	s.serving(t, "cp-a", "cp-c")
	roleB := subsetRequest(map[string]map[string]any{envoyLB: {"role": "b"}})
	if got := s.spreadSubset(t, 20, roleB); got["cp-c"] != 20 {
		t.Errorf("subset b (cp-b unhealthy, cp-c healthy): %v, want every request to cp-c", got)
	}

	// cp-a joins subset b and cp-c leaves it, by EDS alone.
	s.push(t, func() {
		s.meta = map[string]*structpb.Struct{"cp-a": lbStruct("role", []any{"a", "b"}), "cp-b": lbStruct("role", "b"), "cp-c": lbStruct("role", "c")}
	})
	lc := s.dp.cluster(subsetCluster)
	lc.mu.Lock()
	warming := lc.previous != nil || !lc.warm
	lc.mu.Unlock()
	if warming {
		t.Fatal("an EDS update made the cluster warm")
	}
	s.serving(t, "cp-a", "cp-c") // cp-b still unhealthy: no new host, no new check
	if got := s.spreadSubset(t, 20, roleB); got["cp-a"] != 20 {
		t.Errorf("subset b after the EDS update (cp-a joined, cp-c left): %v, want every request to cp-a", got)
	}
	if got := s.dp.Gauge("cluster." + subsetCluster + ".lb_subsets_active"); got != 3 {
		t.Errorf("lb_subsets_active %d, want 3 (role a, b, c)", got)
	}

	// cp-a leaves subset b: cp-b, unhealthy, is its only host: no host (panic threshold 0).
	s.push(t, func() { s.meta["cp-a"] = lbStruct("role", "a") })
	if got := s.spreadSubset(t, 5, roleB); got["503"] != 5 {
		t.Errorf("subset b with only an unhealthy host: %v, want 503 only", got)
	}
}

// TestSubsetConfigNACKed: lb_subset_config fields and values the data plane does not
// implement are rejected.
func TestSubsetConfigNACKed(t *testing.T) {
	for _, tc := range []struct {
		name string
		lb   *clusterv3.Cluster_LbSubsetConfig
		want string
	}{
		{"default_subset fallback", &clusterv3.Cluster_LbSubsetConfig{FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_DEFAULT_SUBSET}, "lb_subset_config.fallback_policy"},
		{"default_subset", &clusterv3.Cluster_LbSubsetConfig{DefaultSubset: lbStruct("role", "a")}, "lb_subset_config.default_subset"},
		{"panic_mode_any", &clusterv3.Cluster_LbSubsetConfig{PanicModeAny: true}, "lb_subset_config.panic_mode_any"},
		{"locality_weight_aware", &clusterv3.Cluster_LbSubsetConfig{LocalityWeightAware: true}, "lb_subset_config.locality_weight_aware"},
		{"metadata_fallback_policy", &clusterv3.Cluster_LbSubsetConfig{MetadataFallbackPolicy: clusterv3.Cluster_LbSubsetConfig_FALLBACK_LIST}, "lb_subset_config.metadata_fallback_policy"},
		{"selector keys_subset",
			&clusterv3.Cluster_LbSubsetConfig{SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{{Keys: []string{"a",
				"b"}, FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_KEYS_SUBSET,
				FallbackKeysSubset: []string{"a"}}}}, "lb_subset_config.subset_selectors.fallback_policy"},
		{"selector default_subset",
			&clusterv3.Cluster_LbSubsetConfig{SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{{Keys: []string{"a"},
				FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_DEFAULT_SUBSET}}},
			"lb_subset_config.subset_selectors.fallback_policy"},
		{"selector single_host_per_subset",
			&clusterv3.Cluster_LbSubsetConfig{SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{{Keys: []string{"a"},
				SingleHostPerSubset: true}}}, "lb_subset_config.subset_selectors.single_host_per_subset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := checkFields(&clusterv3.Cluster{Name: "c", LbSubsetConfig: tc.lb})
			named := false
			for _, e := range errs {
				named = named || strings.Contains(e.Error(), tc.want)
			}
			if !named {
				t.Errorf("errors %v, want one naming %s", errs, tc.want)
			}
		})
	}
	ok := &clusterv3.Cluster{Name: "c", LbSubsetConfig: roleSelectors(clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT, clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK)}
	if errs := checkFields(ok); len(errs) > 0 {
		t.Errorf("supported lb_subset_config rejected: %v", errs)
	}
	for _, ep := range []*extprocfilterv3.ExternalProcessor{
		{MetadataOptions: &extprocfilterv3.MetadataOptions{ReceivingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{Typed: []string{"x"}}}},
		{MetadataOptions: &extprocfilterv3.MetadataOptions{ForwardingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{Untyped: []string{"x"}}}},
	} {
		if errs := checkFields(ep); len(errs) != 1 {
			t.Errorf("ext_proc %v: errors %v, want one", ep, errs)
		}
	}
}

// TestHealthCheckIntervals: each host's next health check is scheduled by its own last
// result (HealthCheckerImplBase::interval): with no traffic yet, a healthy host waits
// no_traffic_healthy_interval and an unhealthy one no_traffic_interval; once the cluster has
// had traffic (a connection of its pool), an unhealthy host waits unhealthy_interval while a
// healthy one waits interval. The fast host must be checked five more times while the slow
// one (its interval an hour) is checked at most twice more.
//
// With traffic: every host passes its checks (no traffic: no_traffic_healthy_interval, short)
// until cp-b's check is held; then a request makes traffic, and the held check answers 503:
// cp-b's next checks follow unhealthy_interval (short) where no_traffic_interval and interval
// are an hour, while the healthy hosts' next checks, with traffic, wait interval (an hour).
func TestHealthCheckIntervals(t *testing.T) {
	const short, long = 150 * time.Millisecond, time.Hour
	for _, tc := range []struct {
		name                  string
		interval, unhealthy   time.Duration
		noTraffic, noTrafficH time.Duration
		traffic               bool
		fast, slow            string
	}{
		{name: "no traffic, unhealthy at no_traffic_interval", interval: long, unhealthy: long, noTraffic: short, noTrafficH: long, fast: "cp-b", slow: "cp-a"},
		{name: "no traffic, healthy at no_traffic_healthy_interval", interval: short, unhealthy: short, noTraffic: long, noTrafficH: short, fast: "cp-a", slow: "cp-b"},
		{name: "traffic, unhealthy at unhealthy_interval, healthy at interval", interval: long, unhealthy: short, noTraffic: long, noTrafficH: short, traffic: true, fast: "cp-b", slow: "cp-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSubsetEnv(t, nil)
			b := s.apiservers["cp-b"]
			hold := make(chan struct{})
			var held atomic.Int64
			// holdChecks makes cp-b hold its health checks until hold is closed, then
			// answer them 503: set with the refusal, under the lock under which the fake
			// reads both for a request.
			holdChecks := func(r *http.Request) bool {
				if r.URL.Path == "/subset-probe" {
					held.Add(1)
					select {
					case <-hold:
					case <-r.Context().Done():
					}
				}
				return false
			}
			healthy := []string{"cp-a", "cp-c"}
			if tc.traffic {
				healthy = append(healthy, "cp-b")
			} else {
				b.refuse(&refusal{status: http.StatusServiceUnavailable})
			}
			s.push(t, func() {
				s.hc = func(h *corev3.HealthCheck) {
					h.Timeout = durationpb.New(time.Hour)
					h.Interval, h.UnhealthyInterval = durationpb.New(tc.interval), durationpb.New(tc.unhealthy)
					h.NoTrafficInterval, h.NoTrafficHealthyInterval = durationpb.New(tc.noTraffic), durationpb.New(tc.noTrafficH)
				}
			})
			s.serving(t, healthy...)
			probes := func(server string) int {
				n := 0
				for _, r := range s.apiservers[server].requests() {
					if r.Path == "/subset-probe" {
						n++
					}
				}
				return n
			}
			if tc.traffic {
				b.mu.Lock()
				b.stall, b.refusal = holdChecks, &refusal{status: http.StatusServiceUnavailable}
				b.mu.Unlock()
				testutil.WaitFor(t, t.Context(), 15*time.Second, "a check of cp-b held", func() error {
					if held.Load() == 0 {
						return fmt.Errorf("none yet")
					}
					return nil
				})
				if s.stat("cluster."+subsetCluster+".upstream_cx_total") != 0 {
					t.Fatal("upstream_cx_total counted before any request (health check connections?)")
				}
				// It may reach cp-b, which refuses it now: any answer from an apiserver
				// will do, a connection of the pool was made.
				if r := s.do(s.client(nil), "GET", "/api/v1/namespaces/default/configmaps", subsetRequest(nil)); r.header.Get("Server") != "fake-apiserver" {
					t.Fatalf("the request to the subset cluster got no upstream answer: %d %s", r.status, r.body)
				}
				if s.stat("cluster."+subsetCluster+".upstream_cx_total") == 0 {
					t.Fatal("no upstream connection counted")
				}
				close(hold)
			}
			fastFrom, slowFrom := probes(tc.fast), probes(tc.slow)
			testutil.WaitFor(t, t.Context(), 20*time.Second, tc.fast+" checked 5 more times", func() error {
				if n := probes(tc.fast); n < fastFrom+5 {
					return fmt.Errorf("%s checked %d more times", tc.fast, n-fastFrom)
				}
				return nil
			})
			if n := probes(tc.slow) - slowFrom; n > 2 {
				t.Errorf("%s checked %d more times meanwhile, want at most 2 (its interval is an hour)", tc.slow, n)
			}
		})
	}
}

// TestHealthCheckTransitions: a check's result and transition, as ActiveHealthCheckSession's
// handleSuccess and setUnhealthy (health_checker_base_impl.cc) make them, and the interval
// each schedules (HealthCheckerImplBase::interval).
func TestHealthCheckTransitions(t *testing.T) {
	const s = time.Second
	cc := &clusterCfg{hc: &healthCheckCfg{healthy: 2, unhealthy: 3, interval: 1 * s, unhealthyInterval: 2 * s, unhealthyEdge: 3 * s, healthyEdge: 4 * s, noTraffic: 5 * s, noTrafficHealthy: 6 * s}}
	c := &liveCluster{}
	h := newLiveHost(hostCfg{address: "x"})
	h.hcPending, h.failedHC = true, true
	type step struct {
		ok, network bool
		want        hcTransition
		healthy     bool
		traffic     time.Duration // the interval with traffic
		noTraffic   time.Duration
	}
	for i, st := range []step{
		{ok: false, network: false, want: hcUnchanged, healthy: false, traffic: 2, noTraffic: 5}, // first check fails: stays unhealthy
		{ok: true, want: hcChangePending, healthy: false, traffic: 4, noTraffic: 5},              // 1 of healthy_threshold 2
		{ok: true, want: hcChanged, healthy: true, traffic: 1, noTraffic: 6},
		{ok: true, want: hcUnchanged, healthy: true, traffic: 1, noTraffic: 6},
		{ok: false, network: true, want: hcChangePending, healthy: true, traffic: 3, noTraffic: 5}, // 1 of unhealthy_threshold 3
		{ok: false, network: true, want: hcChangePending, healthy: true, traffic: 3, noTraffic: 5},
		{ok: true, want: hcUnchanged, healthy: true, traffic: 1, noTraffic: 6}, // resets the count
		{ok: false, network: true, want: hcChangePending, healthy: true, traffic: 3, noTraffic: 5},
		{ok: false, network: false, want: hcChanged, healthy: false, traffic: 2, noTraffic: 5}, // a failed response: at once
		{ok: false, network: true, want: hcUnchanged, healthy: false, traffic: 2, noTraffic: 5},
	} {
		got, _ := c.recordCheck(cc, h, st.ok, st.network)
		h.mu.Lock()
		healthy := !h.failedHC
		h.mu.Unlock()
		if got != st.want || healthy != st.healthy {
			t.Fatalf("step %d: transition %d, healthy %t; want %d, %t", i, got, healthy, st.want, st.healthy)
		}
		if d := cc.hc.next(true, st.ok, got); d != st.traffic*time.Second {
			t.Errorf("step %d: interval with traffic %v, want %ds", i, d, st.traffic)
		}
		if d := cc.hc.next(false, st.ok, got); d != st.noTraffic*time.Second {
			t.Errorf("step %d: interval without traffic %v, want %ds", i, d, st.noTraffic)
		}
	}
}

// testCluster is a cluster a test adds beside the snapshot's: a copy of kube-apiservers
// named name, its health check probing probePath, with a copy of its load assignment, and a
// route to it first in every virtual host for the requests that carry the header header.
type testCluster struct {
	name, probePath, header string
	// version is appended to the versions of the clusters, endpoints and routes.
	version string
	// keep, if set, says which endpoints stay, by address (host:port), and may change them.
	keep func(addr string, ep *endpointv3.LbEndpoint) bool
	// metadataMatch, if set, is the route's metadata_match.
	metadataMatch *corev3.Metadata
}

// add adds the cluster, its endpoints and its routes to res, and returns the cluster for the
// caller to change further.
func (tc testCluster) add(res *snapshot.Resources) (*clusterv3.Cluster, error) {
	var base *clusterv3.Cluster
	for _, r := range res.Clusters {
		if c := r.(*clusterv3.Cluster); c.GetName() == "kube-apiservers" {
			base = c
		}
	}
	if base == nil || len(base.GetHealthChecks()) == 0 {
		return nil, fmt.Errorf("no kube-apiservers cluster with health checks")
	}
	nc := proto.Clone(base).(*clusterv3.Cluster)
	nc.Name = tc.name
	nc.EdsClusterConfig.ServiceName = ""
	nc.HealthChecks[0].GetHttpHealthCheck().Path = tc.probePath
	res.Clusters = append(res.Clusters, nc)
	for _, r := range res.Endpoints {
		cla := r.(*endpointv3.ClusterLoadAssignment)
		if cla.GetClusterName() != "kube-apiservers" {
			continue
		}
		ncla := proto.Clone(cla).(*endpointv3.ClusterLoadAssignment)
		ncla.ClusterName = tc.name
		for _, l := range ncla.GetEndpoints() {
			var kept []*endpointv3.LbEndpoint
			for _, ep := range l.GetLbEndpoints() {
				sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
				if tc.keep == nil || tc.keep(fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()), ep) {
					kept = append(kept, ep)
				}
			}
			l.LbEndpoints = kept
		}
		res.Endpoints = append(res.Endpoints, ncla)
		break
	}
	for _, r := range res.Routes {
		for _, vh := range r.(*routev3.RouteConfiguration).GetVirtualHosts() {
			ra := &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: tc.name}}
			if tc.metadataMatch != nil {
				ra.MetadataMatch = proto.Clone(tc.metadataMatch).(*corev3.Metadata)
			}
			rt := &routev3.Route{
				Match: &routev3.RouteMatch{
					PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
					Headers:       []*routev3.HeaderMatcher{{Name: tc.header, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}},
				},
				Action: &routev3.Route_Route{Route: ra},
			}
			vh.Routes = append([]*routev3.Route{rt}, vh.Routes...)
		}
	}
	for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.RouteType} {
		res.TypeVersions[typ] += tc.version
	}
	return nc, nil
}
