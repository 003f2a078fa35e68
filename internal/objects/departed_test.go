package objects_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var (
	jobs       = topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	jobsStatus = topology.Resource{Group: "batch", Version: "v1", Resource: "jobs", Subresource: "status"}
	pods       = topology.Resource{Version: "v1", Resource: "pods"}
	batchV1    = topology.GroupVersion{Group: "batch", Version: "v1"}.Document()
	t0         = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	grace      = 2 * time.Minute
)

// memCluster is a two-apiserver cluster for the memory tests: a serves batch/v1 and the core
// group, b the core group only. Its clock is set by the test, never slept on.
type memCluster struct {
	now    time.Time
	leases map[string]bool // ID -> Lease exists
	live   map[string]bool // ID -> Lease fresh and discovery verified
	mem    memory.Memory
}

func newMemCluster() *memCluster {
	return &memCluster{now: t0, leases: map[string]bool{idA: true, idB: true}, live: map[string]bool{idA: true, idB: true}}
}

func servedOf(id string) []topology.Resource {
	if id == idA {
		return []topology.Resource{jobs, jobsStatus, pods}
	}
	return []topology.Resource{pods}
}

// look is one rebuild: Observe, then Build with the memory and the live apiservers' discovery.
func (c *memCluster) look(t *testing.T) *topology.Topology {
	t.Helper()
	verified := map[string]memory.Remembered{}
	for id, ok := range c.live {
		if ok {
			verified[id] = memory.Remembered{Hostname: hostOf[id], Address: addressOf(id), Served: servedOf(id)}
		}
	}
	c.mem = c.mem.Observe(memory.Sighting{Now: c.now, Leases: c.leases, Verified: verified, Grace: grace})
	return c.build(t, c.mem)
}

func (c *memCluster) build(t *testing.T, mem memory.Memory) *topology.Topology {
	t.Helper()
	objs := objects.Objects{Discovery: map[string]*apidiscoveryv2.APIGroupDiscoveryList{}, Remembered: mem}
	for _, id := range slices.Sorted(maps.Keys(c.leases)) {
		if !c.leases[id] {
			continue
		}
		renewed := c.now.Add(-time.Minute) // stale
		if c.live[id] {
			renewed = c.now
			objs.Discovery[id] = discoveryOf(servedOf(id))
		}
		objs.Leases = append(objs.Leases, leaseAt(id, renewed))
	}
	topo, errs := objects.Build(objs, objects.Options{Now: c.now})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return topo
}

// The apiservers of these tests: on hosts a, b and c, at 10.0.0.1, .2 and .3.
var (
	idA, idB, idC = objects.APIServerIDFor("a"), objects.APIServerIDFor("b"), objects.APIServerIDFor("c")
	hostOf        = map[string]string{idA: "a", idB: "b", idC: "c"}
)

// addressOf is a's address 10.0.0.1:6443, b's 10.0.0.2:6443, c's 10.0.0.3:6443.
func addressOf(id string) string { return "10.0.0." + string(hostOf[id][0]-'a'+'1') + ":6443" }

// leaseAt is apiserver id's identity Lease, renewed at renewed, with an address.
func leaseAt(id string, renewed time.Time) coordinationv1.Lease {
	holder := id + "_1"
	return coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: objects.IdentityLeaseNamespace,
			Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, objects.HostnameLabel: hostOf[id]},
			Annotations: map[string]string{objects.PeerAdvertiseAnnotation: addressOf(id)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

func discoveryOf(rs []topology.Resource) *apidiscoveryv2.APIGroupDiscoveryList {
	list := &apidiscoveryv2.APIGroupDiscoveryList{}
	for _, r := range rs {
		if r.Subresource != "" {
			continue
		}
		res := apidiscoveryv2.APIResourceDiscovery{Resource: r.Resource}
		for _, s := range rs {
			if s.Parent() == r && s.Subresource != "" {
				res.Subresources = append(res.Subresources, apidiscoveryv2.APISubresourceDiscovery{Subresource: s.Subresource})
			}
		}
		list.Items = append(list.Items, apidiscoveryv2.APIGroupDiscovery{Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: r.Version, Resources: []apidiscoveryv2.APIResourceDiscovery{res}}}})
		list.Items[len(list.Items)-1].Name = r.Group
	}
	return list
}

func outcome(topo *topology.Topology, r topology.Resource) topology.Outcome {
	return topo.DecideResource(r).Outcome
}

