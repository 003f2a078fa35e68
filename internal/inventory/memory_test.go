package inventory

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/testutil/cptlstest"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var (
	memCM = MemoryConfigMap{Namespace: "kube-mvp", Name: "mem"}
	idA   = objects.APIServerIDFor("cp-a") // serves batch/v1
	idB   = objects.APIServerIDFor("cp-b")
	jobs  = topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	pods  = topology.Resource{Version: "v1", Resource: "pods"}
)

// cmServer is the apiserver's side of the memory ConfigMap: one object with optimistic
// concurrency, as the real one has (the fake clientset's tracker has none).
type cmServer struct {
	mu sync.Mutex
	cm *corev1.ConfigMap
	rv int
}

func (s *cmServer) client() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		gr := schema.GroupResource{Resource: "configmaps"}
		obj, ok := a.(interface{ GetObject() runtime.Object })
		if !ok {
			return true, nil, fmt.Errorf("unexpected %s", a.GetVerb())
		}
		cm := obj.GetObject().(*corev1.ConfigMap).DeepCopy()
		switch a.GetVerb() {
		case "create":
			if s.cm != nil {
				return true, nil, apierrors.NewAlreadyExists(gr, cm.Name)
			}
		case "update":
			if s.cm == nil {
				return true, nil, apierrors.NewNotFound(gr, cm.Name)
			}
			if cm.ResourceVersion != s.cm.ResourceVersion {
				return true, nil, apierrors.NewConflict(gr, cm.Name, fmt.Errorf("resourceVersion %s, now %s", cm.ResourceVersion, s.cm.ResourceVersion))
			}
		default:
			return true, nil, fmt.Errorf("unexpected %s", a.GetVerb())
		}
		s.rv++
		cm.ResourceVersion = fmt.Sprint(s.rv)
		s.cm = cm
		return true, cm.DeepCopy(), nil
	})
	return c
}

// edit changes the object as an operator (or an attacker) would; nil data deletes it.
func (s *cmServer) edit(f func(data map[string]string) map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cm == nil {
		s.cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: memCM.Namespace, Name: memCM.Name}}
	}
	data := f(maps.Clone(s.cm.Data))
	if data == nil {
		s.cm = nil
		return
	}
	s.rv++
	s.cm = s.cm.DeepCopy()
	s.cm.Data, s.cm.ResourceVersion = data, fmt.Sprint(s.rv)
}

func (s *cmServer) data() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cm == nil {
		return nil
	}
	return maps.Clone(s.cm.Data)
}

// replica is one xds-server's watcher, its informer fed by sync.
type replica struct {
	t        *testing.T
	w        *Watcher
	server   *cmServer
	logs     *testutil.SyncBuffer
	rejected []string
}

func newReplica(t *testing.T, server *cmServer, creds MemoryCredentials) *replica {
	r := &replica{t: t, server: server, logs: &testutil.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	r.w = &Watcher{opts: WatchOptions{MemoryConfigMap: memCM, MemoryCredentials: creds, Log: log, DepartedGrace: time.Hour,
		OnMemoryRejected: func(reason string) { r.rejected = append(r.rejected, reason) }}}
	r.w.opts.LivenessWindow = 30 * time.Second
	r.w.memoryStore = cache.NewStore(cache.MetaNamespaceKeyFunc)
	r.w.persist = memoryWriter{client: server.client(), cm: memCM, log: log, done: func() {}}
	return r
}

// sync brings the informer up to date with the server.
func (r *replica) sync() {
	r.server.mu.Lock()
	var objs []any
	if r.server.cm != nil {
		objs = append(objs, r.server.cm.DeepCopy())
	}
	r.server.mu.Unlock()
	if err := r.w.memoryStore.Replace(objs, ""); err != nil {
		r.t.Fatal(err)
	}
}

// cluster is what one rebuild sees: the live apiservers (fresh Lease, verified discovery)
// and the dead ones with a stale Lease.
type cluster struct {
	now        time.Time
	live, dead map[string]string // ID -> hostname
}

func (c cluster) objects() objects.Objects {
	objs := objects.Objects{Discovery: map[string]*apidiscoveryv2.APIGroupDiscoveryList{}}
	lease := func(id, hostname string, renewed time.Time) coordinationv1.Lease {
		holder := id + "_" + hostname
		return coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: objects.IdentityLeaseNamespace,
				Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, objects.HostnameLabel: hostname},
				Annotations: map[string]string{objects.PeerAdvertiseAnnotation: "10.0.0.1:6443"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: renewed}},
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.live)) {
		objs.Leases = append(objs.Leases, lease(id, c.live[id], c.now))
		served := []topology.Resource{pods}
		if id == idA {
			served = append(served, jobs)
		}
		list := &apidiscoveryv2.APIGroupDiscoveryList{}
		for _, r := range served {
			g := apidiscoveryv2.APIGroupDiscovery{Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: r.Version, Resources: []apidiscoveryv2.APIResourceDiscovery{{Resource: r.Resource}}}}}
			g.Name = r.Group
			list.Items = append(list.Items, g)
		}
		objs.Discovery[id] = list
	}
	for _, id := range slices.Sorted(maps.Keys(c.dead)) {
		objs.Leases = append(objs.Leases, lease(id, c.dead[id], c.now.Add(-5*time.Minute)))
	}
	return objs
}

