package dataplane

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// hostState is what the data plane holds of the host at address in cluster: present, and if
// so whether it is pending removal (Envoy's PENDING_DYNAMIC_REMOVAL) and healthy.
func (e *env) hostState(cluster, address string) (present, pendingRemoval, healthy bool) {
	c := e.dp.cluster(cluster)
	if c == nil {
		return false, false, false
	}
	_, hosts, _ := c.snapshot()
	return findHostState(hosts, address)
}

// findHostState is hostState of the host at address among hosts.
func findHostState(hosts []*liveHost, address string) (present, pendingRemoval, healthy bool) {
	for _, h := range hosts {
		if h.address == address {
			h.mu.Lock()
			defer h.mu.Unlock()
			return true, h.pendingRemoval, !h.failedHC && !h.hcPending
		}
	}
	return false, false, false
}

// TestHostRemovalWithHealthChecks: an apiserver whose endpoint leaves EDS while it passes
// active health checks. Without ignore_health_on_host_removal Envoy keeps it, pending
// removal, taking traffic, until it fails its health checks; with it (the product's setting:
// the identity Leases decide membership), it is gone with the EDS update.
func TestHostRemovalWithHealthChecks(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignore_health_on_host_removal=%t", ignore), func(t *testing.T) {
			const cluster = "kube-apiservers"
			var drop atomic.Value // the address whose endpoints EDS leaves out
			drop.Store("")
			e := newEnv(t, envOptions{editResources: func(res *snapshot.Resources) error {
				for _, r := range res.Clusters {
					c := r.(*clusterv3.Cluster)
					if c.GetType() != clusterv3.Cluster_EDS {
						continue
					}
					if !c.GetIgnoreHealthOnHostRemoval() {
						return fmt.Errorf("cluster %s: the product does not set ignore_health_on_host_removal", c.GetName())
					}
					c.IgnoreHealthOnHostRemoval = ignore
					// Quick checks, so that a stopped apiserver fails them soon.
					c.HealthChecks[0].Interval = durationpb.New(100 * time.Millisecond)
					c.HealthChecks[0].NoTrafficInterval = durationpb.New(100 * time.Millisecond)
				}
				addr := drop.Load().(string)
				if addr == "" {
					return nil
				}
				for _, r := range res.Endpoints {
					for _, l := range r.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
						l.LbEndpoints = slices.DeleteFunc(slices.Clone(l.LbEndpoints), func(ep *endpointv3.LbEndpoint) bool {
							sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
							return fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()) == addr
						})
					}
				}
				res.TypeVersions[resource.EndpointType] += "-without-" + addr
				return nil
			}})
			gone := e.apiservers["cp-b"]
			addr := gone.addr()
			testutil.WaitFor(t, t.Context(), 15*time.Second, "cp-b healthy", func() error {
				if present, _, healthy := e.hostState(cluster, addr); !present || !healthy {
					return fmt.Errorf("present %t, healthy %t", present, healthy)
				}
				return nil
			})

			drop.Store(addr)
			plans, err := plan.ForEveryEnvoy(e.topo)
			if err != nil {
				t.Fatal(err)
			}
			e.xds.Update(plans)
			testutil.WaitFor(t, t.Context(), 15*time.Second, "EDS without cp-b", func() error {
				if n := e.dp.NACKs(); len(n) > 0 {
					t.Fatalf("NACKs: %q", n)
				}
				for _, l := range e.dp.config().endpoints[cluster].GetEndpoints() {
					for _, ep := range l.GetLbEndpoints() {
						sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
						if fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()) == addr {
							return fmt.Errorf("cp-b still in EDS")
						}
					}
				}
				return nil
			})
			present, pending, _ := e.hostState(cluster, addr)
			c := e.client(nil)
			if ignore {
				if present {
					t.Fatalf("cp-b left EDS but is still a host (pending removal %t)", pending)
				}
				if servers, _ := e.spread(c, "/api/v1/namespaces/default/configmaps", 30); servers["cp-b"] > 0 {
					t.Errorf("cp-b answered %d requests after it left EDS", servers["cp-b"])
				}
				return
			}
			if !present || !pending {
				t.Fatalf("cp-b, healthy, left EDS: present %t, pending removal %t; want kept pending removal", present, pending)
			}
			// It still takes traffic. 60 requests over three hosts (least request):
			// none to cp-b would be (2/3)^60 likely.
			if servers, _ := e.spread(c, "/api/v1/namespaces/default/configmaps", 60); servers["cp-b"] == 0 {
				t.Errorf("cp-b, pending removal, took no requests: %v", servers)
			}
			clusters, err := ReadClusters(t.Context(), e.dp.AdminURL())
			if err != nil {
				t.Fatal(err)
			}
			flagged := false
			for _, cs := range clusters.GetClusterStatuses() {
				for _, hs := range cs.GetHostStatuses() {
					if cs.GetName() == cluster && hs.GetHostname() == "cp-b" && hs.GetHealthStatus().GetPendingDynamicRemoval() {
						flagged = true
					}
				}
			}
			if !flagged {
				t.Errorf("/clusters does not show cp-b of %s pending_dynamic_removal", cluster)
			}
			// Once it fails its health checks, it goes.
			gone.srv.Close()
			testutil.WaitFor(t, t.Context(), 15*time.Second, "cp-b removed after failing health checks", func() error {
				if present, _, healthy := e.hostState(cluster, addr); present {
					return fmt.Errorf("cp-b still a host (healthy %t)", healthy)
				}
				return nil
			})
		})
	}
}
