package dataplane

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestClusterUpdate: a CDS update that leaves a cluster's resource as it was changes nothing
// of it (same hosts with their state, same connection pool), and one that changes anything,
// even only its metadata, makes it a new cluster, as Envoy does: hosts start afresh (their
// request counts, health and outlier state gone), after a warm-up on a new connection pool.
func TestClusterUpdate(t *testing.T) {
	const cluster = "kube-apiservers"
	var gen, push atomic.Int64
	e := newEnv(t, envOptions{editResources: func(res *snapshot.Resources) error {
		g, p := gen.Load(), push.Load()
		if g > 0 {
			for _, r := range res.Clusters {
				if c := r.(*clusterv3.Cluster); c.GetName() == cluster {
					c.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
						"test": {Fields: map[string]*structpb.Value{"generation": structpb.NewNumberValue(float64(g))}},
					}}
				}
			}
		}
		res.TypeVersions[resource.ClusterType] += fmt.Sprintf("-push%d", p)
		return nil
	}})
	c := e.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	// Requests to every host, so that each has a kept-alive connection.
	warm := uint64(0)
	for _, n := range e.reachEvery(c, path, len(e.apiservers), 200) {
		warm += uint64(n)
	}
	requests := func() (n uint64) {
		_, hosts, _ := e.dp.cluster(cluster).snapshot()
		for _, h := range hosts {
			h.mu.Lock()
			n += h.rqTotal
			h.mu.Unlock()
		}
		return n
	}
	repush := func(what string) {
		t.Helper()
		want := fmt.Sprintf("-push%d", push.Add(1))
		plans, err := plan.ForEveryEnvoy(e.topo)
		if err != nil {
			t.Fatal(err)
		}
		e.xds.Update(plans)
		testutil.WaitFor(t, t.Context(), 15*time.Second, what+" applied", func() error {
			if n := e.dp.NACKs(); len(n) > 0 {
				t.Fatalf("NACKs: %q", n)
			}
			if v := e.dp.Versions()[resource.ClusterType]; !strings.HasSuffix(v, want) {
				return fmt.Errorf("CDS version %q", v)
			}
			return nil
		})
	}
	if got := requests(); got != warm {
		t.Fatalf("hosts counted %d requests, want %d", got, warm)
	}

	// The same resources again: nothing changes.
	repush("unchanged clusters")
	if got := requests(); got != warm {
		t.Errorf("after an unchanged CDS update, hosts counted %d requests, want still %d", got, warm)
	}
	cx := e.stat("cluster.kube-apiservers.upstream_cx_total")
	if r := e.do(c, "GET", path, nil); r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := e.stat("cluster.kube-apiservers.upstream_cx_total"); got != cx {
		t.Errorf("after an unchanged CDS update a request opened a connection (%d -> %d): the pool was rebuilt", cx, got)
	}

	// Only the metadata changes: a new cluster.
	gen.Store(1)
	repush("changed metadata")
	testutil.WaitFor(t, t.Context(), 15*time.Second, "the new cluster warmed up", func() error {
		lc := e.dp.cluster(cluster)
		lc.mu.Lock()
		defer lc.mu.Unlock()
		if lc.previous != nil {
			return fmt.Errorf("still warming")
		}
		return nil
	})
	if got := requests(); got != 0 {
		t.Errorf("after a changed CDS update, hosts counted %d requests, want 0 (new hosts)", got)
	}
	cx = e.stat("cluster.kube-apiservers.upstream_cx_total")
	if r := e.do(c, "GET", path, nil); r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := e.stat("cluster.kube-apiservers.upstream_cx_total"); got == cx {
		t.Errorf("after a changed CDS update a request reused a connection of the old pool")
	}
}
