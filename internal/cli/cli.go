// Package cli is the command-line convention of kube-mvp's binaries, on spf13/pflag: a bad
// command line gets every problem reported at once, each naming its flag and what to fix, and
// a usage text made from the flag definitions, so that each default is written once.
//
// It also holds how kube-mvp collects several errors, command line or not: in a
// github.com/hashicorp/go-multierror Error, printed as Err does here or as Lines does.
package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/spf13/pflag"
)

// ErrVersion is Parse's answer to --version, where the flag set defines it.
var ErrVersion = errors.New("version requested")

// NewFlagSet is a flag set that lists its flags in the order they are defined.
func NewFlagSet(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(io.Discard) // problems are returned, not printed
	return fs
}

// WithHelp adds -h/--help to fs, last, unless it has it.
func WithHelp(fs *pflag.FlagSet) *pflag.FlagSet {
	if fs.Lookup("help") == nil {
		fs.BoolP("help", "h", false, "this text")
	}
	return fs
}

// Parse reads args into fs and adds every problem to errs: unknown flags, missing values,
// values their flag's Value refuses (reported as `--name "value" ` and the Value's error),
// flags given twice (unless they take a list, such as a StringArray: each use adds to it),
// stray arguments. It stops with pflag.ErrHelp at -h/--help and with
// ErrVersion at --version.
func Parse(fs *pflag.FlagSet, args []string) (errs *multierror.Error, stop error) {
	WithHelp(fs)
	seen := map[string]bool{}
	set := func(f *pflag.Flag, value string) error {
		switch f.Name {
		case "help":
			return pflag.ErrHelp
		case "version":
			return ErrVersion
		}
		if _, list := f.Value.(pflag.SliceValue); seen[f.Name] && !list {
			errs = multierror.Append(errs, fmt.Errorf("--%s given more than once", f.Name))
		}
		seen[f.Name], f.Changed = true, true
		if err := f.Value.Set(value); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("--%s %q %v", f.Name, value, err))
		}
		return nil // go on: the next problem is reported too
	}
	// pflag stops at its first error (an unknown flag, a missing value), so it gets one
	// argument at a time, and a flag's value with it when it needs one.
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			errs = multierror.Append(errs, fmt.Errorf("unexpected argument %q: every option is a flag", a))
			continue
		}
		err := fs.ParseAll(args[i:i+1], set)
		var needsValue *pflag.ValueRequiredError
		if errors.As(err, &needsValue) && i+1 < len(args) {
			i++
			err = fs.ParseAll(args[i-1:i+1], set)
		}
		var unknown *pflag.NotExistError
		switch {
		case errors.Is(err, pflag.ErrHelp) || errors.Is(err, ErrVersion):
			return errs, err
		case errors.As(err, &unknown):
			errs = multierror.Append(errs, fmt.Errorf("unknown flag %q (known: %s)", a, known(fs)))
			if !strings.Contains(a, "=") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++ // most likely its value
			}
		case errors.As(err, &needsValue):
			errs = multierror.Append(errs, fmt.Errorf("--%s needs a value", needsValue.GetFlag().Name))
		case err != nil:
			errs = multierror.Append(errs, err)
		}
		for _, stray := range fs.Args() {
			errs = multierror.Append(errs, fmt.Errorf("unexpected argument %q: every option is a flag", stray))
		}
	}
	return errs, nil
}

func known(fs *pflag.FlagSet) string {
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" {
			names = append(names, "--"+f.Name)
		}
	})
	return strings.Join(names, ", ")
}

// Err is errs as a command line's one error: nil, or every problem on a line of its own.
func Err(errs *multierror.Error) error {
	if errs != nil {
		errs.ErrorFormat = func(es []error) string {
			lines := make([]string, len(es))
			for i, e := range es {
				lines[i] = "  - " + e.Error()
			}
			return fmt.Sprintf("%d problem(s) with the command line:\n%s", len(es), strings.Join(lines, "\n"))
		}
	}
	return errs.ErrorOrNil()
}

// Lines is a multierror.ErrorFormatFunc that prints each error on a line of its own and
// nothing else, as errors.Join does: set it as ErrorFormat where several problems are reported
// together, e.g. multierror.Append(&multierror.Error{ErrorFormat: cli.Lines}, errs...).
func Lines(es []error) string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Usage is a command's usage text: intro, fs's flags with their defaults, outro.
func Usage(intro string, fs *pflag.FlagSet, outro string) string {
	return intro + "\nflags:\n" + Flags(WithHelp(fs)) + "\n" + outro
}

// Flags lists fs's flags, each with its default.
func Flags(fs *pflag.FlagSet) string { return fs.FlagUsagesWrapped(100) }

// Done handles what parsing ended in for command (e.g. "xds-server serve"): the usage on
// stdout for help (exit 0), the problems on stderr (exit 2). ok means: run the command.
func Done(command string, err error, usage func() string, stdout, stderr io.Writer) (code int, ok bool) {
	switch {
	case errors.Is(err, pflag.ErrHelp):
		fmt.Fprint(stdout, usage())
		return 0, false
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nRun %s --help for usage.\n", command, err, command)
		return 2, false
	}
	return 0, true
}

// Value is a flag of type T whose text parse turns into a T, or refuses with an error that
// completes `--name "text" `, e.g. "is not a positive duration".
type Value[T comparable] struct {
	p      *T
	typ    string
	parse  func(string) (T, error)
	Format func(T) string // the value in the usage text; default fmt.Sprint, and nothing for the zero value
}

// NewValue stores into p, starting at def; typ names the value in the usage text (DURATION).
func NewValue[T comparable](p *T, def T, typ string, parse func(string) (T, error)) *Value[T] {
	*p = def
	return &Value[T]{p: p, typ: typ, parse: parse}
}

func (v *Value[T]) Type() string { return v.typ }

func (v *Value[T]) Set(s string) error {
	x, err := v.parse(s)
	if err == nil {
		*v.p = x
	}
	return err
}

func (v *Value[T]) String() string {
	var zero T
	switch {
	case v.p == nil || *v.p == zero:
		return ""
	case v.Format != nil:
		return v.Format(*v.p)
	}
	return fmt.Sprint(*v.p)
}

// Bool defines a boolean flag that takes only true or false (--name means --name=true).
func Bool(fs *pflag.FlagSet, p *bool, name string, def bool, usage string) {
	fs.Var(NewValue(p, def, "bool", func(s string) (bool, error) {
		if s != "true" && s != "false" {
			return false, errors.New("is not true or false")
		}
		return s == "true", nil
	}), name, usage)
	fs.Lookup(name).NoOptDefVal = "true"
}

// Duration parses a Go duration of at least min; want says what is wanted, e.g.
// "a positive duration, e.g. 30s".
func Duration(min time.Duration, want string) func(string) (time.Duration, error) {
	return func(s string) (time.Duration, error) {
		d, err := time.ParseDuration(s)
		if err != nil || d < min {
			return 0, errors.New("is not " + want)
		}
		return d, nil
	}
}

// Time parses an RFC 3339 time.
func Time(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return t, errors.New("is not an RFC 3339 time, e.g. 2026-11-23T10:00:00Z")
	}
	return t, nil
}