// waitForWrite waits until the memory write a rebuild started, if any, has ended.
func (r *replica) waitForWrite() {
	r.t.Helper()
	testutil.WaitFor(r.t, context.Background(), 10*time.Second, "the write", func() error {
		r.w.persist.mu.Lock()
		defer r.w.persist.mu.Unlock()
		if r.w.persist.writing {
			return fmt.Errorf("still writing")
		}
		return nil
	})
}

// look is one rebuild after the informer caught up (sync) or not; it waits for the write
// it starts, if any.
func (r *replica) look(c cluster, sync bool) memory.Memory {
	r.t.Helper()
	if sync {
		r.sync()
	}
	opts := r.w.opts.Options
	opts.Now = c.now
	mem := r.w.remember(context.Background(), c.objects(), opts)
	r.waitForWrite()
	return mem
}

// persisted is the server's memory, checked as xds-server checks it.
func persisted(t *testing.T, s *cmServer, creds *cptls.Credentials, now time.Time) memory.Memory {
	t.Helper()
	_, pool := creds.Current()
	reading, err := memory.Read(s.data(), memory.Trust{Roots: pool, Now: now})
	if err != nil {
		t.Fatalf("the ConfigMap's memory: %v", err)
	}
	if len(s.data()) > 0 && !reading.Signed {
		t.Fatal("the ConfigMap's memory is not signed")
	}
	return reading.Memory
}

func ids(m memory.Memory) string { return strings.Join(slices.Sorted(maps.Keys(m)), " ") }

func xdsCreds(t *testing.T) *cptls.Credentials {
	t.Helper()
	pki := cptlstest.New(t, t.TempDir())
	creds, err := cptls.Load(pki.Files(cptls.RoleXDSServer), cptls.RoleXDSServer, nil)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// TestMemoryRejectedAndReplaced: a ConfigMap with anything xds-server did not sign — an entry
// without a signature, malformed JSON — is ignored as a whole, logged and counted once per
// version, and replaced by the next write with the process's own memory, signed.
func TestMemoryRejectedAndReplaced(t *testing.T) {
	creds := xdsCreds(t)
	server := &cmServer{}
	r := newReplica(t, server, creds)
	now := time.Now()
	c := cluster{now: now, live: map[string]string{idA: "cp-a", idB: "cp-b"}}
	r.look(c, true)
	if got := ids(persisted(t, server, creds, now)); got != ids(memory.Memory{idA: {}, idB: {}}) {
		t.Fatalf("written: %s", got)
	}

	// An attacker adds an entry for cp-a's hostname at another ID, Lease deleted in 2099.
	forgedID := objects.APIServerIDFor("evil")
	forged := memory.Encode(memory.Memory{forgedID: {Hostname: "cp-a", Address: "192.0.2.1:443", Served: []topology.Resource{jobs},
		LastSeen: now.Truncate(time.Second), LeaseGone: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)}})
	server.edit(func(d map[string]string) map[string]string { d[forgedID] = forged[forgedID]; return d })
	c.now = now.Add(time.Second)
	mem := r.look(c, true)
	if _, ok := mem[forgedID]; ok {
		t.Fatal("the forged entry is believed")
	}
	if got := ids(persisted(t, server, creds, c.now)); got != ids(memory.Memory{idA: {}, idB: {}}) {
		t.Errorf("after the forgery, the ConfigMap holds %s", got)
	}
	for range 3 { // the same version again: not logged again
		c.now = c.now.Add(time.Second)
		r.look(c, false)
	}
	if n := strings.Count(r.logs.String(), "rejected as a whole"); n != 1 || !strings.Contains(r.logs.String(), "kube-mvp/mem") || strings.Join(r.rejected, " ") != memory.RejectFuture {
		t.Errorf("want one line naming kube-mvp/mem and one rejection (future), got %v:\n%s", r.rejected, r.logs.String())
	}

	// Garbage: rejected, replaced, even when this process has nothing to say (nothing live),
	// once the interval between replacements is over.
	server.edit(func(d map[string]string) map[string]string { d[idA] = `{"lastSeen": 12`; return d })
	c = cluster{now: c.now.Add(replaceInterval)}
	r.look(c, true)
	if got := ids(persisted(t, server, creds, c.now)); got != ids(memory.Memory{idA: {}, idB: {}}) {
		t.Errorf("after garbage, the ConfigMap holds %s", got)
	}
	if strings.Join(r.rejected, " ") != memory.RejectFuture+" "+memory.RejectMalformed {
		t.Errorf("rejections %v", r.rejected)
	}
}

