package inventory

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// buildInputs is everything of one rebuild that objects.Build's result depends on, in a form
// cheap to compare: a rebuild whose inputs equal the last build's builds nothing, so a Lease
// renewal or the re-judging tick costs the judging of the Leases, not a topology (with 2,000
// CRDs a build is 4 ms, and there are 24 such rebuilds a minute).
//
// Build reads the time only to judge the Leases (objects.APIServers) and which CRDs are
// young enough to be pending (youngCRDs), so the verdicts and the young CRDs stand for it;
// which apiservers are verified follows from the discovery, compared too
// (objects.Verify). The other watched objects are compared apart, by identity (sameObjects).
type buildInputs struct {
	// leases without their renewals (renewTime, resourceVersion, managedFields).
	leases []coordinationv1.Lease
	// servers and verdictErrs are objects.APIServers' judgement of them at this rebuild.
	servers     []topology.APIServer
	verdictErrs string
	// discovery, discoveredAt and versions are discoveryFor's answer (lists by pointer).
	discovery    map[string]*apidiscoveryv2.APIGroupDiscoveryList
	discoveredAt map[string]time.Time
	versions     map[string]string
	headerNames  memory.RequestHeaderNames
	// crds are the CRDs young enough to be pending (youngCRDs at this rebuild).
	crds []objects.CRD
	// departed is the memory of the apiservers without discovery in use: Build reads the
	// memory of no other (theirs changes at every look: the time they were last seen).
	departed memory.Memory
}

// inputsOf captures what Build will read of objs at opts.Now, but the watched objects other
// than Leases.
func inputsOf(objs objects.Objects, opts objects.Options) *buildInputs {
	in := &buildInputs{
		discovery: objs.Discovery, discoveredAt: objs.DiscoveredAt, versions: objs.Versions,
		headerNames: objs.HeaderNames, crds: objs.CRDs,
	}
	in.headerNames.GoodAt = time.Time{} // when they were first read: Build does not read it
	for _, l := range objs.Leases {
		l.Spec.RenewTime, l.ResourceVersion, l.ManagedFields = nil, "", nil // a copy: objs keeps them
		in.leases = append(in.leases, l)
	}
	var errs []error
	in.servers, errs = objects.APIServers(objs.Leases, opts)
	in.verdictErrs = fmt.Sprint(errs)
	for id, r := range objs.Remembered {
		if objs.Discovery[id] == nil {
			if in.departed == nil {
				in.departed = memory.Memory{}
			}
			in.departed[id] = r
		}
	}
	return in
}

// same reports whether Build would build from in what it built from prev, the other watched
// objects aside.
func (in *buildInputs) same(prev *buildInputs) bool {
	return prev != nil && maps.Equal(in.discovery, prev.discovery) && maps.EqualFunc(in.discoveredAt, prev.discoveredAt, time.Time.Equal) &&
		maps.Equal(in.versions, prev.versions) && in.verdictErrs == prev.verdictErrs &&
		reflect.DeepEqual(in.servers, prev.servers) && reflect.DeepEqual(in.leases, prev.leases) &&
		reflect.DeepEqual(in.headerNames, prev.headerNames) && reflect.DeepEqual(in.departed, prev.departed) &&
		slices.EqualFunc(in.crds, prev.crds, func(a, b objects.CRD) bool { return a.Name == b.Name && a.Created.Equal(b.Created) })
}

// sameObjects reports whether objects (the authentication ConfigMap, StorageVersions,
// APIServices, as the stores hold them) are the set before. They count by identity: an
// informer's store replaces an object that changes, never edits it. Nothing is copied or
// allocated: with 2,000 CRDs there are about as many StorageVersions, at every Lease renewal.
func sameObjects(objects []any, before map[any]bool) bool {
	if len(objects) != len(before) {
		return false
	}
	for _, o := range objects {
		if !before[o] {
			return false
		}
	}
	return true
}

// setOf is objects as a set, for sameObjects.
func setOf(objects []any) map[any]bool {
	set := make(map[any]bool, len(objects))
	for _, o := range objects {
		set[o] = true
	}
	return set
}
