package dataplane

import (
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// stats are Envoy-style counters and gauges, named as Envoy names them where Envoy has the
// stat (cluster.<name>.upstream_rq_total, http.<stat_prefix>.downstream_rq_5xx, the gauge
// http.<stat_prefix>.downstream_rq_active, …). Counters under "dataplane." are this data
// plane's own (Envoy has no equivalent).
type stats struct {
	mu sync.RWMutex
	c  map[string]*atomic.Uint64
	g  map[string]*atomic.Int64
}

func newStats() *stats { return &stats{c: map[string]*atomic.Uint64{}, g: map[string]*atomic.Int64{}} }

func (s *stats) gauge(name string) *atomic.Int64 { return lookOrAdd(&s.mu, s.g, name) }

// gaugeAdd adds delta to a gauge.
func (s *stats) gaugeAdd(name string, delta int64) { s.gauge(name).Add(delta) }

// getGauge is a gauge's value, 0 if it does not exist.
func (s *stats) getGauge(name string) int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if g := s.g[name]; g != nil {
		return g.Load()
	}
	return 0
}

func (s *stats) counter(name string) *atomic.Uint64 { return lookOrAdd(&s.mu, s.c, name) }

// lookOrAdd is m[name], added as a zero value the first time: under the read lock on the hot
// path, where the stat exists.
func lookOrAdd[T any](mu *sync.RWMutex, m map[string]*T, name string) *T {
	mu.RLock()
	v := m[name]
	mu.RUnlock()
	if v != nil {
		return v
	}
	mu.Lock()
	defer mu.Unlock()
	if v = m[name]; v == nil {
		v = new(T)
		m[name] = v
	}
	return v
}

func (s *stats) inc(name string) { s.counter(name).Add(1) }

// timing adds one duration to the pair of counters <name>_us (sum, in µs) and <name>_count,
// where Envoy would keep a histogram: enough for a benchmark to report the mean.
func (s *stats) timing(name string, since time.Time) {
	s.counter(name + "_us").Add(uint64(time.Since(since).Microseconds()))
	s.counter(name + "_count").Add(1)
}

func (s *stats) get(name string) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if c := s.c[name]; c != nil {
		return c.Load()
	}
	return 0
}

type statValue struct {
	Name  string `json:"name"`
	Value uint64 `json:"value"`
}

// typedStat is a counter or a gauge, for the admin's /stats.
type typedStat struct {
	statValue
	gauge bool
}

// all is every counter and gauge, sorted by name (Envoy's /stats lists them together in
// name order). A gauge below 0 (never, unless a count is unbalanced) shows as 0: Envoy's
// gauges are unsigned.
func (s *stats) all() []typedStat {
	s.mu.RLock()
	out := make([]typedStat, 0, len(s.c)+len(s.g))
	for k, v := range s.c {
		out = append(out, typedStat{statValue{k, v.Load()}, false})
	}
	for k, v := range s.g {
		out = append(out, typedStat{statValue{k, uint64(max(0, v.Load()))}, true})
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// countConns is an http.Server's ConnState: http.<prefix>.downstream_cx_active, the prefix
// read once when the connection is accepted (Envoy's connection manager keeps the stats of
// the configuration it was created with). A hijacked connection (an upgrade's tunnel) leaves
// the count when it is hijacked.
func (d *DataPlane) countConns(prefix func() string) func(net.Conn, http.ConnState) {
	var conns sync.Map // net.Conn -> gauge name
	return func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			name := prefix() + "downstream_cx_active"
			conns.Store(c, name)
			d.stats.gaugeAdd(name, 1)
		case http.StateClosed, http.StateHijacked:
			if name, ok := conns.LoadAndDelete(c); ok {
				d.stats.gaugeAdd(name.(string), -1)
			}
		}
	}
}

// beginStream counts a request in http.<prefix>.downstream_rq_active until the returned func
// runs, and wraps w so that the connection manager's drain decision is taken when the
// response headers go out (drainWriter).
func (d *DataPlane) beginStream(prefix string, w http.ResponseWriter, r *http.Request) (http.ResponseWriter, func()) {
	name := prefix + "downstream_rq_active"
	d.stats.gaugeAdd(name, 1)
	end := func() { d.stats.gaugeAdd(name, -1) }
	dc := downConnOf(r.Context())
	if dc == nil {
		return w, end
	}
	return &drainWriter{ResponseWriter: w, d: d, dc: dc, prefix: prefix, r: r}, end
}
