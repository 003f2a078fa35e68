package extproc

import (
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/plan/plantest"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// chartMemoryLimit is extproc's memory limit in the chart (deploy/kube-mvp/values.yaml), and
// streamBytes what one open ext_proc stream costs (BenchmarkOpenStreamMemory, rounded up).
const (
	chartMemoryLimit = 128 << 20
	streamBytes      = 12 << 10
)

// TestTableMemory: a routing table at the limits (tablestream.MaxTableSize, MaxTableKeys; 10
// apiservers, 11 plans) costs extproc little enough that the table in use and a new one
// arriving fit the chart's limit beside --max-streams' open streams. Measured as extproc
// takes a table: its bytes, parsed (tablestream.Follow), converted (FromProto) and prepared
// (SetTable), with every key of one sidecar's plan asked for once (an extproc serves one
// Envoy: one plan), which makes the per-key part of its routes and their metrics.
func TestTableMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a table at the limits (seconds)")
	}
	size := func(t *plan.Table) int { return proto.Size(tablestream.ToProto(t, time.Unix(1, 0))) }
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(tablestream.ToProto(
		plantest.AtLimits(t, tablestream.MaxTableKeys, tablestream.MaxTableSize, size), time.Unix(1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	base := heap()
	var pb tablev1.Table
	if err := proto.Unmarshal(raw, &pb); err != nil {
		t.Fatal(err)
	}
	parsed := heap() - base
	pt, err := tablestream.FromProto(&pb)
	if err != nil {
		t.Fatalf("a table at the limits (%d bytes) is refused: %v", len(raw), err)
	}
	keys := pt.Routes[""].Len()
	if len(raw) > tablestream.MaxTableSize || len(raw) < tablestream.MaxTableSize*9/10 || keys < tablestream.MaxTableKeys*9/10 {
		t.Fatalf("the table (%d bytes, %d keys) is not at the limits (%d bytes, %d keys)", len(raw), keys, tablestream.MaxTableSize, tablestream.MaxTableKeys)
	}
	srv := New(Options{})
	srv.SetTable(pt, pb.GetVersion())
	v := srv.table.Load().view(plantest.Sidecar(pt))
	for i, r := range v.routes.All() {
		v.route(r, i).count()
	}
	converting := heap() - base - parsed // the parsed table is still referenced: both at once
	runtime.KeepAlive(&pb)
	pb = tablev1.Table{}
	pt = nil
	inUse := heap() - base

	// While a table arrives: the one in use, the new one's bytes, parsed, and converted.
	peak := inUse + int64(len(raw)) + parsed + converting
	streams := int64(DefaultMaxStreams) * streamBytes
	runtime.KeepAlive(raw)
	const mib = 1 << 20
	t.Logf("table at the limits: %d bytes, %d keys × %d plans; parsed %.1f MiB, parsing and "+
		"converting %.1f MiB, in use %.1f MiB; peak while the next arrives %.1f MiB, with %d open "+
		"streams %.1f MiB of the chart's %d MiB",

		len(raw), keys, len(srv.table.Load().plans.Routes), float64(parsed)/mib, float64(parsed+converting)/mib, float64(inUse)/mib,
		float64(peak)/mib, DefaultMaxStreams, float64(peak+streams)/mib, chartMemoryLimit/mib)
	// What the process needs besides: an idle extproc's resident memory (its code, runtime,
	// gRPC, metrics) was 24.6 MB with a small table (Go 1.26).
	if room := chartMemoryLimit - 25*mib - streams - peak; room < 0 {
		t.Errorf("tables at the limits need %.1f MiB more than the chart's limit leaves them", float64(-room)/mib)
	}
}
