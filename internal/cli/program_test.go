package cli

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestProgram(t *testing.T) {
	echo := func(name string) *Command {
		return &Command{Name: name, Summary: "the " + name + " command", Usage: func() string { return "usage of " + name + "\n" },
			Run: func(args []string, stdout, _ io.Writer) int { fmt.Fprintf(stdout, "%s %q", name, args); return 7 }}
	}
	p := Program{Name: "tool", About: "A tool.", Commands: []*Command{echo("serve"), echo("config-dump")}, Version: echo("version")}
	for _, c := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{nil, 2, "", "usage: tool COMMAND"},
		{[]string{"serve", "-x"}, 7, `serve ["-x"]`, ""},
		{[]string{"--version"}, 7, `version []`, ""},
		{[]string{"help"}, 0, "  config-dump  the config-dump command\n  help         this text", ""},
		{[]string{"--help", "serve"}, 0, "usage of serve", ""},
		{[]string{"help", "nope"}, 2, "", `tool: unknown command "nope"`},
		{[]string{"nope"}, 2, "", `tool: unknown command "nope"`},
	} {
		var stdout, stderr bytes.Buffer
		code := p.Run(c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.stderr) ||
			(c.stdout == "" && stdout.Len() > 0) || (c.stderr == "" && stderr.Len() > 0) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, stdout.String(), stderr.String(), c.code, c.stdout, c.stderr)
		}
	}
}
