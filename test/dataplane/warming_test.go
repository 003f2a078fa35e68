package dataplane

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// warmingEnv is an env whose resources, once stage > 0, carry an extra cluster "warming-test"
// (a copy of kube-apiservers with its own EDS resource and health-check path /warming-probe,
// with a long check timeout) and, first in every virtual host, a route to it for requests with
// the header x-warming-test. Stage 1: its endpoints are cp-a and cp-b; stage 2: cp-c too;
// stage 3: as stage 2 with health-check path /warming-probe-v2 (a changed cluster); stage 4:
// as stage 3 without cp-c (an EDS update only).
// The fake apiservers hold each /warming-probe until its server's gate is opened, and each
// /warming-probe-v2 until its server's gate in gatesV2 is.
type warmingEnv struct {
	*env
	stage   atomic.Int64
	gates   map[string]chan struct{}
	gatesV2 map[string]chan struct{}
}

const warmingCluster = "warming-test"

func newWarmingEnv(t *testing.T) *warmingEnv {
	w := &warmingEnv{gates: map[string]chan struct{}{}, gatesV2: map[string]chan struct{}{}}
	w.env = newEnv(t, envOptions{editResources: func(res *snapshot.Resources) error {
		stage := w.stage.Load()
		if stage == 0 {
			return nil
		}
		nc, err := testCluster{name: warmingCluster, probePath: "/warming-probe", header: "x-warming-test", version: fmt.Sprintf("-warming%d", stage),
			keep: func(addr string, _ *endpointv3.LbEndpoint) bool {
				return stage == 2 || stage == 3 || addr != w.apiservers["cp-c"].addr()
			}}.add(res)
		if err != nil {
			return err
		}
		nc.HealthChecks[0].Timeout = durationpb.New(time.Hour)
		if stage >= 3 {
			nc.HealthChecks[0].GetHttpHealthCheck().Path = "/warming-probe-v2"
		}
		return nil
	}})
	for name, f := range w.apiservers {
		gate, gateV2 := make(chan struct{}), make(chan struct{})
		w.gates[name], w.gatesV2[name] = gate, gateV2
		f.mu.Lock()
		f.stall = func(r *http.Request) bool {
			var g chan struct{}
			switch r.URL.Path {
			case "/warming-probe":
				g = gate
			case "/warming-probe-v2":
				g = gateV2
			default:
				return false
			}
			select {
			case <-g:
			case <-r.Context().Done():
			}
			return false
		}
		f.mu.Unlock()
	}
	return w
}

// push makes stage the resources' stage and waits until the data plane applied them.
func (w *warmingEnv) push(t *testing.T, stage int64) {
	t.Helper()
	w.stage.Store(stage)
	plans, err := plan.ForEveryEnvoy(w.topo)
	if err != nil {
		t.Fatal(err)
	}
	w.xds.Update(plans)
	want := fmt.Sprintf("-warming%d", stage)
	testutil.WaitFor(t, t.Context(), 15*time.Second, "stage applied", func() error {
		if n := w.dp.NACKs(); len(n) > 0 {
			t.Fatalf("NACKs: %q", n)
		}
		for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.RouteType} {
			if v := w.dp.Versions()[typ]; !strings.HasSuffix(v, want) {
				return fmt.Errorf("%s version %q", typ, v)
			}
		}
		return nil
	})
}

// probed waits until server has received a /warming-probe (which its gate holds).
// warmed lets every first health check pass, sends the cluster and its endpoints (stage 2)
// and waits until the cluster warmed.
func (w *warmingEnv) warmed(t *testing.T) {
	t.Helper()
	for _, g := range w.gates {
		close(g)
	}
	w.push(t, 2)
	testutil.WaitFor(t, t.Context(), 15*time.Second, "the new cluster warmed", func() error {
		if cc, _, _ := w.dp.cluster(warmingCluster).snapshot(); cc == nil {
			return fmt.Errorf("still warming")
		}
		return nil
	})
}

