package xds_test

import (
	"strings"
	"testing"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/plan/plantest"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xds"
)

// buildSnapshot is xds-server's translator: snapshot.Build with the chart's file layout.
func buildSnapshot(p *plan.Plan) (*cachev3.Snapshot, error) {
	res, err := snapshot.Build(p, snapshot.Config{
		ExtProcAddress: "unix:/run/kube-mvp/extproc.sock",
		Secrets: snapshot.SecretFiles{
			ServingCert: "/etc/kube-mvp/serving/tls.crt", ServingKey: "/etc/kube-mvp/serving/tls.key",
			ClientCA: "/etc/kube-mvp/client-ca/ca.crt", PeerCA: "/etc/kube-mvp/peer-ca/ca.crt",
			ProxyClientCert: "/etc/kube-mvp/proxy-client/tls.crt", ProxyClientKey: "/etc/kube-mvp/proxy-client/tls.key",
		},
	})
	if res == nil {
		return nil, err
	}
	return res.Snapshot()
}

// TestUpdateHeldWhenAPlanCannotBeBuilt: a plan whose snapshot cannot be built (here a group
// name Envoy's path-prefix rules refuse, as a compromised apiserver could list one, forced
// past name validation) changes nothing: Update says why, the plans in force stay, and the
// nodes keep their snapshots; the caller then keeps extproc's table (cmd/xds-server). The
// next buildable plan is taken.
func TestUpdateHeldWhenAPlanCannotBeBuilt(t *testing.T) {
	jobs := topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	mk := func(group string) *plan.Envoys {
		served := map[topology.Resource][]string{jobs: {"apiserver-a"}}
		if group != "" {
			served[topology.Resource{Group: group, Version: "v1", Resource: "things"}] = []string{"apiserver-a"}
		}
		tp, err := topology.New([]topology.APIServer{
			{ID: "apiserver-a", Hostname: "cp-a", Address: "127.0.0.1:1", Alive: true, Verified: true},
			{ID: "apiserver-b", Hostname: "cp-b", Address: "127.0.0.1:2", Alive: true, Verified: true},
		}, served, nil)
		if err != nil {
			t.Fatal(err)
		}
		return plans(t, tp)
	}
	srv := xds.New(xds.Options{Translate: buildSnapshot, MakeBeforeBreak: noMBB})
	good := mk("")
	if err := srv.Update(good); err != nil {
		t.Fatal(err)
	}
	before, err := srv.Snapshot("")
	if err != nil {
		t.Fatal(err)
	}

	bad := mk("evil#x.example.com")
	err = srv.Update(bad)
	if err == nil || !strings.Contains(err.Error(), "the front proxy's plan cannot be built") {
		t.Fatalf("Update of an unbuildable plan: %v; want an error naming the plan", err)
	}
	if srv.Plans() != good {
		t.Error("the unbuildable plans replaced the plans in force")
	}
	after, err := srv.Snapshot("")
	if err != nil {
		t.Fatal(err)
	}
	if after.GetVersion(resourcev3.RouteType) != before.GetVersion(resourcev3.RouteType) {
		t.Errorf("routes moved from %s to %s", before.GetVersion(resourcev3.RouteType), after.GetVersion(resourcev3.RouteType))
	}

	next := mk("good.example.com")
	if err := srv.Update(next); err != nil {
		t.Fatalf("a buildable plan after an unbuildable one: %v", err)
	}
	if srv.Plans() != next {
		t.Error("the buildable plan was not taken")
	}
}

// TestUpdateHeldWhenTheTableIsOverItsLimits: with xds-server's Admit (the routing table's
// limits), plans whose table extproc would refuse change nothing, so Envoy never gets
// configuration the table does not follow; the next plans within the limits are taken.
func TestUpdateHeldWhenTheTableIsOverItsLimits(t *testing.T) {
	srv := xds.New(xds.Options{Translate: buildSnapshot, MakeBeforeBreak: noMBB,
		Admit: func(e *plan.Envoys) error { return tablestream.Fits(e.Table()) }})
	good := plans(t, plantest.BigTopology(t, 2, 2))
	if err := srv.Update(good); err != nil {
		t.Fatal(err)
	}
	tooMany := plantest.BigTopology(t, tablestream.MaxTableKeys/plantest.KeysPerGroup+1, 2)
	tooMany.Discovery = nil
	err := srv.Update(plans(t, tooMany))
	if err == nil || !strings.Contains(err.Error(), "over the limits") {
		t.Fatalf("Update of plans whose table has too many keys: %v; want an error naming the limits", err)
	}
	if srv.Plans() != good {
		t.Error("the plans over the table's limits replaced the plans in force")
	}
	next := plans(t, plantest.BigTopology(t, 3, 2))
	if err := srv.Update(next); err != nil || srv.Plans() != next {
		t.Fatalf("plans within the limits after refused ones: %v", err)
	}
}
