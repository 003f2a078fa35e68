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
	"strings"
	"syscall"

	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/version"
)

// command is one subcommand. run gets the arguments after the subcommand's name and returns
// the exit code.
type command struct {
	name    string
	summary string
	usage   func() string
	run     func(args []string, stdout, stderr io.Writer) int
}

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

// commands lists the subcommands in the order usage shows them.
var commands = []*command{
	serveCommand,
	translateCommand,
	certgenCommand,
	versionCommand,
}

// versionCommand prints the build's version stamp (internal/version); also xds-server --version.
var versionCommand = &command{
	name:    "version",
	summary: "print the version (also --version)",
	usage: func() string {
		return "usage: xds-server version\n\nPrints the version and the commit xds-server was built from.\n"
	},
	run: func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, version.String("xds-server"))
		return 0
	},
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: xds-server COMMAND [flags]\n\nkube-mvp's Envoy control plane.\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.summary)
	}
	b.WriteString("  help       this text, or help COMMAND for a command's flags\n\nRun xds-server COMMAND --help for a command's flags.\n")
	return b.String()
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs made explicit; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	switch name := args[0]; name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c := findCommand(args[1]); c != nil {
				fmt.Fprint(stdout, c.usage())
				return 0
			}
			fmt.Fprintf(stderr, "xds-server: unknown command %q\n\n%s", args[1], usage())
			return 2
		}
		fmt.Fprint(stdout, usage())
		return 0
	case "-version", "--version":
		return versionCommand.run(args[1:], stdout, stderr)
	default:
		c := findCommand(name)
		if c == nil {
			fmt.Fprintf(stderr, "xds-server: unknown command %q\n\n%s", name, usage())
			return 2
		}
		return c.run(args[1:], stdout, stderr)
	}
}
