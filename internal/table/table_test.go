package table_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/table"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

func sample(t testing.TB, aliveB bool) *topology.Topology {
	t.Helper()
	topo, err := topology.New(
		[]topology.APIServer{{ID: "apiserver-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: aliveB}, {ID: "apiserver-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true}},
		map[topology.Resource][]string{
			{Group: "batch", Version: "v1", Resource: "jobs"}:                        {"apiserver-a"},
			{Group: "batch", Version: "v1", Resource: "jobs", Subresource: "status"}: {"apiserver-a"},
			{Version: "v1", Resource: "pods"}:                                        {"apiserver-b", "apiserver-a"},
			{Version: "v1", Resource: "pods", Subresource: "log"}:                    {"apiserver-a", "apiserver-gone"},
		},
		[]string{"example.com", "acme.io"})
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// sameTopology says how got differs from want in what the table carries.
func sameTopology(want, got *topology.Topology) error {
	switch {
	case !reflect.DeepEqual(want.APIServers, got.APIServers):
		return fmt.Errorf("apiservers %+v, want %+v", got.APIServers, want.APIServers)
	case !reflect.DeepEqual(want.Served, got.Served):
		if len(want.Served) != len(got.Served) {
			return fmt.Errorf("%d served resources, want %d", len(got.Served), len(want.Served))
		}
		for r, ids := range want.Served {
			if !reflect.DeepEqual(got.Served[r], ids) {
				return fmt.Errorf("%s served by %v, want %v", r, got.Served[r], ids)
			}
		}
		return errors.New("served resources differ")
	case !reflect.DeepEqual(want.ServedEverywhere, got.ServedEverywhere):
		return fmt.Errorf("served everywhere %v, want %v", got.ServedEverywhere, want.ServedEverywhere)
	case !reflect.DeepEqual(want.Discovery, got.Discovery):
		return errors.New("discovery differs")
	}
	return nil
}

func TestRoundTrip(t *testing.T) {
	in := sample(t, true)
	in.Discovery = topology.NewDiscovery([]byte(`{"kind":"APIGroupDiscoveryList"}`))
	tb := table.ToProto(in, time.Unix(1, 0))
	if tb.GetFormat() != table.Format {
		t.Errorf("format %d, want %d", tb.GetFormat(), table.Format)
	}
	// Three resources share apiserver-a; pods and pods/log have sets of their own.
	if len(tb.GetServerSets()) != 3 {
		t.Errorf("server sets %v, want the 3 distinct ones", tb.GetServerSets())
	}
	out, err := table.FromProto(tb)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameTopology(in, out); err != nil {
		t.Errorf("round trip changed the topology: %v", err)
	}
	if again := table.ToProto(out, time.Unix(99, 0)); again.Version != tb.Version {
		t.Errorf("version depends on more than content: %s vs %s", again.Version, tb.Version)
	}
	if other := table.ToProto(sample(t, false), time.Unix(1, 0)); other.Version == tb.Version {
		t.Error("different content, same version")
	}
	if other := table.ToProto(sample(t, true), time.Unix(1, 0)); other.Version == tb.Version {
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
	if out, err := table.FromProto(&back); err != nil || sameTopology(in, out) != nil {
		t.Errorf("after marshalling: %v, %v", err, sameTopology(in, out))
	}
}

// TestFromProtoRejects: a table that contradicts itself or is of another format is an error
// of the right kind, never a panic or a partial topology.
func TestFromProtoRejects(t *testing.T) {
	good := table.ToProto(sample(t, true), time.Unix(1, 0))
	for _, tc := range []struct {
		name   string
		change func(tb *tablev1.Table)
		want   error
	}{
		{"unversioned (the old format)", func(tb *tablev1.Table) { tb.Format = 0 }, table.ErrUnsupportedFormat},
		{"newer format", func(tb *tablev1.Table) { tb.Format = table.Format + 1 }, table.ErrUnsupportedFormat},
		{"set index out of range", func(tb *tablev1.Table) { tb.GroupVersions[0].Resources[0].ServerSet = uint32(len(tb.ServerSets)) }, table.ErrMalformed},
		{"huge set index", func(tb *tablev1.Table) { tb.GroupVersions[0].Resources[0].ServerSet = 1<<32 - 1 }, table.ErrMalformed},
		{"no sets at all", func(tb *tablev1.Table) { tb.ServerSets = nil }, table.ErrMalformed},
		{"empty set", func(tb *tablev1.Table) { tb.ServerSets[0].ApiserverIds = nil }, table.ErrMalformed},
		{"empty apiserver ID in a set", func(tb *tablev1.Table) { tb.ServerSets[0].ApiserverIds = append(tb.ServerSets[0].ApiserverIds, "") }, table.ErrMalformed},
		{"resource listed twice", func(tb *tablev1.Table) {
			tb.GroupVersions[0].Resources = append(tb.GroupVersions[0].Resources, tb.GroupVersions[0].Resources[0])
		}, table.ErrMalformed},
		{"resource without name", func(tb *tablev1.Table) { tb.GroupVersions[0].Resources[0].Resource = "" }, table.ErrMalformed},
		{"group/version without version", func(tb *tablev1.Table) { tb.GroupVersions[0].Version = "" }, table.ErrMalformed},
		{"apiserver without ID", func(tb *tablev1.Table) { tb.Apiservers[0].Id = "" }, table.ErrMalformed},
		{"apiserver listed twice", func(tb *tablev1.Table) { tb.Apiservers = append(tb.Apiservers, tb.Apiservers[0]) }, table.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := proto.CloneOf(good)
			tc.change(tb)
			topo, err := table.FromProto(tb)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want an error wrapping %q", topo, err, tc.want)
			}
			if topo != nil {
				t.Errorf("a topology came with the error: %+v", topo)
			}
		})
	}
	if _, err := table.FromProto(nil); !errors.Is(err, table.ErrMalformed) {
		t.Errorf("nil table: %v", err)
	}
	if _, err := table.FromProto(good); err != nil {
		t.Errorf("the cases changed the good table: %v", err)
	}
}

// FuzzFromProto: whatever bytes arrive, parsing and FromProto do not panic, and a table
// FromProto accepts converts back to a table it accepts again, with the same content.
func FuzzFromProto(f *testing.F) {
	good, err := proto.Marshal(table.ToProto(sample(f, true), time.Unix(1, 0)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	badIndex, err := proto.Marshal(&tablev1.Table{Format: table.Format, GroupVersions: []*tablev1.GroupVersion{{
		Version: "v1", Resources: []*tablev1.ServedResource{{Resource: "pods", ServerSet: 7}},
	}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(badIndex)
	f.Fuzz(func(t *testing.T, b []byte) {
		var tb tablev1.Table
		if proto.Unmarshal(b, &tb) != nil {
			return
		}
		topo, err := table.FromProto(&tb)
		if err != nil {
			if !errors.Is(err, table.ErrMalformed) && !errors.Is(err, table.ErrUnsupportedFormat) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		again, err := table.FromProto(table.ToProto(topo, time.Unix(1, 0)))
		if err != nil {
			t.Fatalf("FromProto refuses what ToProto made of a table it accepted: %v", err)
		}
		if err := sameTopology(topo, again); err != nil {
			t.Fatalf("round trip of an accepted table: %v", err)
		}
	})
}
