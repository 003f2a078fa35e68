package tablestream_test

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/plan/plantest"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
)

var (
	largestOnce sync.Once
	largest     *plan.Table
)

// largestTable is a table of nine tenths of MaxTableKeys and of MaxTableSize, 10 apiservers
// (a front plan and ten sidecar plans), built once per test binary.
func largestTable(tb testing.TB) *plan.Table {
	tb.Helper()
	largestOnce.Do(func() {
		size := func(t *plan.Table) int { return proto.Size(tablestream.ToProto(t, time.Unix(1, 0))) }
		largest = plantest.AtLimits(tb, tablestream.MaxTableKeys*9/10, tablestream.MaxTableSize*9/10, size)
	})
	if largest == nil {
		tb.Fatal("building the largest table failed")
	}
	return largest
}
