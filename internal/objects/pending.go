package objects

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// CRD is what Build reads of a CustomResourceDefinition: its name (<plural>.<group>, as the
// apiserver requires) and when it was created. The inventory watches CRDs' metadata only.
type CRD struct {
	Name    string
	Created time.Time
}

// PendingWindow is how long after its creation a CRD's resource that no apiserver lists yet
// is pending (topology.Topology.Pending): answered 503 with Retry-After, which client-go
// retries, rather than sent to the default set, where an apiserver that does not serve it
// yet answers 404. Apiservers list a new CRD within a second or two, even in a burst of
// thousands; after the window one that no apiserver serves (its names not accepted, say)
// goes to the default set again, which answers 404 as the apiservers do.
const PendingWindow = 30 * time.Second

// MaxPendingResources bounds the pending resources (anyone who may create CRDs names them);
// the rest go to the default set as before.
const MaxPendingResources = 1000

// pendingResources are the resources of the CRDs created within PendingWindow of now that no
// routable apiserver lists (served, by ID), one per version of their group that an
// APIService kube-aggregator made for CRDs names (a CRD's metadata has no versions).
func pendingResources(crds []CRD, services []APIService, served map[topology.Resource][]string, t *topology.Topology, now time.Time) ([]topology.Resource, []error) {
	versions := map[string][]string{}
	for _, s := range services {
		if s.Spec.Service == nil && s.Labels[AutomanagedLabel] == "true" && s.Spec.Group != "" && s.Spec.Version != "" {
			versions[s.Spec.Group] = append(versions[s.Spec.Group], s.Spec.Version)
		}
	}
	var keys []topology.Resource
	var errs []error
	for _, c := range crds {
		if age := now.Sub(c.Created); c.Created.IsZero() || age >= PendingWindow || age <= -PendingWindow {
			continue
		}
		plural, group, ok := strings.Cut(c.Name, ".")
		if !ok {
			continue // the apiserver refuses such a name; nothing is pending
		}
		for _, v := range versions[group] {
			key := topology.Resource{Group: group, Version: v, Resource: plural}
			if slices.ContainsFunc(served[key], func(id string) bool { s, ok := t.Server(id); return ok && s.Routable() }) {
				continue // listed (its names were checked then): most young CRDs, soon
			}
			if err := checkResource("CustomResourceDefinition "+c.Name, key); err != nil {
				errs = append(errs, err)
				break
			}
			if len(keys) == MaxPendingResources {
				return keys, append(errs, fmt.Errorf("more than %d resources of new CRDs no apiserver lists yet: the rest go to every apiserver at once", MaxPendingResources))
			}
			keys = append(keys, key)
		}
	}
	return keys, errs
}
