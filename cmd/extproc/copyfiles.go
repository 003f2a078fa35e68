package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/nodepki"
)

const copyFilesIntro = `usage: extproc copy-files --file CERT --file KEY --to DIR [--interval 10s] [--group GID]
       extproc copy-files --file CERT --file KEY --to DIR --once [--wait [--interval 10s]]|--check

Publishes a certificate and its key, read from files another program rewrites in place (a
kubeadm node's /etc/kubernetes/pki/front-proxy-client.{crt,key}, root's and mode 0600), into
DIR the way the kubelet publishes a Secret volume: DIR/..<timestamp>/NAME, a ..data symlink
switched to a new generation atomically (rename), and DIR/NAME -> ..data/NAME. Envoy's
watched_directory re-reads both files on the switch. A new generation is written only when
the files changed, and only when they are a complete certificate (PEM, X.509) and the key that
matches it, the same bytes in two reads in a row: a read while kubeadm rewrites them (the
certificate renewed, the key not yet, or a file changed while read) is skipped and logged, the
last good pair stays, and the next round tries again. Each file must be a regular file of at
most 64 KiB. Certificates are published mode 0444, the key 0400 (0440 with --group).

In kube-mvp's chart (sidecar.kubeadmFrontProxyClient=true) it runs in the Envoy pod as root
with every capability dropped: root owns the node's files, so it reads them without
CAP_DAC_OVERRIDE, and Envoy and extproc read DIR as their own user through --group.
`

const copyFilesOutro = `Exit codes: --once 0 when DIR holds the pair, 1 when the files are missing, unreadable or not a
matching pair (with --wait: only when interrupted before that); --check 0 when DIR holds the files' current pair (or the files are not a good
pair now: nothing to publish), 1 otherwise; without either, runs until SIGTERM or SIGINT. 2: a
bad command line.
`

func copyFilesUsage() string {
	return cli.Usage(copyFilesIntro, new(copyFilesConfig).flagSet(), copyFilesOutro)
}

// copyFilesConfig is copy-files' command line.
type copyFilesConfig struct {
	files       []string
	to          string
	interval    time.Duration
	once, check bool
	wait        bool
	group       string
	gid         int
}

func (c *copyFilesConfig) flagSet() *pflag.FlagSet {
	fs := cli.NewFlagSet("copy-files")
	fs.StringArrayVar(&c.files, "file", nil, "a source `FILE`, given twice: the certificate and its key (which is which is read from their PEM); each is published as DIR/<its base name>")
	fs.StringVar(&c.to, "to", "", "the destination `DIR`, which must exist (an emptyDir shared with the readers)")
	fs.Var(cli.NewValue(&c.interval, 10*time.Second, "DURATION", cli.Duration(time.Second, "a duration of at least 1s")), "interval",
		"how often the files are read again: a renewal reaches DIR within this")
	cli.Bool(fs, &c.once, "once", false, "publish once and exit (an init container: the readers start only once DIR holds the pair)")
	cli.Bool(fs, &c.wait, "wait", false, "with --once: while the files cannot be published, say why and try again every --interval instead of exiting 1 (an init container that waits)")
	cli.Bool(fs, &c.check, "check", false, "publish nothing: exit 0 when DIR holds the files' current pair, 1 when not (a liveness probe of a running copy-files)")
	fs.StringVar(&c.group, "group", "", "the published files' group `GID`, the key readable by it (0440); the copier must be a member (default: its own group, the key its user's only)")
	return fs
}

func parseCopyFilesArgs(args []string) (copyFilesConfig, error) {
	return parseConfig(args, (*copyFilesConfig).validate)
}

// validate adds to errs what is wrong with the flags' values, and sets gid.
func (c *copyFilesConfig) validate(fs *pflag.FlagSet, errs *multierror.Error) *multierror.Error {
	if len(c.files) != 2 {
		errs = multierror.Append(errs, fmt.Errorf("--file: give it twice, the certificate and its key (got %d)", len(c.files)))
	} else if err := nodepki.CheckFiles(c.files); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("--file: %w", err))
	}
	if c.to == "" {
		errs = multierror.Append(errs, errors.New("--to is required: the directory the files are published in"))
	}
	if c.once && c.check {
		errs = multierror.Append(errs, errors.New("--once and --check exclude each other"))
	}
	if c.wait && !c.once {
		errs = multierror.Append(errs, errors.New("--wait applies only with --once"))
	}
	if ((c.once && !c.wait) || c.check) && fs.Changed("interval") {
		errs = multierror.Append(errs, errors.New("--interval applies only without --once and --check, or with --once --wait"))
	}
	if c.group != "" {
		n, err := strconv.Atoi(c.group)
		if err != nil || n <= 0 {
			errs = multierror.Append(errs, fmt.Errorf("--group %q is not a positive number (a GID, e.g. 65532)", c.group))
		}
		c.gid = n
	}
	return errs
}

// kubeadmHint is the end of every error about the source files: in kube-mvp's chart they
// are there because of one value.
const kubeadmHint = "kube-mvp's chart copies the node's kubeadm front-proxy-client pair because of sidecar.kubeadmFrontProxyClient=true: " +
	"on nodes without that pair (not kubeadm, or another layout), set sidecar.kubeadmFrontProxyClient=false and give certificates.proxyClientCert/proxyClientKey"

// runCopyFiles is `extproc copy-files`; it returns the exit code.
func runCopyFiles(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseCopyFilesArgs(args)
	if code, ok := cli.Done("extproc copy-files", err, copyFilesUsage, stdout, stderr); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	c := &nodepki.Copier{Files: cfg.files, Dir: cfg.to, Group: cfg.gid}
	switch {
	case cfg.check:
		note, err := c.Check()
		if err != nil {
			fmt.Fprintf(stderr, "extproc copy-files --check: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, note)
		return 0
	case cfg.once && cfg.wait:
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := c.WaitPublished(ctx, cfg.interval, log, kubeadmHint); err != nil {
			fmt.Fprintf(stderr, "extproc copy-files: %v\n", err)
			return 1
		}
		return 0
	case cfg.once:
		res, err := c.Sync()
		switch {
		case res == nodepki.Skipped:
			fmt.Fprintf(stderr, "extproc copy-files: nothing published: %v\n%s\n", err, kubeadmHint)
			return 1
		case err != nil:
			fmt.Fprintf(stderr, "extproc copy-files: %v\n", err)
			return 1
		}
		log.Info("the files are published", "result", res.String(), "files", cfg.files, "dir", cfg.to)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("copy-files running", "files", cfg.files, "dir", cfg.to, "interval", cfg.interval)
	c.Run(ctx, cfg.interval, log)
	return 0
}
