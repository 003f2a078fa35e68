package cptls

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Files name a holder's certificate, its key and the control plane's CA bundle: the three
// keys of a Kubernetes TLS Secret (tls.crt, tls.key, ca.crt) as mounted.
type Files struct {
	Cert, Key, CA string
}

// DirFiles are the Files of a mounted TLS Secret: dir/tls.crt, dir/tls.key, dir/ca.crt.
func DirFiles(dir string) Files {
	return Files{Cert: dir + "/tls.crt", Key: dir + "/tls.key", CA: dir + "/ca.crt"}
}

// recheckEvery bounds how often a handshake re-reads the files. Handshakes are rare here
// (Envoy and extproc hold one stream for days), so rotation is noticed at the next one.
const recheckEvery = time.Second

// Credentials hold a holder's current key pair and the CA bundle it trusts, re-read from
// Files when they change (a Secret volume is updated in place), so a renewed certificate or
// a CA rotation takes effect at the next handshake without a restart. A change that does not
// load (say the certificate is new and its key not yet) keeps the previous credentials.
type Credentials struct {
	files Files
	role  Role // what the own certificate names
	log   *slog.Logger

	mu        sync.Mutex
	checked   time.Time
	raw       [3][]byte
	cert      *tls.Certificate
	pool      *x509.CertPool
	notBefore time.Time
	notAfter  time.Time
}

// Load reads files and checks that the certificate matches its key, is valid now, chains to
// the CA bundle and names role. Every problem is an error saying what to fix.
func Load(files Files, role Role, log *slog.Logger) (*Credentials, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Credentials{files: files, role: role, log: log}
	raw, err := c.read()
	if err != nil {
		return nil, err
	}
	if err := c.apply(raw, time.Now()); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Credentials) read() ([3][]byte, error) {
	var raw [3][]byte
	var errs []error
	for i, path := range []string{c.files.Cert, c.files.Key, c.files.CA} {
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
		}
		raw[i] = b
	}
	return raw, errors.Join(errs...)
}

// apply parses raw and makes it current.
func (c *Credentials) apply(raw [3][]byte, now time.Time) error {
	pair, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return fmt.Errorf("%s and %s: %w", c.files.Cert, c.files.Key, err)
	}
	leaf := pair.Leaf
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[2]) {
		return fmt.Errorf("%s holds no PEM certificate: want the control plane's CA bundle", c.files.CA)
	}
	usage := x509.ExtKeyUsageClientAuth
	if c.role == RoleXDSServer {
		usage = x509.ExtKeyUsageServerAuth
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("%s does not verify against %s: %w", c.files.Cert, c.files.CA, err)
	}
	got, err := RoleOf(leaf)
	if err != nil {
		return fmt.Errorf("%s: %w", c.files.Cert, err)
	}
	if got != c.role {
		return fmt.Errorf("%s names role %s; this component needs a %s certificate", c.files.Cert, got, c.role)
	}
	c.raw, c.cert, c.pool, c.notBefore, c.notAfter = raw, &pair, pool, leaf.NotBefore, leaf.NotAfter
	return nil
}

// current returns the credentials to use now, re-reading the files at most once a second.
func (c *Credentials) current() (*tls.Certificate, *x509.CertPool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if now.Sub(c.checked) >= recheckEvery {
		c.checked = now
		raw, err := c.read()
		changed := !bytes.Equal(raw[0], c.raw[0]) || !bytes.Equal(raw[1], c.raw[1]) || !bytes.Equal(raw[2], c.raw[2])
		if changed {
			if err == nil {
				err = c.apply(raw, now)
			}
			if err != nil {
				c.log.Warn("control-plane certificate files changed but do not load; keeping the previous ones", "error", err)
			} else {
				c.log.Info("control-plane certificate reloaded", "cert", c.files.Cert, "notAfter", c.notAfter)
			}
		}
	}
	return c.cert, c.pool
}

// Current is the key pair and the CA bundle in use now, re-read from the files at most once
// a second (as a handshake does). xds-server signs the memory of departed apiservers with
// the key and checks other replicas' signatures against the bundle.
func (c *Credentials) Current() (*tls.Certificate, *x509.CertPool) { return c.current() }

// CurrentNotAfter is when the certificate the next handshake presents expires: the files are
// re-read first (at most once a second) if they changed, so it shows a renewal as soon as
// the kubelet has updated the Secret volume.
func (c *Credentials) CurrentNotAfter() time.Time {
	c.current()
	return c.NotAfter()
}

// NotAfter is when the certificate in use expires.
func (c *Credentials) NotAfter() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notAfter
}

// ServerConfig is the TLS configuration of xds-server's gRPC port: it presents the xds-server
// certificate and requires a client certificate from the control plane's CA naming a role;
// which role may call what is decided per call (Authorize).
func (c *Credentials) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := c.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   []string{"h2"},
				Certificates: []tls.Certificate{*cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    pool,
				// Chain, validity and ExtKeyUsageClientAuth are checked by crypto/tls; a
				// certificate that names no role is refused in the handshake.
				VerifyConnection: func(cs tls.ConnectionState) error {
					if len(cs.PeerCertificates) == 0 {
						return errors.New("no client certificate")
					}
					_, err := RoleOf(cs.PeerCertificates[0])
					return err
				},
			}, nil
		},
	}
}

// ClientConfig is the TLS configuration of a client of xds-server (extproc; Envoy configures
// the same in its bootstrap): it presents the own certificate and accepts only a server
// certificate from the control plane's CA that names the xds-server role. Host names are not
// checked: the role is what a pod joining xds-server's Service cannot forge.
func (c *Credentials) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := c.current()
			return cert, nil
		},
		// The chain is verified below against the current bundle (which may rotate), and
		// the role instead of a host name.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool := c.current()
			return VerifyServer(cs.PeerCertificates, pool)
		},
	}
}

// VerifyServer checks a server's chain against pool and that its leaf names the xds-server
// role.
func VerifyServer(chain []*x509.Certificate, pool *x509.CertPool) error {
	if len(chain) == 0 {
		return errors.New("xds-server presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("xds-server's certificate is not from the control plane's CA: %w", err)
	}
	role, err := RoleOf(chain[0])
	if err != nil {
		return err
	}
	if role != RoleXDSServer {
		return fmt.Errorf("the server's certificate names role %s, not %s", role, RoleXDSServer)
	}
	return nil
}

// FromFlags reads the --xds-tls-dir and --xds-insecure-plaintext flags both binaries take:
// the role's files in dir (checked now, so a bad directory stops start-up), or nil for
// plaintext, which must be asked for by name. required completes "--xds-tls-dir is required"
// with why the component needs it.
func FromFlags(dir string, hasDir, plaintext bool, role Role, required string) (*Files, error) {
	switch {
	case hasDir && plaintext:
		return nil, errors.New("--xds-tls-dir and --xds-insecure-plaintext exclude each other")
	case hasDir:
		files := DirFiles(dir)
		if _, err := Load(files, role, nil); err != nil {
			return nil, fmt.Errorf("--xds-tls-dir: %v", err)
		}
		return &files, nil
	case !plaintext:
		return nil, errors.New("--xds-tls-dir is required: " + required)
	}
	return nil, nil
}