func TestMemoryStaleLeaseKeepsItUnavailable(t *testing.T) {
	c := newMemCluster()
	if o := outcome(c.look(t), jobs); o != topology.Subset {
		t.Fatalf("jobs with a live: %v, want subset", o)
	}
	c.live[idA] = false // killed: its Lease stays, stale
	for _, after := range []time.Duration{time.Second, time.Hour, 5 * time.Hour} {
		c.now = t0.Add(after)
		topo := c.look(t)
		for _, r := range []topology.Resource{jobs, jobsStatus, batchV1} {
			if d := topo.DecideResource(r); d.Outcome != topology.Unavailable || !slices.Equal(d.Servers, []string{idA}) {
				t.Errorf("%s after %s with a's Lease stale: %v %v, want unavailable [%s]", r, after, d.Outcome, d.Servers, idA)
			}
		}
		if s := topo.Sources[idA]; s.From != topology.SourceRemembered || !s.Since.Equal(t0) || !s.LeaseDeleted.IsZero() {
			t.Errorf("source of a: %+v, want remembered since %s", s, t0)
		}
	}
	// b, the only live apiserver, serves pods: the default set (b), not a 503.
	if o := outcome(c.look(t), pods); o != topology.Default {
		t.Errorf("pods, which live b serves: %v, want default", o)
	}
}

func TestMemoryDeletedLeaseGraceThenForgotten(t *testing.T) {
	c := newMemCluster()
	c.look(t)
	c.now = t0.Add(10 * time.Second)
	c.live[idA], c.leases[idA] = false, false // graceful stop: Lease deleted
	deleted := c.now
	topo := c.look(t)
	if o := outcome(topo, jobs); o != topology.Unavailable {
		t.Errorf("jobs just after a's Lease was deleted: %v, want unavailable", o)
	}
	if s := topo.Sources[idA]; s.From != topology.SourceRemembered || !s.LeaseDeleted.Equal(deleted) {
		t.Errorf("source of a: %+v, want remembered, Lease deleted at %s", s, deleted)
	}
	if a, ok := topo.Server(idA); !ok || a.Routable() {
		t.Errorf("a listed %v, routable %v: want listed as dead while remembered", ok, a.Routable())
	}
	c.now = deleted.Add(grace - time.Second)
	if o := outcome(c.look(t), batchV1); o != topology.Unavailable {
		t.Errorf("batch/v1 document a second before the grace period ends: %v, want unavailable", o)
	}
	c.now = deleted.Add(grace)
	topo = c.look(t)
	if o := outcome(topo, jobs); o != topology.NotServed && o != topology.Default {
		t.Errorf("jobs after the grace period: %v, want the normal 404 path", o)
	}
	if _, ok := topo.Server(idA); ok || len(c.mem) != 1 {
		t.Errorf("a still known after its grace period (memory %v)", slices.Collect(maps.Keys(c.mem)))
	}
}

// TestMemoryKeepsDepartedHost: a departed apiserver stays a host of the serving-sets cluster
// (topology.Topology.Hosts), at the address it was last verified at, while it is remembered,
// whether its Lease is stale or deleted; so its return needs no new host. After the grace
// period it is gone.
func TestMemoryKeepsDepartedHost(t *testing.T) {
	hosts := func(topo *topology.Topology) []string { return topo.Hosts() }
	c := newMemCluster()
	if got := hosts(c.look(t)); !slices.Equal(got, []string{idA, idB}) {
		t.Fatalf("hosts with both live: %v", got)
	}
	c.now = t0.Add(10 * time.Second)
	c.live[idA] = false // killed: Lease stale
	topo := c.look(t)
	if got := hosts(topo); !slices.Equal(got, []string{idA, idB}) || !slices.Equal(topo.Live(), []string{idB}) {
		t.Errorf("a's Lease stale: hosts %v, live %v; want a kept as a host, not live", got, topo.Live())
	}
	c.leases[idA] = false // its Lease deleted
	topo = c.look(t)
	a, _ := topo.Server(idA)
	if got := hosts(topo); !slices.Equal(got, []string{idA, idB}) || a.Address != addressOf(idA) || a.Routable() {
		t.Errorf("a's Lease deleted: hosts %v, a %+v; want a kept at %s, not routable", got, a, addressOf(idA))
	}
	// Its address survives a restart of xds-server (the ConfigMap).
	reloaded, err := memory.Decode(memory.Encode(c.mem))
	if err != nil {
		t.Fatal(err)
	}
	if got := hosts(c.build(t, reloaded)); !slices.Equal(got, []string{idA, idB}) {
		t.Errorf("after reload: hosts %v", got)
	}
	// A record without an address (written before addresses were kept) keeps no host.
	old := maps.Clone(c.mem)
	r := old[idA]
	r.Address = ""
	old[idA] = r
	if got := hosts(c.build(t, old)); !slices.Equal(got, []string{idB}) {
		t.Errorf("remembered without an address: hosts %v, want only b", got)
	}
	c.now = c.now.Add(grace)
	if got := hosts(c.look(t)); !slices.Equal(got, []string{idB}) {
		t.Errorf("after the grace period: hosts %v, want only b", got)
	}
}

