package table_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/table"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// BenchmarkToProto50k converts bigTopology's 50,000 resources × 10 apiservers (110,000
// served rows with subresources, 40 MB of merged discovery): what xds-server does per change.
func BenchmarkToProto50k(b *testing.B) {
	topo := big50kTopology(b)
	b.ReportAllocs()
	for b.Loop() {
		table.ToProto(topo, time.Unix(1, 0))
	}
}

// BenchmarkFromProto50k converts the same table back: what extproc does per table received.
func BenchmarkFromProto50k(b *testing.B) {
	tb := table.ToProto(big50kTopology(b), time.Unix(1, 0))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := table.FromProto(tb); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnmarshal50k parses the serialized table, which extproc does before FromProto.
func BenchmarkUnmarshal50k(b *testing.B) {
	raw, err := proto.Marshal(table.ToProto(big50kTopology(b), time.Unix(1, 0)))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if err := proto.Unmarshal(raw, new(tablev1.Table)); err != nil {
			b.Fatal(err)
		}
	}
}
