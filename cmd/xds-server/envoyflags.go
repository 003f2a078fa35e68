package main

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// envoyFlags are the flags that shape the Envoy configuration, shared by translate and serve.
type envoyFlags struct {
	cfg       snapshot.Config
	anonymous bool // deprecated, ignored
	fs        *pflag.FlagSet
}

// warnings name the deprecated flags the command line set, and why they do nothing.
func (e *envoyFlags) warnings() []string {
	var out []string
	e.fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed && f.Deprecated != "" {
			out = append(out, fmt.Sprintf("--%s is deprecated: %s", f.Name, f.Deprecated))
		}
	})
	return out
}

// flagSet defines the flags, with snapshot's defaults.
func (e *envoyFlags) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("envoy")
	e.fs = fs
	c, s := &e.cfg, &e.cfg.Secrets
	fs.StringVar(&c.ListenAddress, "listen-address", snapshot.DefaultListenAddress, "Envoy's listener address, an `IP`")
	fs.Var(cli.NewValue(&c.ListenPort, snapshot.DefaultListenPort, "PORT", func(v string) (uint32, error) {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n == 0 {
			return 0, errors.New("is not a port number from 1 to 65535")
		}
		return uint32(n), nil
	}), "listen-port", "Envoy's listener port")
	fs.StringVar(&c.ExtProcAddress, "extproc-address", snapshot.DefaultExtProcAddress, "extproc's `ADDR`: unix:/path/to.sock or host:port")
	fs.Var(cli.NewValue(&c.ExtProcMessageTimeout, snapshot.DefaultExtProcMessageTimeout, "DURATION",
		cli.Duration(1, "a positive duration, e.g. 200ms")), "extproc-message-timeout", "how long Envoy waits for extproc")
	fs.Var(cli.NewValue(&c.UpstreamRequestTimeout, snapshot.DefaultUpstreamRequestTimeout, "DURATION",
		cli.Duration(1, "a positive duration, e.g. 65s")), "upstream-request-timeout",
		"route timeout of requests that are not long-running (those have none); keep it above the apiservers' --request-timeout")
	fs.StringVar(&c.UpstreamServerName, "upstream-server-name", snapshot.DefaultUpstreamServerName, "SNI and SAN expected of the apiservers, a DNS `NAME`")
	cli.Bool(fs, &e.anonymous, "anonymous-auth", true, "ignored")
	// Requests without credentials now reach the apiservers as they are, and they decide.
	_ = fs.MarkDeprecated("anonymous-auth", "it has no effect: requests without credentials reach the apiservers without the proxy certificate, and each apiserver applies its own anonymous policy")
	for _, f := range []struct {
		p          *string
		name, what string
	}{
		{&s.ServingCert, "serving-cert", "Envoy's serving certificate"},
		{&s.ServingKey, "serving-key", "its key"},
		{&s.ClientCA, "client-ca", "the CA of client certificates"},
		{&s.ProxyClientCert, "proxy-client-cert", "Envoy's client certificate to the apiservers (needs --peer-ca)"},
		{&s.ProxyClientKey, "proxy-client-key", "its key"},
		{&s.PeerCA, "peer-ca", "the CA of the apiservers' serving certificates"},
	} {
		fs.StringVar(f.p, f.name, "", f.what+", a `PATH` in Envoy's file system")
	}
	return fs
}

// configFlags names the flag behind each snapshot.Config field, to report a ConfigError in the
// user's terms.
var configFlags = map[string]string{
	"ListenAddress":           "--listen-address",
	"ListenPort":              "--listen-port",
	"ExtProcAddress":          "--extproc-address",
	"ExtProcMessageTimeout":   "--extproc-message-timeout",
	"UpstreamRequestTimeout":  "--upstream-request-timeout",
	"UpstreamServerName":      "--upstream-server-name",
	"Secrets.ServingCert":     "--serving-cert",
	"Secrets.ServingKey":      "--serving-key",
	"Secrets.ClientCA":        "--client-ca",
	"Secrets.ProxyClientCert": "--proxy-client-cert",
	"Secrets.ProxyClientKey":  "--proxy-client-key",
	"Secrets.PeerCA":          "--peer-ca",
}

// config is the parsed configuration; what makes it invalid is added to errs in flag terms.
func (e *envoyFlags) config(errs *multierror.Error) (snapshot.Config, *multierror.Error) {
	for _, err := range e.cfg.Validate() {
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
	return e.cfg, errs
}
