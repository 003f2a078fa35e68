package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/explain"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/opstatus"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

var explainCommand = &cli.Command{
	Name:    "explain",
	Summary: "where a request goes, and why (offline, from a fixture)",
	Usage:   explainUsage,
	Run:     runExplain,
}

func explainUsage() string {
	return cli.Usage(explainIntro, new(explainOptions).flagSet(), explainOutro)
}

const explainIntro = `usage: kubectl mvp explain [METHOD] PATH -f FIXTURE [flags]    offline, from an inventory fixture
       kubectl mvp explain [METHOD] PATH [-n NAMESPACE] [flags]  a running kube-mvp, through the Kubernetes API
       kubectl mvp explain [METHOD] PATH --xds-admin URL [flags] a running xds-server, at its admin port

Says where Envoy sends a request and why, in the words of the plan: the Envoy route it
matches, whether ext_proc runs, the outcome (default set, serving set, 404 from the default
set, 503), the cluster or serving set, the apiservers it may reach, the route timeout and
retries. METHOD defaults to GET; PATH is the request target as sent (percent-encoded, with
any query), e.g. /apis/batch/v1/jobs?watch=true.

The answer comes from the same code as the data plane's: the plan's per-request routes
(what extproc looks up), the Lua filter's request_class script, and the route table that
xds-server translate prints for the fixture, or, against a running kube-mvp, xds-server's
current plan and the route table it serves (its /debug/explain).
`

const explainOutro = `-o json prints one object (docs/operating.md, "kubectl mvp explain -o json").
Exit codes: 0 explained, 1 the configuration could not be built, 2 bad command line or fixture.
`

type explainOptions struct {
	file        string
	output      string
	nodeID      string
	class       string
	certificate bool
	token       bool
	dangerous   []string
	build       objects.Options
	xdsAdmin    string
	cluster     clusterAccess
}

func (o *explainOptions) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("explain")
	fs.StringVarP(&o.file, "file", "f", "", "the inventory fixture `FILE` (as xds-server translate -f)")
	fs.VarP(outputValue(&o.output), "output", "o", "output format")
	fs.StringVar(&o.nodeID, "node-id", "", "explain for the sidecar Envoy beside the apiserver `ID`")
	fs.StringVar(&o.class, "class", "", "the request `CLASS` instead of the Lua filter's (read, watch, write, long-running, upgrade)")
	fs.BoolVar(&o.certificate, "as-certificate", false, "the client presents a certificate Envoy verifies (its identity is set by Envoy: the front-proxy clusters)")
	fs.BoolVar(&o.token, "as-token", false, "the client sends a bearer token (the default)")
	fs.StringArrayVar(&o.dangerous, "dangerous-apiserver", nil,
		"explain as if extproc had found the apiserver `ID=REASON` taking the proxy certificate for an ordinary client's (as xds-server translate); repeatable")
	fs.StringVar(&o.xdsAdmin, "xds-admin", "", "without -f: xds-server's admin `URL`, e.g. http://127.0.0.1:9100")
	o.cluster.addFlags(fs, "without -f and --xds-admin")
	fs.Var(cli.NewValue(&o.build.Now, time.Time{}, "RFC3339", cli.Time), "now", "judge Lease liveness at this time (default: every Lease is live)")
	fs.Var(cli.NewValue(&o.build.LivenessWindow, objects.DefaultLivenessWindow, "DURATION", cli.Duration(1, "a positive duration, e.g. 30s")),
		"liveness-window", "how recent a live Lease's renewal is")
	return fs
}