func TestMemoryLiveServerEndsUnavailable(t *testing.T) {
	c := newMemCluster()
	c.look(t)
	c.live[idA] = false
	c.now = t0.Add(time.Minute)
	if o := outcome(c.look(t), jobs); o != topology.Unavailable {
		t.Fatalf("jobs: %v, want unavailable", o)
	}
	// b starts serving batch/v1 (upgraded): routed to it at once.
	c.now = c.now.Add(time.Second)
	verified := map[string]memory.Remembered{idB: {Served: []topology.Resource{jobs, pods}}}
	c.mem = c.mem.Observe(memory.Sighting{Now: c.now, Leases: c.leases, Verified: verified, Grace: grace})
	objs := objects.Objects{
		Leases:     []coordinationv1.Lease{leaseAt(idA, c.now.Add(-time.Minute)), leaseAt(idB, c.now)},
		Discovery:  map[string]*apidiscoveryv2.APIGroupDiscoveryList{idB: discoveryOf([]topology.Resource{jobs, pods})},
		Remembered: c.mem,
	}
	topo, _ := objects.Build(objs, objects.Options{Now: c.now})
	// b is the only live apiserver: the default set is b.
	if d := topo.DecideResource(jobs); d.Outcome != topology.Default {
		t.Errorf("jobs with b live and serving it: %v %v, want default (b)", d.Outcome, d.Servers)
	}
	// a comes back: its own discovery replaces the memory.
	c.live[idA] = true
	c.now = c.now.Add(time.Second)
	topo = c.look(t)
	if s := topo.Sources[idA]; s.From != topology.SourceDiscovery {
		t.Errorf("source of a back live: %+v, want discovery", s)
	}
	if c.mem[idA].LastSeen.Before(c.now.Truncate(time.Second)) {
		t.Errorf("a's last sighting %s, want %s", c.mem[idA].LastSeen, c.now)
	}
}

func TestMemoryLeaseBackBeforeGraceEnds(t *testing.T) {
	c := newMemCluster()
	c.look(t)
	c.live[idA], c.leases[idA] = false, false
	c.now = t0.Add(time.Minute)
	c.look(t)
	// A restart: its new Lease appears before its discovery is verified.
	c.leases[idA] = true
	c.now = t0.Add(time.Minute + grace)
	if o := outcome(c.look(t), jobs); o != topology.Unavailable {
		t.Errorf("jobs with a's new Lease, discovery not verified yet, past the grace: %v, want unavailable", o)
	}
	if !c.mem[idA].LeaseGone.IsZero() {
		t.Errorf("grace still running while a has a Lease: %+v", c.mem[idA])
	}
}

func TestMemoryRoundTripAndRestart(t *testing.T) {
	c := newMemCluster()
	c.look(t)
	c.live[idA], c.leases[idA] = false, false
	c.now = t0.Add(30 * time.Second)
	c.look(t)
	data := memory.Encode(c.mem)
	// A new process: starts from the ConfigMap only.
	reloaded, err := memory.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	for id, r := range c.mem {
		if !reloaded[id].Equal(r) {
			t.Errorf("%s: reloaded %+v, want %+v", id, reloaded[id], r)
		}
	}
	if memory.NeedsWrite(reloaded, c.mem, map[string]bool{idB: true}) {
		t.Error("the reloaded memory needs writing again: replicas would write for ever")
	}
	restarted := &memCluster{now: c.now.Add(10 * time.Second), leases: c.leases, live: c.live, mem: reloaded}
	if o := outcome(restarted.look(t), jobs); o != topology.Unavailable {
		t.Errorf("jobs after a restart from the ConfigMap: %v, want unavailable", o)
	}
	// The grace period still counts from the deletion, not from the restart.
	restarted.now = c.now.Add(grace)
	if o := outcome(restarted.look(t), jobs); o == topology.Unavailable {
		t.Errorf("jobs after the grace period counted from the deletion: still unavailable")
	}
}

