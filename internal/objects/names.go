package objects

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Group, version and resource names come from what apiservers say about themselves
// (discovery, and the memory of it), from APIServices and from StorageVersions: any of them
// may be written by an attacker, and a name Envoy's path rules refuse would make every
// snapshot fail to build. So each is checked as Kubernetes checks the names it lets anyone
// define, before it reaches the plan: a group is a DNS-1123 subdomain (or "" for the core
// group), a version a DNS-1035 label (CRD and APIService versions), a resource or
// subresource a DNS-1123 label (lower-case letters, digits and '-', as every built-in
// resource and a CRD's plural are). What fails is left out, with a NameError; the rest is
// used.

// NameError is a name left out, and where it came from.
type NameError struct{ topology.NameRefusal }

func (e *NameError) Error() string {
	return fmt.Sprintf("%s: %s %q left out: %s", e.Source, e.Kind, e.Name, e.Reason)
}

func nameError(source, kind, name string, problems []string) *NameError {
	return &NameError{topology.NameRefusal{Source: source, Kind: kind, Name: clip(name), Reason: strings.Join(problems, "; ")}}
}

// clip keeps a refused name short enough to log and show: it may be 100 KB.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:max], len(s))
}

func checkGroup(g string) []string {
	if g == "" {
		return nil
	}
	return validation.IsDNS1123Subdomain(g)
}

func checkVersion(v string) []string { return validation.IsDNS1035Label(v) }

func checkResourceName(r string) []string { return validation.IsDNS1123Label(r) }

// checkResource is the first problem of r's names, as a NameError naming source; nil when r
// is fine.
func checkResource(source string, r topology.Resource) *NameError {
	if p := checkGroup(r.Group); p != nil {
		return nameError(source, "group", r.Group, p)
	}
	if p := checkVersion(r.Version); p != nil {
		return nameError(source, "version", r.Group+"/"+r.Version, p)
	}
	if p := checkResourceName(r.Resource); p != nil {
		return nameError(source, "resource", r.Resource, p)
	}
	if r.Subresource != "" {
		if p := checkResourceName(r.Subresource); p != nil {
			return nameError(source, "subresource", r.Resource+"/"+r.Subresource, p)
		}
	}
	return nil
}

// Bounds on one apiserver's discovery, far above any real cluster's (a few hundred
// group/versions, a few thousand resources with many CRDs) and far below what fits the chart's
// memory limits: what is over them is left out, with an error, so one bloated apiserver or
// CRD costs its own entries, never the process. The body itself is bounded before decoding
// (inventory's --max-discovery-body).
const (
	MaxDiscoveryGroups          = 2000
	MaxDiscoveryVersions        = 64 // per group
	MaxDiscoveryResources       = 20000
	MaxDiscoveryResourceStrings = 64 // short names, categories, verbs and subresources, each, per resource
)

// validDiscovery is list without the groups, versions, resources and subresources whose
// names fail or that are over the bounds above, and an error for each left out (one per
// bound). list itself when nothing fails (the common case costs no copy).
func validDiscovery(source string, list *apidiscoveryv2.APIGroupDiscoveryList) (*apidiscoveryv2.APIGroupDiscoveryList, []error) {
	if list == nil || discoveryNamesValid(list) {
		return list, nil
	}
	var errs []error
	over := map[string]bool{}
	bound := func(what string, limit int) {
		if !over[what] {
			over[what] = true
			errs = append(errs, fmt.Errorf("%s: more than %d %s; the rest left out", source, limit, what))
		}
	}
	resourcesSeen := 0
	out := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: list.TypeMeta} // the kept groups are copied below
	for _, g := range list.Items {
		if len(out.Items) == MaxDiscoveryGroups {
			bound("groups", MaxDiscoveryGroups)
			break
		}
		if p := checkGroup(g.Name); p != nil {
			errs = append(errs, nameError(source, "group", g.Name, p))
			continue
		}
		g := *g.DeepCopy()
		versions := g.Versions[:0]
		for _, v := range g.Versions {
			if len(versions) == MaxDiscoveryVersions {
				bound("versions in a group", MaxDiscoveryVersions)
				break
			}
			if p := checkVersion(v.Version); p != nil {
				errs = append(errs, nameError(source, "version", g.Name+"/"+v.Version, p))
				continue
			}
			resources := v.Resources[:0]
			for _, r := range v.Resources {
				if p := checkResourceName(r.Resource); p != nil {
					errs = append(errs, nameError(source, "resource", r.Resource, p))
					continue
				}
				if resourcesSeen++; resourcesSeen > MaxDiscoveryResources {
					bound("resources", MaxDiscoveryResources)
					break
				}
				for _, l := range []*[]string{&r.ShortNames, &r.Categories, &r.Verbs} {
					if len(*l) > MaxDiscoveryResourceStrings {
						bound("short names, categories or verbs of a resource", MaxDiscoveryResourceStrings)
						*l = (*l)[:MaxDiscoveryResourceStrings]
					}
				}
				if len(r.Subresources) > MaxDiscoveryResourceStrings {
					bound("subresources of a resource", MaxDiscoveryResourceStrings)
					r.Subresources = r.Subresources[:MaxDiscoveryResourceStrings]
				}
				subs := r.Subresources[:0]
				for _, s := range r.Subresources {
					if p := checkResourceName(s.Subresource); p != nil {
						errs = append(errs, nameError(source, "subresource", r.Resource+"/"+s.Subresource, p))
						continue
					}
					subs = append(subs, s)
				}
				r.Subresources = subs
				resources = append(resources, r)
			}
			v.Resources = resources
			versions = append(versions, v)
		}
		g.Versions = versions
		out.Items = append(out.Items, g)
	}
	return out, errs
}

