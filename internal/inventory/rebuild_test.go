package inventory

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apiserverinternalv1alpha1 "k8s.io/api/apiserverinternal/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// idleCluster is a watcher holding what xds-server holds for two live apiservers that both
// serve n CRDs (ten to a group, an APIService per group, a StorageVersion per CRD), their
// discovery fetched at now:
// nothing is due but re-judging the Leases. onChange counts the topologies handed on.
func idleCluster(tb testing.TB, n int, now time.Time, onChange func(*topology.Topology)) *Watcher {
	tb.Helper()
	list := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: "apidiscovery.k8s.io/v2"}}
	list.Items = append(list.Items, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: "apps"},
		Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: "v1", Resources: []apidiscoveryv2.APIResourceDiscovery{
			{Resource: "deployments", Scope: apidiscoveryv2.ScopeNamespace, Verbs: []string{"get", "list", "watch"}}}}}})
	apisvcs := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for i := 0; i < n; i += 10 {
		group := fmt.Sprintf("g%05d.example.com", i/10)
		v := apidiscoveryv2.APIVersionDiscovery{Version: "v1"}
		for j := i; j < min(n, i+10); j++ {
			v.Resources = append(v.Resources, apidiscoveryv2.APIResourceDiscovery{
				Resource: fmt.Sprintf("widgets%05d", j), Scope: apidiscoveryv2.ScopeNamespace,
				ResponseKind: &metav1.GroupVersionKind{Group: group, Version: "v1", Kind: fmt.Sprintf("Widget%05d", j)},
				Verbs:        []string{"create", "delete", "get", "list", "patch", "update", "watch"},
				Subresources: []apidiscoveryv2.APISubresourceDiscovery{{Subresource: "status"}},
			})
		}
		list.Items = append(list.Items, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: group}, Versions: []apidiscoveryv2.APIVersionDiscovery{v}})
		svc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
			"metadata": map[string]any{"name": "v1." + group, "uid": "uid-" + group, "resourceVersion": "1",
				"labels": map[string]any{objects.AutomanagedLabel: "true"}},
			"spec": map[string]any{"group": group, "version": "v1", "groupPriorityMinimum": int64(1000), "versionPriority": int64(100)},
		}}
		if err := apisvcs.Add(svc); err != nil {
			tb.Fatal(err)
		}
	}
	// A StorageVersion per CRD, as apiservers with the StorageVersion API keep them.
	svs := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for j := range n {
		group := fmt.Sprintf("g%05d.example.com", j/10)
		sv := &apiserverinternalv1alpha1.StorageVersion{ObjectMeta: metav1.ObjectMeta{Name: group + "." + fmt.Sprintf("widgets%05d", j), ResourceVersion: "1"}}
		for _, host := range []string{"cp-a", "cp-b"} {
			sv.Status.StorageVersions = append(sv.Status.StorageVersions, apiserverinternalv1alpha1.ServerStorageVersion{
				APIServerID: objects.APIServerIDFor(host), EncodingVersion: group + "/v1", DecodableVersions: []string{group + "/v1"}, ServedVersions: []string{group + "/v1"}})
		}
		if err := svs.Add(sv); err != nil {
			tb.Fatal(err)
		}
	}
	leases := cache.NewStore(cache.MetaNamespaceKeyFunc)
	discovery := map[string]discovered{}
	for i, host := range []string{"cp-a", "cp-b"} {
		id, holder, address := objects.APIServerIDFor(host), objects.APIServerIDFor(host)+"_1", fmt.Sprintf("10.0.0.%d:6443", i+1)
		renew := metav1.NewMicroTime(now)
		if err := leases.Add(&coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: objects.IdentityLeaseNamespace, UID: types.UID("uid-" + id), CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
				Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, objects.HostnameLabel: host},
				Annotations: map[string]string{objects.PeerAdvertiseAnnotation: address}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renew},
		}); err != nil {
			tb.Fatal(err)
		}
		own := list
		if i > 0 {
			own = list.DeepCopy() // each apiserver's fetch is its own
		}
		discovery[id] = discovered{instance: holder + " at " + address, fetched: now, rounds: 2, list: own, listAt: now}
	}
	auth := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := auth.Add(authentication(map[string]string{
		"requestheader-username-headers": `["X-Remote-User"]`, "requestheader-group-headers": `["X-Remote-Group"]`,
		"requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`})); err != nil {
		tb.Fatal(err)
	}
	return &Watcher{
		cfg: &rest.Config{},
		opts: WatchOptions{Options: objects.Options{LivenessWindow: objects.DefaultLivenessWindow},
			DiscoveryInterval: time.Hour, DepartedGrace: DefaultDepartedGrace, Log: slog.New(slog.DiscardHandler),
			Clock: func() time.Time { return now }},
		kick: make(chan struct{}, 1), discovery: discovery, onChange: onChange, published: true,
		leases: leases, authentication: auth, apisvcs: apisvcs, svs: svs,
	}
}

// BenchmarkIdleRebuild is one rebuild of the watcher with nothing changed but the time (a
// Lease renewal or the re-judging tick, 24 a minute with two apiservers), with n CRDs: its
// cost per CRD is xds-server's idle CPU per CRD.
func BenchmarkIdleRebuild(b *testing.B) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, n := range []int{0, 200, 1000, 2000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			changes := 0
			w := idleCluster(b, n, t0, func(*topology.Topology) { changes++ })
			ctx := context.Background()
			w.rebuild(ctx)
			if changes != 1 {
				b.Fatalf("the first rebuild handed on %d topologies; want 1", changes)
			}
			b.ResetTimer()
			for range b.N {
				w.rebuild(ctx)
			}
			b.StopTimer()
			if changes != 1 {
				b.Fatalf("idle rebuilds handed on %d topologies; want none", changes-1)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*max(n, 1)), "ns/crd")
		})
	}
}

