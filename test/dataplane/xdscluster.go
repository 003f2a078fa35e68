package dataplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpckeepalive "google.golang.org/grpc/keepalive"
)

// XDSCluster is the bootstrap's static cluster that ads_config names (the chart's and
// envoy/*.yaml's "xds-server"): type STRICT_DNS with one endpoint, a host name (xds-server's
// headless Service) and a port.
type XDSCluster struct {
	Name string // the cluster's name: the :authority of the ADS stream, as Envoy's envoy_grpc
	Host string // the endpoint's socket_address.address, a DNS name or an IP address
	Port int
	// DNSRefreshRate is how often the name is resolved again (dns_refresh_rate; Envoy's
	// default 5 s).
	DNSRefreshRate time.Duration
	// ConnectTimeout bounds a new TCP connection (connect_timeout; Envoy's default 5 s).
	ConnectTimeout time.Duration
	// KeepaliveInterval and KeepaliveTimeout are the HTTP/2 connection_keepalive PINGs
	// (zero: none).
	KeepaliveInterval, KeepaliveTimeout time.Duration
}

// startClusterADS runs ADS to a STRICT_DNS cluster as Envoy does. Envoy's STRICT_DNS cluster
// (source/extensions/clusters/strict_dns/strict_dns_cluster.cc) resolves the endpoint's name
// at start and every dns_refresh_rate, and its hosts are the addresses of the last successful
// answer (a failed resolution keeps them); the gRPC client of ads_config
// (source/common/grpc/async_client_impl.cc, envoy_grpc) opens its stream on a connection to
// one of the cluster's hosts, chosen by the cluster's load balancer (ROUND_ROBIN, the
// default), with the cluster name as :authority. Here: the name is resolved at every
// (re)connect, one address taken in turn, and while the stream runs the name is resolved
// again every DNSRefreshRate; a host that left the answer ends its stream (Envoy drains a
// removed host's connection pools), and the next connection goes to a current address. IPv4
// addresses are preferred when the name has both (dns_lookup_family V4_PREFERRED, the
// default). Each connection is a new TLS handshake with the secret files as last loaded.
func (d *DataPlane) startClusterADS() error {
	c := d.opts.XDSCluster
	if c.Host == "" || c.Port <= 0 || c.Port > 65535 {
		return fmt.Errorf("dataplane: xDS cluster %q: endpoint %s:%d", c.Name, c.Host, c.Port)
	}
	var src *xdsTLSSource
	if d.opts.XDSTLS != nil {
		src = newXDSTLSSource(d.opts.XDSTLS, d)
		if err := src.watch(d.ctx, &d.wg); err != nil {
			return fmt.Errorf("dataplane: %w", err)
		}
	}
	turn := 0
	d.keepADS(func() error { return d.clusterSession(c, src, &turn) }, nil, "cluster", c.Name)
	return nil
}

// resolve is the STRICT_DNS lookup: the addresses of host, IPv4 first if there are any.
func (d *DataPlane) resolve(ctx context.Context, host string) ([]string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return []string{host}, nil
	}
	lookup := d.opts.LookupHost
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	addrs, err := lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	var v4, v6 []string
	for _, a := range addrs {
		ip := net.ParseIP(a)
		switch {
		case ip == nil:
		case ip.To4() != nil:
			v4 = append(v4, a)
		default:
			v6 = append(v6, a)
		}
	}
	if len(v4) > 0 {
		return v4, nil
	}
	if len(v6) == 0 {
		return nil, fmt.Errorf("%s has no address", host)
	}
	return v6, nil
}

func (d *DataPlane) clusterSession(c *XDSCluster, src *xdsTLSSource, turn *int) error {
	refresh := c.DNSRefreshRate
	if refresh <= 0 {
		refresh = 5 * time.Second
	}
	connectTimeout := c.ConnectTimeout
	if connectTimeout <= 0 {
		connectTimeout = 5 * time.Second
	}
	rctx, rcancel := context.WithTimeout(d.ctx, refresh)
	addrs, err := d.resolve(rctx, c.Host)
	rcancel()
	if err != nil {
		return fmt.Errorf("resolving %s: %w", c.Host, err)
	}
	ip := addrs[*turn%len(addrs)]
	*turn++
	addr := net.JoinHostPort(ip, strconv.Itoa(c.Port))

	creds := insecure.NewCredentials()
	if src != nil {
		// No SNI: the bootstrap's UpstreamTlsContext sets no sni (Envoy sends none then).
		creds = noSNI{credentials.NewTLS(src.clientConfig()), ip}
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithAuthority(c.Name),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, connectTimeout)
			defer cancel()
			return (&net.Dialer{}).DialContext(dctx, "tcp", a)
		}),
		// Envoy takes xDS responses of any size (see startADS).
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)),
	}
	if c.KeepaliveInterval > 0 {
		opts = append(opts, grpc.WithKeepaliveParams(grpckeepalive.ClientParameters{
			Time: c.KeepaliveInterval, Timeout: c.KeepaliveTimeout, PermitWithoutStream: true}))
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	d.log.Info("ADS: connecting", "cluster", c.Name, "host", c.Host, "address", addr)

	sctx, cancel := context.WithCancelCause(d.ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(refresh)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(sctx, refresh)
			now, err := d.resolve(rctx, c.Host)
			rcancel()
			if err != nil {
				continue // a failed resolution keeps the hosts
			}
			if !slices.Contains(now, ip) {
				cancel(fmt.Errorf("%s left %s's DNS answer %v", ip, c.Host, now))
				return
			}
		}
	}()
	err = d.adsSession(sctx, discovery.NewAggregatedDiscoveryServiceClient(conn))
	if cause := context.Cause(sctx); cause != nil && d.ctx.Err() == nil {
		return cause
	}
	return err
}

