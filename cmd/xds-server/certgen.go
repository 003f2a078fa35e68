package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	cluster.StringVar(&o.namespace, "namespace", "", "namespace of the Secrets, `NS` (required)")
	cluster.StringVar(&o.caSecret, "ca-secret", "", "the CA's Secret `NAME`, type Opaque (required): ca.crt and ca.key (the signing CA), ca-bundle.crt (every trusted CA), next-ca.crt and next-ca.key (only while a rotation waits)")
	cluster.StringVar(&o.secretList, "secret", "", "the roles to keep and their Secrets, `ROLE=NAME,...`, type kubernetes.io/tls: tls.crt, tls.key, ca.crt (the trust bundle) (required)")
	cluster.StringVar(&o.labelList, "labels", "", "extra labels on the Secrets, `KEY=VALUE,...` (they always get "+managedByKey+"="+managedByValue+")")
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

// managedByLabel marks the Secrets certgen keeps.
const (
	managedByKey   = "app.kubernetes.io/managed-by"
	managedByValue = "kube-mvp-certgen"
)

// roleSecret is a role and the Secret that holds its certificate.
type roleSecret struct {
	role cptls.Role
	name string
}

type certgenOptions struct {
	// Cluster mode.
	rest      *rest.Config
	namespace string
	caSecret  string
	secrets   []roleSecret
	labels    map[string]string
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
		if opts.namespace == "" {
			bad("--namespace is required: the namespace of the Secrets (or --out-dir DIR for files)")
		} else if msgs := validation.IsDNS1123Label(opts.namespace); len(msgs) > 0 {
			bad("--namespace %q: %s", opts.namespace, strings.Join(msgs, "; "))
		}
		if opts.caSecret == "" {
			bad("--ca-secret is required: the Secret holding the CA (created when missing)")
		} else if msgs := validation.IsDNS1123Subdomain(opts.caSecret); len(msgs) > 0 {
			bad("--ca-secret %q: %s", opts.caSecret, strings.Join(msgs, "; "))
		}
		used := map[string]string{opts.caSecret: "--ca-secret"}
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
			opts.secrets = append(opts.secrets, roleSecret{r, secret})
		}
		opts.labels = map[string]string{}
		for _, pair := range splitList(opts.labelList) {
			k, val, ok := strings.Cut(pair, "=")
			switch {
			case !ok:
				bad("--labels: %q is not KEY=VALUE", pair)
			case k == managedByKey:
				bad("--labels: %s is always %s; leave it out", managedByKey, managedByValue)
			case len(validation.IsQualifiedName(k)) > 0:
				bad("--labels: %q is not a label key: %s", k, strings.Join(validation.IsQualifiedName(k), "; "))
			case len(validation.IsValidLabelValue(val)) > 0:
				bad("--labels %s: %q is not a label value: %s", k, val, strings.Join(validation.IsValidLabelValue(val), "; "))
			default:
				opts.labels[k] = val
			}
		}
	}

	dns := splitList(opts.dnsList)
	hasDNS := fs.Changed("dns-names")
	keepsServer := slices.Contains(roles, cptls.RoleXDSServer)
	switch {
	case keepsServer && len(dns) == 0:
		bad("--dns-names is required for the xds-server certificate: the names Envoy and extproc dial, e.g. kmvp-xds-server.kube-mvp.svc")
	case !keepsServer && hasDNS && (isLocal || len(opts.secrets) > 0):
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

// errBadSecret is a Secret certgen must not touch (wrong type): exit code 2.
var errBadSecret = errors.New("bad Secret")

// runCertgen runs the command at now() and returns the exit code.
func runCertgen(ctx context.Context, args []string, stdout, stderr io.Writer, now func() time.Time) int {
	opts, err := parseCertgen(args)
	if code, ok := cli.Done("xds-server certgen", err, certgenUsage, stdout, stderr); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	var summary string
	if opts.outDir != "" {
		summary, err = certgenFiles(opts, now(), log)
	} else {
		summary, err = certgenSecrets(ctx, opts, now(), log)
	}
	if err != nil {
		log.Error("certgen failed", "error", err)
		if errors.Is(err, errBadSecret) {
			return 2
		}
		return 1
	}
	fmt.Fprintln(stdout, summary)
	return 0
}

func logChanges(log *slog.Logger, changes []certgen.Change) {
	for _, c := range changes {
		log.Info(c.What+" "+c.Action, "reason", c.Reason)
	}
	if len(changes) == 0 {
		log.Info("nothing due: every certificate and trust bundle is current")
	}
}

// certgenSecrets keeps the Secrets: reads them, renews, writes what changed (the CA Secret
// first: a certificate is never stored without the CA that signed it).
func certgenSecrets(ctx context.Context, opts certgenOptions, now time.Time, log *slog.Logger) (string, error) {
	hc, err := inventory.NoRedirectClient(opts.rest)
	if err != nil {
		return "", fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfigAndClient(opts.rest, hc)
	if err != nil {
		return "", fmt.Errorf("--kubeconfig: %w", err)
	}
	secrets := client.CoreV1().Secrets(opts.namespace)
	get := func(name string, typ corev1.SecretType) (*corev1.Secret, error) {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("reading Secret %s/%s: %w%s", opts.namespace, name, err, rbacHint(err, "get"))
		case s.Type != typ:
			return nil, fmt.Errorf("%w: Secret %s/%s has type %s, want %s (the type cannot be changed: delete the Secret and run again, or name another one)",
				errBadSecret, opts.namespace, name, s.Type, typ)
		}
		return s, nil
	}

	var cur certgen.State
	caSecret, err := get(opts.caSecret, corev1.SecretTypeOpaque)
	if err != nil {
		return "", err
	}
	if caSecret != nil {
		cur.SetCAData(caSecret.Data)
		if renewRequested(caSecret) {
			cur.RenewAllRequest = fmt.Sprintf("annotation %s on Secret %s/%s: every role's certificate", certgen.RenewAnnotation, opts.namespace, opts.caSecret)
		}
	}
	cur.Leaves = map[cptls.Role]certgen.Leaf{}
	roleSecrets := map[cptls.Role]*corev1.Secret{}
	for _, rs := range opts.secrets {
		s, err := get(rs.name, corev1.SecretTypeTLS)
		if err != nil {
			return "", err
		}
		if s != nil {
			roleSecrets[rs.role] = s
			leaf := certgen.LeafFromData(s.Data)
			if renewRequested(s) {
				leaf.RenewRequest = "annotation " + certgen.RenewAnnotation
			}
			cur.Leaves[rs.role] = leaf
		}
	}

	next, changes, err := certgen.Renew(now, cur, opts.specs, opts.policy)
	if err != nil {
		return "", err
	}
	logChanges(log, changes)

	// written is what was done to each Secret: "created" or "updated" (the CA Secret may be
	// updated twice: its data, then its renewal request).
	written := map[string]string{}
	// write stores data under keys in Secret name (old: as read, nil if missing) and, with
	// clearRequest, removes its renewal request; it returns the Secret as stored.
	write := func(name string, old *corev1.Secret, typ corev1.SecretType, keys []string, data map[string][]byte, clearRequest bool) (*corev1.Secret, error) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: opts.namespace}, Type: typ}
		if old != nil {
			s = old.DeepCopy()
		}
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		var changedKeys []string
		for _, k := range keys {
			v, want := data[k]
			if have, ok := s.Data[k]; ok != want || !bytes.Equal(have, v) {
				changedKeys = append(changedKeys, k)
			}
			if want {
				s.Data[k] = v
			} else {
				delete(s.Data, k)
			}
		}
		labels := maps.Clone(opts.labels)
		labels[managedByKey] = managedByValue
		var changedLabels []string
		for k, v := range labels {
			if s.Labels[k] != v {
				changedLabels = append(changedLabels, k)
				s.Labels[k] = v
			}
		}
		slices.Sort(changedLabels)
		cleared := false
		if _, ok := s.Annotations[certgen.RenewAnnotation]; ok && clearRequest {
			delete(s.Annotations, certgen.RenewAnnotation)
			cleared = true
		}
		switch {
		case old == nil:
			stored, err := secrets.Create(ctx, s, metav1.CreateOptions{FieldManager: managedByValue})
			if err != nil {
				return nil, fmt.Errorf("creating Secret %s/%s: %w%s", opts.namespace, name, err, rbacHint(err, "create"))
			}
			written[name] = "created"
			log.Info("Secret created", "secret", opts.namespace+"/"+name, "keys", strings.Join(slices.Sorted(maps.Keys(s.Data)), ","))
			return stored, nil
		case len(changedKeys) > 0 || len(changedLabels) > 0 || cleared:
			// Update carries the resourceVersion read: a Secret changed since is a conflict.
			stored, err := secrets.Update(ctx, s, metav1.UpdateOptions{FieldManager: managedByValue})
			if err != nil {
				if apierrors.IsConflict(err) {
					return nil, fmt.Errorf("the Secret %s/%s changed since it was read (another certgen run?): nothing more was written; run again: %w", opts.namespace, name, err)
				}
				return nil, fmt.Errorf("updating Secret %s/%s: %w%s", opts.namespace, name, err, rbacHint(err, "update"))
			}
			if written[name] == "" {
				written[name] = "updated"
			}
			attrs := []any{"secret", opts.namespace + "/" + name, "keys", strings.Join(changedKeys, ","), "labels", strings.Join(changedLabels, ",")}
			if cleared {
				attrs = append(attrs, "annotation removed", certgen.RenewAnnotation)
			}
			log.Info("Secret updated", attrs...)
			return stored, nil
		}
		return old, nil
	}
	// The CA Secret's renewal request is removed last, once every role's certificate is
	// stored: a run that fails before leaves it for the next run.
	stored, err := write(opts.caSecret, caSecret, corev1.SecretTypeOpaque, certgen.CAKeys, next.CAData(), false)
	if err != nil {
		return "", err
	}
	for _, rs := range opts.secrets {
		if _, err := write(rs.name, roleSecrets[rs.role], corev1.SecretTypeTLS, certgen.LeafKeys, next.Leaves[rs.role].Data(), true); err != nil {
			return "", err
		}
	}
	if renewRequested(stored) {
		if _, err := write(opts.caSecret, stored, corev1.SecretTypeOpaque, certgen.CAKeys, next.CAData(), true); err != nil {
			return "", err
		}
	}
	var created, updated, unchanged int
	for _, name := range append([]string{opts.caSecret}, secretNames(opts.secrets)...) {
		switch written[name] {
		case "created":
			created++
		case "updated":
			updated++
		default:
			unchanged++
		}
	}
	return fmt.Sprintf("certgen: %d change(s); Secrets in %s: %d created, %d updated, %d unchanged", len(changes), opts.namespace, created, updated, unchanged), nil
}

