package tablestream

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// Server is the xds-server side: it serves TableService and broadcasts each Publish.
type Server struct {
	tablev1.UnimplementedTableServiceServer
	log     *slog.Logger
	maxSize int
	refused prometheus.Counter
	sizes   *prometheus.GaugeVec
	limit   prometheus.Gauge
	publish sync.Mutex // serialises Publish, which compresses outside mu
	mu      sync.Mutex
	current *published
	changed chan struct{} // closed and replaced on every change of current
	// checks keeps extprocs' proxy certificate reports (ServerOptions.ProxyChecks); nil: not taken.
	checks *ProxyChecks
}

// published is the table Subscribe sends: encoded, or refused for err.
type published struct {
	version string
	table   *encoded
	err     error
}

// ServerOptions configure NewServer; the zero value is a Server with the defaults.
type ServerOptions struct {
	// Log receives refused tables; nil means slog.Default().
	Log *slog.Logger
	// Registerer, when set, gets the Server's metrics:
	//
	//	kube_mvp_xds_table_refused_total        tables not sent because they exceed a limit
	//	kube_mvp_xds_table_size_bytes{encoding} the last table's size, "protobuf" (what the limit
	//	                                        applies to) and "gzip" (what goes on the wire)
	//	kube_mvp_xds_table_size_limit_bytes     the limit
	Registerer prometheus.Registerer
	// MaxTableSize is the largest table the Server sends; 0 means MaxTableSize (tests lower it).
	MaxTableSize int
	// ProxyChecks, when set, keeps extprocs' proxy certificate reports; nil: not taken.
	ProxyChecks *ProxyChecks
}

// NewServer returns a Server with no table yet; subscribers wait for the first Publish.
func NewServer(opts ServerOptions) *Server {
	s := &Server{
		log: slog.Default(), maxSize: MaxTableSize, changed: make(chan struct{}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kube_mvp_xds_table_refused_total",
			Help: "Routing tables not sent to extproc because they exceed a limit (their serialized size, kube_mvp_xds_table_size_limit_bytes, or their keys); extproc keeps its previous table. See the log.",
		}),
		sizes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kube_mvp_xds_table_size_bytes",
			Help: "Size of the last routing table published: protobuf (serialized, what the limit applies to) and gzip (on the wire).",
		}, []string{"encoding"}),
		limit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kube_mvp_xds_table_size_limit_bytes",
			Help: "The largest routing table xds-server sends and extproc accepts, serialized.",
		}),
	}
	if opts.Log != nil {
		s.log = opts.Log
	}
	if opts.MaxTableSize > 0 {
		s.maxSize = opts.MaxTableSize
	}
	s.checks = opts.ProxyChecks
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(s.refused, s.sizes, s.limit)
	}
	s.limit.Set(float64(s.maxSize))
	return s
}

// Publish makes pt the current table, unless its content equals the current one. A table
// over the limits (its serialization, its keys or its routes) is not sent: it is logged and
// counted, and subscribers get RESOURCE_EXHAUSTED (they keep their previous table) until a
// table within the limits is published.
func (s *Server) Publish(pt *plan.Table, now time.Time) {
	s.publish.Lock()
	defer s.publish.Unlock()
	tb, raw := build(pt, now)
	resources := pt.Routes[""].Len()
	if s.Version() == tb.Version {
		return
	}
	p := &published{version: tb.Version}
	s.sizes.WithLabelValues("protobuf").Set(float64(len(raw)))
	keys, rows := tableRows(tb)
	switch {
	case len(raw) > s.maxSize:
		p.err = fmt.Errorf("routing table %s is %d bytes serialized, over the limit of %d bytes (%d resources, %d bytes of merged discovery); extproc keeps its previous table",
			tb.Version, len(raw), s.maxSize, resources, len(tb.ApisDiscovery))
		s.log.Error("routing table not sent: too large", "version", tb.Version, "bytes", len(raw), "limit", s.maxSize,
			"resources", resources, "discovery_bytes", len(tb.ApisDiscovery))
	case keys > MaxTableKeys || rows > MaxTableRows:
		p.err = fmt.Errorf("routing table %s has %d keys and %d routes in %d plans, over the limits of %d keys and %d routes; extproc keeps its previous table",
			tb.Version, keys, rows, len(tb.Plans), MaxTableKeys, MaxTableRows)
		s.log.Error("routing table not sent: too many keys", "version", tb.Version, "keys", keys, "routes", rows, "plans", len(tb.Plans),
			"key_limit", MaxTableKeys, "route_limit", MaxTableRows)
	default:
		p.table = encode(tb.Version, raw)
		s.sizes.WithLabelValues("gzip").Set(float64(p.table.gzipped))
	}
	if p.err != nil {
		s.sizes.WithLabelValues("gzip").Set(0)
		s.refused.Inc()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = p
	close(s.changed)
	s.changed = make(chan struct{})
}

// Version is the version of the current table, sent or refused; empty before the first
// Publish.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return ""
	}
	return s.current.version
}

// Subscribe implements TableService: it sends the current table and every later one, each
// as a run of chunks, until the client goes away or a table is refused.
func (s *Server) Subscribe(_ *tablev1.SubscribeRequest, stream grpc.ServerStreamingServer[tablev1.TableChunk]) error {
	var sent string
	for {
		s.mu.Lock()
		p, changed := s.current, s.changed
		s.mu.Unlock()
		if p != nil && p.version != sent {
			if p.err != nil {
				return status.Error(codes.ResourceExhausted, p.err.Error())
			}
			for _, c := range p.table.chunks {
				if err := stream.Send(c); err != nil {
					return err
				}
			}
			sent = p.version
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}
