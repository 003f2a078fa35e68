package harness

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

// RoundRobin is the plain balancer of most HA control planes, for contrast: a TCP (layer 4)
// proxy that sends each new connection to the next backend in turn, TLS passing through, with
// no idea which apiserver serves what.
type RoundRobin struct {
	l        net.Listener
	backends []string
	next     atomic.Uint64
}

// StartRoundRobin listens on a free loopback port.
func StartRoundRobin(backends []string) (*RoundRobin, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rr := &RoundRobin{l: l, backends: backends}
	go rr.serve()
	return rr, nil
}

// Addr is host:port.
func (rr *RoundRobin) Addr() string { return rr.l.Addr().String() }

// Close stops accepting; open connections run to their end.
func (rr *RoundRobin) Close() error { return rr.l.Close() }

func (rr *RoundRobin) serve() {
	for {
		c, err := rr.l.Accept()
		if err != nil {
			return
		}
		backend := rr.backends[(rr.next.Add(1)-1)%uint64(len(rr.backends))] // the first one first
		go proxyTCP(c, backend)
	}
}

func proxyTCP(c net.Conn, backend string) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", backend, 5*time.Second)
	if err != nil {
		return // the client sees the connection close, as behind a real L4 balancer
	}
	defer u.Close()
	splice(c, u)
}

// splice copies both ways between two TCP connections until both directions are done,
// passing each half-close on.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src) //nolint:errcheck // either side closing ends the copy
		dst.(*net.TCPConn).CloseWrite()
		done <- struct{}{}
	}
	go pipe(a, b)
	go pipe(b, a)
	<-done
	<-done
}
