package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/certgen"
	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/inventory"
)

var certgenCommand = &cli.Command{
	Name:    "certgen",
	Summary: "make and renew the control plane's CA and role certificates (Secrets or files)",
	Usage:   certgenUsage,
	Run: untilSignal(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return runCertgen(ctx, args, stdout, stderr, time.Now)
	}),
}

const certgenIntro = `usage: xds-server certgen --namespace NS --ca-secret NAME --secret ROLE=NAME,... [flags]
       xds-server certgen --out-dir DIR [flags]

Makes the control plane's own CA and a certificate per role for mutual TLS on xds-server's gRPC
port, and renews them: run it again any time (a Job at install/upgrade, a CronJob daily); a
run with nothing due changes nothing. What it does is logged with the reason; no key material
is printed. Rules (internal/certgen): a certificate is re-issued when missing, damaged, not
from the signing CA, not naming what is wanted, or with less than 1/3 of its lifetime left. A
CA with less than 1/3 left is rotated without an outage: a next CA joins every trust bundle,
signs once it has been there longer than --propagation-delay, and the old CA stays trusted
until it expires.

To renew now, before it is due (e.g. a key may have leaked), annotate a role's Secret with
kube-mvp.io/renew (any value), or the CA Secret to renew every role's certificate (from the
same CA: this is not a CA rotation), and run certgen; it removes the annotation once the new
certificates are written. With --out-dir, create the file DIR/ROLE/renew, or DIR/renew for
every role; it is removed the same way.

Roles: xds-server (server), envoy-front, envoy-sidecar, extproc (clients).
`

const certgenOutro = `Durations are Go durations (90m, 24h) or whole days (365d). Lists are comma-separated; give a
list flag once. Exit codes: 0 done (changed or not), 1 the work failed (an API error, or a
Secret changed meanwhile: run again), 2 bad command line or Secret of the wrong type.
`

func certgenUsage() string {
	cluster, local, both := new(certgenOptions).flagSets()
	return certgenIntro + "\nIn a cluster (Secrets; needs get, create and update on them):\n" + cli.Flags(cluster) +
		"In a directory (files, for local runs and tests):\n" + cli.Flags(local) +
		"Both:\n" + cli.Flags(cli.WithHelp(both)) + "\n" + certgenOutro
}

// flagSets defines certgen's flags on o, with their defaults: for Secrets, for files, for both.
func (o *certgenOptions) flagSets() (cluster, local, both *pflag.FlagSet) {
	cluster, local, both = cli.NewFlagSet("cluster"), cli.NewFlagSet("local"), cli.NewFlagSet("certgen")
	cluster.StringVar(&o.kubeconfig, "kubeconfig", "", "the cluster, a kubeconfig `FILE` (default: in-cluster, then $KUBECONFIG)")
	cluster.StringVar(&o.secrets.Namespace, "namespace", "", "namespace of the Secrets, `NS` (required)")
	cluster.StringVar(&o.secrets.CASecret, "ca-secret", "", "the CA's Secret `NAME`, type Opaque (required): ca.crt, ca.key, ca-bundle.crt, and next-ca.crt and next-ca.key while a rotation waits")
	cluster.StringVar(&o.secretList, "secret", "", "the roles to keep and their Secrets, `ROLE=NAME,...`, type kubernetes.io/tls: tls.crt, tls.key, ca.crt (the trust bundle) (required)")
	cluster.StringVar(&o.labelList, "labels", "", "extra labels on the Secrets, `KEY=VALUE,...` (they always get "+certgen.ManagedByKey+"="+certgen.ManagedByValue+")")
	local.StringVar(&o.outDir, "out-dir", "", "`DIR`/ca.crt, ca.key, ca-bundle.crt (next-ca.* during a rotation) and DIR/ROLE/tls.crt, tls.key, ca.crt; keys are mode 0600")
	local.StringVar(&o.roleList, "roles", "", "the roles to keep, a `LIST` (default: all four)")
	both.StringVar(&o.dnsList, "dns-names", "", "DNS names of the xds-server certificate, a `LIST`: the names Envoy and extproc dial (required when xds-server is kept)")
	def := certgen.DefaultPolicy()
	for _, f := range []struct {
		p     *time.Duration
		def   time.Duration
		name  string
		usage string
	}{
		{&o.policy.CALifetime, def.CALifetime, "ca-lifetime", "validity of a new CA"},
		{&o.policy.CertLifetime, def.CertLifetime, "cert-lifetime", "validity of a new role certificate"},
		{&o.policy.PropagationDelay, def.PropagationDelay, "propagation-delay", "how long a next CA is trusted before it signs: longer than kubelet takes to update every pod's Secret"},
	} {
		v := cli.NewValue(f.p, f.def, "DURATION", parseLifetime)
		v.Format = formatLifetime
		both.Var(v, f.name, f.usage)
	}
	return cluster, local, both
}

