// Command xds-server is kube-mvp's Envoy control plane: it turns what the control plane tells
// about its apiservers into Envoy configuration (internal/snapshot).
//
//	xds-server serve --kubeconfig FILE [flags]             watch a cluster, serve Envoy and extproc
//	xds-server translate -f FILE [-o json|yaml] [flags]   print the configuration for a fixture
//	xds-server help [COMMAND]
//	xds-server version                                     print the version (or: xds-server --version)
//
// Each subcommand has its own flags (xds-server COMMAND --help). Exit codes: 0 success, 1 the
// work failed, 2 bad input (command line, unreadable or undecodable file).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/version"
)

// untilSignal runs a long-running command with a context that SIGINT and SIGTERM end.
func untilSignal(run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) func([]string, io.Writer, io.Writer) int {
	return func(args []string, stdout, stderr io.Writer) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return run(ctx, args, stdout, stderr)
	}
}

// clusterConfig is how serve and certgen reach the cluster: in-cluster without --kubeconfig,
// with the HTTP/2 health check that bounds how long the Lease view can be stuck.
func clusterConfig(kubeconfig string) (*rest.Config, error) {
	return inventory.RESTConfig(inventory.RESTOptions{
		Kubeconfig:           kubeconfig,
		HTTP2ReadIdleTimeout: objects.HTTP2ReadIdleTimeout,
		HTTP2PingTimeout:     objects.HTTP2PingTimeout,
	})
}

// program is xds-server's subcommands, in the order its usage lists them.
var program = cli.Program{
	Name:     "xds-server",
	About:    "kube-mvp's Envoy control plane.",
	Commands: []*cli.Command{serveCommand, translateCommand, certgenCommand, versionCommand},
	Version:  versionCommand,
}

// versionCommand prints the build's version stamp (internal/version); also xds-server --version.
var versionCommand = &cli.Command{
	Name:    "version",
	Summary: "print the version (also --version)",
	Usage: func() string {
		return "usage: xds-server version\n\nPrints the version and the commit xds-server was built from.\n"
	},
	Run: func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, version.String("xds-server"))
		return 0
	},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs made explicit; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int { return program.Run(args, stdout, stderr) }
