package cli

import (
	"fmt"
	"io"
	"strings"
)

// Command is one subcommand of a Program. Run gets the arguments after the command's name and
// returns the exit code; Usage is its help text.
type Command struct {
	Name    string
	Summary string
	Usage   func() string
	Run     func(args []string, stdout, stderr io.Writer) int
}

// Program is a binary made of subcommands (xds-server, kubectl mvp): it dispatches on the
// first argument and answers help, -h, --help and --version the same way in each.
type Program struct {
	Name     string     // as typed: "xds-server", "kubectl mvp"
	About    string     // one line on what it is
	Commands []*Command // in the order the usage lists them
	Version  *Command   // run by --version
}

// Usage lists the commands.
func (p Program) Usage() string {
	width := len("help")
	for _, c := range p.Commands {
		width = max(width, len(c.Name))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s COMMAND [flags]\n\n%s\n\ncommands:\n", p.Name, p.About)
	for _, c := range p.Commands {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, c.Name, c.Summary)
	}
	fmt.Fprintf(&b, "  %-*s  %s\n\nRun %s COMMAND --help for a command's flags.\n", width, "help", "this text, or help COMMAND for a command's flags", p.Name)
	return b.String()
}

func (p Program) find(name string) *Command {
	for _, c := range p.Commands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Run runs the command args name: 2 and the usage for none or an unknown one.
func (p Program) Run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, p.Usage())
		return 2
	}
	switch name := args[0]; name {
	case "help", "-h", "-help", "--help":
		if len(args) == 1 {
			fmt.Fprint(stdout, p.Usage())
			return 0
		}
		if c := p.find(args[1]); c != nil {
			fmt.Fprint(stdout, c.Usage())
			return 0
		}
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", p.Name, args[1], p.Usage())
		return 2
	case "-version", "--version":
		return p.Version.Run(args[1:], stdout, stderr)
	default:
		c := p.find(name)
		if c == nil {
			fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", p.Name, name, p.Usage())
			return 2
		}
		return c.Run(args[1:], stdout, stderr)
	}
}
