// Command kubectl-mvp is the operator's view of kube-mvp, as a kubectl plugin (kubectl mvp):
//
//	kubectl mvp explain [METHOD] PATH -f FIXTURE [flags]   where a request goes, and why
//	kubectl mvp status --xds-admin URL [--extproc-admin URL] what the running processes see
//	kubectl mvp config-dump [--xds-admin URL --envoy-admin URL] each Envoy's applied
//	                                                         configuration against xds-server's
//	kubectl mvp help [COMMAND]
//	kubectl mvp version
//
// Exit codes: 0 success, 1 the work failed (a process did not answer), 2 bad input.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kube-mvp/kube-mvp/internal/cli"
	"github.com/kube-mvp/kube-mvp/internal/version"
)

// program is the plugin's subcommands, in the order its usage lists them.
var program = cli.Program{
	Name:     "kubectl mvp",
	About:    "The operator's view of kube-mvp.",
	Commands: []*cli.Command{explainCommand, statusCommand, configDumpCommand, versionCommand},
	Version:  versionCommand,
}

var versionCommand = &cli.Command{
	Name:    "version",
	Summary: "print the version",
	Usage:   func() string { return "usage: kubectl mvp version\n" },
	Run: func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, version.String("kubectl-mvp"))
		return 0
	},
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is main with its inputs and outputs made explicit; it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int { return program.Run(args, stdout, stderr) }