// TestMemoryReplacementsSpaced: a writer that answers every write with content this process
// rejects (an older replica during an upgrade writes unsigned entries and drops the signed
// ones) meets one replacement per replaceInterval, not one per write of its own.
func TestMemoryReplacementsSpaced(t *testing.T) {
	creds := xdsCreds(t)
	server := &cmServer{}
	r := newReplica(t, server, creds)
	now := time.Now()
	c := cluster{now: now, live: map[string]string{idA: "cp-a", idB: "cp-b"}}
	r.look(c, true) // the first write, signed
	old := memory.Encode(memory.Memory{idA: {Hostname: "cp-a", Address: "192.0.2.1:443", Served: []topology.Resource{jobs}, LastSeen: now.Truncate(time.Second)}})
	replaced := 0
	for step := time.Duration(0); step <= 2*replaceInterval+replaceInterval/2; step += 500 * time.Millisecond {
		if d := server.data(); len(d) > 0 && signedBy(creds, d) {
			if step > 0 {
				replaced++
			}
			server.edit(func(map[string]string) map[string]string { return maps.Clone(old) })
		}
		c.now = now.Add(step)
		r.look(c, true)
	}
	// Replaced at once, then after one and two intervals.
	if replaced != 3 {
		t.Errorf("%d replacements in %s, want 3 (one per %s)", replaced, 2*replaceInterval+replaceInterval/2, replaceInterval)
	}
}

// signedBy reports whether a memory ConfigMap's data is signed by creds' CA.
func signedBy(creds *cptls.Credentials, data map[string]string) bool {
	_, pool := creds.Current()
	reading, err := memory.Read(data, memory.Trust{Roots: pool, Now: time.Now()})
	return err == nil && reading.Signed
}

// TestMemoryOperatorRemoval: an entry an operator deletes (a key, or the whole ConfigMap)
// stays deleted, unless its apiserver is live again; an entry only in one replica's memory
// is not a removal, and two replicas converge.
func TestMemoryOperatorRemoval(t *testing.T) {
	creds := xdsCreds(t)
	server := &cmServer{}
	one, two := newReplica(t, server, creds), newReplica(t, server, creds)
	now := time.Now()
	idC := objects.APIServerIDFor("cp-c")
	// Replica one sees cp-a, cp-b and cp-c live; two, started later, sees cp-c only.
	c := cluster{now: now, live: map[string]string{idA: "cp-a", idB: "cp-b", idC: "cp-c"}}
	one.look(c, true)
	two.look(cluster{now: now, live: map[string]string{idC: "cp-c"}}, false) // its informer still empty
	// cp-a dies (its Lease stays, stale).
	c = cluster{now: now.Add(time.Minute), live: map[string]string{idB: "cp-b", idC: "cp-c"}, dead: map[string]string{idA: "cp-a"}}
	for range 3 {
		one.look(c, true)
		two.look(c, true)
	}
	if got, want := ids(persisted(t, server, creds, c.now)), ids(memory.Memory{idA: {}, idB: {}, idC: {}}); got != want {
		t.Fatalf("converged on %s, want %s", got, want)
	}
	if !maps.EqualFunc(one.w.memory, two.w.memory, memory.Remembered.Equal) {
		t.Fatalf("the replicas differ: %v\n%v", one.w.memory, two.w.memory)
	}

	// The operator deletes departed cp-a's key, and live cp-b's.
	server.edit(func(d map[string]string) map[string]string { delete(d, idA); delete(d, idB); return d })
	for i := range 4 {
		c.now = c.now.Add(5 * time.Second)
		for _, r := range []*replica{one, two} {
			mem := r.look(c, true)
			if _, ok := mem[idA]; ok {
				t.Fatalf("round %d: cp-a's deleted entry is still remembered", i)
			}
		}
	}
	got := persisted(t, server, creds, c.now)
	if _, ok := got[idA]; ok {
		t.Error("cp-a's deleted entry was written back")
	}
	if b, ok := got[idB]; !ok || !b.LastSeen.After(now) {
		t.Errorf("live cp-b is not recorded afresh: %+v", b)
	}

	// The whole ConfigMap deleted: recreated with the live apiservers only.
	server.edit(func(map[string]string) map[string]string { return nil })
	c.now = c.now.Add(5 * time.Second)
	c.dead[idA] = "cp-a"
	for range 3 {
		c.now = c.now.Add(5 * time.Second)
		one.look(c, true)
		two.look(c, true)
	}
	if got, want := ids(persisted(t, server, creds, c.now)), ids(memory.Memory{idB: {}, idC: {}}); got != want {
		t.Errorf("after the ConfigMap was deleted: %s, want %s", got, want)
	}

	// A stale informer right after this replica's own write is no removal: cp-e comes up,
	// one writes it, cp-e dies, and one looks again before its informer shows its write.
	idE := objects.APIServerIDFor("cp-e")
	c.live[idE] = "cp-e"
	c.now = c.now.Add(time.Minute)
	one.look(c, true)
	if _, ok := server.data()[idE]; !ok {
		t.Fatal("cp-e not written")
	}
	delete(c.live, idE)
	c.dead[idE] = "cp-e"
	c.now = c.now.Add(time.Minute)
	one.look(c, false)
	if _, ok := one.w.memory[idE]; !ok {
		t.Error("cp-e forgotten because the informer had not shown the write yet")
	}
	one.look(c, true)
	if _, ok := one.w.memory[idE]; !ok {
		t.Error("cp-e forgotten once the informer showed the write")
	}
}

