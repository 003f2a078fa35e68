package tablestream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// The proxy certificate check runs in extproc, beside Envoy, where the proxy key is
// (internal/proxycert); xds-server never holds the key. extproc reports what it found over
// its table connection (TableService.ReportProxyChecks, ReportProxyChecks below), and
// xds-server keeps each extproc's latest report (ProxyChecks) and leaves every apiserver
// one of them calls dangerous out of the front-proxy clusters (topology.APIServer.Dangerous,
// internal/plan).

// Limits of what xds-server keeps of the reports.
const (
	// DefaultMaxReporters is how many extprocs' reports ProxyChecks keeps by default: one per
	// Envoy pod.
	DefaultMaxReporters = 1000
	// DefaultReportGrace is how long ProxyChecks keeps the report of an extproc whose stream
	// ended: long enough for it (or xds-server behind a Service) to reconnect without a
	// dangerous apiserver coming back into the front-proxy clusters meanwhile.
	DefaultReportGrace = 2 * time.Minute
	// maxReportedAPIServers bounds the verdicts of one report.
	maxReportedAPIServers = 1000
	// maxReportField bounds an ID, address or client ID; a longer reason is cut.
	maxReportField  = 512
	maxReportReason = 2048
)

// ProxyChecks keeps, on xds-server, the latest proxy certificate report of every extproc:
// while its stream is open, and for Grace after it ended. It is safe for concurrent use.
type ProxyChecks struct {
	// OnChange, when set, is called (outside ProxyChecks' lock, possibly concurrently) after
	// every change of the reports kept.
	OnChange func()
	// Grace and MaxReporters: DefaultReportGrace and DefaultMaxReporters when zero.
	Grace        time.Duration
	MaxReporters int
	// Log receives refused streams; nil discards.
	Log *slog.Logger

	mu      sync.Mutex
	reports map[string]*report // by client ID
	next    uint64
}

// report is one extproc's latest report.
type report struct {
	stream    uint64 // which stream sent it: a newer stream of the client replaces it
	verdicts  []*tablev1.ProxyCheckVerdict
	connected bool
	ended     time.Time
}

func (p *ProxyChecks) grace() time.Duration {
	if p.Grace > 0 {
		return p.Grace
	}
	return DefaultReportGrace
}

func (p *ProxyChecks) maxReporters() int {
	if p.MaxReporters > 0 {
		return p.MaxReporters
	}
	return DefaultMaxReporters
}

func (p *ProxyChecks) changed() {
	if p.OnChange != nil {
		p.OnChange()
	}
}

// Dangerous is, for each apiserver of t that some kept report calls dangerous at the
// address t has for it, the reason (the report of the lowest client ID that says so, so
// every call on the same reports gives the same answer). A report about another address is
// about another process: it does not count.
func (p *ProxyChecks) Dangerous(t *topology.Topology) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for _, client := range slices.Sorted(maps.Keys(p.reports)) {
		for _, v := range p.reports[client].verdicts {
			if !v.GetDangerous() {
				continue
			}
			if s, ok := t.Server(v.GetId()); ok && s.Address != "" && s.Address == v.GetAddress() {
				if _, seen := out[s.ID]; !seen {
					out[s.ID] = v.GetReason()
				}
			}
		}
	}
	return out
}

// Reporters counts the reports kept: from extprocs connected now, and from those whose
// stream ended within the grace period.
func (p *ProxyChecks) Reporters() (connected, ended int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.reports {
		if r.connected {
			connected++
		} else {
			ended++
		}
	}
	return connected, ended
}

