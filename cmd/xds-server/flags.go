package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/go-multierror"
)

// flagSpec declares one flag of a subcommand: --name VALUE, --name=VALUE, and with a short
// name also -s VALUE and -s=VALUE. A boolean flag takes no value.
type flagSpec struct {
	name    string
	short   string
	boolean bool
}

// errHelp asks for the usage text.
var errHelp = errors.New("help requested")

// parseFlags reads args against specs and returns the given values by long name. It reports
// every problem at once (unknown flags, missing values, repeated flags, stray arguments);
// -h/--help anywhere returns errHelp.
func parseFlags(specs []flagSpec, args []string) (map[string]string, *multierror.Error) {
	var errs *multierror.Error
	values := map[string]string{}
	lookup := func(n string) *flagSpec {
		for i := range specs {
			if specs[i].name == n || (specs[i].short != "" && specs[i].short == n) {
				return &specs[i]
			}
		}
		return nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-h" || a == "-help" || a == "--help" {
			return nil, multierror.Append(nil, errHelp)
		}
		if a == "-" || a == "--" || !strings.HasPrefix(a, "-") {
			errs = multierror.Append(errs, fmt.Errorf("unexpected argument %q: every option is a flag", a))
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		spec := lookup(name)
		if spec == nil {
			var known []string
			for _, s := range specs {
				known = append(known, "--"+s.name)
			}
			errs = multierror.Append(errs, fmt.Errorf("unknown flag %q (known: %s)", a, strings.Join(known, ", ")))
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++ // most likely its value
			}
			continue
		}
		switch {
		case spec.boolean && !hasValue:
			value = "true"
		case spec.boolean && !slices.Contains([]string{"true", "false"}, value):
			errs = multierror.Append(errs, fmt.Errorf("--%s=%q: want true or false", spec.name, value))
			continue
		case !hasValue:
			if i+1 == len(args) {
				errs = multierror.Append(errs, fmt.Errorf("--%s needs a value", spec.name))
				continue
			}
			i++
			value = args[i]
		}
		if _, seen := values[spec.name]; seen {
			errs = multierror.Append(errs, fmt.Errorf("--%s given more than once", spec.name))
		}
		values[spec.name] = value
	}
	return values, errs
}

// listErrors formats a multierror as one problem per line.
func listErrors(errs []error) string {
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = "  - " + e.Error()
	}
	return fmt.Sprintf("%d problem(s) with the command line:\n%s", len(errs), strings.Join(lines, "\n"))
}
