package snapshot_test

import (
	"fmt"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// benchTopology is a large control plane mid-upgrade: 5 apiservers, 400 group/version/
// resources in 40 group/versions (each resource with a status subresource). Every fourth
// group/version is missing on one apiserver and every seventh resource exists on the newest
// two only, so there are subset clusters and ext_proc routes as well as line-rate ones.
func benchTopology(b *testing.B) *topology.Topology {
	const servers, gvs, perGV = 5, 40, 10
	ss := liveAPIServers(servers)
	served := map[topology.Resource][]string{}
	n := 0
	for g := range gvs {
		for r := range perGV {
			res := topology.Resource{Group: fmt.Sprintf("group%d.example.io", g), Version: "v1", Resource: fmt.Sprintf("things%d", r)}
			var ids []string
			for i, s := range ss {
				switch {
				case n%7 == 0 && i < servers-2:
				case g%4 == 0 && i == g%servers:
				default:
					ids = append(ids, s.ID)
				}
			}
			served[res] = ids
			sub := res
			sub.Subresource = "status"
			served[sub] = ids
			n++
		}
	}
	t, err := topology.New(ss, served, nil)
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// liveAPIServers are n live apiservers cp-0, cp-1, … at 10.0.0.1, 10.0.0.2, ….
func liveAPIServers(n int) []topology.APIServer {
	var ss []topology.APIServer
	for i := range n {
		ss = append(ss, topology.APIServer{
			ID:       fmt.Sprintf("apiserver-%026d", i),
			Hostname: fmt.Sprintf("cp-%d", i),
			Address:  fmt.Sprintf("10.0.0.%d:6443", i+1),
			Alive:    true,
			Verified: true,
		})
	}
	return ss
}

func BenchmarkBuild(b *testing.B) {
	topo := benchTopology(b)
	cfg := testConfig()
	b.ReportAllocs()
	for b.Loop() {
		res, err := snapshot.Build(mustPlan(b, topo), cfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := res.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}
