package snapshot

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Defaults for the zero fields of a Config.
const (
	DefaultListenAddress         = "0.0.0.0"
	DefaultListenPort            = 6443
	DefaultExtProcAddress        = "127.0.0.1:9001"
	DefaultExtProcMessageTimeout = 200 * time.Millisecond
	DefaultUpstreamServerName    = "kubernetes.default.svc"
	// DefaultUpstreamRequestTimeout is just above the apiserver's own --request-timeout
	// default (1m), so that a live apiserver's own 504 Timeout always comes first.
	DefaultUpstreamRequestTimeout = 65 * time.Second
)

// Config is everything besides the topology that shapes the Envoy configuration. The zero
// value is usable: every empty field takes its default, and every empty secret leaves its
// TLS piece out (see SecretFiles).
type Config struct {
	// ListenAddress and ListenPort are where Envoy accepts clients; default 0.0.0.0:6443.
	// The address must be an IP literal (Envoy listeners do not resolve names).
	ListenAddress string
	ListenPort    uint32
	// ExtProcAddress is where cmd/extproc listens: "unix:/path/to.sock" (also
	// "unix:///path/to.sock") or "host:port"; default 127.0.0.1:9001. A host that is not an IP
	// literal is resolved by Envoy (STRICT_DNS).
	ExtProcAddress string
	// ExtProcMessageTimeout bounds how long Envoy waits for extproc's answer to one request's
	// headers; default 200ms. When it expires the request fails (docs/envoy-config.md#ext_proc-filter).
	ExtProcMessageTimeout time.Duration
	// UpstreamRequestTimeout is the route timeout of every request the apiserver does not
	// treat as long-running (watches, exec, attach, port-forward, proxy, logs keep none);
	// default 65s, just above the apiserver's --request-timeout (1m). It should stay above
	// the apiservers' --request-timeout: it is there for an apiserver that stopped answering
	// (frozen, partitioned), not to cut requests short.
	UpstreamRequestTimeout time.Duration
	// UpstreamServerName is the SNI Envoy sends to the apiservers and the DNS SAN it requires
	// in their serving certificates; default kubernetes.default.svc.
	UpstreamServerName string
	// Secrets name the certificate files Envoy reads, delivered by SDS as file references.
	Secrets SecretFiles
}

// SecretFiles are absolute paths in Envoy's file system (mounted Secrets, or a kubeadm
// node's front-proxy-client pair as the chart's copier publishes it, in the same layout).
// xds-server never opens them: SDS carries only the paths, and Envoy reads the files and
// watches each one's directory. Any of them may be empty, and then the TLS piece it feeds is
// left out; some combinations are errors (Config.check names them).
// What each one left out means: docs/envoy-config.md#leaving-a-secret-out.
type SecretFiles struct {
	ServingCert, ServingKey         string
	ClientCA                        string
	ProxyClientCert, ProxyClientKey string
	PeerCA                          string
}

// config is a Config with its defaults applied and its parts checked.
type config struct {
	Config
	extProc extProcAddress
}

type extProcAddress struct {
	pipe string // unix socket path; empty for host:port
	host string
	port uint32
	isIP bool
}

func (c Config) withDefaults() Config {
	if c.ListenAddress == "" {
		c.ListenAddress = DefaultListenAddress
	}
	if c.ListenPort == 0 {
		c.ListenPort = DefaultListenPort
	}
	if c.ExtProcAddress == "" {
		c.ExtProcAddress = DefaultExtProcAddress
	}
	if c.ExtProcMessageTimeout == 0 {
		c.ExtProcMessageTimeout = DefaultExtProcMessageTimeout
	}
	if c.UpstreamServerName == "" {
		c.UpstreamServerName = DefaultUpstreamServerName
	}
	if c.UpstreamRequestTimeout == 0 {
		c.UpstreamRequestTimeout = DefaultUpstreamRequestTimeout
	}
	return c
}

// ConfigError is one problem with one field of a Config.
type ConfigError struct {
	// Field is the Config field, e.g. "ExtProcAddress" or "Secrets.PeerCA".
	Field string
	// Problem completes the sentence that starts with the field, e.g. `"x" is not an IP address`.
	Problem string
}

