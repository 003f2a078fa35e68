package harness

import (
	"net"
	"sync"
	"time"
)

// Switch is a TCP proxy with one backend at a time, for a client whose server is replaced
// under it (the Service in front of a Deployment during a rollout): Set sends new connections
// to another backend and closes the open ones, as a stopped pod's connections end, so the
// client reconnects to the new backend.
type Switch struct {
	l       net.Listener
	mu      sync.Mutex
	backend string
	conns   map[net.Conn]struct{}
}

// StartSwitch listens on a free loopback port, forwarding to backend.
func StartSwitch(backend string) (*Switch, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Switch{l: l, backend: backend, conns: map[net.Conn]struct{}{}}
	go s.serve()
	return s, nil
}

// Addr is host:port.
func (s *Switch) Addr() string { return s.l.Addr().String() }

// Backend is where new connections go.
func (s *Switch) Backend() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backend
}

// Set makes backend the destination of new connections and closes every open one.
func (s *Switch) Set(backend string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backend = backend
	for c := range s.conns {
		c.Close()
	}
	clear(s.conns)
}

// Close stops accepting and closes every open connection.
func (s *Switch) Close() error {
	err := s.l.Close()
	s.Set("")
	return err
}

func (s *Switch) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Switch) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

func (s *Switch) serve() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		go s.proxy(c, s.Backend())
	}
}

func (s *Switch) proxy(c net.Conn, backend string) {
	defer c.Close()
	if backend == "" {
		return
	}
	u, err := net.DialTimeout("tcp", backend, 5*time.Second)
	if err != nil {
		return
	}
	defer u.Close()
	if !s.track(c) || !s.track(u) {
		return
	}
	defer s.untrack(c)
	defer s.untrack(u)
	splice(c, u)
}
