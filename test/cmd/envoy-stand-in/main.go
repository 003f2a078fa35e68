// Command envoy-stand-in is kube-mvp's TEST stand-in for Envoy: it takes Envoy's command line
// as the Helm chart (deploy/kube-mvp/templates/envoy.yaml) writes it, reads the chart's
// bootstrap ConfigMap and SDS files unchanged, and runs the test data plane (test/dataplane)
// until SIGTERM. It is for tests only (test/node/standin builds its image,
// kube-mvp.test/envoy-stand-in); production runs real Envoy.
//
//	envoy-stand-in -c /etc/kube-mvp/bootstrap/envoy.yaml --service-node "$POD_NAME" \
//	    --reject-unknown-dynamic-fields --service-cluster kube-mvp \
//	    [--config-yaml '{"node": {"metadata": {"kube-mvp.io/local-apiserver": "NODE"}}}'] \
//	    --disable-hot-restart --log-level info [--drain-time-s N] [--drain-strategy gradual|immediate]
//
// The flags it takes are Envoy's (any other is refused, as Envoy's parser refuses an unknown
// one), and --envoy-version 1.N[.P], the Envoy release it models; SIGTERM stops it at once, as
// Envoy's. Each flag, the signals, and why: test/dataplane/README.md#envoy-stand-in.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-mvp/kube-mvp/test/dataplane"
)

// Version is what --version prints.
const Version = "envoy-stand-in: kube-mvp's test stand-in for Envoy (test/dataplane), not Envoy"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command: 0 after SIGTERM, 1 on a bad command line or bootstrap.
func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	cl, err := dataplane.ParseCommandLine(argv)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	if cl.Version {
		fmt.Fprintln(stdout, Version)
		return 0
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cl.LogLevel}))
	opts, err := dataplane.BootstrapOptions(cl)
	if err != nil {
		// Envoy: "error initializing configuration '<path>': <reason>", exit 1.
		fmt.Fprintf(stderr, "error initializing configuration '%s': %v\n", cl.ConfigPath, err)
		return 1
	}
	opts.Logger = log
	dp, err := dataplane.Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "envoy-stand-in: %v\n", err)
		return 1
	}
	log.Info("envoy-stand-in started", "node", opts.NodeID, "admin", dp.AdminURL(), "health", dp.HealthListenerAddr())
	<-ctx.Done()
	log.Info("envoy-stand-in: shutting down")
	if err := dp.Close(); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "envoy-stand-in: %v\n", err)
		return 1
	}
	return 0
}
