package tablestream_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/plan/plantest"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// serve serves srv (any TableService) on a new listener until the test ends; it returns the
// address and a function that stops serving sooner.
func serve(t *testing.T, addr string, srv tablev1.TableServiceServer) (string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	if srv != nil {
		tablev1.RegisterTableServiceServer(g, srv)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String(), g.Stop
}

// follower runs tablestream.Follow against addr until the test ends and records what it does.
type follower struct {
	mu       sync.Mutex
	versions []string
	last     *plan.Table
	rejects  []string // reasons
	errs     []error
	log      testutil.SyncBuffer
}

func follow(t *testing.T, addr string, maxTableSize int) *follower {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	opts := tablestream.FollowOptions{Log: slog.New(slog.NewTextHandler(&f.log, nil)), MaxTableSize: maxTableSize, OnReject: func(reason string, err error) {
		f.mu.Lock()
		f.rejects, f.errs = append(f.rejects, reason), append(f.errs, err)
		f.mu.Unlock()
	}}
	go func() {
		defer close(done)
		tablestream.Follow(ctx, conn, "test", func(tb *plan.Table, v string) {
			f.mu.Lock()
			f.versions, f.last = append(f.versions, v), tb
			f.mu.Unlock()
		}, opts)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return f
}

// wait waits until cond holds of f (under its lock).
func (f *follower) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	f.waitUpTo(t, 20*time.Second, what, cond)
}

// waitUpTo is wait with another bound.
func (f *follower) waitUpTo(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, t.Context(), bound, what, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if cond() {
			return nil
		}
		return fmt.Errorf("versions %v, rejects %v %v", f.versions, f.rejects, f.errs)
	})
}

func (f *follower) rejected(reason string) bool { return slices.Contains(f.rejects, reason) }

// metric is the value of the series of name in reg whose one label (if any) has the given
// value.
func metric(t *testing.T, reg *prometheus.Registry, name string, label ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(label) > 0 && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != label[0]) {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s%v", name, label)
	return 0
}

// TestFollowSurvivesRestart streams over real gRPC, drops the server, and checks that the
// client keeps its last table, reports the lost stream, and picks up the new server's table
// after reconnecting.
func TestFollowSurvivesRestart(t *testing.T) {
	srv1 := tablestream.NewServer(tablestream.ServerOptions{})
	srv1.Publish(sample(t, true), time.Now())
	addr, stop1 := serve(t, "127.0.0.1:0", srv1)
	f := follow(t, addr, 0)
	f.wait(t, "the first table", func() bool { return len(f.versions) == 1 })
	srv1.Publish(sample(t, false), time.Now())
	f.wait(t, "the second table", func() bool { return len(f.versions) == 2 })
	srv1.Publish(sample(t, false), time.Now()) // same content: not sent again

	stop1()
	f.wait(t, "the lost stream reported", func() bool { return f.rejected(tablestream.ReasonStream) })
	f.mu.Lock()
	if f.last.Live() != 1 || len(f.versions) != 2 {
		t.Errorf("after the server went away the client lost its table: versions %v, live %v", f.versions, f.last.Live())
	}
	f.mu.Unlock()

	srv2 := tablestream.NewServer(tablestream.ServerOptions{})
	srv2.Publish(sample(t, true), time.Now())
	serve(t, addr, srv2)
	f.wait(t, "the new server's table", func() bool { return len(f.versions) == 3 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.versions[0] != f.versions[2] || f.versions[1] == f.versions[0] || f.last.Live() != 2 {
		t.Errorf("versions %v, live %v", f.versions, f.last.Live())
	}
	if strings.Contains(f.log.String(), "level=ERROR") {
		t.Errorf("a restart logged errors:\n%s", f.log.String())
	}
}

// TestLargeTableStreams: the largest table the limits take (10 apiservers, long discovery)
// reaches a follower whole.
func TestLargeTableStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a table of 9,000 keys and 7.5 MB (seconds)")
	}
	big := largestTable(t)
	reg := prometheus.NewRegistry()
	srv := tablestream.NewServer(tablestream.ServerOptions{Registerer: reg})
	srv.Publish(big, time.Now())
	addr, _ := serve(t, "127.0.0.1:0", srv)
	f := follow(t, addr, 0)
	// Tens of MB to encode, chunk, send and decode under -race: on a busy 2-core machine
	// that took more than 20 s.
	f.waitUpTo(t, 3*time.Minute, "the table", func() bool { return len(f.versions) == 1 || len(f.rejects) > 0 })
	f.mu.Lock()
	got, rejects := f.last, f.rejects
	f.mu.Unlock()
	if len(rejects) > 0 {
		t.Fatalf("rejected: %v", rejects)
	}
	if err := sameTable(big, got); err != nil {
		t.Errorf("the table changed on the way: %v", err)
	}
	size := metric(t, reg, "kube_mvp_xds_table_size_bytes", "protobuf")
	gz := metric(t, reg, "kube_mvp_xds_table_size_bytes", "gzip")
	t.Logf("%d resources in %d plans, %d bytes of discovery: table %.0f bytes, %.0f gzipped (limit %d)",
		big.Routes[""].Len(), len(big.Routes), len(big.Discovery.JSON), size, gz, tablestream.MaxTableSize)
	if size == 0 || gz == 0 || size > tablestream.MaxTableSize || size < tablestream.MaxTableSize/2 {
		t.Errorf("table of %.0f bytes, %.0f gzipped: want within the limit of %d, and more than half of it", size, gz, tablestream.MaxTableSize)
	}
}

