package dataplane

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
)

// secretFilePoll is how often file-based secrets are re-read. Envoy watches the directories
// with inotify and reacts at once; polling changes only how soon, not what.
const secretFilePoll = 200 * time.Millisecond

// watchSecretFiles keeps file-based SDS secrets in step with their files, as Envoy does for a
// TlsCertificate or CertificateValidationContext delivered by SDS with file references
// (api: TlsCertificate.watched_directory, CertificateValidationContext.watched_directory;
// docs: "SDS key rotation"): a change is read and takes effect for new connections and
// handshakes; a change that cannot be loaded (a key that does not match its certificate in a
// half-written rotation) keeps the previous secret and counts
// sds.<name>.key_rotation_failed (Envoy's SdsApi::onWatchUpdate).
func (d *DataPlane) watchSecretFiles() {
	t := time.NewTicker(secretFilePoll)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
			d.reloadSecretFiles()
		}
	}
}

func (d *DataPlane) reloadSecretFiles() {
	d.mu.Lock()
	defer d.mu.Unlock()
	cfg := d.cfg
	var changed map[string]*tlsv3.Secret
	for name, raw := range cfg.raw[resource.SecretType] {
		src := raw.(*tlsv3.Secret)
		if !hasFiles(src) {
			continue
		}
		s, err := resolveSecret(src)
		if err != nil {
			d.stats.inc("sds." + name + ".key_rotation_failed")
			d.log.Warn("secret files changed but do not load; keeping the previous ones", "secret", name, "error", err)
			continue
		}
		if !proto.Equal(s, cfg.secrets[name]) {
			if changed == nil {
				changed = map[string]*tlsv3.Secret{}
			}
			changed[name] = s
		}
	}
	if changed == nil {
		return
	}
	next := cfg.clone()
	next.secrets = map[string]*tlsv3.Secret{}
	for name, s := range cfg.secrets {
		next.secrets[name] = s
	}
	for name, s := range changed {
		next.secrets[name] = s
		d.log.Info("secret reloaded from its files", "secret", name)
	}
	d.cfg = next
}

// XDSTLS is the transport socket of the bootstrap's xds-server cluster (envoy/*.yaml): an
// UpstreamTlsContext whose client certificate and trusted CA are files, and whose
// match_typed_subject_alt_names requires the URI SAN of xds-server's role. Envoy validates
// the chain against trusted_ca and then the SANs, and does not compare host names.
type XDSTLS struct {
	CertFile, KeyFile, CAFile string
	// ServerURISAN is the exact URI SAN required of xds-server's certificate.
	ServerURISAN string
	// CertWatchedDirectory and CAWatchedDirectory are the SDS secrets' watched_directory:
	// when set, the files are read at start and again when a file is moved into the
	// directory, as Envoy (xdscluster.go, xdsTLSSource.watch); unset, at every handshake.
	// Used with Options.XDSCluster.
	CertWatchedDirectory, CAWatchedDirectory string
	// CertSecret names the client certificate's secret in stats (default xds-client-cert).
	CertSecret string
}

// clientConfig reads the files at every handshake (the bootstrap's files are re-read through
// SDS in Envoy) and verifies the server as Envoy's default certificate validator does.
func (x *XDSTLS) clientConfig() *tls.Config {
	plain := *x
	plain.CertWatchedDirectory, plain.CAWatchedDirectory = "", ""
	return (&xdsTLSSource{x: &plain}).clientConfig()
}

// verifyXDSServer checks xds-server's chain against pool, then its URI SAN.
func verifyXDSServer(raw [][]byte, pool *x509.CertPool, uriSAN string) error {
	if len(raw) == 0 {
		return errors.New("no server certificate")
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, r := range raw[1:] {
		if c, err := x509.ParseCertificate(r); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return err
	}
	var uris []string
	for _, u := range leaf.URIs {
		uris = append(uris, u.String())
	}
	if !slices.Contains(uris, uriSAN) {
		return fmt.Errorf("xds-server certificate URI SANs %v lack %s", uris, uriSAN)
	}
	return nil
}
