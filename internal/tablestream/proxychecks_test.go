package tablestream_test

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/tablestream"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// TestRoundTripDangerous: the dangerous apiservers' reasons and the routes that refuse
// front-proxy requests (and the default route's refusal) survive the wire; a refusal list
// that is not sorted is malformed.
func TestRoundTripDangerous(t *testing.T) {
	topo := sampleTopology(t)
	in := tableOf(t, topo.WithDangerous(map[string]string{"apiserver-a": "takes it for a client's", "apiserver-b": "so does b"}))
	if refused := in.Routes[""].Default.ProxyCertRefused; !slices.Equal(refused, topology.ServerSet{"apiserver-a", "apiserver-b"}) {
		t.Fatalf("front default route refuses %v; the sample's live apiservers are a and b", refused)
	}
	out, err := tablestream.FromProto(tablestream.ToProto(in, time.Unix(1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sameTable(in, out); err != nil {
		t.Error(err)
	}
	if s, _ := out.Server("apiserver-a"); s.Dangerous != "takes it for a client's" {
		t.Errorf("apiserver-a after the round trip: %+v", s)
	}

	tb := tablestream.ToProto(in, time.Unix(1, 0))
	tb.Plans[0].DefaultFrontProxyRefused = []string{"apiserver-b", "apiserver-a"}
	if _, err := tablestream.FromProto(tb); !errors.Is(err, tablestream.ErrMalformed) {
		t.Errorf("unsorted default_front_proxy_refused: %v, want malformed", err)
	}
	tb = tablestream.ToProto(in, time.Unix(1, 0))
	for _, r := range tb.Plans[0].Routes {
		if r.GetOutcome() == tablev1.Outcome_OUTCOME_UNAVAILABLE {
			r.FrontProxyRefused = []string{"apiserver-a"}
		}
	}
	if _, err := tablestream.FromProto(tb); !errors.Is(err, tablestream.ErrMalformed) {
		t.Errorf("an unavailable route refusing front-proxy requests: %v, want malformed", err)
	}
}

func sampleTopology(t *testing.T) *topology.Topology {
	t.Helper()
	topo, err := topology.New(
		[]topology.APIServer{
			{ID: "apiserver-a", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
			{ID: "apiserver-b", Hostname: "cp-b", Address: "10.0.0.2:6443", Alive: true, Verified: true},
			{ID: "apiserver-c", Hostname: "cp-c", Address: "10.0.0.3:6443"},
		},
		map[topology.Resource][]string{
			{Group: "batch", Version: "v1", Resource: "jobs"}: {"apiserver-a"},
			{Version: "v1", Resource: "pods"}:                 {"apiserver-b", "apiserver-a"},
			{Group: "x.io", Version: "v1", Resource: "gone"}:  {"apiserver-c"},
		}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// findings is a proxycert.Monitor's Findings stand-in that the test changes.
type findings struct {
	mu      sync.Mutex
	list    []proxycert.Finding
	changed chan struct{}
}

func newFindings() *findings { return &findings{changed: make(chan struct{})} }

func (f *findings) get() ([]proxycert.Finding, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.list), f.changed
}

func (f *findings) set(list ...proxycert.Finding) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = list
	close(f.changed)
	f.changed = make(chan struct{})
}

func dangerousAt(id, address, reason string) proxycert.Finding {
	return proxycert.Finding{Target: proxycert.Target{ID: id, Address: address},
		Result: proxycert.Result{Verdict: proxycert.Refused, Dangerous: true, Reason: reason}}
}

func acceptedAt(id, address string) proxycert.Finding {
	return proxycert.Finding{Target: proxycert.Target{ID: id, Address: address}, Result: proxycert.Result{Verdict: proxycert.Accepted}}
}

// reporter runs tablestream.ReportProxyChecks against addr as clientID until stop is called.
func reporter(t *testing.T, addr, clientID string, f *findings) (stop func()) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tablestream.ReportProxyChecks(ctx, conn, clientID, nil, f.get) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done; conn.Close() }) }
	t.Cleanup(stop)
	return stop
}

