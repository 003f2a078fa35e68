package version

import (
	"runtime/debug"
	"testing"
)

func TestFormat(t *testing.T) {
	if got, want := format("xds-server", "0.1.0", "abc1234"), "xds-server 0.1.0 (commit abc1234)"; got != want {
		t.Errorf("format = %q, want %q", got, want)
	}
}

func TestResolve(t *testing.T) {
	for _, c := range []struct {
		version string
		bi      *debug.BuildInfo
		want    string
	}{
		{"0.1.0", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}}, "0.1.0"}, // the stamp wins
		{"dev", nil, "dev"},
		{"dev", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"dev", &debug.BuildInfo{Main: debug.Module{Version: ""}}, "dev"},
		{"dev", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, "v0.1.0"}, // go install ...@v0.1.0
	} {
		if got := resolve(c.version, c.bi); got != c.want {
			t.Errorf("resolve(%q, %+v) = %q, want %q", c.version, c.bi, got, c.want)
		}
	}
}

// An unstamped test binary reports the defaults.
func TestStringUnstamped(t *testing.T) {
	if got, want := String("prog"), "prog dev (commit unknown)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}