func (e *ConfigError) Error() string { return "Config." + e.Field + " " + e.Problem }

// Validate reports every problem with c (after defaults), each a *ConfigError. Build calls it.
func (c Config) Validate() []error {
	_, errs := c.check()
	return errs
}

// check applies the defaults and reports every problem with c, each naming its field.
func (c Config) check() (config, []error) {
	cfg := config{Config: c.withDefaults()}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	if ip := net.ParseIP(cfg.ListenAddress); ip == nil {
		bad("ListenAddress", "%q is not an IP address", cfg.ListenAddress)
	}
	if cfg.ListenPort > 65535 {
		bad("ListenPort", "%d is not a port number", cfg.ListenPort)
	}
	var err error
	if cfg.extProc, err = parseExtProcAddress(cfg.ExtProcAddress); err != nil {
		bad("ExtProcAddress", "%q: %v", cfg.ExtProcAddress, err)
	}
	if cfg.ExtProcMessageTimeout < time.Millisecond || cfg.ExtProcMessageTimeout > time.Hour {
		bad("ExtProcMessageTimeout", "%v is not between 1ms and 1h", cfg.ExtProcMessageTimeout)
	}
	if cfg.UpstreamRequestTimeout < time.Second || cfg.UpstreamRequestTimeout > 24*time.Hour {
		bad("UpstreamRequestTimeout", "%v is not between 1s and 24h", cfg.UpstreamRequestTimeout)
	}
	if strings.ContainsAny(cfg.UpstreamServerName, " /:") || cfg.UpstreamServerName != strings.ToLower(cfg.UpstreamServerName) {
		bad("UpstreamServerName", "%q is not a lower-case DNS name", cfg.UpstreamServerName)
	}

	s := cfg.Secrets
	for field, path := range map[string]string{"ServingCert": s.ServingCert, "ServingKey": s.ServingKey, "ClientCA": s.ClientCA,
		"ProxyClientCert": s.ProxyClientCert, "ProxyClientKey": s.ProxyClientKey, "PeerCA": s.PeerCA} {
		if path != "" && !filepath.IsAbs(path) {
			bad("Secrets."+field, "%q is not an absolute path (Envoy reads it, from its own working directory)", path)
		}
	}
	pair := func(certField, cert, keyField, key string) {
		switch {
		case cert == "" && key != "":
			bad("Secrets."+certField, "is missing: a key without its certificate")
		case key == "" && cert != "":
			bad("Secrets."+keyField, "is missing: a certificate without its key")
		}
	}
	pair("ServingCert", s.ServingCert, "ServingKey", s.ServingKey)
	pair("ProxyClientCert", s.ProxyClientCert, "ProxyClientKey", s.ProxyClientKey)
	if s.ClientCA != "" && s.ServingCert == "" {
		bad("Secrets.ClientCA", "is given but there is no serving certificate: without TLS on the listener no client certificate can be verified")
	}
	if s.ClientCA != "" && s.ProxyClientCert == "" {
		bad("Secrets.ProxyClientCert", "is missing: the identity of client certificates verified against ClientCA cannot be forwarded without it, and they would reach the apiservers as anonymous")
	}
	if s.ProxyClientCert != "" && s.PeerCA == "" {
		bad("Secrets.PeerCA", "is missing: the proxy client certificate (as strong as cluster-admin) would go to apiservers nobody verified")
	}
	return cfg, errs
}

func parseExtProcAddress(a string) (extProcAddress, error) {
	if path, ok := strings.CutPrefix(a, "unix:"); ok {
		if strings.HasPrefix(path, "///") {
			path = path[2:] // unix:///abs/path, gRPC's spelling
		}
		if path == "" || strings.HasPrefix(path, "//") {
			return extProcAddress{}, errors.New("want unix:/path/to.sock")
		}
		return extProcAddress{pipe: path}, nil
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return extProcAddress{}, fmt.Errorf("want unix:/path or host:port: %v", err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return extProcAddress{}, fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	if host == "" {
		return extProcAddress{}, errors.New("host is empty")
	}
	return extProcAddress{host: host, port: uint32(n), isIP: net.ParseIP(host) != nil}, nil
}