// TestProxyCheckReports: what extprocs report reaches xds-server's ProxyChecks at once and
// at every change; an apiserver is dangerous while any kept report says so at the address
// the topology has for it; a report outlives its stream for the grace period, then goes; a
// reconnecting extproc's report replaces its own.
func TestProxyCheckReports(t *testing.T) {
	topo := sampleTopology(t)
	changes := make(chan struct{}, 100)
	checks := &tablestream.ProxyChecks{Grace: 300 * time.Millisecond, OnChange: func() { changes <- struct{}{} }}
	addr, _ := serve(t, "127.0.0.1:0", tablestream.NewServer(tablestream.ServerOptions{ProxyChecks: checks}))
	waitDangerous := func(what string, want map[string]string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := checks.Dangerous(topo)
			if maps.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: dangerous %v, want %v", what, got, want)
			}
			select {
			case <-changes:
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	one, two := newFindings(), newFindings()
	one.set(acceptedAt("apiserver-a", "10.0.0.1:6443"), dangerousAt("apiserver-b", "10.0.0.2:6443", "b takes it"))
	stopOne := reporter(t, addr, "envoy-1", one)
	waitDangerous("first report", map[string]string{"apiserver-b": "b takes it"})

	// Another extproc calls apiserver-a dangerous, but at an address the topology does not
	// have for it (another process): that does not count.
	two.set(dangerousAt("apiserver-a", "10.9.9.9:6443", "elsewhere"))
	stopTwo := reporter(t, addr, "envoy-2", two)
	deadline := time.Now().Add(5 * time.Second)
	for c, _ := checks.Reporters(); c < 2; c, _ = checks.Reporters() {
		if time.Now().After(deadline) {
			t.Fatal("the second extproc's report never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitDangerous("a report about another address", map[string]string{"apiserver-b": "b takes it"})
	two.set(dangerousAt("apiserver-a", "10.0.0.1:6443", "a takes it"))
	waitDangerous("any report counts", map[string]string{"apiserver-a": "a takes it", "apiserver-b": "b takes it"})

	// A change of verdict replaces the report.
	one.set(acceptedAt("apiserver-a", "10.0.0.1:6443"), acceptedAt("apiserver-b", "10.0.0.2:6443"))
	waitDangerous("b fixed", map[string]string{"apiserver-a": "a takes it"})

	// The second extproc goes away: its report is kept for the grace period, then forgotten.
	stopTwo()
	ended := time.Now()
	waitDangerous("after the stream ended", map[string]string{"apiserver-a": "a takes it"})
	waitDangerous("after the grace period", map[string]string{})
	if d := time.Since(ended); d < 250*time.Millisecond {
		t.Errorf("report forgotten %s after its stream ended, before the grace period", d)
	}
	if c, e := checks.Reporters(); c != 1 || e != 0 {
		t.Errorf("reporters %d connected, %d ended; want 1, 0", c, e)
	}

	// A reconnecting extproc (same client ID) replaces its own report: the old stream's end
	// does not expire the new one.
	stopOne()
	again := newFindings()
	again.set(dangerousAt("apiserver-b", "10.0.0.2:6443", "b again"))
	reporter(t, addr, "envoy-1", again)
	waitDangerous("reconnected", map[string]string{"apiserver-b": "b again"})
	time.Sleep(500 * time.Millisecond) // past the old stream's grace
	waitDangerous("past the old stream's grace", map[string]string{"apiserver-b": "b again"})
}

// TestProxyCheckReportLimits: a report over the limits, or from one extproc too many, is
// refused; an xds-server that keeps no reports answers UNIMPLEMENTED.
func TestProxyCheckReportLimits(t *testing.T) {
	checks := &tablestream.ProxyChecks{MaxReporters: 1}
	addr, _ := serve(t, "127.0.0.1:0", tablestream.NewServer(tablestream.ServerOptions{ProxyChecks: checks}))
	plain, _ := serve(t, "127.0.0.1:0", tablestream.NewServer(tablestream.ServerOptions{}))
	send := func(addr string, reports ...*tablev1.ProxyCheckReport) error {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx := testutil.Context(t, 5*time.Second)
		stream, err := tablev1.NewTableServiceClient(conn).ReportProxyChecks(ctx)
		if err != nil {
			return err
		}
		for _, r := range reports {
			if err := stream.Send(r); err != nil {
				break
			}
		}
		_, err = stream.CloseAndRecv()
		return err
	}
	ok := &tablev1.ProxyCheckReport{ClientId: "envoy-1"}
	if err := send(addr, ok); err != nil {
		t.Errorf("a valid report: %v", err)
	}
	if err := send(addr, &tablev1.ProxyCheckReport{ClientId: "envoy-2"}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second extproc with room for one: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := send(addr, &tablev1.ProxyCheckReport{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no client ID: %v, want INVALID_ARGUMENT", err)
	}
	big := &tablev1.ProxyCheckReport{ClientId: "envoy-1"}
	for range 1001 {
		big.Apiservers = append(big.Apiservers, &tablev1.ProxyCheckVerdict{Id: "x"})
	}
	if err := send(addr, big); status.Code(err) != codes.InvalidArgument {
		t.Errorf("1001 apiservers: %v, want INVALID_ARGUMENT", err)
	}
	if err := send(addr, ok, &tablev1.ProxyCheckReport{ClientId: "someone-else"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a stream switching clients: %v, want INVALID_ARGUMENT", err)
	}
	if err := send(plain, ok); status.Code(err) != codes.Unimplemented {
		t.Errorf("an xds-server without ProxyChecks: %v, want UNIMPLEMENTED", err)
	}
}

// TestReportToReplicas: every address the xds-server name resolves to gets the report (the
// replicas share no state); an address that leaves the name stops getting it.
func TestReportToReplicas(t *testing.T) {
	first, _ := serve(t, "127.0.0.1:0", nil) // only to pick a port
	_, port, _ := net.SplitHostPort(first)
	var checks [2]*tablestream.ProxyChecks
	for i, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		checks[i] = &tablestream.ProxyChecks{Grace: time.Millisecond}
		lis, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			t.Skipf("cannot listen on %s:%s: %v", ip, port, err)
		}
		lis.Close()
		serve(t, net.JoinHostPort(ip, port), tablestream.NewServer(tablestream.ServerOptions{ProxyChecks: checks[i]}))
	}
	var mu sync.Mutex
	addrs := []string{"127.0.0.2", "127.0.0.3"}
	f := newFindings()
	f.set(dangerousAt("apiserver-a", "10.0.0.1:6443", "a takes it"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tablestream.ReportToReplicas(ctx, net.JoinHostPort("xds-server.example", port), tablestream.Replicas{
			Dial: func(addr string) (*grpc.ClientConn, error) {
				return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			},
			Lookup: func(_ context.Context, host string) ([]string, error) {
				mu.Lock()
				defer mu.Unlock()
				if host != "xds-server.example" {
					return nil, errors.New("no such host")
				}
				return slices.Clone(addrs), nil
			},
			Interval: 50 * time.Millisecond,
		}, "envoy-1", nil, f.get)
	}()
	t.Cleanup(func() { cancel(); <-done })
	topo := sampleTopology(t)
	want := map[string]string{"apiserver-a": "a takes it"}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("both replicas got the report", func() bool {
		return maps.Equal(checks[0].Dangerous(topo), want) && maps.Equal(checks[1].Dangerous(topo), want)
	})
	mu.Lock()
	addrs = addrs[:1]
	mu.Unlock()
	waitFor("the replica that left the name forgot the report", func() bool {
		return len(checks[1].Dangerous(topo)) == 0
	})
	if !maps.Equal(checks[0].Dangerous(topo), want) {
		t.Errorf("the remaining replica: %v, want %v", checks[0].Dangerous(topo), want)
	}
}