// renewRequested reports whether s (nil: missing) asks for a renewal now: it carries the
// annotation certgen.RenewAnnotation, whatever its value.
func renewRequested(s *corev1.Secret) bool {
	if s == nil {
		return false
	}
	_, ok := s.Annotations[certgen.RenewAnnotation]
	return ok
}

func secretNames(rs []roleSecret) []string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.name
	}
	return names
}

// rbacHint says which permission is missing when err is Forbidden.
func rbacHint(err error, verb string) string {
	if !apierrors.IsForbidden(err) {
		return ""
	}
	return fmt.Sprintf(" (the caller may not %s it: certgen needs get, create and update on these Secrets; see the chart's certgen Role)", verb)
}

// certgenFiles keeps the files under opts.outDir: DIR/<CA key> and DIR/<role>/<role key>.
func certgenFiles(opts certgenOptions, now time.Time, log *slog.Logger) (string, error) {
	read := func(dir string, keys []string) (map[string][]byte, error) {
		data := map[string][]byte{}
		for _, k := range keys {
			b, err := os.ReadFile(filepath.Join(dir, k))
			switch {
			case errors.Is(err, os.ErrNotExist):
			case err != nil:
				return nil, fmt.Errorf("--out-dir: %w", err)
			default:
				data[k] = b
			}
		}
		return data, nil
	}
	var cur certgen.State
	caData, err := read(opts.outDir, certgen.CAKeys)
	if err != nil {
		return "", err
	}
	cur.SetCAData(caData)
	// A renewal request is a file certgen.RenewFile: DIR/renew for every role, DIR/ROLE/renew
	// for one.
	requested := func(dir string) (string, error) {
		path := filepath.Join(dir, certgen.RenewFile)
		_, err := os.Lstat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return "", nil
		case err != nil:
			return "", fmt.Errorf("--out-dir: %w", err)
		}
		return path, nil
	}
	allMarker, err := requested(opts.outDir)
	if err != nil {
		return "", err
	}
	if allMarker != "" {
		cur.RenewAllRequest = "file " + allMarker + ": every role's certificate"
	}
	cur.Leaves = map[cptls.Role]certgen.Leaf{}
	leafData := map[cptls.Role]map[string][]byte{}
	markers := map[cptls.Role]string{}
	for _, s := range opts.specs {
		dir := filepath.Join(opts.outDir, string(s.Role))
		d, err := read(dir, certgen.LeafKeys)
		if err != nil {
			return "", err
		}
		leafData[s.Role] = d
		if markers[s.Role], err = requested(dir); err != nil {
			return "", err
		}
		if len(d) > 0 {
			leaf := certgen.LeafFromData(d)
			if markers[s.Role] != "" {
				leaf.RenewRequest = "file " + markers[s.Role]
			}
			cur.Leaves[s.Role] = leaf
		}
	}

	next, changes, err := certgen.Renew(now, cur, opts.specs, opts.policy)
	if err != nil {
		return "", err
	}
	logChanges(log, changes)

	var written, removed int
	remove := func(path string) error {
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("--out-dir: %w", err)
		}
		removed++
		log.Info("file removed", "path", path)
		return nil
	}
	sync := func(dir string, keys []string, old, data map[string][]byte) error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("--out-dir: %w", err)
		}
		for _, k := range keys {
			path := filepath.Join(dir, k)
			v, want := data[k]
			have, had := old[k]
			switch {
			case !want && had:
				if err := remove(path); err != nil {
					return err
				}
			case want && (!had || !bytes.Equal(have, v)):
				mode := os.FileMode(0o644)
				if certgen.IsPrivateKey(k) {
					mode = 0o600
				}
				if err := writeFileAtomic(path, v, mode); err != nil {
					return fmt.Errorf("--out-dir: %w", err)
				}
				written++
				log.Info("file written", "path", path)
			}
		}
		return nil
	}
	if err := sync(opts.outDir, certgen.CAKeys, caData, next.CAData()); err != nil {
		return "", err
	}
	for _, s := range opts.specs {
		dir := filepath.Join(opts.outDir, string(s.Role))
		if err := sync(dir, certgen.LeafKeys, leafData[s.Role], next.Leaves[s.Role].Data()); err != nil {
			return "", err
		}
		// The request is carried out: its file goes (DIR/renew last, after every role's).
		if m := markers[s.Role]; m != "" {
			if err := remove(m); err != nil {
				return "", err
			}
		}
	}
	if allMarker != "" {
		if err := remove(allMarker); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("certgen: %d change(s); files in %s: %d written, %d removed", len(changes), opts.outDir, written, removed), nil
}

// writeFileAtomic replaces path with data by a rename, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename: nothing to remove
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
