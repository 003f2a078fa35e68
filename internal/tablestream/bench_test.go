package tablestream_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/tablestream"
)

// BenchmarkToProto50k converts the plans of bigTopology's 50,000 resources × 10 apiservers
// (110,000 rows with subresources, 11 plans, 40 MB of merged discovery): what xds-server
// does per change.
func BenchmarkToProto50k(b *testing.B) {
	tbl := big50kTable(b)
	b.ReportAllocs()
	for b.Loop() {
		tablestream.ToProto(tbl, time.Unix(1, 0))
	}
}

// BenchmarkFromProto50k converts the same table back: what extproc does per table received.
func BenchmarkFromProto50k(b *testing.B) {
	tb := tablestream.ToProto(big50kTable(b), time.Unix(1, 0))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tablestream.FromProto(tb); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChunks50k is the rest of xds-server's work per change: serialize, gzip, cut.
func BenchmarkChunks50k(b *testing.B) {
	tb := tablestream.ToProto(big50kTable(b), time.Unix(1, 0))
	b.SetBytes(int64(proto.Size(tb)))
	b.ReportAllocs()
	for b.Loop() {
		tablestream.Chunks(tb)
	}
}

// BenchmarkAssemble50k is extproc's work per table before FromProto: gunzip and parse.
func BenchmarkAssemble50k(b *testing.B) {
	tb := tablestream.ToProto(big50kTable(b), time.Unix(1, 0))
	chunks := tablestream.Chunks(tb)
	b.SetBytes(int64(proto.Size(tb)))
	b.ReportAllocs()
	for b.Loop() {
		if got, err := tablestream.Assemble(chunks, tablestream.MaxTableSize); err != nil || got == nil {
			b.Fatal(err)
		}
	}
}
