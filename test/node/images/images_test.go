package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kube-mvp/kube-mvp/internal/ociimage"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// loaded is an image read back from its tarball: its config and every file of its file
// system (contents kept for files up to 64 KiB).
type loaded struct {
	cfg   *v1.ConfigFile
	files map[string]*tar.Header
	data  map[string][]byte
}

func load(t *testing.T, im Image) loaded {
	t.Helper()
	tag, err := name.NewTag(im.Ref, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(im.Tarball, &tag)
	if err != nil {
		t.Fatalf("%s does not load as %s: %v", im.Tarball, im.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("%s: platform %s/%s, want linux/%s", im.Ref, cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if !cfg.Created.Time.Equal(time.Unix(0, 0)) {
		t.Errorf("%s: created %s, want the epoch", im.Ref, cfg.Created.Time)
	}
	l := loaded{cfg: cfg, files: map[string]*tar.Header{}, data: map[string][]byte{}}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		l.files[n] = h
		if h.Size <= 64<<10 {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			l.data[n] = b
		}
	}
	return l
}

// mustHave checks the image has path, of type typ and (unless a symlink) permissions mode
// (with the sticky bit as 0o1000).
func (l loaded) mustHave(t *testing.T, path string, typ byte, mode int64) *tar.Header {
	t.Helper()
	h, ok := l.files[path]
	if !ok {
		t.Errorf("no %s in the image", path)
		return &tar.Header{}
	}
	if h.Typeflag != typ {
		t.Errorf("%s: type %q, want %q", path, h.Typeflag, typ)
	}
	if typ != tar.TypeSymlink && h.Mode&0o7777 != mode {
		t.Errorf("%s: mode %o, want %o", path, h.Mode, mode)
	}
	return h
}

func TestPause(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the pause program")
	}
	ctx := testutil.Context(t, 5*time.Minute)
	im, err := Pause(ctx, testutil.LogWriter(t))
	if err != nil {
		t.Fatal(err)
	}
	if im.Ref != PauseRef {
		t.Errorf("ref %q, want %q", im.Ref, PauseRef)
	}
	l := load(t, im)
	if got := l.cfg.Config.Entrypoint; !slices.Equal(got, []string{"/pause"}) {
		t.Errorf("entrypoint %q", got)
	}
	if got := l.cfg.Config.User; got != "65535:65535" {
		t.Errorf("user %q", got)
	}
	l.mustHave(t, "/pause", tar.TypeReg, 0o755)
	if len(l.files) != 1 {
		t.Errorf("files %v, want only /pause", keys(l.files))
	}

	// A second call reuses the tarball.
	again, err := Pause(ctx, io.Discard)
	if err != nil || again != im {
		t.Errorf("second call: %+v, %v; want %+v", again, err, im)
	}
	checkImport(t, ctx, im, "/pause", "-h") // exits 2: proves it started
}

// TestPauseProgram runs the pause program as PID 1 of a new PID namespace, as in a pod
// sandbox: an orphan re-parented to it is reaped, and SIGTERM ends it with status 0.
func TestPauseProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the pause program")
	}
	ctx := testutil.Context(t, 5*time.Minute)
	bin := filepath.Join(t.TempDir(), "pause")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	if out, err := exec.Command(bin, "x").CombinedOutput(); err == nil || !strings.Contains(string(out), "usage") {
		t.Errorf("pause x: %v, %s; want a usage error", err, out)
	}

	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("no new PID namespace without privileges: %v", err)
		}
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid

	// A shell in its PID namespace leaves an orphan behind; the orphan becomes pause's child.
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	if nsenter, err := exec.LookPath("nsenter"); err != nil {
		t.Logf("no nsenter: not checking the reaping")
	} else {
		time.Sleep(100 * time.Millisecond) // let pause install its signal handlers
		out, err := exec.CommandContext(ctx, nsenter, "--target", strconv.Itoa(pid), "--pid", "--", sh, "-c", "sleep 0.3 & echo $!").CombinedOutput()
		if err != nil {
			t.Fatalf("nsenter: %v\n%s", err, out)
		}
		testutil.WaitFor(t, ctx, 10*time.Second, "pause has no zombie children", func() error {
			kids, zombies := children(t, pid)
			if kids == 0 && zombies == 0 {
				return nil
			}
			return errors.New(strconv.Itoa(kids) + " children, " + strconv.Itoa(zombies) + " of them zombies")
		})
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("pause after SIGTERM: %v, want exit status 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pause did not end on SIGTERM")
	}
}

// children counts the processes whose parent is pid, and the zombies among them.
func children(t *testing.T, pid int) (kids, zombies int) {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		_, rest, ok := strings.Cut(string(b[bytes.LastIndexByte(b, ')'):]), ") ")
		if f := strings.Fields(rest); ok && len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			kids++
			if f[0] == "Z" {
				zombies++
			}
		}
	}
	return kids, zombies
}