// TestTooLargeRefused: xds-server does not send a table over its limit (it logs and counts
// it); a follower keeps its previous table and reports it, a new follower gets no table, and
// both take the next table within the limit.
func TestTooLargeRefused(t *testing.T) {
	reg := prometheus.NewRegistry()
	var log testutil.SyncBuffer
	const limit = 64 << 10
	srv := tablestream.NewServer(tablestream.ServerOptions{Log: slog.New(slog.NewTextHandler(&log, nil)), Registerer: reg, MaxTableSize: limit})
	small := sample(t, true)
	srv.Publish(small, time.Now())
	addr, _ := serve(t, "127.0.0.1:0", srv)
	f := follow(t, addr, 0)
	f.wait(t, "the first table", func() bool { return len(f.versions) == 1 })

	big := tableOf(t, plantest.BigTopology(t, 20, 3)) // 400 resources, about 320 KB of discovery
	srv.Publish(big, time.Now())
	f.wait(t, "the refusal reported", func() bool { return f.rejected(tablestream.ReasonTooLarge) })
	if got := metric(t, reg, "kube_mvp_xds_table_refused_total"); got != 1 {
		t.Errorf("kube_mvp_xds_table_refused_total %v, want 1", got)
	}
	if got := metric(t, reg, "kube_mvp_xds_table_size_limit_bytes"); got != limit {
		t.Errorf("kube_mvp_xds_table_size_limit_bytes %v, want %d", got, limit)
	}
	bigVersion := tablestream.ToProto(big, time.Time{}).GetVersion()
	size := int(metric(t, reg, "kube_mvp_xds_table_size_bytes", "protobuf"))
	if l := log.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "too large") ||
		!strings.Contains(l, fmt.Sprintf("bytes=%d limit=%d", size, limit)) || !strings.Contains(l, bigVersion) {
		t.Errorf("the server's log does not name the table, its size %d and the limit:\n%s", size, l)
	}
	f.mu.Lock()
	if err := sameTable(small, f.last); err != nil || len(f.versions) != 1 {
		t.Errorf("the follower's table changed (versions %v): %v", f.versions, err)
	}
	if err := f.errs[len(f.errs)-1]; !strings.Contains(err.Error(), fmt.Sprintf("%d bytes serialized, over the limit of %d", size, limit)) {
		t.Errorf("the follower was not told the size and the limit: %v", err)
	}
	f.mu.Unlock()
	if l := f.log.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "reason=too_large") || !strings.Contains(l, "Fix:") {
		t.Errorf("the follower's log does not say what happened and what to do:\n%s", l)
	}

	fresh := follow(t, addr, 0)
	fresh.wait(t, "the refusal reported to a new follower", func() bool { return fresh.rejected(tablestream.ReasonTooLarge) })

	srv.Publish(sample(t, false), time.Now())
	f.wait(t, "the next table", func() bool { return len(f.versions) == 2 })
	fresh.wait(t, "the next table", func() bool { return len(fresh.versions) == 1 })
	if got := metric(t, reg, "kube_mvp_xds_table_refused_total"); got != 1 {
		t.Errorf("kube_mvp_xds_table_refused_total %v, want 1", got)
	}
}

