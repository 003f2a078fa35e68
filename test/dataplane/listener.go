package dataplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"golang.org/x/net/http2"
)

// liveListener is a bound listener. Its configuration is looked up by name for every
// connection and request, so an update applies to new requests without rebinding.
type liveListener struct {
	name    string
	addr    string // bound address
	want    string // the address it was bound for (override or resource)
	ln      net.Listener
	srv     *http.Server
	closeMu sync.Once
}

func (l *liveListener) close() {
	l.closeMu.Do(func() {
		l.srv.Close()
	})
}

// syncListenersLocked binds new listeners, rebinds those whose address changed and closes
// removed ones. A bind failure rejects the update (Envoy NACKs a listener it cannot bind).
func (d *DataPlane) syncListenersLocked() error {
	for name, l := range d.listeners {
		lc := d.cfg.listeners[name]
		if lc == nil || d.listenAddress(lc) != l.want {
			l.close()
			delete(d.listeners, name)
		}
	}
	for name, lc := range d.cfg.listeners {
		if d.listeners[name] != nil {
			continue
		}
		if d.listenersStopped {
			// ListenerManagerImpl refuses to add a listener once the listeners are stopped
			// (drain.go, stopListeners).
			d.log.Info("listener not bound: the listeners are stopped", "listener", name)
			continue
		}
		want := d.listenAddress(lc)
		ln, err := net.Listen("tcp", want)
		if err != nil {
			return fmt.Errorf("listener %q: cannot bind %s: %w", name, want, err)
		}
		l := &liveListener{name: name, addr: ln.Addr().String(), want: want, ln: ln}
		l.srv = &http.Server{
			Handler:     d.handler(name),
			ConnContext: connContext,
			ConnState: d.countConns(func() string {
				if lc := d.config().listeners[name]; lc != nil && lc.hcm != nil {
					return "http." + lc.hcm.statPrefix + "."
				}
				return "http.unknown."
			}),
			ReadHeaderTimeout: time.Minute,
			ErrorLog:          nil,
			// HTTP/2 (ALPN h2) is served by x/net/http2's server, one per connection with
			// the listener's http2_protocol_options at accept (serveH2).
			TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){
				"h2": func(hs *http.Server, c *tls.Conn, h http.Handler) { d.serveH2(name, hs, c, h) },
			},
		}
		wrapped := &tlsSwitchListener{Listener: ln, d: d, name: name}
		_, _ = rand.Read(wrapped.ticketKey[:]) // never fails (Go 1.24+)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			_ = l.srv.Serve(wrapped)
		}()
		d.listeners[name] = l
		d.log.Info("listener bound", "listener", name, "address", l.addr)
	}
	return nil
}

// serveH2 serves one HTTP/2 connection with the stream limit and windows of the
// listener's current http_connection_manager.http2_protocol_options (Envoy's defaults
// without), as Envoy's server codec advertises them in its first SETTINGS and connection
// WINDOW_UPDATE (source/common/http/http2/codec_impl.cc, ConnectionImpl::sendSettings).
// Go's server credits request body data, stream and connection window alike, as the
// handler reads it (serverConn.noteBodyRead), and the router reads it only as it forwards
// it upstream; Envoy credits it on arrival unless the stream is read-disabled because the
// upstream does not take more (ConnectionImpl::onData): in both a stalled upload holds up
// to its stream window of the connection window. SETTINGS_MAX_CONCURRENT_STREAMS is
// max_concurrent_streams; a stream past it is refused (REFUSED_STREAM), as Envoy's codec
// library does.
func (d *DataPlane) serveH2(name string, hs *http.Server, c *tls.Conn, h http.Handler) {
	f := compileH2Flow(nil)
	if lc := d.config().listeners[name]; lc != nil && lc.hcm != nil {
		f = lc.hcm.h2
	}
	// The connection's context (its downConn, drain.go) goes on to the streams, as
	// x/net/http2's own ConfigureServer passes it.
	ctx := context.Background()
	if bc, ok := h.(interface{ BaseContext() context.Context }); ok {
		ctx = bc.BaseContext()
	}
	f.server().ServeConn(c, &http2.ServeConnOpts{Context: ctx, BaseConfig: hs, Handler: h})
}