func (w *warmingEnv) probed(t *testing.T, server string) { w.probedAt(t, server, "/warming-probe") }

// probedAt waits until server has received a health check of path.
func (w *warmingEnv) probedAt(t *testing.T, server, path string) {
	t.Helper()
	testutil.WaitFor(t, t.Context(), 15*time.Second, server+" probed at "+path, func() error {
		for _, r := range w.apiservers[server].requests() {
			if r.Path == path {
				return nil
			}
		}
		return fmt.Errorf("no %s yet", path)
	})
}

var warmingHeader = map[string]string{"x-warming-test": "1"}

// TestNewClusterWarming: a cluster added by CDS is not used until its endpoints arrived and
// every host's first health check finished: a route naming it gets 503 "cluster not found"
// (NC) meanwhile, and the cluster is not in /clusters, as in Envoy, where the cluster is only
// in the warming clusters until ClusterImplBase finished initializing.
func TestNewClusterWarming(t *testing.T) {
	w := newWarmingEnv(t)
	c := w.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	if r := w.do(c, "GET", path, warmingHeader); r.status != 200 {
		t.Fatalf("before the new cluster: status %d: %s", r.status, r.body)
	}
	w.push(t, 1)
	w.probed(t, "cp-a")
	w.probed(t, "cp-b")
	r := w.do(c, "GET", path, warmingHeader)
	if r.status != http.StatusServiceUnavailable || r.seen.Server != "" {
		t.Fatalf("while the new cluster warms: status %d from %q, want a local 503 (cluster not found)", r.status, r.seen.Server)
	}
	clusters, err := ReadClusters(t.Context(), w.dp.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range clusters.GetClusterStatuses() {
		if cs.GetName() == warmingCluster {
			t.Errorf("/clusters lists %s while it warms", warmingCluster)
		}
	}
	// One host's first check done is not enough.
	close(w.gates["cp-a"])
	testutil.WaitFor(t, t.Context(), 15*time.Second, "cp-a checked", func() error {
		if _, _, healthy := w.hostStateAny(warmingCluster, w.apiservers["cp-a"].addr()); !healthy {
			return fmt.Errorf("cp-a not checked")
		}
		return nil
	})
	if r := w.do(c, "GET", path, warmingHeader); r.status != http.StatusServiceUnavailable || r.seen.Server != "" {
		t.Fatalf("with one first check pending: status %d from %q, want a local 503", r.status, r.seen.Server)
	}
	close(w.gates["cp-b"])
	testutil.WaitFor(t, t.Context(), 15*time.Second, "the new cluster warmed", func() error {
		if cc, _, _ := w.dp.cluster(warmingCluster).snapshot(); cc == nil {
			return fmt.Errorf("still warming")
		}
		return nil
	})
	servers, _ := w.spreadWith(c, path, 10, warmingHeader)
	if servers["cp-c"] > 0 {
		t.Errorf("cp-c, not an endpoint of %s, answered: %v", warmingCluster, servers)
	}
}

// TestNewHostUnhealthyUntilFirstCheck: a host EDS adds to a warmed cluster with active health
// checks takes no traffic until its first check passes (Envoy starts it FAILED_ACTIVE_HC;
// our configuration has no ignore_new_hosts_until_first_hc and a panic threshold of 0).
func TestNewHostUnhealthyUntilFirstCheck(t *testing.T) {
	w := newWarmingEnv(t)
	close(w.gates["cp-a"])
	close(w.gates["cp-b"])
	w.push(t, 1)
	testutil.WaitFor(t, t.Context(), 15*time.Second, "the new cluster warmed", func() error {
		if cc, _, _ := w.dp.cluster(warmingCluster).snapshot(); cc == nil {
			return fmt.Errorf("still warming")
		}
		return nil
	})
	w.push(t, 2)
	w.probed(t, "cp-c")
	c := w.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	// 60 requests over three hosts (least request): none to a usable cp-c would be
	// (2/3)^60 likely.
	if servers, _ := w.spreadWith(c, path, 60, warmingHeader); servers["cp-c"] > 0 {
		t.Errorf("cp-c, its first health check pending, answered %d requests: %v", servers["cp-c"], servers)
	}
	close(w.gates["cp-c"])
	testutil.WaitFor(t, t.Context(), 15*time.Second, "cp-c checked", func() error {
		if _, _, healthy := w.hostStateAny(warmingCluster, w.apiservers["cp-c"].addr()); !healthy {
			return fmt.Errorf("cp-c not healthy")
		}
		return nil
	})
	if servers, _ := w.spreadWith(c, path, 60, warmingHeader); servers["cp-c"] == 0 {
		t.Errorf("cp-c, healthy, took no requests: %v", servers)
	}
}

// hostStateAny is hostState of the newest version of cluster, warmed or not.
func (e *env) hostStateAny(cluster, address string) (present, pendingRemoval, healthy bool) {
	c := e.dp.cluster(cluster)
	if c == nil {
		return false, false, false
	}
	return findHostState(c.current(), address)
}

// TestChangedClusterWarming: a cluster changed by CDS is a new cluster that warms up like an
// added one, while the previous version keeps serving every request; once every host of the
// new version had its first health check, the new version serves (Envoy: the updated cluster
// waits in the warming clusters; the active one stays in the thread-local cluster manager
// until ClusterManagerImpl::onClusterInit replaces it).
func TestChangedClusterWarming(t *testing.T) {
	w := newWarmingEnv(t)
	w.warmed(t)
	c := w.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	w.spreadWith(c, path, 5, warmingHeader)
	oldCfg, _, _ := w.dp.cluster(warmingCluster).snapshot()

	w.push(t, 3)
	for name := range w.apiservers {
		w.probedAt(t, name, "/warming-probe-v2")
	}
	// Every request is served, by the previous version.
	w.spreadWith(c, path, 20, warmingHeader)
	if cc, _, _ := w.dp.cluster(warmingCluster).snapshot(); cc != oldCfg {
		t.Fatalf("the changed cluster serves before its hosts' first health checks")
	}
	close(w.gatesV2["cp-a"])
	close(w.gatesV2["cp-b"])
	w.spreadWith(c, path, 20, warmingHeader)
	close(w.gatesV2["cp-c"])
	testutil.WaitFor(t, t.Context(), 15*time.Second, "the changed cluster warmed", func() error {
		if cc, _, _ := w.dp.cluster(warmingCluster).snapshot(); cc == oldCfg {
			return fmt.Errorf("the previous version still serves")
		}
		return nil
	})
	w.spreadWith(c, path, 20, warmingHeader)
}

// TestEDSDuringChangedClusterWarming: while a changed cluster warms, EDS updates reach the
// previous version that serves too (in Envoy the active cluster keeps its EDS subscription
// until the warmed one replaces it): an apiserver that leaves EDS (the product sets
// ignore_health_on_host_removal, so it goes at once) takes no more requests.
func TestEDSDuringChangedClusterWarming(t *testing.T) {
	w := newWarmingEnv(t)
	w.warmed(t)
	c := w.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	w.push(t, 3)
	w.probedAt(t, "cp-a", "/warming-probe-v2")
	oldCfg, _, _ := w.dp.cluster(warmingCluster).snapshot()
	w.push(t, 4)
	if cc, _, _ := w.dp.cluster(warmingCluster).snapshot(); cc != oldCfg {
		t.Fatalf("the previous version no longer serves")
	}
	// 60 requests over two or three hosts: none to cp-c if it were still a host of the
	// serving version would be (2/3)^60 likely.
	if servers, _ := w.spreadWith(c, path, 60, warmingHeader); servers["cp-c"] > 0 {
		t.Errorf("cp-c, no longer in EDS, answered %d requests during the warm-up: %v", servers["cp-c"], servers)
	}
	for _, g := range w.gatesV2 {
		close(g)
	}
}
