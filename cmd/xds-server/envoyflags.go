package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// envoyConfigFlags are the flags that shape the Envoy configuration, shared by translate and
// serve.
var envoyConfigFlags = []flagSpec{
	{name: "listen-address"},
	{name: "listen-port"},
	{name: "extproc-address"},
	{name: "extproc-message-timeout"},
	{name: "upstream-server-name"},
	{name: "anonymous-auth", boolean: true},
	{name: "serving-cert"},
	{name: "serving-key"},
	{name: "client-ca"},
	{name: "proxy-client-cert"},
	{name: "proxy-client-key"},
	{name: "peer-ca"},
}

// configFlags names the flag behind each snapshot.Config field, to report a ConfigError in the
// user's terms.
var configFlags = map[string]string{
	"ListenAddress":           "--listen-address",
	"ListenPort":              "--listen-port",
	"ExtProcAddress":          "--extproc-address",
	"ExtProcMessageTimeout":   "--extproc-message-timeout",
	"UpstreamServerName":      "--upstream-server-name",
	"Secrets.ServingCert":     "--serving-cert",
	"Secrets.ServingKey":      "--serving-key",
	"Secrets.ClientCA":        "--client-ca",
	"Secrets.ProxyClientCert": "--proxy-client-cert",
	"Secrets.ProxyClientKey":  "--proxy-client-key",
	"Secrets.PeerCA":          "--peer-ca",
}

// parseEnvoyConfig reads the envoyConfigFlags into a snapshot.Config, adding every problem to errs in flag terms.
func parseEnvoyConfig(raw map[string]string, errs *multierror.Error) (snapshot.Config, *multierror.Error) {
	var cfg snapshot.Config
	duration := func(flag string, into *time.Duration) {
		if v, ok := raw[flag]; ok {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = multierror.Append(errs, fmt.Errorf("--%s %q is not a positive duration", flag, v))
			}
			*into = d
		}
	}
	duration("extproc-message-timeout", &cfg.ExtProcMessageTimeout)
	if p, ok := raw["listen-port"]; ok {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			errs = multierror.Append(errs, fmt.Errorf("--listen-port %q is not a port number from 1 to 65535", p))
		}
		cfg.ListenPort = uint32(n)
	}
	cfg.ListenAddress = raw["listen-address"]
	cfg.ExtProcAddress = raw["extproc-address"]
	cfg.UpstreamServerName = raw["upstream-server-name"]
	cfg.DisableAnonymous = raw["anonymous-auth"] == "false"

	s := &cfg.Secrets
	s.ServingCert, s.ServingKey = raw["serving-cert"], raw["serving-key"]
	s.ClientCA = raw["client-ca"]
	s.ProxyClientCert, s.ProxyClientKey = raw["proxy-client-cert"], raw["proxy-client-key"]
	s.PeerCA = raw["peer-ca"]

	// What the flags parsed into must also make a valid configuration; say so in flag terms.
	for _, err := range cfg.Validate() {
		var ce *snapshot.ConfigError
		flag, known := "", false
		if errors.As(err, &ce) {
			flag, known = configFlags[ce.Field]
		}
		if !known {
			errs = multierror.Append(errs, err)
			continue
		}
		errs = multierror.Append(errs, fmt.Errorf("%s %s", flag, ce.Problem))
	}
	return cfg, errs
}
