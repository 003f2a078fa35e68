package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/opstatus"
)

var statusCommand = &cli.Command{
	Name:    "status",
	Summary: "what the running xds-server and extproc see",
	Usage:   statusUsage,
	Run:     runStatus,
}

func statusUsage() string {
	return cli.Usage(statusIntro, new(statusOptions).flagSet(), statusOutro)
}

const statusIntro = `usage: kubectl mvp status [-n NAMESPACE] [flags]
       kubectl mvp status --xds-admin URL [--extproc-admin URL] [flags]

Prints each apiserver as xds-server sees it (hostname, ID, live / unverified / departed /
stale, where its capabilities came from and since when, whether it accepts the proxy
certificate), the resources not every live apiserver serves and who serves them, each Envoy
connected to xds-server (node, role, configuration version, ACK or NACK with Envoy's reason)
and, with --extproc-admin, extproc's routing table (version, age, update failures).
`

const statusOutro = `Reads xds-server's /debug/topology and /debug/syncz and extproc's /readyz and /metrics:
with --xds-admin at the URLs given (processes outside a cluster, as make demo runs them);
otherwise through the Kubernetes API's pod proxy, from every running xds-server pod (the
topology from the first; each lists the Envoys connected to it) and every Envoy pod's
extproc in the namespace, which needs list on pods and get on pods/proxy there
(the chart's rbac.operators; with its NetworkPolicy, networkPolicy.adminFrom admitting the
apiservers).
Exit codes: 0 printed, 1 xds-server's admin did not answer, 2 bad command line.
`

type statusOptions struct {
	xdsAdmin, extprocAdmin string
	adminFlags
}

func (o *statusOptions) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("status")
	fs.StringVar(&o.xdsAdmin, "xds-admin", "", "xds-server's admin `URL`, e.g. http://127.0.0.1:9100")
	fs.StringVar(&o.extprocAdmin, "extproc-admin", "", "extproc's admin `URL`, e.g. http://127.0.0.1:9002")
	o.adminFlags.addFlags(fs, 10*time.Second, "how long to wait for the admin pages")
	return fs
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	var o statusOptions
	errs, stop := cli.Parse(o.flagSet(), args)
	err := stop
	if err == nil {
		if o.xdsAdmin == "" && o.extprocAdmin != "" {
			errs = multierror.Append(errs, errors.New("--extproc-admin needs --xds-admin (without both, status finds the pods through the Kubernetes API)"))
		}
		err = cli.Err(errs)
	}
	if code, ok := cli.Done("kubectl mvp status", err, statusUsage, stdout, stderr); !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	client, replicas, extprocs := &http.Client{}, []opstatus.Target{{Name: o.xdsAdmin, URL: o.xdsAdmin}}, []opstatus.Target(nil)
	var problems []string
	if o.extprocAdmin != "" {
		extprocs = append(extprocs, opstatus.Target{Name: o.extprocAdmin, URL: o.extprocAdmin})
	}
	if o.xdsAdmin == "" {
		cfg, ns, err := o.cluster.restConfig()
		if err == nil {
			client, replicas, extprocs, problems, err = targets(ctx, cfg, ns)
		}
		if err != nil {
			fmt.Fprintf(stderr, "kubectl mvp status: %v\n", err)
			return 1
		}
	}
	pages, err := opstatus.Fetch(ctx, client, replicas, extprocs)
	if err == nil {
		pages.Problems = append(problems, pages.Problems...)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mvp status: %v\n", err)
		return 1
	}
	r := opstatus.Summarize(pages)
	if !printStructured(stdout, r, o.output) {
		opstatus.Write(stdout, r, time.Now())
	}
	return 0
}