// receive serves one ReportProxyChecks stream.
func (p *ProxyChecks) receive(stream grpc.ClientStreamingServer[tablev1.ProxyCheckReport, tablev1.ProxyCheckReportAck]) error {
	p.mu.Lock()
	p.next++
	id := p.next
	p.mu.Unlock()
	var client string
	defer func() {
		if client == "" {
			return
		}
		p.mu.Lock()
		r := p.reports[client]
		mine := r != nil && r.stream == id
		if mine {
			r.connected, r.ended = false, time.Now()
		}
		p.mu.Unlock()
		if mine {
			time.AfterFunc(p.grace(), func() { p.expire(client, id) })
		}
	}()
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&tablev1.ProxyCheckReportAck{}) // extproc closed it
		}
		if err != nil {
			return nil // the extproc went away (or the stream broke): nothing to answer
		}
		if err := validReport(msg); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if client == "" {
			client = msg.GetClientId()
		} else if msg.GetClientId() != client {
			return status.Errorf(codes.InvalidArgument, "client_id %q: this stream reports for %q", msg.GetClientId(), client)
		}
		verdicts := make([]*tablev1.ProxyCheckVerdict, len(msg.GetApiservers()))
		for i, v := range msg.GetApiservers() {
			reason := v.GetReason()
			if len(reason) > maxReportReason {
				reason = strings.ToValidUTF8(reason[:maxReportReason], "") + "…"
			}
			verdicts[i] = &tablev1.ProxyCheckVerdict{Id: v.GetId(), Address: v.GetAddress(), Accepted: v.GetAccepted(), Dangerous: v.GetDangerous(), Reason: reason}
		}
		p.mu.Lock()
		prev := p.reports[client]
		if prev == nil && len(p.reports) >= p.maxReporters() {
			p.mu.Unlock()
			client = "" // nothing of it is kept
			p.logger().Warn("proxy certificate report refused: as many extprocs' reports kept as allowed", "client", msg.GetClientId(), "max", p.maxReporters())
			return status.Errorf(codes.ResourceExhausted, "xds-server keeps the proxy certificate reports of at most %d extprocs", p.maxReporters())
		}
		same := prev != nil && prev.connected && sameVerdicts(prev.verdicts, verdicts)
		if p.reports == nil {
			p.reports = map[string]*report{}
		}
		p.reports[client] = &report{stream: id, verdicts: verdicts, connected: true}
		p.mu.Unlock()
		if !same {
			p.changed()
		}
	}
}

// expire forgets client's report if stream id's end is still the last thing it did.
func (p *ProxyChecks) expire(client string, id uint64) {
	p.mu.Lock()
	r := p.reports[client]
	gone := r != nil && r.stream == id && !r.connected
	if gone {
		delete(p.reports, client)
	}
	p.mu.Unlock()
	if gone {
		p.changed()
	}
}

func (p *ProxyChecks) logger() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.New(slog.DiscardHandler)
}

func validReport(r *tablev1.ProxyCheckReport) error {
	if c := r.GetClientId(); c == "" || len(c) > maxReportField {
		return fmt.Errorf("client_id %q: want 1 to %d bytes", c, maxReportField)
	}
	if n := len(r.GetApiservers()); n > maxReportedAPIServers {
		return fmt.Errorf("%d apiservers reported; at most %d", n, maxReportedAPIServers)
	}
	for _, v := range r.GetApiservers() {
		if v.GetId() == "" || len(v.GetId()) > maxReportField || len(v.GetAddress()) > maxReportField {
			return fmt.Errorf("apiserver %q at %q: want an ID and an address of at most %d bytes", v.GetId(), v.GetAddress(), maxReportField)
		}
	}
	return nil
}

func sameVerdicts(a, b []*tablev1.ProxyCheckVerdict) bool {
	return slices.EqualFunc(a, b, func(x, y *tablev1.ProxyCheckVerdict) bool {
		return x.GetId() == y.GetId() && x.GetAddress() == y.GetAddress() && x.GetAccepted() == y.GetAccepted() &&
			x.GetDangerous() == y.GetDangerous() && x.GetReason() == y.GetReason()
	})
}

// ReportProxyChecks implements TableService: it keeps the stream's reports in the
// ProxyChecks given to NewServer (ServerOptions.ProxyChecks); without one it is unimplemented.
func (s *Server) ReportProxyChecks(stream grpc.ClientStreamingServer[tablev1.ProxyCheckReport, tablev1.ProxyCheckReportAck]) error {
	if s.checks == nil {
		return status.Error(codes.Unimplemented, "this xds-server keeps no proxy certificate reports")
	}
	return s.checks.receive(stream)
}

