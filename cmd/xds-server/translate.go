package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/kube-mvp/kube-mvp/internal/inventory/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

var translateCommand = &command{
	name:    "translate",
	summary: "print the Envoy configuration for an inventory fixture, offline",
	usage:   translateUsage,
	run:     runTranslate,
}

const translateUsage = `usage: xds-server translate -f FILE [flags]

Reads an inventory fixture (a YAML stream of identity Leases, StorageVersions, APIServices
and kube-mvp.io/v1alpha1 APIServerDiscovery objects), builds the topology as the live
inventory would, and prints the Envoy resources xds-server would serve for it:
{"version", "listeners", "routes", "clusters", "endpoints", "secrets"}, each resource in
protojson with its "@type".

flags:
  -f, --file FILE                  the fixture (required)
  -o, --output json|yaml           output format (default json)
      --node-id ID                 sidecar mode: the ID of the apiserver this Envoy runs beside
      --now RFC3339                judge Lease liveness at this time (default: every Lease is live)
      --liveness-window DURATION   how recent a live Lease's renewal is (default 30s)
      --listen-address IP          Envoy's listener address (default 0.0.0.0)
      --listen-port PORT           Envoy's listener port (default 6443)
      --extproc-address ADDR       extproc: unix:/path/to.sock or host:port (default 127.0.0.1:9001)
      --extproc-message-timeout D  how long Envoy waits for extproc (default 200ms)
      --upstream-server-name NAME  SNI and SAN expected of the apiservers (default kubernetes.default.svc)
      --anonymous-auth=false       as the apiservers' own flag: with false, requests without
                                   credentials are not forwarded as system:anonymous (default true)
      --serving-cert PATH          Envoy's TLS files, as absolute paths in Envoy's file system
      --serving-key PATH             (xds-server never opens them; SDS carries the paths and
      --client-ca PATH               Envoy watches the files); each one left out leaves its
      --proxy-client-cert PATH       TLS piece out (see internal/snapshot.SecretFiles); a proxy
      --proxy-client-key PATH        client certificate needs --peer-ca
      --peer-ca PATH
  -h, --help                       this text

Problems with single objects of the fixture are printed as warnings, and so is an apiserver
whose endpoint had to be left out. Exit codes: 0 printed, 1 the translation failed, 2 bad
command line or fixture.
`

var translateFlags = append(envoyConfigFlags, []flagSpec{
	{name: "file", short: "f"},
	{name: "output", short: "o"},
	{name: "node-id"},
	{name: "now"},
	{name: "liveness-window"},
}...)

type translateOptions struct {
	file   string
	output string
	nodeID string
	build  objects.Options
	cfg    snapshot.Config
}

// parseTranslate validates the whole command line, reads the secret files, and reports every
// problem at once, each naming its flag.
func parseTranslate(args []string) (translateOptions, error) {
	opts := translateOptions{output: "json"}
	raw, errs := parseFlags(translateFlags, args)
	if errs != nil && errors.Is(errs.Errors[0], errHelp) {
		return opts, errHelp
	}

	if f, ok := raw["file"]; !ok || f == "" {
		errs = multierror.Append(errs, errors.New("-f FILE is required: the inventory fixture to translate"))
	} else {
		opts.file = f
	}
	if o, ok := raw["output"]; ok {
		if o != "json" && o != "yaml" {
			errs = multierror.Append(errs, fmt.Errorf("--output %q: want json or yaml", o))
		}
		opts.output = o
	}
	if id, ok := raw["node-id"]; ok {
		if id == "" {
			errs = multierror.Append(errs, errors.New("--node-id needs an apiserver ID, e.g. apiserver-hxhuy3rsmzqt3nvdbfa4wlpycq"))
		}
		opts.nodeID = id
	}
	if n, ok := raw["now"]; ok {
		t, err := time.Parse(time.RFC3339, n)
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--now %q is not an RFC 3339 time, e.g. 2026-11-23T10:00:00Z", n))
		}
		opts.build.Now = t
	}
	if w, ok := raw["liveness-window"]; ok {
		d, err := time.ParseDuration(w)
		if err != nil || d <= 0 {
			errs = multierror.Append(errs, fmt.Errorf("--liveness-window %q is not a positive duration, e.g. 30s", w))
		}
		opts.build.LivenessWindow = d
	}
	opts.cfg, errs = parseEnvoyConfig(raw, errs)
	if errs != nil {
		errs.ErrorFormat = listErrors
	}
	return opts, errs.ErrorOrNil()
}

func runTranslate(args []string, stdout, stderr io.Writer) int {
	opts, err := parseTranslate(args)
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, translateUsage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "xds-server translate: %v\nRun xds-server translate --help for usage.\n", err)
		return 2
	}

	objs, err := objects.LoadFixture(opts.file)
	if err != nil {
		fmt.Fprintf(stderr, "xds-server translate: %v\n", err)
		return 2
	}
	topo, warnings := objects.Build(objs, opts.build)
	for _, w := range warnings {
		fmt.Fprintf(stderr, "warning: %s: %v\n", opts.file, w)
	}
	if topo == nil {
		fmt.Fprintf(stderr, "xds-server translate: %s describes no usable topology\n", opts.file)
		return 2
	}
	if opts.nodeID != "" {
		if _, ok := topo.Server(opts.nodeID); !ok {
			fmt.Fprintf(stderr, "warning: --node-id %s: no identity Lease in %s names this apiserver; its local cluster is empty\n", opts.nodeID, opts.file)
		}
		topo = topo.WithLocal(opts.nodeID)
	}

	p, err := plan.Build(topo)
	if err != nil {
		fmt.Fprintf(stderr, "xds-server translate: %v\n", err)
		return 1
	}
	res, err := snapshot.Build(p, opts.cfg)
	if res == nil {
		fmt.Fprintf(stderr, "xds-server translate: %v\n", err)
		return 1
	}
	if err != nil {
		for _, e := range unjoin(err) {
			fmt.Fprintf(stderr, "warning: %v\n", e)
		}
	}
	var out []byte
	if opts.output == "yaml" {
		out, err = res.ToYAML()
	} else {
		out, err = res.ToJSON()
	}
	if err != nil {
		fmt.Fprintf(stderr, "xds-server translate: rendering: %v\n", err)
		return 1
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintf(stderr, "xds-server translate: %v\n", err)
		return 1
	}
	return 0
}

// unjoin splits an errors.Join error into its parts.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
