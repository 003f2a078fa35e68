package tablestream

import (
	"google.golang.org/protobuf/proto"

	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// Chunks is tb as Server sends it, for tests that send tables Server would not.
func Chunks(tb *tablev1.Table) []*tablev1.TableChunk {
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(tb)
	if err != nil {
		panic(err)
	}
	return encode(tb.GetVersion(), raw).chunks
}

// Assemble puts chunks back together as Follow does.
func Assemble(chunks []*tablev1.TableChunk, limit int) (*tablev1.Table, error) {
	a := &assembler{limit: limit}
	for _, c := range chunks {
		if tb, err := a.add(c); tb != nil || err != nil {
			return tb, err
		}
	}
	return nil, nil
}