// TestClientLimit: a table over the follower's own limit (a server with a higher one) is
// refused by the follower, which keeps its table and takes the next one on the same stream.
func TestClientLimit(t *testing.T) {
	srv := tablestream.NewServer(tablestream.ServerOptions{})
	srv.Publish(sample(t, true), time.Now())
	addr, _ := serve(t, "127.0.0.1:0", srv)
	f := follow(t, addr, 64<<10)
	f.wait(t, "the first table", func() bool { return len(f.versions) == 1 })
	srv.Publish(tableOf(t, plantest.BigTopology(t, 20, 3)), time.Now())
	f.wait(t, "the refusal", func() bool { return f.rejected(tablestream.ReasonTooLarge) })
	srv.Publish(sample(t, false), time.Now())
	f.wait(t, "the next table", func() bool { return len(f.versions) == 2 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.rejects, []string{tablestream.ReasonTooLarge}) {
		t.Errorf("rejects %v, want one too_large and no stream error", f.rejects)
	}
}

// scripted is a TableService that sends each subscriber the chunks it is given.
type scripted struct {
	tablev1.UnimplementedTableServiceServer
	chunks chan []*tablev1.TableChunk
}

func (s *scripted) Subscribe(_ *tablev1.SubscribeRequest, stream grpc.ServerStreamingServer[tablev1.TableChunk]) error {
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case cs := <-s.chunks:
			for _, c := range cs {
				if err := stream.Send(c); err != nil {
					return err
				}
			}
		}
	}
}

// TestBadTablesRejected: tables a follower cannot use are reported with their reason and
// leave the table in use alone; the stream goes on.
func TestBadTablesRejected(t *testing.T) {
	srv := &scripted{chunks: make(chan []*tablev1.TableChunk)}
	addr, _ := serve(t, "127.0.0.1:0", srv)
	f := follow(t, addr, 0)
	good := tablestream.ToProto(sample(t, true), time.Unix(1, 0))
	srv.chunks <- tablestream.Chunks(good)
	f.wait(t, "the good table", func() bool { return len(f.versions) == 1 })

	badIndex := proto.CloneOf(good)
	badIndex.Version = "bad-index"
	badIndex.Plans[0].ResourceRoutes[0] = 99
	newer := proto.CloneOf(good)
	newer.Version, newer.Format = "newer", tablestream.Format+1
	broken := tablestream.Chunks(good)[0]
	broken.Data = broken.Data[:len(broken.Data)-5]
	for _, tc := range []struct {
		name   string
		chunks []*tablev1.TableChunk
		reason string
	}{
		{"set index out of range", tablestream.Chunks(badIndex), tablestream.ReasonMalformed},
		{"unknown format", tablestream.Chunks(newer), tablestream.ReasonUnsupportedFormat},
		{"truncated gzip", []*tablev1.TableChunk{broken}, tablestream.ReasonMalformed},
		{"chunk out of sequence", []*tablev1.TableChunk{{Version: "x", Index: 1, Count: 2}}, tablestream.ReasonMalformed},
	} {
		f.mu.Lock()
		n := len(f.rejects)
		f.mu.Unlock()
		srv.chunks <- tc.chunks
		f.wait(t, tc.name+" rejected", func() bool { return len(f.rejects) > n })
		f.mu.Lock()
		if got := f.rejects[n]; got != tc.reason {
			t.Errorf("%s: reason %q (%v), want %q", tc.name, got, f.errs[n], tc.reason)
		}
		f.mu.Unlock()
	}
	next := tablestream.ToProto(sample(t, false), time.Unix(1, 0))
	srv.chunks <- tablestream.Chunks(next)
	f.wait(t, "the next good table", func() bool { return len(f.versions) == 2 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.versions, []string{good.Version, next.Version}) || len(f.rejects) != 4 {
		t.Errorf("versions %v, rejects %v %v", f.versions, f.rejects, f.errs)
	}
}

// TestServerWithoutSubscribe: an xds-server that does not serve this table stream (an older
// one) is reported as an unsupported format, not as a mere lost stream.
func TestServerWithoutSubscribe(t *testing.T) {
	addr, _ := serve(t, "127.0.0.1:0", nil)
	f := follow(t, addr, 0)
	f.wait(t, "the rejection", func() bool { return len(f.rejects) > 0 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rejects[0] != tablestream.ReasonUnsupportedFormat {
		t.Errorf("reason %q (%v), want %q", f.rejects[0], f.errs[0], tablestream.ReasonUnsupportedFormat)
	}
}
