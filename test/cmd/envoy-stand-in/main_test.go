package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersionAndRefusals(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run(context.Background(), []string{"--version"}, &out, &errb); rc != 0 || !strings.Contains(out.String(), "test stand-in for Envoy") {
		t.Errorf("--version: %d %q", rc, out.String())
	}
	bad := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(bad, []byte("node: {id: a, cluster: b}\nwatchdog: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--concurrency", "2"}, "Couldn't find match for argument"},
		{[]string{"-c", bad}, "error initializing configuration '" + bad + "'"},
		{[]string{"-c", bad}, "watchdog"},
		{[]string{}, "At least one of --config-path or --config-yaml"},
		{[]string{"--drain-strategy", "fast", "-c", bad}, "error: unknown drain-strategy 'fast'"},
		{[]string{"--drain-time-s", "soon", "-c", bad}, "Couldn't read argument value from string 'soon'"},
	} {
		out.Reset()
		errb.Reset()
		if rc := run(context.Background(), c.args, &out, &errb); rc != 1 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q, want 1 and %q", c.args, rc, errb.String(), c.want)
		}
	}
}
