package cli

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func testFlags() (*pflag.FlagSet, *string, *time.Duration, *bool) {
	fs := NewFlagSet("test")
	var s string
	var d time.Duration
	var b bool
	fs.StringVarP(&s, "file", "f", "", "a `FILE`")
	fs.Var(NewValue(&d, 30*time.Second, "DURATION", Duration(time.Second, "a duration of at least 1s")), "wait", "how long")
	Bool(fs, &b, "on", true, "switch")
	return fs, &s, &d, &b
}

// TestParseEveryProblem: pflag's first error does not hide the next ones.
func TestParseEveryProblem(t *testing.T) {
	fs, _, d, b := testFlags()
	errs, stop := Parse(fs, []string{"-x", "--bogus", "val", "--wait", "1ms", "--on=no", "stray", "-f", "a", "--file=b", "--", "--file"})
	if stop != nil {
		t.Fatal(stop)
	}
	msg := Err(errs).Error()
	for _, want := range []string{
		`unknown flag "-x"`, `unknown flag "--bogus"`, `--wait "1ms" is not a duration of at least 1s`, `--on "no" is not true or false`,
		`unexpected argument "stray"`, "--file given more than once", `unexpected argument "--"`, "--file needs a value", "8 problem(s)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, `"val"`) {
		t.Errorf("an unknown flag's value is reported too:\n%s", msg)
	}
	if *d != 30*time.Second || !*b {
		t.Errorf("refused values changed the defaults: %v %v", *d, *b)
	}
}

// TestParseRepeatedList: a flag that takes a list may be given again; each use adds.
func TestParseRepeatedList(t *testing.T) {
	fs := NewFlagSet("test")
	var files []string
	var to string
	fs.StringArrayVar(&files, "file", nil, "a `FILE`, given once per file")
	fs.StringVar(&to, "to", "", "a `DIR`")
	errs, stop := Parse(fs, []string{"--file", "a,b", "--file=c", "--to", "d", "--to=e"})
	if stop != nil {
		t.Fatal(stop)
	}
	if msg := Err(errs).Error(); !strings.Contains(msg, "--to given more than once") || strings.Contains(msg, "--file") {
		t.Errorf("errors %s, want --to only", msg)
	}
	if len(files) != 2 || files[0] != "a,b" || files[1] != "c" {
		t.Errorf("--file %q, want [a,b c]", files)
	}
}

func TestParseValues(t *testing.T) {
	fs, s, d, b := testFlags()
	errs, stop := Parse(fs, []string{"-f", "x", "--wait=2s", "--on=false"})
	if errs != nil || stop != nil || *s != "x" || *d != 2*time.Second || *b {
		t.Errorf("%v %v: %q %v %v", errs, stop, *s, *d, *b)
	}
	for _, help := range []string{"-h", "--help", "-help"} {
		fs, _, _, _ := testFlags()
		if _, stop := Parse(fs, []string{"--bogus", help, "--wait"}); !errors.Is(stop, pflag.ErrHelp) {
			t.Errorf("%s: %v", help, stop)
		}
	}
	if u := Usage("intro\n", fs, "outro\n"); !strings.Contains(u, "--wait DURATION") || !strings.Contains(u, "(default 30s)") || !strings.Contains(u, "-h, --help") {
		t.Errorf("usage:\n%s", u)
	}
}