// TestMemoryMigration: the unsigned memory of an xds-server that predates signatures is
// migrated once — only entries whose ID's Lease names their hostname — and written back
// signed; after that, unsigned entries are rejected.
func TestMemoryMigration(t *testing.T) {
	creds := xdsCreds(t)
	server := &cmServer{}
	now := time.Now().Truncate(time.Second)
	idGone := objects.APIServerIDFor("cp-gone")
	old := memory.Encode(memory.Memory{
		idA:    {Hostname: "cp-a", Address: "10.0.0.1:6443", Served: []topology.Resource{jobs}, LastSeen: now.Add(-time.Minute)},
		idB:    {Hostname: "cp-x", Served: []topology.Resource{jobs}, LastSeen: now.Add(-time.Minute)}, // not its Lease's hostname
		idGone: {Hostname: "cp-gone", Served: []topology.Resource{jobs}, LastSeen: now.Add(-time.Minute)},
	})
	server.edit(func(map[string]string) map[string]string { return old })
	r := newReplica(t, server, creds)
	c := cluster{now: now, dead: map[string]string{idA: "cp-a", idB: "cp-b"}}
	c.live = map[string]string{objects.APIServerIDFor("cp-z"): "cp-z"}
	mem := r.look(c, true)
	if _, ok := mem[idA]; !ok {
		t.Fatalf("cp-a's unsigned entry was not migrated: %v\n%s", mem, r.logs.String())
	}
	got := persisted(t, server, creds, now)
	if _, ok := got[idA]; !ok || len(got) != 2 {
		t.Errorf("written back: %s, want cp-a's and cp-z's", ids(got))
	}
	// An unsigned memory again (say a restored backup): rejected.
	server.edit(func(map[string]string) map[string]string { return old })
	c.now = now.Add(time.Second)
	r.look(c, true)
	if strings.Join(r.rejected, " ") != memory.RejectUnsigned {
		t.Errorf("rejections %v, want unsigned", r.rejected)
	}
	if got := persisted(t, server, creds, c.now); len(got) != 2 {
		t.Errorf("not replaced: %s", ids(got))
	}
}

// TestMemoryInProcessBounded: without a ConfigMap the memory is bounded too.
func TestMemoryInProcessBounded(t *testing.T) {
	var logs bytes.Buffer
	w := &Watcher{opts: WatchOptions{Log: slog.New(slog.NewTextHandler(&logs, nil)), DepartedGrace: time.Minute}}
	now := time.Now()
	live := map[string]string{}
	for i := range memory.MaxEntries + 2 {
		live[objects.APIServerIDFor(fmt.Sprint("cp-", i))] = fmt.Sprint("cp-", i)
	}
	mem := w.remember(context.Background(), cluster{now: now, live: live}.objects(), objects.Options{Now: now})
	if len(mem) != memory.MaxEntries || !strings.Contains(logs.String(), "exceeds the memory's bounds") {
		t.Errorf("%d entries remembered, want %d; log:\n%s", len(mem), memory.MaxEntries, logs.String())
	}
}
