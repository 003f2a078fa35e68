package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// runAsMain makes the test binary run extproc itself (a subprocess of a test, with other
// credentials) when this variable is set.
const runAsMain = "KUBE_MVP_TEST_RUN_EXTPROC"

func TestMain(m *testing.M) {
	if os.Getenv(runAsMain) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// copyDirs is a node's pki directory holding kubeadm's two file names, and a destination.
type copyDirs struct{ src, dst, crt, key string }

func newCopyDirs(t *testing.T, base string) copyDirs {
	t.Helper()
	d := copyDirs{src: filepath.Join(base, "pki"), dst: filepath.Join(base, "node-pki")}
	for _, dir := range []string{d.src, d.dst} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	d.crt, d.key = filepath.Join(d.src, "front-proxy-client.crt"), filepath.Join(d.src, "front-proxy-client.key")
	return d
}

func (d copyDirs) write(t *testing.T, crt, key []byte) {
	t.Helper()
	for path, b := range map[string][]byte{d.crt: crt, d.key: key} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func (d copyDirs) args(mode ...string) []string {
	return append([]string{"copy-files", "--file", d.crt, "--file", d.key, "--to", d.dst}, mode...)
}

func runCopy(args []string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestCopyFilesOnce: --once publishes a good pair; a mismatched, missing or damaged one
// fails naming the chart value that put the command there, and publishes nothing.
func TestCopyFilesOnce(t *testing.T) {
	ps := testutil.ProxyClientPairs(t, 2)
	for _, c := range []struct {
		name     string
		crt, key []byte
		want     string
	}{
		{"mismatched", ps[1].CertPEM, ps[0].KeyPEM, "not a matching certificate and key"},
		{"missing", nil, nil, "no such file or directory"},
		{"empty key", ps[0].CertPEM, []byte{}, "holds no PEM certificate or private key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newCopyDirs(t, t.TempDir())
			if c.crt != nil {
				d.write(t, c.crt, c.key)
			}
			code, _, stderr := runCopy(d.args("--once"))
			if code != 1 || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "sidecar.kubeadmFrontProxyClient=false") {
				t.Errorf("exit %d, stderr %q; want 1 and a message saying %q and naming sidecar.kubeadmFrontProxyClient", code, stderr, c.want)
			}
			if entries, _ := os.ReadDir(d.dst); len(entries) != 0 {
				t.Errorf("published %v", entries)
			}
		})
	}

	d := newCopyDirs(t, t.TempDir())
	d.write(t, ps[0].CertPEM, ps[0].KeyPEM)
	if code, _, stderr := runCopy(d.args("--once")); code != 0 {
		t.Fatalf("--once: exit %d: %s", code, stderr)
	}
	for name, want := range map[string][]byte{"front-proxy-client.crt": ps[0].CertPEM, "front-proxy-client.key": ps[0].KeyPEM} {
		if b, err := os.ReadFile(filepath.Join(d.dst, name)); err != nil || !bytes.Equal(b, want) {
			t.Errorf("%s: %v, or not the node's file", name, err)
		}
	}
	if code, stdout, stderr := runCopy(d.args("--check")); code != 0 || !strings.Contains(stdout, "holds the source files' current pair") {
		t.Errorf("--check after --once: exit %d %q %q", code, stdout, stderr)
	}
	// Renewed on the node and not yet copied: --check fails (a stuck copier is restarted).
	d.write(t, ps[1].CertPEM, ps[1].KeyPEM)
	if code, _, stderr := runCopy(d.args("--check")); code != 1 || !strings.Contains(stderr, "does not hold the source files' current pair") {
		t.Errorf("--check with a newer pair on the node: exit %d %q", code, stderr)
	}
	// Torn on the node: nothing the copier could do; --check passes.
	d.write(t, ps[1].CertPEM, ps[0].KeyPEM)
	if code, stdout, _ := runCopy(d.args("--check")); code != 0 || !strings.Contains(stdout, "not a good pair now") {
		t.Errorf("--check with a torn pair on the node: exit %d %q", code, stdout)
	}
}

// TestCopyFilesOnceWait: --once --wait (the chart's init container) waits while the node's
// pair is mismatched, saying why once and naming the chart value, and publishes the pair
// and exits 0 as soon as the node holds a good one: no crash loop.
func TestCopyFilesOnceWait(t *testing.T) {
	ps := testutil.ProxyClientPairs(t, 2)
	d := newCopyDirs(t, t.TempDir())
	d.write(t, ps[1].CertPEM, ps[0].KeyPEM)
	var out, errb testutil.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- run(d.args("--once", "--wait", "--interval=1s"), &out, &errb) }()
	testutil.WaitFor(t, t.Context(), 10*time.Second, "a waiting message naming the chart value", func() error {
		if s := errb.String(); !strings.Contains(s, "not a matching certificate and key") || !strings.Contains(s, "sidecar.kubeadmFrontProxyClient=false") {
			return errors.New("not yet: " + s)
		}
		return nil
	})
	select {
	case code := <-done:
		t.Fatalf("exited %d while the pair is mismatched: %s", code, errb.String())
	case <-time.After(2500 * time.Millisecond): // at least two more tries
	}
	if n := strings.Count(errb.String(), "waiting"); n != 1 {
		t.Errorf("the same reason logged %d times, want once:\n%s", n, errb.String())
	}
	d.write(t, ps[0].CertPEM, ps[0].KeyPEM)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("still waiting after the node got a good pair:\n%s", errb.String())
	}
	if b, err := os.ReadFile(filepath.Join(d.dst, "front-proxy-client.key")); err != nil || !bytes.Equal(b, ps[0].KeyPEM) {
		t.Errorf("the key is not published: %v", err)
	}
}

func TestCopyFilesFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"copy-files", "--file", "/a/tls.crt", "--to", "/d"}, "give it twice"},
		{[]string{"copy-files", "--file", "/a/tls.crt", "--file", "/b/tls.crt", "--to", "/d"}, "two files named tls.crt"},
		{[]string{"copy-files", "--file", "/a/x.crt", "--file", "/a/x.key"}, "--to is required"},
		{[]string{"copy-files", "--file", "/a/x.crt", "--file", "/a/x.key", "--to", "/d", "--once", "--check"}, "exclude each other"},
		{[]string{"copy-files", "--file", "/a/x.crt", "--file", "/a/x.key", "--to", "/d", "--once", "--interval", "5s"}, "--interval applies only"},
		{[]string{"copy-files", "--file", "/a/x.crt", "--file", "/a/x.key", "--to", "/d", "--wait"}, "--wait applies only with --once"},
		{[]string{"copy-files", "--file", "/a/x.crt", "--file", "/a/x.key", "--to", "/d", "--interval", "10ms"}, "at least 1s"},
		{[]string{"copy-files", "--file", "/a/x.crt", "--file", "/a/x.key", "--to", "/d", "--group", "nobody"}, "not a positive number"},
	} {
		code, _, stderr := runCopy(c.args)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", c.args, code, stderr, c.want)
		}
	}
	if code, stdout, _ := runCopy([]string{"copy-files", "--help"}); code != 0 || !strings.Contains(stdout, "..data") {
		t.Errorf("--help: exit %d %q", code, stdout)
	}
}

