package dataplane

import (
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Subset load balancing: Envoy's SubsetLoadBalancer
// (source/extensions/load_balancing_policies/subset/subset_lb.cc) for the part of
// Cluster.lb_subset_config the allowlist admits: fallback_policy NO_FALLBACK or ANY_ENDPOINT,
// subset_selectors with keys and a fallback_policy NOT_DEFINED, NO_FALLBACK or ANY_ENDPOINT,
// and list_as_any.

// envoyLB is the metadata namespace of load balancing (Config::MetadataFilters::ENVOY_LB):
// of hosts' subset values, of routes' metadata_match and of the request's dynamic metadata
// the router merges into its criteria.
const envoyLB = "envoy.lb"

type selectorPolicy = clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_LbSubsetSelectorFallbackPolicy

type subsetCfg struct {
	// anyEndpoint is fallback_policy ANY_ENDPOINT (else NO_FALLBACK: the allowlist admits no
	// other): the fallback subset is every host (initSubsetAnyOnce), or there is none.
	anyEndpoint bool
	listAsAny   bool
	// selectors are the subset_selectors' keys, each sorted and without duplicates (Envoy
	// keeps them in a std::set), in order; selectors without keys are left out, as
	// LoadBalancerSubsetInfoImpl does.
	selectors [][]string
	// fallbacks is Envoy's selector tree (SubsetLoadBalancer::initSubsetSelectorMap)
	// flattened: every prefix of every selector's sorted keys (joined by keyPath) -> the
	// fallback_policy of that node. A node takes the policy of the selector that created it
	// when the selector's keys end there, NOT_DEFINED otherwise, and keeps it: a later
	// selector ending at an existing node does not set it (as in Envoy).
	fallbacks map[string]selectorPolicy
}

// compileSubset is nil when the subset load balancer is not enabled: Envoy enables it only
// with subset_selectors (LoadBalancerSubsetInfoImpl: enabled_ is !subset_selectors().empty()).
func compileSubset(sc *clusterv3.Cluster_LbSubsetConfig) *subsetCfg {
	if len(sc.GetSubsetSelectors()) == 0 {
		return nil
	}
	out := &subsetCfg{
		anyEndpoint: sc.GetFallbackPolicy() == clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT,
		listAsAny:   sc.GetListAsAny(),
		fallbacks:   map[string]selectorPolicy{},
	}
	for _, sel := range sc.GetSubsetSelectors() {
		keys := slices.Compact(slices.Sorted(slices.Values(sel.GetKeys())))
		if len(keys) == 0 {
			continue
		}
		out.selectors = append(out.selectors, keys)
		for i := range keys {
			p := keyPath(keys[:i+1])
			if _, ok := out.fallbacks[p]; ok {
				continue
			}
			policy := clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NOT_DEFINED
			if i == len(keys)-1 {
				policy = sel.GetFallbackPolicy()
			}
			out.fallbacks[p] = policy
		}
	}
	return out
}

func keyPath(keys []string) string { return strings.Join(keys, "\x00") }

// subsetKV is one key and value of a subset's metadata or of a request's criteria.
type subsetKV struct {
	key   string
	value *structpb.Value
}

// subsetID identifies a subset by its key-value pairs, sorted by key: the path of Envoy's
// LbSubsetMap tree, whose values compare as HashedValue (the protobuf Value).
func subsetID(kvs []subsetKV) string {
	var b strings.Builder
	for _, kv := range kvs {
		v, _ := proto.MarshalOptions{Deterministic: true}.Marshal(kv.value)
		b.WriteString(kv.key)
		b.WriteByte(0)
		b.Write(v)
		b.WriteByte(0)
	}
	return b.String()
}

// subsetLB is a cluster version's subsets, computed from its hosts whenever they change (EDS
// updates, removals): Envoy's SubsetLoadBalancer::update runs processSubsets over every host
// on each host set update, hosts' metadata having possibly changed in place.
type subsetLB struct {
	subsets map[string]*lbSubset // by subsetID
	anyRR   atomic.Uint64        // round robin of the any-endpoint subset
}

type lbSubset struct {
	hosts []*liveHost
	rr    atomic.Uint64
}

// extractSubsetMetadata is SubsetLoadBalancer::extractSubsetMetadata: the host's values
// (filter_metadata["envoy.lb"]) for every key of a selector, none if it lacks one; with
// list_as_any, a list value makes one set of key-values per element (so a host may be in
// several subsets of one selector).
func (sc *subsetCfg) extractSubsetMetadata(keys []string, h *liveHost) [][]subsetKV {
	fields := h.metadata().GetFilterMetadata()[envoyLB].GetFields()
	var all [][]subsetKV
	for _, k := range keys {
		v, ok := fields[k]
		if !ok {
			return nil
		}
		vals := []*structpb.Value{v}
		if lv := v.GetListValue(); sc.listAsAny && lv != nil {
			vals = lv.GetValues()
		}
		if len(all) == 0 {
			for _, x := range vals {
				all = append(all, []subsetKV{{k, x}})
			}
			continue
		}
		var next [][]subsetKV
		for _, kvs := range all {
			for _, x := range vals {
				next = append(next, append(slices.Clone(kvs), subsetKV{k, x}))
			}
		}
		all = next
	}
	return all
}

// buildSubsets computes the subsets of hosts. prev (may be nil) is the same cluster version's
// previous computation: its round-robin positions carry over. With statPrefix, the cluster's
// lb_subsets_* stats are updated as Envoy's are: lb_subsets_active (a gauge) is the number of
// subsets with hosts, lb_subsets_created counts subsets that appeared
// (initLbSubsetEntryOnce), lb_subsets_removed those that were left without hosts
// (purgeEmptySubsets).
func (sc *subsetCfg) buildSubsets(d *DataPlane, hosts []*liveHost, prev *subsetLB, statPrefix string) *subsetLB {
	out := &subsetLB{subsets: map[string]*lbSubset{}}
	if prev != nil {
		out.anyRR.Store(prev.anyRR.Load())
	}
	for _, h := range hosts {
		for _, keys := range sc.selectors {
			for _, kvs := range sc.extractSubsetMetadata(keys, h) {
				id := subsetID(kvs)
				s := out.subsets[id]
				if s == nil {
					s = &lbSubset{}
					if prev != nil && prev.subsets[id] != nil {
						s.rr.Store(prev.subsets[id].rr.Load())
					}
					out.subsets[id] = s
				}
				if !slices.Contains(s.hosts, h) {
					s.hosts = append(s.hosts, h)
				}
			}
		}
	}
	if statPrefix != "" {
		for id := range out.subsets {
			if prev == nil || prev.subsets[id] == nil {
				d.stats.inc(statPrefix + "lb_subsets_created")
			}
		}
		if prev != nil {
			for id := range prev.subsets {
				if out.subsets[id] == nil {
					d.stats.inc(statPrefix + "lb_subsets_removed")
				}
			}
		}
		d.stats.gauge(statPrefix + "lb_subsets_active").Store(int64(len(out.subsets)))
	}
	return out
}

// subsetCriteria is the request's metadata match criteria, as Envoy's router computes them
// once per request (Router::Filter::metadataMatchCriteria, source/common/router/router.cc;
// retries use the same): the route's metadata_match["envoy.lb"] with the request's dynamic
// metadata namespace "envoy.lb" merged over it (MetadataMatchCriteriaImpl::
// mergeMatchCriteria: its values replace the route's for the same key, and add keys), sorted
// by key.
func (st *stream) subsetCriteria(rt *route) []subsetKV {
	m := map[string]*structpb.Value{}
	for k, v := range rt.metadataMatch.GetFields() {
		m[k] = v
	}
	for k, v := range st.dynamicMetadata[envoyLB].GetFields() {
		m[k] = v
	}
	out := make([]subsetKV, 0, len(m))
	for k, v := range m {
		out = append(out, subsetKV{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// choose picks the host of a request attempt: with a subset load balancer,
// SubsetLoadBalancer::chooseHostIteration; otherwise the cluster's load balancer over every
// host (pick).
//
// With criteria that name an existing subset with hosts (findSubset: the criteria's keys
// must be exactly a selector's, and their values a subset's), the subset's own load balancer
// chooses among its hosts, health and panic threshold evaluated on them, and its answer
// stands even if it is no host (lb_subsets_selected). Otherwise the selector whose keys are
// the criteria's keys decides, if its fallback_policy is not NOT_DEFINED
// (tryFindSelectorFallbackParams, chooseHostForSelectorFallbackPolicy): ANY_ENDPOINT picks
// among every host, NO_FALLBACK none. Otherwise (no criteria, or no such selector or policy),
// the top-level fallback_policy: ANY_ENDPOINT picks among every host (lb_subsets_fallback
// when that found one), NO_FALLBACK none.
func (c *liveCluster) choose(cc *clusterCfg, hosts []*liveHost, lb *subsetLB, criteria []subsetKV, tried map[*liveHost]bool, maxSelections int) *liveHost {
	sc := cc.subset
	if sc == nil || lb == nil {
		return c.pickFrom(cc, hosts, &c.rr, tried, maxSelections)
	}
	if len(criteria) > 0 {
		if s := lb.subsets[subsetID(criteria)]; s != nil && len(s.hosts) > 0 {
			c.d.stats.inc("cluster." + cc.stat + ".lb_subsets_selected")
			return c.pickFrom(cc, s.hosts, &s.rr, tried, maxSelections)
		}
		keys := make([]string, len(criteria))
		for i, kv := range criteria {
			keys[i] = kv.key
		}
		switch sc.fallbacks[keyPath(keys)] {
		case clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_ANY_ENDPOINT:
			return c.pickFrom(cc, hosts, &lb.anyRR, tried, maxSelections)
		case clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK:
			return nil
		}
	}
	if !sc.anyEndpoint {
		return nil
	}
	h := c.pickFrom(cc, hosts, &lb.anyRR, tried, maxSelections)
	if h != nil {
		c.d.stats.inc("cluster." + cc.stat + ".lb_subsets_fallback")
	}
	return h
}