func runExplain(args []string, stdout, stderr io.Writer) int {
	var o explainOptions
	fs := cli.WithHelp(o.flagSet())
	var req explain.Request
	err := fs.Parse(args)
	if help, _ := fs.GetBool("help"); help {
		err = pflag.ErrHelp
	}
	if err == nil {
		switch pos := fs.Args(); len(pos) {
		case 1:
			req.Method, req.Target = "GET", pos[0]
		case 2:
			req.Method, req.Target = strings.ToUpper(pos[0]), pos[1]
		default:
			err = errors.New("want [METHOD] PATH, e.g. GET /apis/batch/v1/jobs")
		}
	}
	switch {
	case err != nil:
	case o.file != "" && o.xdsAdmin != "":
		err = errors.New("-f FIXTURE and --xds-admin exclude each other: a fixture, or a running xds-server")
	case o.file == "" && (fs.Changed("now") || fs.Changed("liveness-window") || len(o.dangerous) > 0):
		err = errors.New("--now, --liveness-window and --dangerous-apiserver go with -f FIXTURE: a running xds-server judges for itself")
	case o.certificate && o.token:
		err = errors.New("--as-certificate and --as-token exclude each other")
	case !strings.HasPrefix(req.Target, "/"):
		err = fmt.Errorf("PATH %q must start with /", req.Target)
	}
	if code, ok := cli.Done("kubectl mvp explain", err, explainUsage, stdout, stderr); !ok {
		return code
	}
	req.Certificate, req.Class = o.certificate, o.class
	if o.file == "" {
		x, err := explainRunning(o, req)
		if err != nil {
			fmt.Fprintf(stderr, "kubectl mvp explain: %v\n", err)
			return 1
		}
		return printExplanation(x, o.output, stdout)
	}

	d := map[string]string{}
	for _, f := range o.dangerous {
		id, reason, ok := strings.Cut(f, "=")
		if !ok || id == "" || reason == "" {
			fmt.Fprintf(stderr, "kubectl mvp explain: --dangerous-apiserver %q: want ID=REASON\n", f)
			return 2
		}
		d[id] = reason
	}
	topo, warnings, err := objects.LoadFixtureTopology(o.file, objects.FixtureView{Build: o.build, LocalID: o.nodeID, Dangerous: d})
	for _, w := range warnings {
		fmt.Fprintln(stderr, "warning: "+w)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mvp explain: %v\n", err)
		return 2
	}
	p, err := plan.Build(topo)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mvp explain: %v\n", err)
		return 1
	}
	e, err := explain.New(p, snapshot.Config{Secrets: explain.SecretsAssumed})
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mvp explain: %v\n", err)
		return 1
	}
	x, err := e.Explain(req)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mvp explain: %v\n", err)
		return 1
	}
	return printExplanation(x, o.output, stdout)
}

func printExplanation(x *explain.Explanation, output string, stdout io.Writer) int {
	if !printStructured(stdout, x, output) {
		explain.Write(stdout, x)
	}
	return 0
}

// explainRunning asks a running xds-server's /debug/explain, at --xds-admin or through the
// Kubernetes API.
func explainRunning(o explainOptions, req explain.Request) (*explain.Explanation, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, admin := &http.Client{}, o.xdsAdmin
	if admin == "" {
		cfg, ns, err := o.cluster.restConfig()
		if err != nil {
			return nil, err
		}
		var replicas []opstatus.Target
		if client, replicas, _, _, err = targets(ctx, cfg, ns); err != nil {
			return nil, err
		}
		admin = replicas[0].URL // every replica decides alike: any one explains
	}
	q := url.Values{"method": {req.Method}, "path": {req.Target}}
	if req.Certificate {
		q.Set("certificate", "true")
	}
	if req.Class != "" {
		q.Set("class", req.Class)
	}
	if o.nodeID != "" {
		q.Set("local", o.nodeID)
	}
	u := strings.TrimSuffix(admin, "/") + "/debug/explain?" + q.Encode()
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("xds-server's admin at %s does not answer: %w (is xds-server running, and is this its --admin-address?)", admin, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && !strings.Contains(string(body), "sidecar plan"):
		return nil, fmt.Errorf("xds-server at %s has no /debug/explain: an older xds-server (explain a fixture with -f instead)", admin)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, fmt.Errorf("xds-server's admin at %s answered %d (through the Kubernetes API: you need get on pods/proxy in its namespace): %s", admin, resp.StatusCode, strings.TrimSpace(string(body)))
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("xds-server's /debug/explain answered %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var x explain.Explanation
	if err := json.Unmarshal(body, &x); err != nil {
		return nil, fmt.Errorf("xds-server's /debug/explain: %w", err)
	}
	return &x, nil
}
