package snapshot_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// shuffled returns the objects of a fixture in a random order, down to the order of the
// resources and subresources inside each discovery document.
func shuffled(t *testing.T, name string, r *rand.Rand) objects.Objects {
	t.Helper()
	objs, err := objects.LoadFixture(fixtures.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	shuffle := func(n int, swap func(i, j int)) { r.Shuffle(n, swap) }
	shuffle(len(objs.Leases), func(i, j int) { objs.Leases[i], objs.Leases[j] = objs.Leases[j], objs.Leases[i] })
	shuffle(len(objs.StorageVersions), func(i, j int) {
		objs.StorageVersions[i], objs.StorageVersions[j] = objs.StorageVersions[j], objs.StorageVersions[i]
	})
	for i := range objs.StorageVersions {
		e := objs.StorageVersions[i].Status.StorageVersions
		shuffle(len(e), func(i, j int) { e[i], e[j] = e[j], e[i] })
	}
	shuffle(len(objs.APIServices), func(i, j int) { objs.APIServices[i], objs.APIServices[j] = objs.APIServices[j], objs.APIServices[i] })
	for _, d := range objs.Discovery {
		g := d.Items
		shuffle(len(g), func(i, j int) { g[i], g[j] = g[j], g[i] })
		for gi := range g {
			v := g[gi].Versions
			shuffle(len(v), func(i, j int) { v[i], v[j] = v[j], v[i] })
			for vi := range v {
				rs := v[vi].Resources
				shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
				for ri := range rs {
					s := rs[ri].Subresources
					shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
				}
			}
		}
	}
	return objs
}

// TestDeterminism: the same control plane, described in any order, yields byte-identical
// resources and versions, so replicas of the xds server agree.
func TestDeterminism(t *testing.T) {
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			var first []byte
			var firstVersion string
			for seed := range uint64(5) {
				objs := shuffled(t, name, rand.New(rand.NewPCG(seed, seed*7919+1)))
				topo, errs := objects.Build(objs, objects.Options{Now: fixtures.Now})
				if len(errs) > 0 {
					t.Fatal(errs)
				}
				if id := fixtures.SidecarOf(name); id != "" {
					topo = topo.WithLocal(id)
				}
				if d := fixtures.DangerousOf(name); d != nil {
					topo = topo.WithDangerous(d)
				}
				res, err := snapshot.Build(mustPlan(t, topo), testConfig())
				if err != nil {
					t.Fatal(err)
				}
				js, err := res.ToJSON()
				if err != nil {
					t.Fatal(err)
				}
				if seed == 0 {
					first, firstVersion = js, res.Version
					continue
				}
				if res.Version != firstVersion {
					t.Errorf("seed %d: version %s, seed 0: %s", seed, res.Version, firstVersion)
				}
				if !bytes.Equal(js, first) {
					t.Errorf("seed %d: JSON differs from seed 0", seed)
				}
			}
		})
	}
}

// TestVersionsFollowContent: a change anywhere changes the version of that type (and the
// overall version), and only of that type.
func TestVersionsFollowContent(t *testing.T) {
	topo := loadCase(t, "batch-off")
	a, err := snapshot.Build(mustPlan(t, topo), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Secrets.PeerCA = "/etc/kube-mvp/other-peer-ca/ca.crt"
	b, err := snapshot.Build(mustPlan(t, topo), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a.Version == b.Version {
		t.Error("overall version unchanged by a new peer CA")
	}
	for typ, va := range a.TypeVersions {
		changed := va != b.TypeVersions[typ]
		if wantChanged := typ == "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"; changed != wantChanged {
			t.Errorf("%s: version changed %v, want %v", typ, changed, wantChanged)
		}
	}
	snap, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for typ, v := range b.TypeVersions {
		if got := snap.GetVersion(typ); got != v {
			t.Errorf("snapshot version of %s = %q, want %q", typ, got, v)
		}
	}
}