// TestMergeMemoryTwoWriters: two replicas see a's departure at slightly different times and
// merge each other's writes; whatever the order, both end with one memory and stop writing.
func TestMergeMemoryTwoWriters(t *testing.T) {
	r1, r2 := newMemCluster(), newMemCluster()
	r1.look(t)
	r2.now = t0.Add(time.Second)
	r2.look(t)
	for _, r := range []*memCluster{r1, r2} {
		r.live[idA], r.leases[idA] = false, false
	}
	r1.now, r2.now = t0.Add(20*time.Second), t0.Add(23*time.Second)
	r1.look(t)
	r2.look(t)
	// r1 writes first; r2 merges what it read, and the other way round.
	m12 := memory.Merge(r2.mem, r1.mem, r2.now, grace)
	m21 := memory.Merge(r1.mem, r2.mem, r1.now, grace)
	if len(m12) != len(m21) {
		t.Fatalf("merges differ: %v vs %v", m12, m21)
	}
	for id := range m12 {
		if !m12[id].Equal(m21[id]) {
			t.Errorf("%s: merge depends on order: %+v vs %+v", id, m12[id], m21[id])
		}
	}
	a := m12[idA]
	if !a.LastSeen.Equal(t0.Add(time.Second)) || !a.LeaseGone.Equal(t0.Add(20*time.Second)) {
		t.Errorf("merged a: last seen %s, Lease gone %s; want the latest sighting (t0+1s) and the first deletion seen (t0+20s)", a.LastSeen, a.LeaseGone)
	}
	if memory.NeedsWrite(m12, m21, nil) {
		t.Error("after merging, a replica still has something to write: they would fight")
	}
	if !memory.NeedsWrite(r1.mem, m12, nil) {
		t.Error("r1's write lacks r2's later sighting of a, yet nothing to write")
	}
	// A restart of a with the same ID beats an older deletion.
	back := m12[idA]
	back.LastSeen, back.LeaseGone = t0.Add(time.Minute), time.Time{}
	merged := memory.Merge(m12, memory.Memory{idA: back}, t0.Add(time.Minute), grace)
	if !merged[idA].LeaseGone.IsZero() {
		t.Errorf("a seen live after its old deletion still counts as deleted: %+v", merged[idA])
	}
	// Past the grace period, the merge drops it whoever still has it.
	if m := memory.Merge(m12, nil, t0.Add(20*time.Second+grace), grace); len(m) != 1 {
		t.Errorf("after the grace period the merge keeps %v", slices.Collect(maps.Keys(m)))
	}
}

// TestRememberedAddressIsNoVerification: a fresh Lease without an address, of an apiserver
// remembered at one, does not make it routable there: the memory's address is where it was
// last verified, and routing needs its discovery verified now (objects.Verify).
func TestRememberedAddressIsNoVerification(t *testing.T) {
	lease := leaseAt(idA, t0)
	delete(lease.Annotations, objects.PeerAdvertiseAnnotation)
	objs := objects.Objects{
		Leases:     []coordinationv1.Lease{lease, leaseAt(idB, t0)},
		Discovery:  map[string]*apidiscoveryv2.APIGroupDiscoveryList{idB: discoveryOf(servedOf(idB))},
		Remembered: memory.Memory{idA: {Hostname: "a", Address: addressOf(idA), Served: servedOf(idA), LastSeen: t0.Add(-time.Minute)}},
	}
	topo, errs := objects.Build(objs, objects.Options{Now: t0})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if s, _ := topo.Server(idA); !s.Alive || s.Verified || s.Routable() {
		t.Errorf("a: %+v, want alive, unverified, not routable", s)
	}
	if o := outcome(topo, jobs); o != topology.Unavailable {
		t.Errorf("jobs, served only by a: %v, want unavailable", o)
	}
	for _, n := range topo.NotRoutable() {
		if n.ID == idA && !strings.Contains(n.Reason, "own discovery was never read") {
			t.Errorf("a: reason %q, want its discovery never read", n.Reason)
		}
	}
}