// xdsTLSSource holds the client certificate and CA of the TLS to xds-server. With watched
// directories the files are read at start and again only when a file is moved into one of
// those directories (as Envoy, below); without, at every handshake.
type xdsTLSSource struct {
	x *XDSTLS
	d *DataPlane

	mu     sync.Mutex
	cert   *tls.Certificate
	pool   *x509.CertPool
	loaded bool
}

func newXDSTLSSource(x *XDSTLS, d *DataPlane) *xdsTLSSource { return &xdsTLSSource{x: x, d: d} }

func (s *xdsTLSSource) watched() bool {
	return s.x.CertWatchedDirectory != "" || s.x.CAWatchedDirectory != ""
}

func (s *xdsTLSSource) read() (*tls.Certificate, *x509.CertPool, error) {
	c, err := tls.LoadX509KeyPair(s.x.CertFile, s.x.KeyFile)
	if err != nil {
		return nil, nil, err
	}
	ca, err := os.ReadFile(s.x.CAFile)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, nil, fmt.Errorf("%s holds no certificate", s.x.CAFile)
	}
	return &c, pool, nil
}

// reload reads the files again; files that do not load keep the previous ones and count
// sds.<secret>.key_rotation_failed, as Envoy's SdsApi::onWatchUpdate
// (source/common/secret/sds_api.cc).
func (s *xdsTLSSource) reload() {
	c, p, err := s.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.loaded {
			name := s.x.CertSecret
			if name == "" {
				name = "xds-client-cert"
			}
			s.d.stats.inc("sds." + name + ".key_rotation_failed")
		}
		s.d.log.Warn("xDS TLS files do not load; keeping the previous ones", "error", err)
		return
	}
	s.cert, s.pool, s.loaded = c, p, true
	s.d.log.Info("xDS TLS files loaded", "cert", s.x.CertFile, "ca", s.x.CAFile)
}

func (s *xdsTLSSource) current() (*tls.Certificate, *x509.CertPool, error) {
	if !s.watched() {
		return s.read()
	}
	s.mu.Lock()
	loaded := s.loaded
	s.mu.Unlock()
	if !loaded {
		s.reload() // not there at start: try again at each handshake until they are
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.loaded {
		return nil, nil, errors.New("xDS TLS files not loaded yet")
	}
	return s.cert, s.pool, nil
}

// watch starts Envoy's watch of each watched_directory: Config::WatchedDirectory
// (source/common/config/watched_directory.cc) adds an inotify watch for MovedTo on the
// directory, and Filesystem::WatcherImpl (source/common/filesystem/inotify/watcher_impl.cc)
// calls a directory's callback for a file of any name moved into it: the kubelet's atomic
// update of a Secret volume, a new timestamped directory then the ..data symlink renamed
// over the old one, is such a move. Files written in place (no rename) are not noticed,
// as in Envoy.
func (s *xdsTLSSource) watch(ctx context.Context, wg *sync.WaitGroup) error {
	if !s.watched() {
		return nil
	}
	s.reload()
	var dirs []string
	for _, dir := range []string{s.x.CertWatchedDirectory, s.x.CAWatchedDirectory} {
		if dir != "" && !slices.Contains(dirs, filepath.Clean(dir)) {
			dirs = append(dirs, filepath.Clean(dir))
		}
	}
	for _, dir := range dirs {
		if err := watchMovedTo(ctx, wg, dir, func(name string) {
			s.d.log.Info("xDS TLS watched directory: file moved in; reloading", "directory", dir, "file", name)
			s.reload()
		}); err != nil {
			return err
		}
	}
	return nil
}

// watchMovedTo calls cb with the name of every file moved into dir until ctx ends.
func watchMovedTo(ctx context.Context, wg *sync.WaitGroup, dir string, cb func(name string)) error {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return fmt.Errorf("unable to add filesystem watch for directory %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), "inotify:"+dir) // non-blocking: Close ends a pending Read
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		f.Close()
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				off += unix.SizeofInotifyEvent + int(ev.Len)
				if ev.Mask&unix.IN_MOVED_TO != 0 {
					cb(string(trimNUL(nameBytes)))
				}
			}
		}
	}()
	return nil
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// clientConfig verifies xds-server as the bootstrap's UpstreamTlsContext does: the chain
// against the trusted CA, then match_typed_subject_alt_names (a URI SAN, exact), no host
// name (source/common/tls/cert_validator/default_validator.cc).
func (s *xdsTLSSource) clientConfig() *tls.Config {
	x := s.x
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _, err := s.current()
			return c, err
		},
		InsecureSkipVerify: true, //nolint:gosec // verified below as Envoy does
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, pool, err := s.current()
			if err != nil {
				return err
			}
			return verifyXDSServer(raw, pool, x.ServerURISAN)
		},
	}
}

// noSNI hands the TLS handshake the dialled IP address instead of the :authority, for which
// gRPC's TLS credentials would send SNI: Go sends none for an IP address.
type noSNI struct {
	credentials.TransportCredentials
	ip string
}

func (c noSNI) ClientHandshake(ctx context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, c.ip, conn)
}

func (c noSNI) Clone() credentials.TransportCredentials {
	return noSNI{c.TransportCredentials.Clone(), c.ip}
}