// ReportProxyChecks is the extproc side: until ctx ends it streams findings' report to
// xds-server over conn, at once and again at every change (findings returns the current
// findings and a channel closed at their next change, as proxycert.Monitor.Findings). When
// the stream fails it waits (exponential backoff up to 10 s; a minute for an xds-server
// that does not take reports) and reconnects.
func ReportProxyChecks(ctx context.Context, conn grpc.ClientConnInterface, clientID string, log *slog.Logger, findings func() ([]proxycert.Finding, <-chan struct{})) {
	if log == nil {
		log = slog.Default()
	}
	client := tablev1.NewTableServiceClient(conn)
	const initialBackoff = 100 * time.Millisecond
	backoff := initialBackoff
	var lastErr string
	for ctx.Err() == nil {
		sent, err := reportOnce(ctx, client, clientID, findings)
		if ctx.Err() != nil {
			return
		}
		if sent {
			backoff = initialBackoff
		}
		wait := backoff
		if status.Code(err) == codes.Unimplemented {
			wait = time.Minute
		}
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			if status.Code(err) == codes.Unimplemented {
				log.Warn("xds-server does not take proxy certificate reports: it cannot keep "+
					"requests whose identity kube-mvp sets away from apiservers found "+
					"dangerous. Fix: run xds-server and extproc of the same kube-mvp version", "error", err)
			} else {
				log.Warn("proxy certificate report stream lost; reconnecting", "error", err, "retry_in", wait)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// reportOnce runs one report stream until it fails or ctx ends; sent says whether a report
// went out on it.
func reportOnce(ctx context.Context, client tablev1.TableServiceClient, clientID string, findings func() ([]proxycert.Finding, <-chan struct{})) (sent bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.ReportProxyChecks(ctx)
	if err != nil {
		return false, err
	}
	// The server answers only with an error; a Recv in the background notices it at once.
	failed := make(chan error, 1)
	go func() {
		err := stream.RecvMsg(new(tablev1.ProxyCheckReportAck))
		if err == nil {
			err = fmt.Errorf("xds-server ended the report stream")
		}
		failed <- err
	}()
	for {
		fs, changed := findings()
		if err := stream.Send(reportOf(clientID, fs)); err != nil {
			select {
			case err = <-failed: // the server's reason, when it gave one
			case <-time.After(time.Second):
			}
			return sent, err
		}
		sent = true
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case err := <-failed:
			return sent, err
		case <-changed:
		}
	}
}

// reportOf is the report of fs.
func reportOf(clientID string, fs []proxycert.Finding) *tablev1.ProxyCheckReport {
	r := &tablev1.ProxyCheckReport{ClientId: clientID}
	for _, f := range fs {
		r.Apiservers = append(r.Apiservers, &tablev1.ProxyCheckVerdict{
			Id: f.ID, Address: f.Address, Accepted: f.Verdict == proxycert.Accepted, Dangerous: f.Dangerous, Reason: f.Reason,
		})
	}
	return r
}

// Replicas configures ReportToReplicas.
type Replicas struct {
	// Dial opens a connection to one address (IP:port).
	Dial func(address string) (*grpc.ClientConn, error)
	// Lookup resolves a host name to its addresses; default net.DefaultResolver.LookupHost.
	Lookup func(ctx context.Context, host string) ([]string, error)
	// Interval between lookups; default 30 s.
	Interval time.Duration
}

// ReportToReplicas runs ReportProxyChecks against every address the host of hostport
// resolves to, each over a connection of its own, until ctx ends, and looks the name up
// again every Interval (addresses that appear get a reporter, those gone lose theirs; a
// failed lookup changes nothing). xds-server replicas share no state and each plans from
// the reports it received, while an Envoy follows whichever replica it reached: behind a
// headless Service (the chart's) every replica thus hears from every extproc. An IP literal
// is its one address.
func ReportToReplicas(ctx context.Context, hostport string, r Replicas, clientID string, log *slog.Logger, findings func() ([]proxycert.Finding, <-chan struct{})) {
	if log == nil {
		log = slog.Default()
	}
	if r.Lookup == nil {
		r.Lookup = net.DefaultResolver.LookupHost
	}
	if r.Interval <= 0 {
		r.Interval = 30 * time.Second
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		log.Error("cannot report the proxy certificate check to xds-server", "address", hostport, "error", err)
		return
	}
	type running struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	reporters := map[string]running{}
	defer func() {
		for _, rn := range reporters {
			rn.cancel()
			<-rn.done
		}
	}()
	var lastErr string
	for {
		addrs := []string{host}
		if net.ParseIP(host) == nil {
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			addrs, err = r.Lookup(lctx, host)
			cancel()
			if err != nil {
				addrs = nil
				if err.Error() != lastErr {
					log.Warn("cannot look up xds-server's replicas to report the proxy certificate check to; keeping those known", "host", host, "error", err)
				}
				lastErr = err.Error()
			} else {
				lastErr = ""
			}
		}
		if addrs != nil {
			want := map[string]bool{}
			for _, a := range addrs {
				want[net.JoinHostPort(a, port)] = true
			}
			for addr, rn := range reporters {
				if !want[addr] {
					rn.cancel()
					<-rn.done
					delete(reporters, addr)
				}
			}
			for addr := range want {
				if _, ok := reporters[addr]; ok {
					continue
				}
				conn, err := r.Dial(addr)
				if err != nil {
					log.Error("cannot report the proxy certificate check to an xds-server replica", "address", addr, "error", err)
					continue
				}
				rctx, cancel := context.WithCancel(ctx)
				rn := running{cancel: cancel, done: make(chan struct{})}
				go func() {
					defer close(rn.done)
					defer conn.Close()
					ReportProxyChecks(rctx, conn, clientID, log.With("replica", addr), findings)
				}()
				reporters[addr] = rn
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.Interval):
		}
	}
}
