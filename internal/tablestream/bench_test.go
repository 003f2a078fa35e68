package tablestream_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/tablestream"
)

// BenchmarkToProtoLargest converts the plans of a table at nine tenths of the limits (9,000
// keys × 11 plans, 10 apiservers, 7.5 MB): what xds-server does per change.
func BenchmarkToProtoLargest(b *testing.B) {
	tbl := largestTable(b)
	b.ReportAllocs()
	for b.Loop() {
		tablestream.ToProto(tbl, time.Unix(1, 0))
	}
}

// BenchmarkFromProtoLargest converts the same table back: what extproc does per table received.
func BenchmarkFromProtoLargest(b *testing.B) {
	tb := tablestream.ToProto(largestTable(b), time.Unix(1, 0))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tablestream.FromProto(tb); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChunksLargest is the rest of xds-server's work per change: serialize, gzip, cut.
func BenchmarkChunksLargest(b *testing.B) {
	tb := tablestream.ToProto(largestTable(b), time.Unix(1, 0))
	b.SetBytes(int64(proto.Size(tb)))
	b.ReportAllocs()
	for b.Loop() {
		tablestream.Chunks(tb)
	}
}

// BenchmarkAssembleLargest is extproc's work per table before FromProto: gunzip and parse.
func BenchmarkAssembleLargest(b *testing.B) {
	tb := tablestream.ToProto(largestTable(b), time.Unix(1, 0))
	chunks := tablestream.Chunks(tb)
	b.SetBytes(int64(proto.Size(tb)))
	b.ReportAllocs()
	for b.Loop() {
		if got, err := tablestream.Assemble(chunks, tablestream.MaxTableSize); err != nil || got == nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFitsLargest is xds-server's check of every new plan against the table's limits
// (it builds the table's content, but neither marshals nor hashes it).
func BenchmarkFitsLargest(b *testing.B) {
	tbl := largestTable(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := tablestream.Fits(tbl); err != nil {
			b.Fatal(err)
		}
	}
}