// DiscoveryMemo remembers, between builds, what Build derives from discovery lists that did
// not change (by pointer: a fetch brings a new list): each list's names check and the
// merged document. A rebuild with nothing fetched since (a Lease renewal, the re-judging
// tick) then neither checks a name nor merges and marshals the document again. Its zero
// value is ready; nil derives everything every time.
type DiscoveryMemo struct {
	m map[checkedKey]checkedList
	// merged is the last merged document and what it was merged from; groups, each group's.
	merged *mergedDiscovery
	groups groupMemo
}

// checkedKey: the same list checked for another apiserver names that apiserver in its errors.
type checkedKey struct {
	id   string
	list *apidiscoveryv2.APIGroupDiscoveryList
}

type checkedList struct {
	list *apidiscoveryv2.APIGroupDiscoveryList
	errs []error
}

type mergedDiscovery struct {
	lists    []*apidiscoveryv2.APIGroupDiscoveryList
	priority map[string]int32
	doc      *topology.Discovery
}

// valid is validDiscovery of apiserver id's list.
func (c *DiscoveryMemo) valid(id string, list *apidiscoveryv2.APIGroupDiscoveryList) (*apidiscoveryv2.APIGroupDiscoveryList, []error) {
	source := "discovery of apiserver " + id
	if c == nil {
		return validDiscovery(source, list)
	}
	k := checkedKey{id, list}
	if v, ok := c.m[k]; ok {
		return v.list, v.errs
	}
	out, errs := validDiscovery(source, list)
	if c.m == nil {
		c.m = map[checkedKey]checkedList{}
	}
	c.m[k] = checkedList{out, errs}
	return out, errs
}

// keepOnly forgets every list but those given, so the memory holds no list a build no longer
// reads.
func (c *DiscoveryMemo) keepOnly(lists map[string]*apidiscoveryv2.APIGroupDiscoveryList) {
	if c == nil {
		return
	}
	for k := range c.m {
		if lists[k.id] != k.list {
			delete(c.m, k)
		}
	}
}

// merge is MergeDiscoveryOrdered, merged again only when a list (by pointer, in order) or a
// priority changed since the last call, and then only the groups whose entries changed.
func (c *DiscoveryMemo) merge(lists []*apidiscoveryv2.APIGroupDiscoveryList, priority map[string]int32) *topology.Discovery {
	if c == nil {
		return MergeDiscoveryOrdered(lists, priority)
	}
	if m := c.merged; m != nil && slices.Equal(m.lists, lists) && maps.Equal(m.priority, priority) {
		return m.doc
	}
	doc := c.groups.merge(lists, priority)
	c.merged = &mergedDiscovery{lists: slices.Clone(lists), priority: priority, doc: doc}
	return doc
}

func discoveryNamesValid(list *apidiscoveryv2.APIGroupDiscoveryList) bool {
	if len(list.Items) > MaxDiscoveryGroups {
		return false
	}
	n := 0
	for _, g := range list.Items {
		if checkGroup(g.Name) != nil || len(g.Versions) > MaxDiscoveryVersions {
			return false
		}
		for _, v := range g.Versions {
			if checkVersion(v.Version) != nil {
				return false
			}
			if n += len(v.Resources); n > MaxDiscoveryResources {
				return false
			}
			for _, r := range v.Resources {
				if checkResourceName(r.Resource) != nil || len(r.ShortNames) > MaxDiscoveryResourceStrings || len(r.Categories) > MaxDiscoveryResourceStrings ||
					len(r.Verbs) > MaxDiscoveryResourceStrings || len(r.Subresources) > MaxDiscoveryResourceStrings {
					return false
				}
				for _, s := range r.Subresources {
					if checkResourceName(s.Subresource) != nil {
						return false
					}
				}
			}
		}
	}
	return true
}
