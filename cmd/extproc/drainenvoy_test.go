package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

func TestDrainEnvoyFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--envoy-admin", "localhost"}, `--envoy-admin "localhost": address localhost: missing port in address; want host:port, e.g. 127.0.0.1:9901`},
		{[]string{"--envoy-admin", "127.0.0.1:http"}, `--envoy-admin "127.0.0.1:http": port "http" is not a number`},
		{[]string{"--delay", "-1s"}, `--delay "-1s" is not a non-negative duration`},
		{[]string{"--drain-time", "45"}, `--drain-time "45" is not a duration of at least 1s`},
		{[]string{"--drain-time", "500ms"}, `--drain-time "500ms" is not a duration of at least 1s`},
		{[]string{"--poll-interval", "1ms"}, `--poll-interval "1ms" is not a duration of at least 10ms`},
		{[]string{"--exit-wait", "soon"}, `--exit-wait "soon" is not a non-negative duration`},
		{[]string{"--done-file="}, "--done-file must name a file"},
		{[]string{"--drain-time-s", "45"}, `unknown flag "--drain-time-s"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"drain-envoy"}, c.args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), c.want) || !strings.Contains(stderr.String(), "Run extproc drain-envoy --help") || stdout.Len() != 0 {
			t.Errorf("%v: exit %d %q, want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
	var stdout bytes.Buffer
	if code := run([]string{"drain-envoy", "--help"}, &stdout, io.Discard); code != 0 ||
		!strings.Contains(stdout.String(), "drain_listeners?graceful") ||
		!strings.Contains(stdout.String(), "--drain-time-s") {
		t.Errorf("--help: exit %d %q", code, stdout.String())
	}
}

func TestDrainedFlags(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"--source", "file:" + fixture, "--listen", "127.0.0.1:0", "--drained-max-wait", "-1s", "--drained-file="}, io.Discard, &stderr)
	for _, want := range []string{`--drained-max-wait "-1s" is not a non-negative duration`, "--drained-file must name a file"} {
		if code != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("exit %d, stderr lacks %q:\n%s", code, want, stderr.String())
		}
	}
}

// TestDrainEnvoyAndDrained: the two preStop hooks together. The Envoy container's, GET
// /drained on extproc's admin, waits while drain-envoy (the extproc container's) drains a
// fake Envoy admin; it answers once the drain is over, and extproc logs drain-envoy's log.
// With --drained-max-wait=0 there is no /drained.
func TestDrainEnvoyAndDrained(t *testing.T) {
	active := make(chan int, 10)
	last := 2
	envoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/drain_listeners":
			fmt.Fprintln(w, "OK")
		case "/stats":
			select {
			case last = <-active:
			default:
			}
			fmt.Fprintf(w, `{"stats":[{"name":"http.kube_mvp.downstream_rq_active","value":%d}]}`, last)
		}
	}))
	defer envoy.Close()

	dir := shortTempDir(t)
	done := filepath.Join(dir, "envoy-drained")
	var logs testutil.SyncBuffer
	a, stop := runExtproc(t, &logs, nil, "--source", "file:"+fixture, "--listen", "unix:"+filepath.Join(dir, "s.sock"), "--admin-address", "127.0.0.1:0", "--drained-file", done)
	defer stop()
	drained := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + a.AdminAddr().String() + "/drained")
		if err != nil {
			drained <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		drained <- fmt.Sprint(resp.StatusCode, " ", string(b))
	}()

	var hookLog bytes.Buffer
	hook := make(chan int, 1)
	go func() {
		hook <- run([]string{"drain-envoy", "--envoy-admin", strings.TrimPrefix(envoy.URL, "http://"), "--delay=0s", "--drain-time=10s",
			"--poll-interval=20ms", "--exit-wait=0s", "--done-file", done}, io.Discard, &hookLog)
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case got := <-drained:
		t.Fatalf("/drained answered %q with requests active", got)
	default:
	}
	active <- 1
	active <- 0
	select {
	case got := <-drained:
		if got != "200 drained\n" {
			t.Errorf("/drained: %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("/drained did not answer after the drain")
	}
	if code := <-hook; code != 0 {
		t.Errorf("drain-envoy exit %d:\n%s", code, hookLog.String())
	}
	testutil.WaitFor(t, t.Context(), 10*time.Second, "extproc's log of the drain", testutil.Cond(func() bool {
		return strings.Contains(logs.String(), "Envoy is drained; its container may stop") && strings.Contains(logs.String(), `active=1`)
	}))
	if _, err := os.Stat(done); err != nil {
		t.Error(err)
	}

	// Off.
	b, stopB := runExtproc(t, io.Discard, nil, "--source", "file:"+fixture, "--listen", "unix:"+filepath.Join(dir, "b.sock"), "--admin-address", "127.0.0.1:0", "--drained-max-wait=0s")
	defer stopB()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.AdminAddr().String()+"/drained", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/drained with --drained-max-wait=0: %d", resp.StatusCode)
	}
}
