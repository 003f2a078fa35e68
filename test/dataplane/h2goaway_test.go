package dataplane

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawH2 is an HTTP/2 apiserver written on the frame layer, so that a test decides exactly
// which streams a GOAWAY covers. It answers /readyz with 200 and every other request with
// the JSON echo of the fake apiservers, except what goAway decides for a request. Over
// HTTP/1.1 (the health checks) it answers /readyz only.
type rawH2 struct {
	name string
	ln   net.Listener
	// goAway, if set, is asked for each request (not /readyz) on a connection that sent no
	// GOAWAY yet; it returns whether to send one, and whether its last-stream-id covers the
	// request (processed: the request is never answered, the connection closes) or not
	// (refused).
	goAway func(method, path string) (send, processed bool)

	mu   sync.Mutex
	seen []string // "METHOD path" of every request (not /readyz) received, refused ones too
}

func newRawH2(t testing.TB, p *pki, name, ip string) *rawH2 {
	ln, err := tls.Listen("tcp", ip+":0", &tls.Config{Certificates: []tls.Certificate{p.apiserver.tls(t)}, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	s := &rawH2{name: name, ln: ln}
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				s.serve(c)
			}()
		}
	}()
	return s
}

func (s *rawH2) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

func (s *rawH2) serve(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			return
		}
		if tc.ConnectionState().NegotiatedProtocol != "h2" {
			// HTTP/1.1: the health checks.
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				status := "200 OK"
				if req.URL.Path != "/readyz" {
					status = "404 Not Found"
				}
				if _, err := fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Length: 2\r\n\r\nok", status); err != nil {
					return
				}
			}
		}
	}
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	if err := fr.WriteSettings(); err != nil {
		return
	}
	wentAway := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			method, path := f.PseudoValue("method"), f.PseudoValue("path")
			id := f.StreamID
			if path != "/readyz" {
				s.mu.Lock()
				s.seen = append(s.seen, method+" "+path)
				s.mu.Unlock()
				if !wentAway && s.goAway != nil {
					if send, processed := s.goAway(method, path); send {
						wentAway = true
						last := id - 2 // the request's stream is refused
						if processed {
							last = id
						}
						_ = fr.WriteGoAway(last, http2.ErrCodeNo, nil)
						// The server ends the connection soon after (a stopping apiserver's
						// last streams; the request, if processed, is never answered).
						time.AfterFunc(100*time.Millisecond, func() { c.Close() })
						continue
					}
				}
			}
			body := []byte("ok")
			if path != "/readyz" {
				body, _ = json.Marshal(seenRequest{Server: s.name, Method: method, Path: path, Proto: "HTTP/2.0"})
			}
			hb.Reset()
			_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			_ = enc.WriteField(hpack.HeaderField{Name: "server", Value: "fake-apiserver"})
			_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/json"})
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
				return
			}
			if err := fr.WriteData(id, true, body); err != nil {
				return
			}
		}
	}
}

// TestH2GoAway: an apiserver's GOAWAY. A stream above its last-stream-id was not processed:
// Envoy's codec resets it as a refused stream (RemoteRefusedStreamReset), which every route's
// retry_on (refused-stream) retries, a POST too, on another apiserver. A stream at or below
// it was (or may have been) processed: when the connection then closes under it, it is a
// connection termination (UC), retried only by the read variants' reset, so a POST gets a 503
// and reaches the apiservers once.
func TestH2GoAway(t *testing.T) {
	raws := map[string]*rawH2{}
	var mu sync.Mutex
	var once = map[string]*sync.Once{"refuse": {}, "processed-post": {}, "processed-get": {}}
	e := newEnv(t, envOptions{editResources: h2Config{keepalive: keepalive(10*time.Second, 5*time.Second)}.edit,
		front: func(p *pki, name, addr string) string {
			host, _, _ := net.SplitHostPort(addr)
			s := newRawH2(t, p, name, host)
			s.goAway = func(method, path string) (bool, bool) {
				for mark, o := range once {
					if strings.Contains(path, "fieldSelector="+mark) {
						first := false
						mu.Lock()
						o.Do(func() { first = true })
						mu.Unlock()
						return first, mark != "refuse"
					}
				}
				return false, false
			}
			raws[name] = s
			return s.ln.Addr().String()
		}})
	c := e.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	e.reachEvery(c, path, len(raws), 200)
	count := func(mark string) (n int) {
		for _, s := range raws {
			for _, r := range s.requests() {
				if strings.Contains(r, "fieldSelector="+mark) {
					n++
				}
			}
		}
		return n
	}
	const retry = "cluster.kube-apiservers.upstream_rq_retry"

	// Refused: retried.
	before := e.stat(retry)
	r := e.do(c, "POST", path+"?fieldSelector=refuse", nil)
	if r.status != 200 {
		t.Fatalf("refused POST: status %d, want 200 from another apiserver after a refused-stream retry: %s", r.status, r.body)
	}
	if got := e.stat(retry) - before; got != 1 {
		t.Errorf("refused POST: upstream_rq_retry +%d, want 1", got)
	}
	if n := count("refuse"); n != 2 {
		t.Errorf("refused POST: sent %d times, want 2 (refused, then retried)", n)
	}

	// Processed, then the connection closed: a POST is not retried.
	before = e.stat(retry)
	r = e.do(c, "POST", path+"?fieldSelector=processed-post", nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "connection_termination") {
		t.Errorf("processed POST: status %d, want the 503 of a UC: %s", r.status, r.body)
	}
	if got := e.stat(retry) - before; got != 0 {
		t.Errorf("processed POST: upstream_rq_retry +%d, want 0", got)
	}
	if n := count("processed-post"); n != 1 {
		t.Errorf("processed POST: sent %d times, want once", n)
	}
	// ... a GET is, by its read variant's reset.
	before = e.stat(retry)
	r = e.do(c, "GET", path+"?fieldSelector=processed-get", nil)
	if r.status != 200 {
		t.Errorf("processed GET: status %d, want 200 after a retry: %s", r.status, r.body)
	}
	if got := e.stat(retry) - before; got != 1 {
		t.Errorf("processed GET: upstream_rq_retry +%d, want 1", got)
	}
}