// TestRebuildBuildsOnlyWhenSomethingChanged: a rebuild whose inputs equal the last build's
// (a Lease renewed, time passed within the liveness window) builds nothing; every change
// Build would see, including time alone turning a Lease stale, builds and hands on the new
// topology.
func TestRebuildBuildsOnlyWhenSomethingChanged(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var got *topology.Topology
	w := idleCluster(t, 30, now, func(t *topology.Topology) { got = t })
	w.opts.Clock = func() time.Time { return now }
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a fetch an address change starts fails at once
	w.rebuild(ctx)
	if got == nil || len(got.Live()) != 2 {
		t.Fatalf("first rebuild: %v; want both apiservers live", got)
	}
	w.rebuild(ctx) // builds once more: the request-header names it learnt the first time
	idA, idB := objects.APIServerIDFor("cp-a"), objects.APIServerIDFor("cp-b")
	listA := w.discovery[idA].list
	update := func(store cache.Store, o any) {
		t.Helper()
		if err := store.Update(o); err != nil {
			t.Fatal(err)
		}
	}
	lease := func(id string) *coordinationv1.Lease {
		o, _, _ := w.leases.GetByKey(objects.IdentityLeaseNamespace + "/" + id)
		return o.(*coordinationv1.Lease).DeepCopy()
	}
	renew := func(id string) {
		l := lease(id)
		l.Spec.RenewTime = ptr(metav1.NewMicroTime(now))
		l.ResourceVersion += "1"
		update(w.leases, l)
	}
	// step rebuilds and says whether it built, and whether it handed on a topology.
	step := func(what string, wantBuild bool) *topology.Topology {
		t.Helper()
		before := w.built
		got = nil
		w.rebuild(ctx)
		if built := w.built != before; built != wantBuild {
			t.Errorf("%s: built %v, want %v", what, built, wantBuild)
		}
		return got
	}

	now = now.Add(5 * time.Second)
	renew(idA)
	renew(idB)
	if step("both renewed, 5 s later", false) != nil {
		t.Error("a renewal handed on a topology")
	}
	now = now.Add(20 * time.Second)
	renew(idB)
	step("cp-b renewed, cp-a 25 s ago: still live", false)
	now = now.Add(11 * time.Second)
	if t2 := step("cp-a's renewal 31 s old: stale", true); t2 == nil || !slices.Equal(t2.Live(), []string{idB}) {
		t.Errorf("cp-a stale: handed on %v; want cp-b alone live", t2)
	}
	renew(idA)
	renew(idB)
	step("cp-a renewed again: its discovery is fetched anew", true)
	w.mu.Lock()
	d := w.discovery[idA]
	d.list, d.listAt = listA, now // as if the fetch had succeeded
	w.discovery[idA] = d
	w.mu.Unlock()
	if t2 := step("cp-a's discovery fetched", true); t2 == nil || len(t2.Live()) != 2 {
		t.Errorf("cp-a fetched: handed on %v; want both live", t2)
	}

	o, _, _ := w.apisvcs.GetByKey("v1.g00002.example.com")
	svc := o.(*unstructured.Unstructured).DeepCopy()
	svc.Object["spec"].(map[string]any)["groupPriorityMinimum"] = int64(2000)
	svc.SetResourceVersion("2")
	update(w.apisvcs, svc)
	if t2 := step("an APIService's priority raised", true); t2 == nil || !strings.Contains(string(t2.Discovery.JSON), `"items":[{"metadata":{"name":"g00002.example.com"}`) {
		t.Errorf("APIService changed: handed on %v; want g00002 first in the merged discovery", t2)
	}

	w.mu.Lock()
	d = w.discovery[idA]
	d.list = d.list.DeepCopy()
	d.list.Items = d.list.Items[:len(d.list.Items)-1] // cp-a no longer serves g00002
	w.discovery[idA] = d
	w.mu.Unlock()
	widgets := topology.Resource{Group: "g00002.example.com", Version: "v1", Resource: "widgets00020"}
	if t2 := step("cp-a's discovery fetched anew", true); t2 == nil || !slices.Equal(t2.Served[widgets], []string{idB}) {
		t.Errorf("cp-a's new discovery: handed on %v; want %s served by cp-b alone", t2, widgets)
	}

	o, _, _ = w.authentication.GetByKey(objects.AuthenticationNamespace + "/" + objects.AuthenticationConfigMap)
	auth := o.(*corev1.ConfigMap).DeepCopy()
	auth.Data["requestheader-username-headers"] = `["X-Other-User"]`
	update(w.authentication, auth)
	if t2 := step("the request-header names changed", true); t2 == nil || !slices.Equal(t2.RequestHeaders.User, []string{"x-other-user"}) {
		t.Errorf("new header names: handed on %v; want user header x-other-user", t2)
	}

	// A new CRD no apiserver lists yet is pending while it is young, and then not.
	w.crds = cache.NewStore(cache.MetaNamespaceKeyFunc)
	crd := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "gadgets.g00001.example.com", CreationTimestamp: metav1.NewTime(now.Add(-2 * time.Second))}}
	if err := w.crds.Add(crd); err != nil {
		t.Fatal(err)
	}
	gadgets := topology.Resource{Group: "g00001.example.com", Version: "v1", Resource: "gadgets"}
	if t2 := step("a new CRD", true); t2 == nil || !t2.Pending[gadgets] {
		t.Errorf("a new CRD: handed on %v; want %s pending", t2, gadgets)
	}
	step("nothing changed, the CRD still young", false)
	now = now.Add(objects.PendingWindow)
	renew(idA)
	renew(idB)
	if t2 := step("the CRD no longer young", true); t2 == nil || len(t2.Pending) != 0 {
		t.Errorf("the CRD aged: handed on %v; want nothing pending", t2)
	}

	l := lease(idB)
	l.Labels[objects.HostnameLabel] = "cp-x" // no longer the host its ID says
	update(w.leases, l)
	if t2 := step("cp-b's Lease names another host", true); t2 == nil || !slices.Equal(t2.Live(), []string{idA}) {
		t.Errorf("cp-b's Lease relabelled: handed on %v; want cp-a alone live", t2)
	}
	step("nothing changed", false)
}