func (d *DataPlane) listenAddress(lc *listenerCfg) string {
	if a, ok := d.opts.ListenerAddress[lc.name]; ok {
		return a
	}
	return lc.address
}

// tlsSwitchListener terminates TLS on accepted connections when the listener's current
// configuration has a transport socket (DownstreamTlsContext), else passes them through.
type tlsSwitchListener struct {
	net.Listener
	d    *DataPlane
	name string
	// ticketKey encrypts the listener's session tickets. Envoy without session_ticket_keys
	// lets BoringSSL make the keys, one set per SSL_CTX, shared by every connection; the
	// outer tls.Config below is per connection, so Go's automatic keys would be too, and no
	// ticket would ever resume.
	ticketKey [32]byte
}

func (t *tlsSwitchListener) Accept() (net.Conn, error) {
	c, err := t.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := t.d.config().listeners[t.name]
	if lc == nil || lc.tls == nil {
		return c, nil
	}
	return tls.Server(c, &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return t.d.downstreamTLSConfig(t.name, t.ticketKey)
	}}), nil
}

// downstreamTLSConfig builds the server TLS configuration from the listener's
// DownstreamTlsContext and the current SDS secrets: the serving certificate; when a
// validation context is given, client certificates are requested and verified against it,
// required only with require_client_certificate (Envoy: without it, a client that presents
// no certificate is accepted, one that presents an invalid certificate is not); the ALPN
// protocols offered; session tickets (one key per bound listener) unless
// disable_stateless_session_resumption, the TLS 1.2 session-ID cache not modelled. A resumed
// connection's certificate is presented but not validated (runLua).
// Why, with Envoy's and BoringSSL's sources: test/dataplane/README.md#downstream-tls-session-resumption.
func (d *DataPlane) downstreamTLSConfig(name string, ticketKey [32]byte) (*tls.Config, error) {
	cfg := d.config()
	lc := cfg.listeners[name]
	if lc == nil || lc.tls == nil {
		return nil, errors.New("listener has no TLS configuration")
	}
	cert, err := secretKeyPair(cfg.secrets[lc.tls.certSecret])
	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", lc.tls.certSecret, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: lc.tls.alpn, MinVersion: tls.VersionTLS12}
	if lc.tls.caSecret != "" {
		pool, err := secretCAPool(cfg.secrets[lc.tls.caSecret])
		if err != nil {
			return nil, fmt.Errorf("secret %q: %w", lc.tls.caSecret, err)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.VerifyClientCertIfGiven
		// Go's handshake parses every client certificate with crypto/x509, which refuses
		// some that BoringSSL parses (dataplane.go); this refuses what BoringSSL refuses of
		// the rest (x509name.go).
		tc.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			for _, der := range raw {
				c, err := x509.ParseCertificate(der)
				if err != nil {
					return err
				}
				if err := boringAcceptsNames(c.RawIssuer, c.RawSubject); err != nil {
					return fmt.Errorf("BoringSSL would not parse the certificate: %w", err)
				}
			}
			return nil
		}
		if lc.tls.requireClient {
			tc.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	if lc.tls.tickets {
		tc.SetSessionTicketKeys([][32]byte{ticketKey})
	} else {
		tc.SessionTicketsDisabled = true
	}
	return tc, nil
}

func secretKeyPair(s *tlsv3.Secret) (tls.Certificate, error) {
	if s.GetTlsCertificate() == nil {
		return tls.Certificate{}, errors.New("no tls_certificate secret")
	}
	c, err := tls.X509KeyPair(dataSource(s.GetTlsCertificate().GetCertificateChain()), dataSource(s.GetTlsCertificate().GetPrivateKey()))
	if err != nil {
		return c, err
	}
	if c.Leaf == nil && len(c.Certificate) > 0 {
		c.Leaf, _ = x509.ParseCertificate(c.Certificate[0])
	}
	return c, nil
}

func secretCAPool(s *tlsv3.Secret) (*x509.CertPool, error) {
	if s.GetValidationContext() == nil {
		return nil, errors.New("no validation_context secret")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(dataSource(s.GetValidationContext().GetTrustedCa())) {
		return nil, errors.New("trusted_ca holds no PEM certificate")
	}
	return pool, nil
}