// TestCopyFilesAsRootWithoutCapabilities runs copy-files as the chart does: uid 0 with every
// capability dropped (setpriv empties the bounding set, so exec gives root no capability)
// and group 65532, into a directory made as the kubelet makes an emptyDir with fsGroup 65532.
// It reads the node's root-owned 0600 files as their owner; it cannot read a file of another
// owner (the proof that no CAP_DAC_OVERRIDE is left); user 65532 then reads the published
// pair, and not the node's files. Then the loop publishes a renewal within its interval.
func TestCopyFilesAsRootWithoutCapabilities(t *testing.T) {
	setpriv, err := exec.LookPath("setpriv")
	if os.Geteuid() != 0 || err != nil {
		t.Skip("needs root and setpriv (util-linux) to drop capabilities:", err)
	}
	base, err := os.MkdirTemp("", "kmvp-copy-files-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	d := newCopyDirs(t, base)
	// The emptyDir: mode 0777 with the set-group-ID bit, group fsGroup.
	if err := os.Chown(d.dst, 0, 65532); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d.dst, 0o777|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	ps := testutil.ProxyClientPairs(t, 2)
	d.write(t, ps[0].CertPEM, ps[0].KeyPEM)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copier := func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, setpriv, append([]string{"--reuid=0", "--regid=65532", "--groups=65532",
			"--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--", self}, args...)...)
		cmd.Env = append(os.Environ(), runAsMain+"=1")
		return cmd
	}
	asUser := func(args ...string) *exec.Cmd {
		return exec.Command(setpriv, append([]string{"--reuid=65532", "--regid=65532", "--clear-groups",
			"--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"}, args...)...)
	}
	readAsUser := func(path string) ([]byte, error) { return asUser("cat", path).Output() }
	ctx := testutil.Context(t, time.Minute)

	// Not vacuous: without CAP_DAC_OVERRIDE, root cannot read another owner's 0600 file.
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	od := copyDirs{src: other, dst: d.dst, crt: filepath.Join(other, "front-proxy-client.crt"), key: filepath.Join(other, "front-proxy-client.key")}
	od.write(t, ps[0].CertPEM, ps[0].KeyPEM)
	if err := os.Chown(od.key, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if out, err := copier(ctx, od.args("--once")...).CombinedOutput(); err == nil || !strings.Contains(string(out), "permission denied") {
		t.Fatalf("the copier read a file of another owner, mode 0600 (capabilities not dropped?): %v\n%s", err, out)
	}

	if out, err := copier(ctx, d.args("--once", "--group=65532")...).CombinedOutput(); err != nil {
		t.Fatalf("copy-files --once as root without capabilities: %v\n%s", err, out)
	}
	for name, want := range map[string][]byte{"front-proxy-client.crt": ps[0].CertPEM, "front-proxy-client.key": ps[0].KeyPEM} {
		if b, err := readAsUser(filepath.Join(d.dst, name)); err != nil || !bytes.Equal(b, want) {
			t.Errorf("user 65532 reading the published %s: %v", name, err)
		}
	}
	if _, err := readAsUser(d.key); err == nil {
		t.Error("user 65532 reads the node's key itself: the test does not show what the copier is for")
	}

	// The loop, and its liveness check, with the same credentials.
	loop := copier(ctx, d.args("--interval=1s", "--group=65532")...)
	var logs testutil.SyncBuffer
	loop.Stdout, loop.Stderr = &logs, &logs
	if err := loop.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- loop.Wait() }()
	d.write(t, ps[1].CertPEM, ps[1].KeyPEM) // kubeadm renews in place
	testutil.WaitFor(t, ctx, 10*time.Second, "the renewal published for user 65532", func() error {
		if b, err := readAsUser(filepath.Join(d.dst, "front-proxy-client.key")); err != nil || !bytes.Equal(b, ps[1].KeyPEM) {
			return os.ErrNotExist
		}
		return nil
	})
	if out, err := copier(ctx, d.args("--check")...).CombinedOutput(); err != nil {
		t.Errorf("copy-files --check: %v\n%s", err, out)
	}
	if b, err := readAsUser(filepath.Join(d.dst, "front-proxy-client.crt")); err != nil || !bytes.Equal(b, ps[1].CertPEM) {
		t.Errorf("the renewed certificate: %v", err)
	}
	loop.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Errorf("the loop on SIGTERM: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "published the source files") {
		t.Errorf("the loop did not log its publication:\n%s", logs.String())
	}
}
