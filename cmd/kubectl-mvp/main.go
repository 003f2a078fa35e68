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
	"strings"

	"github.com/kube-mvp/kube-mvp/internal/version"
)

type command struct {
	name    string
	summary string
	usage   func() string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = []*command{explainCommand, statusCommand, configDumpCommand, versionCommand}

var versionCommand = &command{
	name:    "version",
	summary: "print the version",
	usage:   func() string { return "usage: kubectl mvp version\n" },
	run: func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, version.String("kubectl-mvp"))
		return 0
	},
}

func usage() string {
	var b strings.Builder
	b.WriteString("usage: kubectl mvp COMMAND [flags]\n\nThe operator's view of kube-mvp.\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-11s %s\n", c.name, c.summary)
	}
	b.WriteString("  help        this text, or help COMMAND for a command's flags\n")
	return b.String()
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	find := func(name string) *command {
		for _, c := range commands {
			if c.name == name {
				return c
			}
		}
		return nil
	}
	switch name := args[0]; name {
	case "help", "-h", "--help":
		if len(args) > 1 {
			if c := find(args[1]); c != nil {
				fmt.Fprint(stdout, c.usage())
				return 0
			}
		}
		fmt.Fprint(stdout, usage())
		return 0
	case "--version":
		return versionCommand.run(nil, stdout, stderr)
	default:
		c := find(name)
		if c == nil {
			fmt.Fprintf(stderr, "kubectl mvp: unknown command %q\n\n%s", name, usage())
			return 2
		}
		return c.run(args[1:], stdout, stderr)
	}
}
