package extproc

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestOnRealControlPlane decides on the table that inventory builds from a real two-version
// control plane (cp-a v1.37.1, cp-b v1.36.4 with batch/v1 off), over real gRPC: batch/v1 and
// the 1.37-only storagemigration.k8s.io/v1 go to cp-a alone, what both serve to both, and once
// cp-a is gone its resources get the 503 Status.
func TestOnRealControlPlane(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Servers: controlplane.MixedServers()})

	srv := New(Options{})
	client := serve(t, "unix", srv)
	opts := inventory.WatchOptions{Log: slog.New(slog.DiscardHandler)}
	opts.LivenessWindow = 15 * time.Second
	w, err := inventory.NewWatcher(cp.Server("cp-b").RESTConfig(), opts, func(topo *topology.Topology) {
		srv.SetTopology(topo, fmt.Sprint(time.Now().UnixNano()))
	})
	if err != nil {
		t.Fatal(err)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go w.Run(watchCtx) //nolint:errcheck // ends with watchCtx

	cases := []struct {
		method, path string
		want         want
	}{
		{"GET", "/apis/batch/v1/namespaces/default/jobs", subset("kube-apiservers-only-cp-a")},
		{"PATCH", "/apis/batch/v1/namespaces/default/jobs/j/status", subset("kube-apiservers-only-cp-a")},
		{"GET", "/apis/batch/v1/cronjobs?watch=true", subset("kube-apiservers-only-cp-a")},
		{"GET", "/apis/storagemigration.k8s.io/v1/storageversionmigrations", subset("kube-apiservers-only-cp-a")},
		{"GET", "/apis/apps/v1/namespaces/default/deployments", routed("kube-apiservers")},
		{"GET", "/api/v1/namespaces/default/pods/p/log", routed("kube-apiservers")},
		{"GET", "/healthz", routed("kube-apiservers")},
		{"GET", "/apis/widgets.example.com/v1/widgets", routed("kube-apiservers")},
	}
	// The first tables may predate the apiservers' discovery; wait for the settled one.
	waitDecision(t, client, "GET", "/apis/batch/v1/namespaces/default/jobs/j/status", "kube-apiservers-only-cp-a")
	waitDecision(t, client, "GET", "/apis/apps/v1/namespaces/default/deployments", "kube-apiservers")
	for _, c := range cases {
		req := request(c.method, c.path)
		checkResponse(t, req, call(t, client, req), c.want)
	}

	cp.Kill("cp-a")
	for _, c := range []struct {
		method, path string
		want         want
	}{
		{"GET", "/apis/batch/v1/namespaces/default/jobs", unavailable("batch/v1/jobs")},
		{"GET", "/apis/storagemigration.k8s.io/v1/storageversionmigrations", unavailable("storagemigration.k8s.io/v1/storageversionmigrations")},
		{"GET", "/apis/apps/v1/namespaces/default/deployments", routed("kube-apiservers")},
	} {
		req := request(c.method, c.path)
		resp := call(t, client, req)
		if c.want.cluster == "" && resp.GetImmediateResponse() == nil {
			// cp-a's Lease is not stale yet; wait for it.
			deadline := time.Now().Add(time.Minute)
			for resp.GetImmediateResponse() == nil && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				resp = call(t, client, req)
			}
		}
		checkResponse(t, req, resp, c.want)
	}
}

// waitDecision waits (up to two minutes) until extproc names cluster for the request.
func waitDecision(t *testing.T, client extprocv3.ExternalProcessorClient, method, path, cluster string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp := call(t, client, request(method, path))
		if destination(resp) == cluster {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: extproc answers %v, want cluster %s", method, path, resp, cluster)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