type certgenOptions struct {
	// Cluster mode.
	rest    *rest.Config
	secrets certgen.Secrets
	// Local mode.
	outDir string
	// Both.
	specs  []certgen.Spec
	policy certgen.Policy

	// Flags read into the above after parsing.
	kubeconfig, secretList, labelList, roleList, dnsList string
}

// policyFlags names the flag behind each certgen.Policy field.
var policyFlags = map[string]string{
	"CALifetime":       "--ca-lifetime",
	"CertLifetime":     "--cert-lifetime",
	"PropagationDelay": "--propagation-delay",
}

// parseLifetime reads a Go duration or a whole number of days ("365d").
func parseLifetime(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 || days > 100*365 {
			return 0, errors.New("is not whole days, e.g. 365d")
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("is not a duration such as 24h or a number of days such as 365d")
	}
	return d, nil
}

// formatLifetime writes whole days as such ("365d").
func formatLifetime(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// parseCertgen validates the whole command line and reports every problem at once, each
// naming its flag.
func parseCertgen(args []string) (certgenOptions, error) {
	var opts certgenOptions
	cluster, local, fs := opts.flagSets()
	fs.AddFlagSet(cluster)
	fs.AddFlagSet(local)
	errs, stop := cli.Parse(fs, args)
	if stop != nil {
		return opts, stop
	}
	bad := func(format string, a ...any) { errs = multierror.Append(errs, fmt.Errorf(format, a...)) }

	for _, err := range opts.policy.Validate() {
		var pe *certgen.PolicyError
		if errors.As(err, &pe) {
			bad("%s %s", policyFlags[pe.Field], pe.Msg)
		}
	}

	isLocal := fs.Changed("out-dir")
	var clusterFlags []string
	cluster.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			clusterFlags = append(clusterFlags, "--"+f.Name)
		}
	})
	var roles []cptls.Role
	switch {
	case isLocal && len(clusterFlags) > 0:
		bad("--out-dir writes files; %s are for Secrets: give one or the other", strings.Join(clusterFlags, ", "))
	case isLocal:
		if opts.outDir == "" {
			bad("--out-dir needs a directory")
		}
		roles = slices.Clone(cptls.Roles)
		if v := opts.roleList; fs.Changed("roles") {
			roles = nil
			for _, name := range splitList(v) {
				r, err := cptls.ParseRole(name)
				if err != nil {
					bad("--roles: %v", err)
					continue
				}
				if slices.Contains(roles, r) {
					bad("--roles: %s is listed twice", r)
					continue
				}
				roles = append(roles, r)
			}
			if len(roles) == 0 && len(splitList(v)) == 0 {
				bad("--roles needs at least one role (%s)", roleNames())
			}
		}
	default:
		if fs.Changed("roles") {
			bad("--roles is for --out-dir; in a cluster --secret ROLE=NAME names the roles")
		}
		if opts.secrets.Namespace == "" {
			bad("--namespace is required: the namespace of the Secrets (or --out-dir DIR for files)")
		} else if msgs := validation.IsDNS1123Label(opts.secrets.Namespace); len(msgs) > 0 {
			bad("--namespace %q: %s", opts.secrets.Namespace, strings.Join(msgs, "; "))
		}
		if opts.secrets.CASecret == "" {
			bad("--ca-secret is required: the Secret holding the CA (created when missing)")
		} else if msgs := validation.IsDNS1123Subdomain(opts.secrets.CASecret); len(msgs) > 0 {
			bad("--ca-secret %q: %s", opts.secrets.CASecret, strings.Join(msgs, "; "))
		}
		used := map[string]string{opts.secrets.CASecret: "--ca-secret"}
		v := opts.secretList
		if len(splitList(v)) == 0 {
			bad("--secret ROLE=NAME,... is required: the roles to keep and their Secrets (roles: %s)", roleNames())
		}
		for _, pair := range splitList(v) {
			name, secret, ok := strings.Cut(pair, "=")
			if !ok || secret == "" {
				bad("--secret: %q is not ROLE=SECRET-NAME", pair)
				continue
			}
			r, err := cptls.ParseRole(name)
			if err != nil {
				bad("--secret: %v", err)
				continue
			}
			if msgs := validation.IsDNS1123Subdomain(secret); len(msgs) > 0 {
				bad("--secret %s: %q is not a Secret name: %s", r, secret, strings.Join(msgs, "; "))
				continue
			}
			if slices.Contains(roles, r) {
				bad("--secret: role %s is listed twice", r)
				continue
			}
			if other, dup := used[secret]; dup {
				bad("--secret %s=%s: that Secret is already %s; each role needs its own Secret", r, secret, other)
				continue
			}
			used[secret] = "--secret " + string(r)
			roles = append(roles, r)
			opts.secrets.Roles = append(opts.secrets.Roles, certgen.RoleSecret{Role: r, Name: secret})
		}
		opts.secrets.Labels = map[string]string{}
		for _, pair := range splitList(opts.labelList) {
			k, val, ok := strings.Cut(pair, "=")
			switch {
			case !ok:
				bad("--labels: %q is not KEY=VALUE", pair)
			case k == certgen.ManagedByKey:
				bad("--labels: %s is always %s; leave it out", certgen.ManagedByKey, certgen.ManagedByValue)
			case len(validation.IsQualifiedName(k)) > 0:
				bad("--labels: %q is not a label key: %s", k, strings.Join(validation.IsQualifiedName(k), "; "))
			case len(validation.IsValidLabelValue(val)) > 0:
				bad("--labels %s: %q is not a label value: %s", k, val, strings.Join(validation.IsValidLabelValue(val), "; "))
			default:
				opts.secrets.Labels[k] = val
			}
		}
	}

	dns := splitList(opts.dnsList)
	hasDNS := fs.Changed("dns-names")
	keepsServer := slices.Contains(roles, cptls.RoleXDSServer)
	switch {
	case keepsServer && len(dns) == 0:
		bad("--dns-names is required for the xds-server certificate: the names Envoy and extproc dial, e.g. kmvp-xds-server.kube-mvp.svc")
	case !keepsServer && hasDNS && (isLocal || len(opts.secrets.Roles) > 0):
		bad("--dns-names: only the xds-server certificate has DNS names, and xds-server is not among the roles kept")
	}
	for _, r := range roles {
		s := certgen.Spec{Role: r}
		if r == cptls.RoleXDSServer {
			s.DNSNames = dns
		}
		opts.specs = append(opts.specs, s)
	}
	for _, err := range certgen.ValidateSpecs(opts.specs) {
		bad("--dns-names: %v", err)
	}

	if errs == nil && !isLocal {
		var err error
		if opts.rest, err = clusterConfig(opts.kubeconfig); err != nil {
			bad("--kubeconfig: %v", err)
		}
	}
	return opts, cli.Err(errs)
}

