package tablestream

import (
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// wire returns a table with an incompressible discovery of n bytes, as chunks.
func wire(t testing.TB, version string, n int) (*tablev1.Table, []*tablev1.TableChunk) {
	t.Helper()
	tb := &tablev1.Table{Format: Format, Version: version, ApisDiscovery: make([]byte, n)}
	rand.Read(tb.ApisDiscovery)
	raw, err := proto.Marshal(tb)
	if err != nil {
		t.Fatal(err)
	}
	return tb, encode(version, raw).chunks
}

func feed(a *assembler, chunks []*tablev1.TableChunk) (tables []*tablev1.Table, errs []error) {
	for _, c := range chunks {
		tb, err := a.add(c)
		if tb != nil {
			tables = append(tables, tb)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return tables, errs
}

func TestAssembler(t *testing.T) {
	want, three := wire(t, "v3", 2*chunkSize+100)
	if len(three) != 3 {
		t.Fatalf("%d chunks for 2 MiB and a bit of incompressible data, want 3", len(three))
	}
	_, one := wire(t, "v1", 100)
	a := &assembler{limit: MaxTableSize}
	got, errs := feed(a, three)
	if len(got) != 1 || len(errs) != 0 || !proto.Equal(got[0], want) {
		t.Fatalf("3 chunks gave tables %d, errors %v", len(got), errs)
	}

	corrupt := proto.CloneOf(three[1])
	corrupt.Data = append([]byte(nil), corrupt.Data...)
	corrupt.Data[len(corrupt.Data)/2] ^= 0xff
	retagged := proto.CloneOf(three[2])
	retagged.Version = "v4"
	for _, tc := range []struct {
		name   string
		chunks []*tablev1.TableChunk
		want   error
	}{
		{"missing chunk", []*tablev1.TableChunk{three[0], three[2]}, ErrMalformed},
		{"repeated chunk", []*tablev1.TableChunk{three[0], three[1], three[1]}, ErrMalformed},
		{"chunks of two tables", []*tablev1.TableChunk{three[0], three[1], retagged}, ErrMalformed},
		{"no first chunk", []*tablev1.TableChunk{three[1]}, ErrMalformed},
		{"corrupt gzip", []*tablev1.TableChunk{three[0], corrupt, three[2]}, ErrMalformed},
		{"zero chunks", []*tablev1.TableChunk{{Version: "v", Count: 0}}, ErrMalformed},
		{"not gzip", []*tablev1.TableChunk{{Version: "v", Count: 1, TableSize: 10, Data: []byte("0123456789")}}, ErrMalformed},
		{"shorter than its size", []*tablev1.TableChunk{{Version: one[0].Version, Count: 1, TableSize: one[0].TableSize + 1, Data: one[0].Data}}, ErrMalformed},
		{"longer than its size", []*tablev1.TableChunk{{Version: one[0].Version, Count: 1, TableSize: one[0].TableSize - 1, Data: one[0].Data}}, ErrMalformed},
		{"version not the table's", []*tablev1.TableChunk{{Version: "v2", Count: 1, TableSize: one[0].TableSize, Data: one[0].Data}}, ErrMalformed},
		{"over the limit", []*tablev1.TableChunk{{Version: "v", Count: 1, TableSize: MaxTableSize + 1}}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &assembler{limit: MaxTableSize}
			got, errs := feed(a, tc.chunks)
			if len(got) != 0 || len(errs) != 1 || !errors.Is(errs[0], tc.want) {
				t.Fatalf("got %d tables, errors %v; want one error wrapping %q", len(got), errs, tc.want)
			}
			// The next table assembles.
			got, errs = feed(a, one)
			if len(got) != 1 || len(errs) != 0 || got[0].Version != "v1" {
				t.Fatalf("after the error: tables %v, errors %v", got, errs)
			}
		})
	}
}

// TestAssemblerSkipsRefusedTable: a table refused at its first chunk costs one error, not one
// per chunk, and is not held in memory.
func TestAssemblerSkipsRefusedTable(t *testing.T) {
	_, three := wire(t, "v3", 2*chunkSize+100)
	_, one := wire(t, "v1", 100)
	a := &assembler{limit: chunkSize}
	got, errs := feed(a, append(three, one...))
	if len(errs) != 1 || !errors.Is(errs[0], ErrTooLarge) || len(got) != 1 || got[0].Version != "v1" {
		t.Fatalf("tables %v, errors %v; want one ErrTooLarge, then v1", got, errs)
	}
}

// FuzzAssembler: no chunk sequence panics the assembler or makes it allocate beyond its limit.
func FuzzAssembler(f *testing.F) {
	_, one := wire(f, "v1", 100)
	f.Add("v1", uint32(0), uint32(1), one[0].TableSize, one[0].Data)
	f.Add("v1", uint32(0), uint32(2), uint64(1<<30), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, version string, index, count uint32, size uint64, data []byte) {
		a := &assembler{limit: 1 << 20}
		for range 2 {
			tb, err := a.add(&tablev1.TableChunk{Version: version, Index: index, Count: count, TableSize: size, Data: data})
			if tb != nil && err != nil {
				t.Fatal("a table and an error")
			}
			if tb != nil && tb.GetVersion() != version {
				t.Fatalf("table %q from chunks of %q", tb.GetVersion(), version)
			}
		}
	})
}

func TestEncodeSmallTable(t *testing.T) {
	tb, raw := build(&plan.Table{}, time.Unix(1, 0))
	e := encode(tb.Version, raw)
	if len(e.chunks) != 1 || e.chunks[0].Count != 1 || e.chunks[0].TableSize != uint64(len(raw)) {
		t.Fatalf("chunks %v", e.chunks)
	}
	got, errs := feed(&assembler{limit: MaxTableSize}, e.chunks)
	if len(errs) != 0 || len(got) != 1 || !proto.Equal(got[0], tb) {
		t.Fatalf("tables %v, errors %v; want %v", got, errs, tb)
	}
}
