package dataplane

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// stats are Envoy-style counters, named as Envoy names them where Envoy has the counter
// (cluster.<name>.upstream_rq_total, http.<stat_prefix>.downstream_rq_5xx, …). Counters
// under "dataplane." are this data plane's own (Envoy has no equivalent).
type stats struct {
	mu sync.RWMutex
	c  map[string]*atomic.Uint64
}

func newStats() *stats { return &stats{c: map[string]*atomic.Uint64{}} }

func (s *stats) counter(name string) *atomic.Uint64 {
	s.mu.RLock()
	c := s.c[name]
	s.mu.RUnlock()
	if c != nil {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c = s.c[name]; c == nil {
		c = &atomic.Uint64{}
		s.c[name] = c
	}
	return c
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

func (s *stats) snapshot() []statValue {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]statValue, 0, len(s.c))
	for k, v := range s.c {
		out = append(out, statValue{k, v.Load()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
