package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

var translateCommand = &cli.Command{
	Name:    "translate",
	Summary: "print the Envoy configuration for an inventory fixture, offline",
	Usage:   translateUsage,
	Run:     runTranslate,
}

func translateUsage() string {
	return cli.Usage(translateIntro, new(translateOptions).flagSet(), translateOutro)
}

const translateIntro = `usage: xds-server translate -f FILE [flags]

Reads an inventory fixture (a YAML stream of identity Leases, StorageVersions, APIServices
and kube-mvp.io/v1alpha1 APIServerDiscovery objects), builds the topology as the live
inventory would, and prints the Envoy resources xds-server would serve for it:
{"version", "listeners", "routes", "clusters", "endpoints", "secrets"}, each resource in
protojson with its "@type".
`

const translateOutro = `The certificate flags are absolute paths in Envoy's file system: xds-server never opens
them, SDS carries the paths and Envoy watches the files; each one left out leaves its TLS piece
out (see internal/snapshot.SecretFiles).

Problems with single objects of the fixture are printed as warnings, and so are an apiserver
whose endpoint had to be left out and every apiserver that takes part in no routing, with why
(an apiserver routes only with its own discovery: a fixture of Leases and StorageVersions alone
routes every request to a 503). Exit codes: 0 printed, 1 the translation failed, 2 bad
command line or fixture.
`

type translateOptions struct {
	file   string
	output string
	nodeID string
	build  objects.Options
	cfg    snapshot.Config
	envoy  envoyFlags
	// dangerous are the apiservers to translate as found dangerous, with the reason
	// (--dangerous-apiserver, read into dangerous after parsing).
	dangerousFlags []string
	dangerous      map[string]string
}

// flagSet defines translate's flags on o, with their defaults.
func (o *translateOptions) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("translate")
	fs.StringVarP(&o.file, "file", "f", "", "the fixture `FILE` (required)")
	fs.VarP(cli.NewValue(&o.output, "json", "json|yaml", func(s string) (string, error) {
		if s != "json" && s != "yaml" {
			return "", errors.New("is not json or yaml")
		}
		return s, nil
	}), "output", "o", "output format")
	fs.StringVar(&o.nodeID, "node-id", "", "sidecar mode: the `ID` of the apiserver this Envoy runs beside")
	fs.Var(cli.NewValue(&o.build.Now, time.Time{}, "RFC3339", cli.Time), "now", "judge Lease liveness at this time (default: every Lease is live)")
	fs.Var(cli.NewValue(&o.build.LivenessWindow, objects.DefaultLivenessWindow, "DURATION", cli.Duration(1, "a positive duration, e.g. 30s")),
		"liveness-window", "how recent a live Lease's renewal is")
	fs.StringArrayVar(&o.dangerousFlags, "dangerous-apiserver", nil, "translate as if extproc had found the apiserver `ID=REASON` taking the proxy certificate for an ordinary client's; repeatable")
	fs.AddFlagSet(o.envoy.flagSet())
	return fs
}

// parseTranslate validates the whole command line and reports every problem at once, each
// naming its flag.
func parseTranslate(args []string) (translateOptions, error) {
	var opts translateOptions
	fs := opts.flagSet()
	errs, stop := cli.Parse(fs, args)
	if stop != nil {
		return opts, stop
	}
	if opts.file == "" {
		errs = multierror.Append(errs, errors.New("-f FILE is required: the inventory fixture to translate"))
	}
	if fs.Changed("node-id") && opts.nodeID == "" {
		errs = multierror.Append(errs, errors.New("--node-id needs an apiserver ID, e.g. apiserver-tqsyvnc7rs47fayzipsuqpfg4m"))
	}
	for _, f := range opts.dangerousFlags {
		id, reason, ok := strings.Cut(f, "=")
		if !ok || id == "" || reason == "" {
			errs = multierror.Append(errs, fmt.Errorf("--dangerous-apiserver %q: want ID=REASON, e.g. apiserver-tqsyvnc7rs47fayzipsuqpfg4m='takes the proxy certificate as the client front-proxy-client'", f))
			continue
		}
		if opts.dangerous == nil {
			opts.dangerous = map[string]string{}
		}
		opts.dangerous[id] = reason
	}
	opts.cfg, errs = opts.envoy.config(errs)
	return opts, cli.Err(errs)
}

func runTranslate(args []string, stdout, stderr io.Writer) int {
	opts, err := parseTranslate(args)
	if code, ok := cli.Done("xds-server translate", err, translateUsage, stdout, stderr); !ok {
		return code
	}
	for _, w := range opts.envoy.warnings() {
		fmt.Fprintln(stderr, "xds-server translate: warning: "+w)
	}

	topo, warnings, err := objects.LoadFixtureTopology(opts.file, objects.FixtureView{Build: opts.build, LocalID: opts.nodeID, Dangerous: opts.dangerous})
	for _, w := range warnings {
		fmt.Fprintln(stderr, "warning: "+w)
	}
	if err != nil {
		fmt.Fprintf(stderr, "xds-server translate: %v\n", err)
		return 2
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
	if merr, ok := err.(interface{ Unwrap() []error }); ok { // Resources despite problems: warn of each
		for _, e := range merr.Unwrap() {
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