func ptr[T any](v T) *T { return &v }

// TestRebuildsCoalesced: a burst of changes is taken in at most every minRebuildInterval,
// and the last change of the burst is taken in.
func TestRebuildsCoalesced(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	rebuilds, lastSeen := 0, ""
	w := idleCluster(t, 0, now, func(t *topology.Topology) {
		mu.Lock()
		defer mu.Unlock()
		rebuilds++
		lastSeen = t.RequestHeaders.User[0]
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.loop(ctx, nil) }()
	defer func() { cancel(); <-done }()

	o, _, _ := w.authentication.GetByKey(objects.AuthenticationNamespace + "/" + objects.AuthenticationConfigMap)
	start := time.Now()
	const changes = 300
	for i := range changes {
		auth := o.(*corev1.ConfigMap).DeepCopy()
		auth.Data["requestheader-username-headers"] = fmt.Sprintf(`["X-User-%d"]`, i)
		if err := w.authentication.Update(auth); err != nil {
			t.Fatal(err)
		}
		w.trigger()
		time.Sleep(time.Millisecond)
	}
	want := fmt.Sprintf("x-user-%d", changes-1)
	seen := func() (int, string) {
		mu.Lock()
		defer mu.Unlock()
		return rebuilds, lastSeen
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, last := seen(); last == want {
			break
		}
	}
	elapsed := time.Since(start)
	n, last := seen()
	if last != want {
		t.Fatalf("the last change handed on named %q; want %q", last, want)
	}
	if most := int(elapsed/minRebuildInterval) + 2; n > most {
		t.Errorf("%d changes over %s took %d rebuilds that handed something on; want at most %d (one per %s)", changes, elapsed.Round(time.Millisecond), n, most, minRebuildInterval)
	}
	t.Logf("%d changes over %s: %d topologies handed on", changes, elapsed.Round(time.Millisecond), n)
}

// TestServedMemo: what a discovery list serves is read once while the group/versions served
// everywhere stay the same, read again when they change, and forgotten with the list.
func TestServedMemo(t *testing.T) {
	list := &apidiscoveryv2.APIGroupDiscoveryList{Items: []apidiscoveryv2.APIGroupDiscovery{
		{ObjectMeta: metav1.ObjectMeta{Name: "apps"}, Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: "v1", Resources: []apidiscoveryv2.APIResourceDiscovery{{Resource: "deployments"}}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "a.example.com"}, Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: "v1", Resources: []apidiscoveryv2.APIResourceDiscovery{{Resource: "widgets"}}}}},
	}}
	crd := topology.GroupVersion{Group: "a.example.com", Version: "v1"}
	var m servedMemo
	m.begin(map[topology.GroupVersion]bool{crd: true})
	first := m.by(list)
	if want := objects.ServedBy(list, map[topology.GroupVersion]bool{crd: true}); !slices.Equal(first, want) {
		t.Fatalf("served %v, want %v", first, want)
	}
	m.begin(map[topology.GroupVersion]bool{crd: true})
	if again := m.by(list); len(again) == 0 || &again[0] != &first[0] {
		t.Error("the same list with the same everywhere was read again")
	}
	m.begin(nil) // the CRD's APIService gone: its group/version is served by who lists it
	if now := m.by(list); len(now) != len(first)+1 {
		t.Errorf("after everywhere changed: %v; want widgets too", now)
	}
	m.begin(nil)
	m.begin(nil) // a rebuild that did not look the list up
	if len(m.last) != 0 {
		t.Errorf("%d lists remembered after a rebuild without them", len(m.last))
	}
}