func TestBusybox(t *testing.T) {
	if testing.Short() {
		t.Skip("makes the busybox image")
	}
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("%v: apt-get install busybox-static", err)
	}
	ctx := testutil.Context(t, 5*time.Minute)
	im, err := Busybox(ctx, testutil.LogWriter(t))
	if err != nil {
		t.Fatal(err)
	}
	l := load(t, im)
	if got := l.cfg.Config.Cmd; !slices.Equal(got, []string{"sh"}) {
		t.Errorf("cmd %q", got)
	}
	if len(l.cfg.Config.Entrypoint) != 0 || (l.cfg.Config.User != "" && l.cfg.Config.User != "0") {
		t.Errorf("entrypoint %q, user %q: want none, root", l.cfg.Config.Entrypoint, l.cfg.Config.User)
	}
	l.mustHave(t, "/bin/busybox", tar.TypeReg, 0o755)
	for _, applet := range []string{"sh", "sleep", "cat", "ls", "echo", "wget", "nslookup", "env", "id", "true", "false", "ps", "hostname", "mkdir", "test", "["} {
		if h := l.mustHave(t, "/bin/"+applet, tar.TypeSymlink, 0); h.Linkname != "busybox" {
			t.Errorf("/bin/%s -> %q, want busybox", applet, h.Linkname)
		}
	}
	if h := l.mustHave(t, "/usr/bin/env", tar.TypeSymlink, 0); h.Linkname != "../../bin/busybox" {
		t.Errorf("/usr/bin/env -> %q", h.Linkname)
	}
	l.mustHave(t, "/tmp", tar.TypeDir, 0o1777)
	l.mustHave(t, "/root", tar.TypeDir, 0o700)
	l.mustHave(t, "/etc/passwd", tar.TypeReg, 0o644)
	l.mustHave(t, "/etc/group", tar.TypeReg, 0o644)
	if !strings.HasPrefix(string(l.data["/etc/passwd"]), "root:x:0:0:root:/root:/bin/sh\n") {
		t.Errorf("/etc/passwd:\n%s", l.data["/etc/passwd"])
	}
	checkImport(t, ctx, im, "/bin/busybox", "echo", "hi")
}

func TestBusyboxMissing(t *testing.T) {
	b, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Skip(err)
	}
	if isStaticELF(b) {
		t.Skip("/bin/sh is static here")
	}
	if isStaticELF([]byte("#!/bin/sh\n")) {
		t.Error("a script is not a static executable")
	}
}

func TestCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds CoreDNS (minutes when cold)")
	}
	ctx := testutil.Context(t, 20*time.Minute)
	im, err := CoreDNS(ctx, testutil.LogWriter(t))
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := CoreDNSRef(); im.Ref != want || !strings.HasPrefix(im.Ref, Registry+"/coredns:v1.") {
		t.Errorf("ref %q, want %q", im.Ref, want)
	}
	l := load(t, im)
	c := l.cfg.Config
	if !slices.Equal(c.Entrypoint, []string{"/coredns"}) || !slices.Equal(c.Cmd, []string{"-conf", "/etc/coredns/Corefile"}) {
		t.Errorf("entrypoint %q, cmd %q", c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q", c.User)
	}
	h := l.mustHave(t, "/coredns", tar.TypeReg, 0o755)
	if got := h.PAXRecords["SCHILY.xattr.security.capability"]; got != string(netBindServiceCap) {
		t.Errorf("/coredns: security.capability %x, want cap_net_bind_service=+ep", got)
	}
	l.mustHave(t, "/tmp", tar.TypeDir, 0o1777)
	if !strings.Contains(string(l.data["/etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd:\n%s", l.data["/etc/passwd"])
	}
	checkImport(t, ctx, im, "/coredns", "-version")
}

func TestHelm(t *testing.T) {
	if testing.Short() {
		t.Skip("builds helm (minutes when cold)")
	}
	ctx := testutil.Context(t, 20*time.Minute)
	helm, err := Helm(ctx, testutil.LogWriter(t))
	if err != nil {
		t.Fatal(err)
	}
	want, err := requiredVersion("../../../go.mod", "helm.sh/helm/v3")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, helm, "version", "--short").CombinedOutput()
	if err != nil {
		t.Fatalf("helm version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), want) {
		t.Errorf("helm version --short: %q, want %s", out, want)
	}
}

func TestRequiredVersion(t *testing.T) {
	dir := t.TempDir()
	gomod := filepath.Join(dir, "go.mod")
	os.WriteFile(gomod, []byte("module x\n\ngo 1.26.0\n\nrequire example.com/one v1.2.3\n\nrequire (\n\texample.com/two v0.4.0 // indirect\n)\n"), 0o644)
	for mod, want := range map[string]string{"example.com/one": "v1.2.3", "example.com/two": "v0.4.0"} {
		if got, err := requiredVersion(gomod, mod); got != want || err != nil {
			t.Errorf("%s: %q, %v; want %s", mod, got, err, want)
		}
	}
	if _, err := requiredVersion(gomod, "example.com/three"); err == nil {
		t.Error("a module not required: no error")
	}
}

func TestHelmLDFlags(t *testing.T) {
	got := helmLDFlags("v3.22.0", "v0.37.0")
	for _, want := range []string{
		"internal/version.version=v3.22.0",
		"pkg/chartutil.k8sVersionMajor=1", "pkg/chartutil.k8sVersionMinor=37",
		"pkg/lint/rules.k8sVersionMinor=37",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}

// TestLayer checks an image made by newImage reads back as written, and that the same
// entries give the same digest (reproducible).
func TestLayer(t *testing.T) {
	entries := []ociimage.Entry{
		ociimage.Dir("d", 0o755, 7),
		ociimage.File("d/f", 0o640, []byte("hello")),
		ociimage.Link("d/l", "f"),
	}
	entries[1].PAX = map[string]string{"SCHILY.xattr.user.x": "\x00\x01"}
	a, err := newImage(v1.Config{Cmd: []string{"x"}}, "test", entries)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := newImage(v1.Config{Cmd: []string{"x"}}, "test", entries)
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("digests %s and %s of the same image", da, db)
	}
	tarPath := filepath.Join(t.TempDir(), "x.tar")
	if err := tarball.WriteToFile(tarPath, name.MustParseReference("kube-mvp.test/x:1"), a); err != nil {
		t.Fatal(err)
	}
	l := load(t, Image{Ref: "kube-mvp.test/x:1", Tarball: tarPath})
	if h := l.mustHave(t, "/d", tar.TypeDir, 0o755); h.Uid != 7 || h.Gid != 7 {
		t.Errorf("/d owned by %d:%d", h.Uid, h.Gid)
	}
	if h := l.mustHave(t, "/d/f", tar.TypeReg, 0o640); string(l.data["/d/f"]) != "hello" || h.PAXRecords["SCHILY.xattr.user.x"] != "\x00\x01" {
		t.Errorf("/d/f: %q, xattrs %q", l.data["/d/f"], h.PAXRecords)
	}
	if h := l.mustHave(t, "/d/l", tar.TypeSymlink, 0); h.Linkname != "f" {
		t.Errorf("/d/l -> %q", h.Linkname)
	}
	if len(netBindServiceCap) != 20 {
		t.Errorf("vfs_cap_data revision 2 is 20 bytes, have %d", len(netBindServiceCap))
	}
}

func keys(m map[string]*tar.Header) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// checkImport imports im into a running containerd with ctr (at $CONTAINERD_ADDRESS, else
// containerd's default socket), in a namespace of its own, removed afterwards, and runs args
// in a container of it, checking that it starts. Skipped without ctr or a containerd that
// answers; tests never start one.
func checkImport(t *testing.T, ctx context.Context, im Image, args ...string) {
	t.Helper()
	ctr, err := exec.LookPath("ctr")
	if err != nil {
		t.Log("no ctr: not importing into containerd")
		return
	}
	const ns = "kube-mvp-images-test"
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, ctr, append([]string{"-n", ns}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	sock := os.Getenv("CONTAINERD_ADDRESS")
	if sock == "" {
		sock = "/run/containerd/containerd.sock"
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Type() != fs.ModeSocket {
		t.Logf("no containerd socket at %s: not importing", sock)
		return
	}
	if out, err := run("version"); err != nil || !strings.Contains(out, "Server:") {
		t.Logf("no containerd answers ctr at %s (%v): not importing", sock, err)
		return
	}
	t.Run("ctr", func(t *testing.T) {
		if out, err := run("images", "import", im.Tarball); err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", im.Tarball, err, out)
		}
		defer run("images", "rm", im.Ref)
		out, err := run("images", "ls", "-q")
		if err != nil || !slices.Contains(strings.Fields(out), im.Ref) {
			t.Fatalf("ctr images ls: %v; %q lacks %s", err, out, im.Ref)
		}
		if os.Geteuid() != 0 {
			t.Log("not root: not running a container")
			return
		}
		id := "t-" + strings.NewReplacer("/", "-", ":", "-", ".", "-").Replace(im.Ref)
		out, err = run(append([]string{"run", "--rm", im.Ref, id}, args...)...)
		if err != nil {
			// pause -h says its usage and exits 2; anything else is a failure to start.
			if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, "usage") {
				t.Fatalf("ctr run %s %q: %v\n%s", im.Ref, args, err, out)
			}
		}
		t.Logf("ctr run %s %q:\n%s", im.Ref, args, out)
	})
}
