package tablestream

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// MaxTableSize is the largest table, serialized and uncompressed, that the server sends and
// Follow accepts; MaxTableKeys and MaxTableRows bound what it costs extproc besides its
// bytes (its keys are kept once for all plans, with 4 bytes per key and plan). They fit
// extproc's memory limit in the chart, 128 MiB: with both limits reached, the table in use
// and the next one arriving (its bytes, parsed, then converted) took 47 MiB at their peak
// (TestTableMemory), beside 48 MiB for --max-streams' open streams and 25 MiB for an idle
// extproc. A real two-apiserver control plane's table is about 24 KB; 2,000 CRDs make it
// about 710 KB, nearly all of it the merged discovery, which the apiservers' own bound
// (--max-discovery-body, 8 MiB by default) keeps near this limit at most. xds-server holds
// back plans whose table would be over them (Fits), so Envoy and extproc stay in step.
const (
	MaxTableSize = 8 << 20
	MaxTableKeys = 10_000
	MaxTableRows = 500_000
)

// chunkSize is the most compressed table bytes one TableChunk carries.
const chunkSize = 1 << 20

// maxChunkMessage is the receive limit per message on the table stream
// (grpc.MaxCallRecvMsgSize; it applies to the message as received, and the stream uses no
// gRPC compression: the chunks are gzip already). A chunk is at most chunkSize of data and a
// few dozen bytes of fields, so 2 MiB leaves room and anything larger is not a table chunk.
const maxChunkMessage = 2 * chunkSize

// encoded is a table as it goes on the wire.
type encoded struct {
	version string
	gzipped int // bytes on the wire
	chunks  []*tablev1.TableChunk
}

// encode gzips a serialized table and cuts it into chunks.
func encode(version string, raw []byte) *encoded {
	var buf bytes.Buffer
	buf.Grow(len(raw)/8 + 64)
	// BestSpeed: the table is compressed on the publish path, once per change. Measured on
	// a 44 MB table (50,000 resources): 15x in 0.27 s; the default level gives 24x in 1.3 s.
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	zw.Write(raw)
	zw.Close()
	z := buf.Bytes()
	e := &encoded{version: version, gzipped: len(z)}
	count := max(1, (len(z)+chunkSize-1)/chunkSize)
	for i := range count {
		e.chunks = append(e.chunks, &tablev1.TableChunk{
			Version: version, Index: uint32(i), Count: uint32(count), TableSize: uint64(len(raw)),
			Data: z[i*chunkSize : min(len(z), (i+1)*chunkSize)],
		})
	}
	return e
}

// assembler puts a table back together from its chunks.
type assembler struct {
	limit int // largest table accepted, serialized
	// The table being assembled; skip means the rest of it is ignored (it was refused).
	version   string
	count     uint32
	next      uint32
	tableSize uint64
	skip      bool
	buf       bytes.Buffer
}

// add takes the next chunk off the stream. It returns the table when c completes one, and an
// error (wrapping ErrTooLarge, ErrMalformed or ErrUnsupportedFormat) when c completes or
// breaks a table that cannot be used; the rest of a broken table's chunks are then ignored.
func (a *assembler) add(c *tablev1.TableChunk) (*tablev1.Table, error) {
	if c.GetIndex() == 0 {
		a.start(c)
		if c.GetCount() == 0 {
			return a.fail(fmt.Errorf("%w: table %s has no chunks", ErrMalformed, c.GetVersion()))
		}
		if c.GetTableSize() > uint64(a.limit) {
			return a.fail(fmt.Errorf("%w: table %s is %d bytes, over this client's limit of %d", ErrTooLarge, c.GetVersion(), c.GetTableSize(), a.limit))
		}
	} else {
		if a.skip {
			return nil, nil
		}
		if a.count == 0 || c.GetVersion() != a.version || c.GetIndex() != a.next || c.GetCount() != a.count || c.GetTableSize() != a.tableSize {
			err := fmt.Errorf("%w: chunk %d/%d of table %q out of sequence (expected %d/%d of %q)",
				ErrMalformed, c.GetIndex(), c.GetCount(), c.GetVersion(), a.next, a.count, a.version)
			a.start(&tablev1.TableChunk{})
			return a.fail(err)
		}
	}
	// Deflate stores incompressible data with 5 bytes per block of up to 64 KiB, and gzip
	// adds 18 bytes of framing: more data than this is not a table of tableSize bytes.
	if uint64(a.buf.Len()+len(c.GetData())) > a.tableSize+a.tableSize/1024+1024 {
		return a.fail(fmt.Errorf("%w: table %s: more compressed data than its size of %d bytes allows", ErrMalformed, a.version, a.tableSize))
	}
	a.buf.Write(c.GetData())
	a.next++
	if a.next < a.count {
		return nil, nil
	}
	defer a.start(&tablev1.TableChunk{})
	raw, err := gunzip(a.buf.Bytes(), a.tableSize)
	if err != nil {
		return nil, fmt.Errorf("%w: table %s: %w", ErrMalformed, a.version, err)
	}
	tb := &tablev1.Table{}
	if err := proto.Unmarshal(raw, tb); err != nil {
		return nil, fmt.Errorf("%w: table %s: %w", ErrMalformed, a.version, err)
	}
	if tb.GetVersion() != a.version {
		return nil, fmt.Errorf("%w: table %s arrived in chunks of table %s", ErrMalformed, tb.GetVersion(), a.version)
	}
	return tb, nil
}

// start begins assembling the table c is the first chunk of, dropping any other.
func (a *assembler) start(c *tablev1.TableChunk) {
	a.version, a.count, a.next, a.tableSize, a.skip = c.GetVersion(), c.GetCount(), 0, c.GetTableSize(), false
	a.buf.Reset()
	if a.buf.Cap() > 4*chunkSize {
		a.buf = bytes.Buffer{} // do not hold a large table's buffer between tables
	}
}

// fail abandons the table being assembled; its remaining chunks are skipped.
func (a *assembler) fail(err error) (*tablev1.Table, error) {
	a.skip = true
	a.buf = bytes.Buffer{}
	return nil, err
}

// gunzip decompresses z, which must hold exactly size bytes.
func gunzip(z []byte, size uint64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(z))
	if err != nil {
		return nil, err
	}
	raw := make([]byte, size)
	if _, err := io.ReadFull(zr, raw); err != nil {
		return nil, fmt.Errorf("decompressed to fewer than its size of %d bytes: %w", size, err)
	}
	// Reading on to the end also checks the gzip checksum.
	extra, err := io.ReadAll(io.LimitReader(zr, 1))
	if err != nil {
		return nil, err
	}
	if len(extra) > 0 {
		return nil, fmt.Errorf("decompresses to more than its size of %d bytes", size)
	}
	return raw, nil
}
