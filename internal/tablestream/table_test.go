package tablestream_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/plan/plantest"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// sample is a three-apiserver table: batch/v1 jobs on cp-a only, pods on cp-a and cp-b (dead
// when !aliveB), pods/log also naming a gone apiserver, anvils on cp-b only, widgets on the
// dead cp-c only, and two served-everywhere groups.
func sample(t testing.TB, aliveB bool) *plan.Table {
	t.Helper()
	topo, err := topology.New(
		[]topology.APIServer{
			{ID: "apiserver-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: aliveB, Verified: true},
			{ID: "apiserver-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
			{ID: "apiserver-c", Hostname: "cp-c", Address: "10.0.0.3:6443"},
		},
		map[topology.Resource][]string{
			{Group: "batch", Version: "v1", Resource: "jobs"}:                        {"apiserver-a"},
			{Group: "batch", Version: "v1", Resource: "jobs", Subresource: "status"}: {"apiserver-a"},
			{Version: "v1", Resource: "pods"}:                                        {"apiserver-b", "apiserver-a"},
			{Version: "v1", Resource: "pods", Subresource: "log"}:                    {"apiserver-a", "apiserver-gone"},
			{Group: "tools.acme.dev", Version: "v1", Resource: "anvils"}:             {"apiserver-b"},
			{Group: "tools.acme.dev", Version: "v1", Resource: "widgets"}:            {"apiserver-c"},
		},
		[]topology.GroupVersion{{Group: "example.com", Version: "v1"}, {Group: "acme.io", Version: "v1beta1"}})
	if err != nil {
		t.Fatal(err)
	}
	return tableOf(t, topo)
}

// tableOf is the routing table of topo, as xds-server publishes it.
func tableOf(t testing.TB, topo *topology.Topology) *plan.Table {
	t.Helper()
	tb, err := plan.TableOf(topo)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// sameTable says how got differs from want in what the table carries: apiservers, discovery
// and, per plan, where each published resource goes (outcome and cluster).
func sameTable(want, got *plan.Table) error {
	switch {
	case !reflect.DeepEqual(want.APIServers, got.APIServers):
		return fmt.Errorf("apiservers %+v, want %+v", got.APIServers, want.APIServers)
	case !reflect.DeepEqual(want.Discovery, got.Discovery):
		return errors.New("discovery differs")
	case !reflect.DeepEqual(want.RequestHeaders, got.RequestHeaders):
		return fmt.Errorf("request headers %+v, want %+v", got.RequestHeaders, want.RequestHeaders)
	case len(want.Routes) != len(got.Routes):
		return fmt.Errorf("%d plans, want %d", len(got.Routes), len(want.Routes))
	}
	for local, w := range want.Routes {
		g := got.Routes[local]
		if g == nil {
			return fmt.Errorf("no plan for %q", local)
		}
		if g.Default.Outcome != w.Default.Outcome || g.Default.Cluster != w.Default.Cluster || !slices.Equal(g.Default.ProxyCertRefused, w.Default.ProxyCertRefused) {
			return fmt.Errorf("plan %q: default route %+v, want %+v", local, g.Default, w.Default)
		}
		wr, gr := w.All(), g.All()
		if len(wr) != len(gr) {
			return fmt.Errorf("plan %q: %d routes, want %d", local, len(gr), len(wr))
		}
		for i := range wr {
			if wr[i].Resource != gr[i].Resource || wr[i].Outcome != gr[i].Outcome || wr[i].Cluster != gr[i].Cluster {
				return fmt.Errorf("plan %q: %s goes %v to %q, want %v to %q", local, wr[i].Resource, gr[i].Outcome, gr[i].Cluster, wr[i].Outcome, wr[i].Cluster)
			}
			if wr[i].Pending != gr[i].Pending {
				return fmt.Errorf("plan %q: %s pending %v, want %v", local, wr[i].Resource, gr[i].Pending, wr[i].Pending)
			}
			if !slices.Equal(wr[i].ProxyCertRefused, gr[i].ProxyCertRefused) {
				return fmt.Errorf("plan %q: %s refuses front-proxy requests for %v, want %v", local, wr[i].Resource, gr[i].ProxyCertRefused, wr[i].ProxyCertRefused)
			}
		}
	}
	return nil
}

func TestRoundTrip(t *testing.T) {
	in := sample(t, true)
	in.Discovery = topology.NewDiscovery([]byte(`{"kind":"APIGroupDiscoveryList"}`))
	in.RequestHeaders = topology.RequestHeaders{User: []string{"x-user", "x-login"}, UID: []string{"x-uid"}, Group: []string{"x-groups"}, ExtraPrefix: []string{"x-extra-"}}
	tb := tablestream.ToProto(in, time.Unix(1, 0))
	if tb.GetFormat() != tablestream.Format {
		t.Errorf("format %d, want %d", tb.GetFormat(), tablestream.Format)
	}
	// The front proxy's plan first, then one per apiserver; each lists its distinct routes
	// once: the front's cp-a subset (jobs, jobs/status, pods/log), default (pods), cp-b
	// subset (anvils) and unavailable (widgets).
	if got := len(tb.GetPlans()); got != 4 || tb.GetPlans()[0].GetLocalApiserver() != "" {
		t.Fatalf("plans %v, want the front proxy's and one per apiserver", tb.GetPlans())
	}
	if front := tb.GetPlans()[0]; len(front.GetResourceRoutes()) != 6 || len(front.GetRoutes()) != 4 {
		t.Errorf("front plan: %d routes for %d resources, want 4 distinct for 6", len(front.GetRoutes()), len(front.GetResourceRoutes()))
	}
	out, err := tablestream.FromProto(tb)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameTable(in, out); err != nil {
		t.Errorf("round trip changed the table: %v", err)
	}
	if got := out.Routes[""].Lookup(topology.Resource{Group: "batch", Version: "v1", Resource: "jobs", Subresource: "scale"}); got.Cluster != "kube-apiservers-only-cp-a" {
		t.Errorf("unpublished subresource of jobs goes to %q, want jobs' cluster", got.Cluster)
	}
	// A group/version's document goes to whoever serves some resource of it.
	batchDoc := topology.GroupVersion{Group: "batch", Version: "v1"}.Document()
	if got := out.Routes[""].Lookup(batchDoc); got.Cluster != "kube-apiservers-only-cp-a" || got.Outcome != topology.Subset {
		t.Errorf("batch/v1 document goes %s to %q, want subset to cp-a's cluster", got.Outcome, got.Cluster)
	}
	// A table from an xds-server that sends no documents: they go to the default cluster.
	old := proto.CloneOf(tb)
	for _, p := range old.Plans {
		p.DocumentRoutes = nil
	}
	if o, err := tablestream.FromProto(old); err != nil {
		t.Errorf("table without documents: %v", err)
	} else if got := o.Routes[""].Decide(topology.RequestInfo{GroupVersionDocument: true, APIGroup: "batch", APIVersion: "v1"}); got.Cluster != o.Routes[""].Default.Cluster {
		t.Errorf("without documents, batch/v1's goes to %q, want the default cluster", got.Cluster)
	}
	if again := tablestream.ToProto(out, time.Unix(99, 0)); again.Version != tb.Version {
		t.Errorf("version depends on more than content: %s vs %s", again.Version, tb.Version)
	}
	if other := tablestream.ToProto(sample(t, false), time.Unix(1, 0)); other.Version == tb.Version {
		t.Error("different content, same version")
	}
	if other := tablestream.ToProto(sample(t, true), time.Unix(1, 0)); other.Version == tb.Version {
		t.Error("different discovery, same version")
	}
	// Through the wire form too.
	b, err := proto.Marshal(tb)
	if err != nil {
		t.Fatal(err)
	}
	var back tablev1.Table
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if out, err := tablestream.FromProto(&back); err != nil || sameTable(in, out) != nil {
		t.Errorf("after marshalling: %v, %v", err, sameTable(in, out))
	}
}

// TestPendingRoundTrip: a new CRD's resource that no apiserver lists yet travels as an
// unavailable route that is pending (its 503 says Retry-After), apart from the unavailable
// routes of dead apiservers.
func TestPendingRoundTrip(t *testing.T) {
	topo, err := topology.New([]topology.APIServer{{ID: "apiserver-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true}, {ID: "apiserver-c", Hostname: "cp-c"}},
		map[topology.Resource][]string{{Group: "tools.acme.dev", Version: "v1", Resource: "widgets"}: {"apiserver-c"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	gadgets := topology.Resource{Group: "tools.acme.dev", Version: "v1", Resource: "gadgets"}
	topo.SetPending([]topology.Resource{gadgets})
	in := tableOf(t, topo)
	out, err := tablestream.FromProto(tablestream.ToProto(in, time.Unix(1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sameTable(in, out); err != nil {
		t.Fatal(err)
	}
	if r := out.Routes[""].Lookup(gadgets); r.Outcome != topology.Unavailable || !r.Pending {
		t.Errorf("gadgets: %+v, want unavailable and pending", r)
	}
	if r := out.Routes[""].Lookup(topology.Resource{Group: "tools.acme.dev", Version: "v1", Resource: "widgets"}); r.Outcome != topology.Unavailable || r.Pending {
		t.Errorf("widgets (only a dead apiserver serves it): %+v, want unavailable, not pending", r)
	}
}

// TestFromProtoRejects: a table that contradicts itself or is of another format is an error
// of the right kind, never a panic or a partial table.
func TestFromProtoRejects(t *testing.T) {
	good := tablestream.ToProto(sample(t, false), time.Unix(1, 0))
	for _, tc := range []struct {
		name   string
		change func(tb *tablev1.Table)
		want   error
	}{
		{"unversioned (the old format)", func(tb *tablev1.Table) { tb.Format = 0 }, tablestream.ErrUnsupportedFormat},
		{"format 1 (the topology)", func(tb *tablev1.Table) { tb.Format = 1 }, tablestream.ErrUnsupportedFormat},
		{"newer format", func(tb *tablev1.Table) { tb.Format = tablestream.Format + 1 }, tablestream.ErrUnsupportedFormat},
		{"route index out of range", func(tb *tablev1.Table) { tb.Plans[0].ResourceRoutes[0] = uint32(len(tb.Plans[0].Routes)) }, tablestream.ErrMalformed},
		{"huge route index", func(tb *tablev1.Table) { tb.Plans[0].ResourceRoutes[0] = 1<<32 - 1 }, tablestream.ErrMalformed},
		{"no routes at all", func(tb *tablev1.Table) { tb.Plans[1].Routes = nil }, tablestream.ErrMalformed},
		{"a resource without a route", func(tb *tablev1.Table) { tb.Plans[0].ResourceRoutes = tb.Plans[0].ResourceRoutes[1:] }, tablestream.ErrMalformed},
		{"unknown outcome", func(tb *tablev1.Table) { tb.Plans[0].Routes[0].Outcome = 99 }, tablestream.ErrMalformed},
		{"unspecified outcome", func(tb *tablev1.Table) { tb.Plans[0].Routes[0].Outcome = tablev1.Outcome_OUTCOME_UNSPECIFIED }, tablestream.ErrMalformed},
		{"a routed outcome without a cluster", func(tb *tablev1.Table) { tb.Plans[0].Routes[0].Cluster = "" }, tablestream.ErrMalformed},
		{"no front proxy plan", func(tb *tablev1.Table) { tb.Plans = tb.Plans[1:] }, tablestream.ErrMalformed},
		{"two plans for one apiserver", func(tb *tablev1.Table) { tb.Plans = append(tb.Plans, tb.Plans[1]) }, tablestream.ErrMalformed},
		{"resource listed twice", func(tb *tablev1.Table) {
			tb.GroupVersions[0].Resources = append(tb.GroupVersions[0].Resources, tb.GroupVersions[0].Resources[0])
			for _, p := range tb.Plans {
				p.ResourceRoutes = append(p.ResourceRoutes, p.ResourceRoutes[0])
			}
		}, tablestream.ErrMalformed},
		{"resource without name", func(tb *tablev1.Table) { tb.GroupVersions[0].Resources[0].Resource = "" }, tablestream.ErrMalformed},
		{"documents of fewer group/versions", func(tb *tablev1.Table) { tb.Plans[0].DocumentRoutes = tb.Plans[0].DocumentRoutes[1:] }, tablestream.ErrMalformed},
		{"documents in one plan only", func(tb *tablev1.Table) { tb.Plans[1].DocumentRoutes = nil }, tablestream.ErrMalformed},
		{"document route out of range", func(tb *tablev1.Table) { tb.Plans[0].DocumentRoutes[0] = 99 }, tablestream.ErrMalformed},
		{"group/version without version", func(tb *tablev1.Table) { tb.GroupVersions[0].Version = "" }, tablestream.ErrMalformed},
		{"a pending route that forwards", func(tb *tablev1.Table) {
			for _, r := range tb.Plans[0].Routes {
				if r.Outcome != tablev1.Outcome_OUTCOME_UNAVAILABLE {
					r.Pending = true
					return
				}
			}
		}, tablestream.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := proto.CloneOf(good)
			tc.change(tb)
			got, err := tablestream.FromProto(tb)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want an error wrapping %q", got, err, tc.want)
			}
			if got != nil {
				t.Errorf("a table came with the error: %+v", got)
			}
		})
	}
	if _, err := tablestream.FromProto(nil); !errors.Is(err, tablestream.ErrMalformed) {
		t.Errorf("nil table: %v", err)
	}
	if _, err := tablestream.FromProto(good); err != nil {
		t.Errorf("the cases changed the good table: %v", err)
	}
}

// TestTableLimits: a table of more keys than MaxTableKeys, or whose merged discovery leaves
// it over MaxTableSize, does not fit (xds-server holds such plans back), and a follower that
// gets one anyway refuses it as too large; the largest table the limits take fits.
func TestTableLimits(t *testing.T) {
	if err := tablestream.Fits(largestTable(t)); err != nil {
		t.Errorf("the largest table: %v", err)
	}
	manyKeys := plantest.BigTopology(t, tablestream.MaxTableKeys/plantest.KeysPerGroup+1, 3)
	manyKeys.Discovery = nil
	keys := tableOf(t, manyKeys)
	if err := tablestream.Fits(keys); err == nil || !strings.Contains(err.Error(), "keys") {
		t.Errorf("%d keys fit: %v", keys.Routes[""].Len(), err)
	}
	if got, err := tablestream.FromProto(tablestream.ToProto(keys, time.Unix(1, 0))); !errors.Is(err, tablestream.ErrTooLarge) || got != nil {
		t.Errorf("FromProto of %d keys: %v, want an error wrapping %q", keys.Routes[""].Len(), err, tablestream.ErrTooLarge)
	}
	bigDiscovery := plantest.BigTopology(t, 10, 3)
	bigDiscovery.Discovery = plantest.BigTopology(t, tablestream.MaxTableSize/plantest.BytesPerGroup*3/2, 1).Discovery
	if err := tablestream.Fits(tableOf(t, bigDiscovery)); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("%d bytes of discovery fit: %v", len(bigDiscovery.Discovery.JSON), err)
	}
}

// FuzzFromProto: whatever bytes arrive, parsing and FromProto do not panic, and a table
// FromProto accepts converts back to a table it accepts again, with the same content.
func FuzzFromProto(f *testing.F) {
	good, err := proto.Marshal(tablestream.ToProto(sample(f, true), time.Unix(1, 0)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	badIndex, err := proto.Marshal(&tablev1.Table{Format: tablestream.Format, GroupVersions: []*tablev1.GroupVersion{{
		Version: "v1", Resources: []*tablev1.PublishedResource{{Resource: "pods"}},
	}}, Plans: []*tablev1.Plan{{ResourceRoutes: []uint32{7}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(badIndex)
	f.Fuzz(func(t *testing.T, b []byte) {
		var tb tablev1.Table
		if proto.Unmarshal(b, &tb) != nil {
			return
		}
		got, err := tablestream.FromProto(&tb)
		if err != nil {
			if !errors.Is(err, tablestream.ErrMalformed) && !errors.Is(err, tablestream.ErrUnsupportedFormat) && !errors.Is(err, tablestream.ErrTooLarge) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		again, err := tablestream.FromProto(tablestream.ToProto(got, time.Unix(1, 0)))
		if err != nil {
			t.Fatalf("FromProto refuses what ToProto made of a table it accepted: %v", err)
		}
		if err := sameTable(got, again); err != nil {
			t.Fatalf("round trip of an accepted table: %v", err)
		}
	})
}
