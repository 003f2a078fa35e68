package topology_test

import (
	"slices"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := topology.New([]topology.APIServer{{ID: "a"}, {ID: "a"}}, nil, nil); err == nil {
		t.Error("duplicate IDs accepted")
	}
	if _, err := topology.New([]topology.APIServer{{Hostname: "h"}}, nil, nil); err == nil {
		t.Error("apiserver without ID accepted")
	}
	if _, err := topology.New(nil, map[topology.Resource][]string{{Group: "g", Resource: "r"}: {"a"}}, nil); err == nil {
		t.Error("resource without version accepted")
	}
}

// A group/version's document goes to whoever serves any resource of it: a subset when only
// some live apiservers serve some of it, the default set when every live one serves some,
// 503 when only dead ones do.
// live is an apiserver that is alive, with an address from its ID's last character.
func live(id string) topology.APIServer {
	return topology.APIServer{ID: id, Hostname: id, Address: "10.0.0." + id[len(id)-1:] + ":6443", Alive: true, Verified: true}
}

// resourceOf is resource r of gv.
func resourceOf(gv topology.GroupVersion, r string) topology.Resource {
	return topology.Resource{Group: gv.Group, Version: gv.Version, Resource: r}
}

func TestDecideDocument(t *testing.T) {
	dead := topology.APIServer{ID: "d", Hostname: "d"}
	batch := topology.GroupVersion{Group: "batch", Version: "v1"}
	alpha := topology.GroupVersion{Group: "x.k8s.io", Version: "v1alpha1"}
	gone := topology.GroupVersion{Group: "gone.k8s.io", Version: "v1"}
	tp, err := topology.New([]topology.APIServer{live("s1"), live("s2"), live("s3"), dead}, map[topology.Resource][]string{
		resourceOf(batch, "jobs"):     {"s1", "s2"},
		resourceOf(batch, "cronjobs"): {"s2", "s3"},
		resourceOf(alpha, "things"):   {"s1"},
		resourceOf(alpha, "others"):   {"s2"},
		resourceOf(gone, "ghosts"):    {"d"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		gv      topology.GroupVersion
		outcome topology.Outcome
		servers topology.ServerSet
	}{
		{batch, topology.Default, nil},                                               // s1+s2+s3: every live one
		{alpha, topology.Subset, topology.ServerSet{"s1", "s2"}},                     // the union, not either resource's set
		{gone, topology.Unavailable, topology.ServerSet{"d"}},                        // only a dead one
		{topology.GroupVersion{Group: "nope", Version: "v1"}, topology.Default, nil}, // unpublished
	} {
		d := tp.DecideResource(c.gv.Document())
		if d.Outcome != c.outcome || !equalSets(d.Servers, c.servers) {
			t.Errorf("%s document: %s %v, want %s %v", c.gv, d.Outcome, d.Servers, c.outcome, c.servers)
		}
	}
	if !batch.Document().IsDocument() || resourceOf(batch, "jobs").IsDocument() {
		t.Error("IsDocument")
	}
}

func equalSets(a, b topology.ServerSet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestServedEverywhereClaims: a group/version that an APIService says every apiserver serves
// (a CRD's, or one claimed by anyone who may create CRDs or APIServices) is per
// group/version, never overrides the apiservers' own discovery, and costs nothing where
// discovery agrees with it.
func TestServedEverywhereClaims(t *testing.T) {
	dead := topology.APIServer{ID: "d", Hostname: "d"}
	events := topology.GroupVersion{Group: "events.k8s.io", Version: "v1"}
	crd := topology.GroupVersion{Group: "stable.example.com", Version: "v1"}
	tp, err := topology.New([]topology.APIServer{live("s1"), live("s2"), dead}, map[topology.Resource][]string{
		resourceOf(events, "events"):                                     {"s1"},            // built in, s2 has it off
		resourceOf(events, "widgets"):                                    {"s1", "s2"},      // the CRD claiming the group/version
		resourceOf(crd, "crontabs"):                                      {"s1", "s2", "d"}, // every live one lists it
		resourceOf(crd, "fresh"):                                         {"s2"},            // not yet in s1's discovery
		resourceOf(crd, "departed"):                                      {"d"},             // only a dead one lists it
		{Group: "events.k8s.io", Version: "v1beta1", Resource: "events"}: {"s1"},            // not claimed
	}, []topology.GroupVersion{events, crd, {Group: "events.k8s.io", Version: "v1alpha9"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r       topology.Resource
		outcome topology.Outcome
		servers topology.ServerSet
	}{
		{resourceOf(events, "events"), topology.Subset, topology.ServerSet{"s1"}},
		{resourceOf(events, "widgets"), topology.Default, nil},
		{events.Document(), topology.Subset, topology.ServerSet{"s1"}}, // only s1 lists some resource of it still
		{topology.Resource{Group: "events.k8s.io", Version: "v1beta1", Resource: "events"}, topology.Subset, topology.ServerSet{"s1"}},
		{resourceOf(crd, "crontabs"), topology.Default, nil},
		{resourceOf(crd, "fresh"), topology.Subset, topology.ServerSet{"s2"}},
		{resourceOf(crd, "departed"), topology.Default, nil}, // every apiserver's chain serves a CRD: never 503
		{resourceOf(crd, "unlisted"), topology.Default, nil},
	} {
		if d := tp.DecideResource(c.r); d.Outcome != c.outcome || !equalSets(d.Servers, c.servers) {
			t.Errorf("%s: %s %v, want %s %v", c.r, d.Outcome, d.Servers, c.outcome, c.servers)
		}
	}
	// What every live apiserver lists, or none does, needs no route: it is not published.
	for _, r := range []topology.Resource{resourceOf(events, "widgets"), resourceOf(crd, "crontabs"), resourceOf(crd, "departed")} {
		if _, ok := tp.Served[r]; ok {
			t.Errorf("%s is published; a claimed group/version's resource every live apiserver (or none) lists needs no route", r)
		}
	}
}

// TestPendingResources: a new CRD's resource that no apiserver lists yet is Unavailable and
// Pending (a 503 with Retry-After), with its subresources and, when no apiserver lists
// anything of it, its group/version's document; one some live apiserver lists goes by who
// lists it, and a pending key names no subresource.
func TestPendingResources(t *testing.T) {
	crd := topology.GroupVersion{Group: "stable.example.com", Version: "v1"}
	fresh := topology.GroupVersion{Group: "fresh.example.com", Version: "v1"}
	tp, err := topology.New([]topology.APIServer{live("s1"), live("s2")}, map[topology.Resource][]string{
		resourceOf(crd, "crontabs"): {"s1", "s2"},
		resourceOf(crd, "listed"):   {"s2"},
	}, []topology.GroupVersion{crd, fresh})
	if err != nil {
		t.Fatal(err)
	}
	tp.SetPending([]topology.Resource{
		resourceOf(crd, "widgets"), resourceOf(crd, "listed"), resourceOf(fresh, "gadgets"),
		{Group: crd.Group, Version: crd.Version, Resource: "widgets", Subresource: "status"},
	})
	widgets := resourceOf(crd, "widgets")
	for _, c := range []struct {
		r       topology.Resource
		outcome topology.Outcome
		pending bool
		key     topology.Resource
	}{
		{widgets, topology.Unavailable, true, widgets},
		{topology.Resource{Group: crd.Group, Version: crd.Version, Resource: "widgets", Subresource: "status"}, topology.Unavailable, true, widgets},
		{resourceOf(crd, "listed"), topology.Subset, false, resourceOf(crd, "listed")},
		{resourceOf(crd, "crontabs"), topology.Default, false, topology.Resource{}},
		{crd.Document(), topology.Subset, false, crd.Document()}, // s2 lists some of it
		{resourceOf(fresh, "gadgets"), topology.Unavailable, true, resourceOf(fresh, "gadgets")},
		{fresh.Document(), topology.Unavailable, true, fresh.Document()}, // nobody lists anything of it
		{resourceOf(fresh, "others"), topology.Default, false, topology.Resource{}},
	} {
		d := tp.DecideResource(c.r)
		if d.Outcome != c.outcome || d.Pending != c.pending || d.Resource != c.key {
			t.Errorf("%s: %s pending=%v key %s, want %s pending=%v key %s", c.r, d.Outcome, d.Pending, d.Resource, c.outcome, c.pending, c.key)
		}
	}
	if len(tp.Pending) != 2 {
		t.Errorf("Pending = %v, want the two keys no apiserver lists", tp.Pending)
	}
	if rs := tp.Resources(); !slices.Contains(rs, widgets) || !slices.Contains(rs, resourceOf(fresh, "gadgets")) {
		t.Errorf("Resources() = %v: pending keys are routed, so they are listed", rs)
	}
	if gvs := tp.GroupVersions(); !slices.Contains(gvs, fresh) {
		t.Errorf("GroupVersions() = %v, want %s (only pending keys)", gvs, fresh)
	}
}
