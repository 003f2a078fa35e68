package inventory_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// watch runs a Watcher on cfg until the test ends; the returned pointer holds its latest
// topology (nil before the first).
func watch(t *testing.T, ctx context.Context, cfg *rest.Config, opts inventory.WatchOptions) *atomic.Pointer[topology.Topology] {
	t.Helper()
	latest, _ := watchCounting(t, ctx, cfg, opts)
	return latest
}

// watchCounting is watch, and also counts the topologies handed on.
func watchCounting(t *testing.T, ctx context.Context, cfg *rest.Config, opts inventory.WatchOptions) (*atomic.Pointer[topology.Topology], *atomic.Int64) {
	t.Helper()
	var latest atomic.Pointer[topology.Topology]
	var handed atomic.Int64
	opts.Log = slog.New(slog.NewTextHandler(testutil.LogWriter(t), nil))
	w, err := inventory.NewWatcher(cfg, opts, func(t *topology.Topology) { latest.Store(t); handed.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(wctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	return &latest, &handed
}

// TestWatcherAgainstMixedControlPlane follows a real two-version control plane: A v1.37.1
// with every API, B v1.36.4 with batch/v1 off. It then kills A, sees it leave, and brings it
// back.
func TestWatcherAgainstMixedControlPlane(t *testing.T) {
	ctx := testutil.Context(t, 15*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: controlplane.MixedServers()})

	// Leases renew every 10 s; 15 s notices a dead server quickly without flapping.
	latest, handed := watchCounting(t, ctx, cp.Server("cp-b").RESTConfig(), inventory.WatchOptions{
		Options: objects.Options{LivenessWindow: 15 * time.Second},
		// Only a restart or a CRD change may refetch discovery in this test.
		DiscoveryInterval: time.Hour,
	})

	jobs := topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	jobStatus := topology.Resource{Group: "batch", Version: "v1", Resource: "jobs", Subresource: "status"}
	deployments := topology.Resource{Group: "apps", Version: "v1", Resource: "deployments"}
	migrations := topology.Resource{Group: "storagemigration.k8s.io", Version: "v1", Resource: "storageversionmigrations"}
	var idA, idB string
	testutil.WaitFor(t, ctx, 90*time.Second, "both apiservers live with discovery", func() error {
		topo := latest.Load()
		if topo == nil {
			return fmt.Errorf("no topology yet")
		}
		if len(topo.Live()) != 2 {
			return fmt.Errorf("live: %v", topo.Live())
		}
		for _, s := range topo.APIServers {
			switch s.Hostname {
			case "cp-a":
				idA = s.ID
				if s.Address != cp.Server("cp-a").Address() {
					return fmt.Errorf("cp-a address %q", s.Address)
				}
			case "cp-b":
				idB = s.ID
			}
		}
		if idA == "" || idB == "" || idA == idB {
			return fmt.Errorf("IDs: cp-a %q, cp-b %q", idA, idB)
		}
		// Subresources come only from discovery: seeing one proves discovery was used.
		if got := topo.Served[jobStatus]; !slices.Equal(got, []string{idA}) {
			return fmt.Errorf("batch/v1 jobs/status served by %v, want cp-a only", got)
		}
		if got := topo.Served[deployments]; len(got) != 2 {
			return fmt.Errorf("apps/v1 deployments served by %v, want both", got)
		}
		// Both discoveries, not StorageVersions for one that is still starting (its first
		// fetch may fail while post-start hooks run): subresources and the merged document.
		if got := topo.Served[topology.Resource{Version: "v1", Resource: "pods", Subresource: "log"}]; len(got) != 2 || topo.Discovery == nil {
			return fmt.Errorf("core/v1 pods/log served by %v, merged discovery %v: want both apiservers' discovery", got, topo.Discovery != nil)
		}
		return nil
	})
	// Once settled (the apiservers' own APIServices, created as they start, refetch
	// discovery: wait until 8 s pass without a new topology), nothing changes: Lease
	// renewals (every 10 s) and the re-judging tick (every 2.5 s) rebuild the same topology,
	// which is not handed on again.
	quietSince, count := time.Now(), handed.Load()
	testutil.WaitFor(t, ctx, 2*time.Minute, "8 s without a new topology", func() error {
		if n := handed.Load(); n != count {
			quietSince, count = time.Now(), n
		}
		if quiet := time.Since(quietSince); quiet < 8*time.Second {
			return fmt.Errorf("quiet for %s", quiet.Round(time.Second))
		}
		return nil
	})
	before := handed.Load()
	time.Sleep(21 * time.Second)
	if n := handed.Load() - before; n != 0 {
		t.Errorf("%d topologies handed on in 21 s of a settled control plane (two Lease renewals each), want none", n)
	}
	topo := latest.Load()
	for _, id := range []string{idA, idB} {
		if s := topo.Sources[id]; s.From != topology.SourceDiscovery || s.Since.IsZero() {
			t.Errorf("%s: capabilities from %+v, want discovery with its time", id, s)
		}
	}
	for _, c := range []struct {
		r       topology.Resource
		outcome topology.Outcome
		servers []string
	}{
		{jobs, topology.Subset, []string{idA}},
		{jobStatus, topology.Subset, []string{idA}},
		{migrations, topology.Subset, []string{idA}},
		{deployments, topology.Default, nil},
		{topology.Resource{Version: "v1", Resource: "pods", Subresource: "log"}, topology.Default, nil},
	} {
		d := topo.DecideResource(c.r)
		if d.Outcome != c.outcome || !slices.Equal(d.Servers, c.servers) {
			t.Errorf("%s: %v %v, want %v %v", c.r, d.Outcome, d.Servers, c.outcome, c.servers)
		}
	}
	if name := plan.SubsetClusterName(topo, topo.DecideResource(jobs).Servers); name != "kube-apiservers-only-cp-a" {
		t.Errorf("cluster for batch/v1 jobs: %q", name)
	}
	// The merged /apis discovery has batch/v1 (from cp-a) and no core group (that is /api's).
	if topo.Discovery == nil {
		t.Fatal("no merged discovery: the apiservers' aggregated discovery was not read whole")
	}
	var merged apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(topo.Discovery.JSON, &merged); err != nil {
		t.Fatal(err)
	}
	groups := map[string]bool{}
	for _, g := range merged.Items {
		groups[g.Name] = true
		if g.Name == "batch" && (len(g.Versions) == 0 || g.Versions[0].Resources[0].ResponseKind == nil) {
			t.Errorf("batch in the merged discovery lacks what kubectl needs: %+v", g)
		}
	}
	if !groups["batch"] || !groups["apps"] || groups[""] {
		t.Errorf("merged discovery groups %v, want batch and apps, not the core group", slices.Sorted(maps.Keys(groups)))
	}

	// A new CRD is in the merged discovery at once, not at the next periodic refetch.
	createCRD(t, ctx, cp.Server("cp-a").RESTConfig(), "inventory.kube-mvp.io", "gadget", "Gadget")
	testutil.WaitFor(t, ctx, 90*time.Second, "the new CRD in the merged discovery", func() error {
		d := latest.Load().Discovery
		if d == nil || !strings.Contains(string(d.JSON), `"name":"inventory.kube-mvp.io"`) {
			return fmt.Errorf("not yet")
		}
		return nil
	})

	cp.Kill("cp-a")
	testutil.WaitFor(t, ctx, 90*time.Second, "cp-a dead (its Lease no longer renewed)", func() error {
		d := latest.Load().DecideResource(jobs)
		if d.Outcome != topology.Unavailable || !slices.Equal(d.Servers, []string{idA}) {
			return fmt.Errorf("batch/v1 jobs: %v %v", d.Outcome, d.Servers)
		}
		return nil
	})
	if d := latest.Load().DecideResource(deployments); d.Outcome != topology.Default {
		t.Errorf("apps/v1 deployments with cp-a dead: %v, want default (cp-b alone)", d.Outcome)
	}

	if err := cp.Restart(ctx, "cp-a", ""); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, ctx, 90*time.Second, "cp-a back", func() error {
		d := latest.Load().DecideResource(jobs)
		if d.Outcome != topology.Subset || !slices.Equal(d.Servers, []string{idA}) {
			return fmt.Errorf("batch/v1 jobs: %v %v", d.Outcome, d.Servers)
		}
		return nil
	})
}

// TestWatcherReadsRequestHeaderNames: the identity header names come from what the
// apiservers publish in kube-system/extension-apiserver-authentication, a union over them:
// here cp-a reads the defaults, cp-b X-User, X-Groups and X-Extra-.
func TestWatcherReadsRequestHeaderNames(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: []controlplane.ServerSpec{
		{Name: "cp-a", Version: "v1.37.1"},
		{Name: "cp-b", Version: "v1.37.1", Args: []string{
			"--requestheader-username-headers=X-User", "--requestheader-group-headers=X-Groups", "--requestheader-extra-headers-prefix=X-Extra-",
		}},
	}})
	latest := watch(t, ctx, cp.Server("cp-a").RESTConfig(), inventory.WatchOptions{})
	testutil.WaitFor(t, ctx, 90*time.Second, "both apiservers' header names", func() error {
		topo := latest.Load()
		if topo == nil {
			return fmt.Errorf("no topology yet")
		}
		h := topo.RequestHeaders
		if !slices.Contains(h.User, "x-remote-user") || !slices.Contains(h.User, "x-user") ||
			!slices.Contains(h.Group, "x-remote-group") || !slices.Contains(h.Group, "x-groups") ||
			!slices.Contains(h.ExtraPrefix, "x-remote-extra-") || !slices.Contains(h.ExtraPrefix, "x-extra-") {
			return fmt.Errorf("request headers %+v", h)
		}
		return nil
	})
	// And they reach the plan, which the listener and extproc follow.
	p, err := plan.Build(latest.Load())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(p.RequestHeaders.User, "x-user") {
		t.Errorf("plan request headers %+v", p.RequestHeaders)
	}
}

// createCRD creates a namespaced CRD of group with one served version, v1, whose resource is
// kind's plural (singular + "s").
func createCRD(t *testing.T, ctx context.Context, cfg *rest.Config, group, singular, kind string) {
	t.Helper()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": singular + "s." + group},
		"spec": map[string]any{
			"group": group, "scope": "Namespaced",
			"names": map[string]any{"plural": singular + "s", "singular": singular, "kind": kind, "listKind": kind + "List"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dynamic.NewForConfigOrDie(cfg).Resource(crds).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