func roleNames() string {
	names := make([]string, len(cptls.Roles))
	for i, r := range cptls.Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// runCertgen runs the command at now() and returns the exit code.
func runCertgen(ctx context.Context, args []string, stdout, stderr io.Writer, now func() time.Time) int {
	opts, err := parseCertgen(args)
	if code, ok := cli.Done("xds-server certgen", err, certgenUsage, stdout, stderr); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	var summary string
	if opts.outDir != "" {
		summary, err = certgen.KeepFiles(certgen.Files{Dir: opts.outDir, Name: "--out-dir"}, opts.specs, opts.policy, now(), log)
	} else {
		summary, err = certgenSecrets(ctx, opts, now(), log)
	}
	if err != nil {
		log.Error("certgen failed", "error", err)
		if errors.Is(err, certgen.ErrBadSecret) {
			return 2
		}
		return 1
	}
	fmt.Fprintln(stdout, summary)
	return 0
}

// certgenSecrets keeps the Secrets (certgen.KeepSecrets) through the cluster's API.
func certgenSecrets(ctx context.Context, opts certgenOptions, now time.Time, log *slog.Logger) (string, error) {
	hc, err := inventory.NoRedirectClient(opts.rest)
	if err != nil {
		return "", fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfigAndClient(opts.rest, hc)
	if err != nil {
		return "", fmt.Errorf("--kubeconfig: %w", err)
	}
	return certgen.KeepSecrets(ctx, client, opts.secrets, opts.specs, opts.policy, now, log)
}
