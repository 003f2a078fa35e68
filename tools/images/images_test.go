package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/kube-mvp/kube-mvp/deploy"
)

// root is the module root, seen from this package's directory (where go test runs it).
const root = "../.."

var epoch1700 = time.Unix(1700000000, 0).UTC()

func chartAppVersion(t *testing.T) string {
	t.Helper()
	// Helm's own reading of the chart, independent of ChartAppVersion.
	ch, err := loader.Load(filepath.Join(root, "deploy", "kube-mvp"))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.AppVersion == "" {
		t.Fatal("the chart has no appVersion")
	}
	return ch.Metadata.AppVersion
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseArgs(t *testing.T) {
	appVersion := chartAppVersion(t)

	o, err := ParseArgs([]string{"-root", root}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if o.Version != appVersion || o.Registry != DefaultRegistry || !slices.Equal(o.Archs, []string{"amd64", "arm64"}) || o.Push || o.Out != "bin/images" {
		t.Errorf("defaults: %+v; want version %s, registry %s, amd64 and arm64, out bin/images, no push", o, appVersion, DefaultRegistry)
	}
	if tag, _ := o.Tag("xds-server"); tag.String() != "ghcr.io/kube-mvp/xds-server:"+appVersion {
		t.Errorf("default tag %s", tag)
	}
	head, headTime := GitHead(root)
	if o.Commit != head {
		t.Errorf("default commit %q, want GitHead's %q", o.Commit, head)
	}
	if want := headTime; want.IsZero() && !o.Created.Equal(time.Unix(0, 0)) || !want.IsZero() && !o.Created.Equal(want) {
		t.Errorf("default created %s, want the commit time %s (the epoch outside git)", o.Created, want)
	}

	o, err = ParseArgs([]string{"-root", root, "-registry", "registry.example.com:5000/team/", "-version", "1.2.3-rc.1", "-commit", "abc1234",
		"-arch", "arm64,amd64", "-out", "x", "-push"}, env(map[string]string{"SOURCE_DATE_EPOCH": "1700000000"}))
	if err != nil {
		t.Fatal(err)
	}
	if tag, _ := o.Tag("extproc"); tag.String() != "registry.example.com:5000/team/extproc:1.2.3-rc.1" {
		t.Errorf("tag %s", tag)
	}
	if o.Commit != "abc1234" || !slices.Equal(o.Archs, []string{"arm64", "amd64"}) || o.Out != "x" || !o.Push || !o.Created.Equal(epoch1700) {
		t.Errorf("given: %+v", o)
	}

	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-arch", "amd64 amd64"}, nil, "each at most once"},
		{[]string{"-arch", "x86_64"}, nil, `architecture "x86_64"`},
		{[]string{"-registry", "Bad Registry"}, nil, "image reference"},
		{[]string{"-version", "v1/2"}, nil, "image reference"},
		{[]string{"-commit", "a b"}, nil, `commit "a b"`},
		{[]string{"amd64"}, nil, "unexpected arguments"},
		{nil, map[string]string{"SOURCE_DATE_EPOCH": "yesterday"}, "SOURCE_DATE_EPOCH"},
		{[]string{"-root", t.TempDir()}, nil, "reading the chart's appVersion"},
	} {
		args := append([]string{"-root", root}, c.args...)
		if _, err := ParseArgs(args, env(c.env)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseArgs(%q, %v) = %v, want an error containing %q", args, c.env, err, c.want)
		}
	}
}

func TestGitHead(t *testing.T) {
	dir := t.TempDir()
	if h, tm := GitHead(dir); h != "unknown" || !tm.IsZero() {
		t.Errorf("outside git: %q %s, want unknown and the zero time", h, tm)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_COMMITTER_DATE=1700000000 +0000", "GIT_AUTHOR_DATE=1600000000 +0000")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %q: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	if h, _ := GitHead(dir); h != "unknown" {
		t.Errorf("no commit yet: %q, want unknown", h)
	}
	git("commit", "-q", "--allow-empty", "-m", "x")
	h, tm := GitHead(dir)
	if want := git("rev-parse", "--short", "HEAD"); h != want || !tm.Equal(epoch1700) {
		t.Errorf("GitHead = %q %s, want %q and the committer time %s", h, tm, want, epoch1700)
	}
}

// entry is a file of an image's filesystem, as the image's layers leave it.
type entry struct {
	mode     fs.FileMode
	uid, gid int
	mtime    time.Time
	data     []byte
}

// files flattens img's layers.
func files(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[path.Clean("/"+h.Name)] = entry{h.FileInfo().Mode(), h.Uid, h.Gid, h.ModTime, data}
	}
}

// want describes an image.
type want struct {
	program, arch, version, commit string
	created                        time.Time
}

// checkImage checks img's configuration and filesystem against w and returns its binaries
// by name: its program's and its companions'.
func checkImage(t *testing.T, img v1.Image, w want) map[string][]byte {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != w.arch {
		t.Errorf("%s: platform %s/%s, want linux/%s", w.program, cf.OS, cf.Architecture, w.arch)
	}
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/" + w.program}) || len(c.Cmd) != 0 || c.WorkingDir != "/" {
		t.Errorf("%s/%s: user %q entrypoint %q cmd %q workdir %q; want 65532:65532, [/usr/local/bin/%[1]s], none, /", w.program, w.arch, c.User, c.Entrypoint, c.Cmd, c.WorkingDir)
	}
	labels := map[string]string{
		"org.opencontainers.image.source":   "https://github.com/kube-mvp/kube-mvp",
		"org.opencontainers.image.url":      "https://github.com/kube-mvp/kube-mvp",
		"org.opencontainers.image.title":    w.program,
		"org.opencontainers.image.version":  w.version,
		"org.opencontainers.image.revision": w.commit,
	}
	if !maps.Equal(c.Labels, labels) {
		t.Errorf("%s/%s: labels %v, want %v", w.program, w.arch, c.Labels, labels)
	}
	if !cf.Created.Time.Equal(w.created) || len(cf.History) != 1 || !cf.History[0].Created.Time.Equal(w.created) {
		t.Errorf("%s/%s: created %s (history %+v), want %s", w.program, w.arch, cf.Created, cf.History, w.created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%s/%s: layers %d (%v), want one", w.program, w.arch, len(layers), err)
	}

	fsys := files(t, img)
	bin := "/usr/local/bin/" + w.program
	wantFiles := map[string]fs.FileMode{
		"/etc": fs.ModeDir | 0o755, "/etc/passwd": 0o644, "/etc/group": 0o644,
		"/home": fs.ModeDir | 0o755, "/home/nonroot": fs.ModeDir | 0o700,
		"/tmp": fs.ModeDir | fs.ModeSticky | 0o777,
		"/usr": fs.ModeDir | 0o755, "/usr/local": fs.ModeDir | 0o755, "/usr/local/bin": fs.ModeDir | 0o755,
		bin: 0o755,
	}
	for _, c := range Companions[w.program] {
		wantFiles["/usr/local/bin/"+c] = 0o755
	}
	got := map[string]fs.FileMode{}
	for p, e := range fsys {
		got[p] = e.mode
		if !e.mtime.Equal(w.created) {
			t.Errorf("%s/%s: %s modified %s, want %s", w.program, w.arch, p, e.mtime, w.created)
		}
		owner := 0
		if p == "/home/nonroot" {
			owner = 65532
		}
		if e.uid != owner || e.gid != owner {
			t.Errorf("%s/%s: %s owned by %d:%d, want %d:%[5]d", w.program, w.arch, p, e.uid, e.gid, owner)
		}
	}
	if !maps.Equal(got, wantFiles) {
		t.Errorf("%s/%s: files\n%v\nwant\n%v", w.program, w.arch, got, wantFiles)
	}
	for _, sh := range []string{"/bin/sh", "/bin", "/usr/bin/sh", "/bin/busybox"} {
		if _, ok := fsys[sh]; ok {
			t.Errorf("%s/%s: the image has %s", w.program, w.arch, sh)
		}
	}
	if p := string(fsys["/etc/passwd"].data); !strings.Contains(p, "\nnonroot:x:65532:65532:") {
		t.Errorf("%s/%s: /etc/passwd has no nonroot user 65532:\n%s", w.program, w.arch, p)
	}
	if g := string(fsys["/etc/group"].data); !strings.Contains(g, "\nnonroot:x:65532:") {
		t.Errorf("%s/%s: /etc/group has no nonroot group 65532:\n%s", w.program, w.arch, g)
	}
	bins := map[string][]byte{w.program: fsys[bin].data}
	for _, c := range Companions[w.program] {
		bins[c] = fsys["/usr/local/bin/"+c].data
	}
	return bins
}

func TestNewImage(t *testing.T) {
	s := Spec{Program: "xds-server", Arch: "arm64", Version: "0.1.0", Commit: "abc1234", Created: epoch1700, Binary: []byte("not really a program"),
		Companions: map[string][]byte{"kubectl-mvp": []byte("not really a plugin")}}
	img, err := NewImage(s)
	if err != nil {
		t.Fatal(err)
	}
	if bin := checkImage(t, img, want{"xds-server", "arm64", "0.1.0", "abc1234", epoch1700})["xds-server"]; !bytes.Equal(bin, s.Binary) {
		t.Errorf("the image's binary is %q, want %q", bin, s.Binary)
	}
	if mt, _ := img.MediaType(); mt != "application/vnd.oci.image.manifest.v1+json" {
		t.Errorf("media type %s, want an OCI manifest", mt)
	}

	// Reproducible: the same inputs make the same image; any input changes it.
	digest := func(s Spec) v1.Hash {
		img, err := NewImage(s)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := digest(s)
	if again := digest(s); again != d {
		t.Errorf("the same spec made %s and %s", d, again)
	}
	for _, change := range []func(*Spec){
		func(s *Spec) { s.Created = s.Created.Add(time.Second) },
		func(s *Spec) { s.Commit = "abc1235" },
		func(s *Spec) { s.Binary = []byte("another program") },
		func(s *Spec) { s.Companions = map[string][]byte{"kubectl-mvp": []byte("another plugin")} },
		func(s *Spec) { s.Arch = "amd64" },
	} {
		s2 := s
		change(&s2)
		if digest(s2) == d {
			t.Errorf("%+v made the same image as %+v", s2, s)
		}
	}

	if _, err := NewImage(Spec{Program: "extproc", Arch: "amd64"}); err == nil {
		t.Error("an image of no binary was made")
	}
}

// fakeBuild stands in for the compiler: each program is a line of text.
func fakeBuild(_ context.Context, o *Options, arch, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range built() {
		if err := os.WriteFile(filepath.Join(dir, p), fakeBinary(p, arch, o.Commit), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func fakeBinary(program, arch, commit string) []byte {
	return []byte(fmt.Sprintf("%s for %s at %s\n", program, arch, commit))
}

// checkOutputs checks what Run wrote to out for programs built for archs, tagged
// registry/<program>:ver, and returns the binaries by program and arch, read from the tarballs.
func checkOutputs(t *testing.T, out, registry, ver, commit string, archs []string, created time.Time) map[string]map[string][]byte {
	t.Helper()
	var wantTars []string
	for _, p := range Programs {
		for _, a := range archs {
			wantTars = append(wantTars, filepath.Join(out, p+"-"+a+".tar"))
		}
	}
	gotTars, err := filepath.Glob(filepath.Join(out, "*.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(wantTars); !slices.Equal(gotTars, wantTars) {
		t.Errorf("tarballs %q, want %q", gotTars, wantTars)
	}

	bins := map[string]map[string][]byte{}
	for _, p := range built() {
		bins[p] = map[string][]byte{}
	}
	for _, p := range Programs {
		imgs := map[string]v1.Image{}
		tag, err := name.NewTag(registry + "/" + p + ":" + ver)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range archs {
			tarPath := filepath.Join(out, p+"-"+a+".tar")
			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{tag.String()}) {
				t.Errorf("%s: manifest.json %+v, want one image tagged exactly %s", tarPath, m, tag)
			}
			img, err := tarball.ImageFromPath(tarPath, &tag)
			if err != nil {
				t.Fatal(err)
			}
			for name, bin := range checkImage(t, img, want{p, a, ver, commit, created}) {
				bins[name][a] = bin
			}
			imgs[a] = img
		}

		// The layout: one index, named for ctr and skopeo, of one image per architecture
		// (the same configurations as the tarballs').
		dir := filepath.Join(out, "oci", p)
		lp, err := layout.FromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		top, err := lp.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		tm, err := top.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations[annContainerdName] != tag.String() || tm.Manifests[0].Annotations[annRefName] != ver {
			t.Fatalf("%s/index.json: %+v, want one index named %s and %s", dir, tm.Manifests, tag, ver)
		}
		idx, err := top.ImageIndex(tm.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if im.MediaType != "application/vnd.oci.image.index.v1+json" || im.Annotations["org.opencontainers.image.revision"] != commit || im.Annotations["org.opencontainers.image.version"] != ver {
			t.Errorf("%s: index media type %s, annotations %v", dir, im.MediaType, im.Annotations)
		}
		var platforms []string
		for _, d := range im.Manifests {
			platforms = append(platforms, d.Platform.String())
			li, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			lc, _ := li.ConfigName()
			tc, _ := imgs[d.Platform.Architecture].ConfigName()
			if lc != tc {
				t.Errorf("%s %s: the layout's configuration %s is not the tarball's %s", p, d.Platform, lc, tc)
			}
		}
		// Every blob is one of the index's: no leftovers of an earlier run.
		reachable := map[string]bool{tm.Manifests[0].Digest.Hex: true}
		for _, d := range im.Manifests {
			reachable[d.Digest.Hex] = true
			li, _ := idx.Image(d.Digest)
			m, err := li.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			reachable[m.Config.Digest.Hex] = true
			for _, l := range m.Layers {
				reachable[l.Digest.Hex] = true
			}
		}
		blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
		if err != nil {
			t.Fatal(err)
		}
		var stored []string
		for _, b := range blobs {
			stored = append(stored, b.Name())
		}
		if want := slices.Sorted(maps.Keys(reachable)); !slices.Equal(stored, want) {
			t.Errorf("%s: blobs %q, want the index's %q", dir, stored, want)
		}

		var wantPlatforms []string
		for _, a := range archs {
			wantPlatforms = append(wantPlatforms, "linux/"+a)
		}
		if !slices.Equal(platforms, wantPlatforms) {
			t.Errorf("%s: platforms %q, want %q", dir, platforms, wantPlatforms)
		}
	}
	return bins
}

// TestRun runs the whole of `make images REGISTRY=… PUSH=1` with a stand-in compiler, pushing
// to a registry in this process; three times, the second for another commit, to see the output
// replaced, not added to, and the first and last runs make the same images.
func TestRun(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://") + "/kube-mvp"
	out := t.TempDir()
	var digests []string
	for _, commit := range []string{"abc1234", "def5678", "abc1234"} {
		var log bytes.Buffer
		o := &Options{Root: root, Registry: reg, Commit: commit, Created: epoch1700, Out: out, Push: true, Log: &log, Build: fakeBuild}
		if err := Defaults(o, env(nil)); err != nil {
			t.Fatal(err)
		}
		results, err := Run(context.Background(), o)
		if err != nil {
			t.Fatalf("%v\n%s", err, log.Bytes())
		}
		if len(results) != len(Programs) {
			t.Fatalf("%d results, want %d", len(results), len(Programs))
		}
		for _, r := range results {
			if !r.Pushed {
				t.Errorf("%s not pushed", r.Program)
			}
			local, err := r.Index.Digest()
			if err != nil {
				t.Fatal(err)
			}
			digests = append(digests, local.String())
			remoteIdx, err := remote.Index(r.Tag)
			if err != nil {
				t.Fatalf("%s: %v", r.Tag, err)
			}
			if d, _ := remoteIdx.Digest(); d != local {
				t.Errorf("%s: the registry has %s, want %s", r.Tag, d, local)
			}
			im, err := remoteIdx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range im.Manifests {
				img, err := remoteIdx.Image(d.Digest)
				if err != nil {
					t.Fatal(err)
				}
				for name, bin := range checkImage(t, img, want{r.Program, d.Platform.Architecture, o.Version, commit, epoch1700}) {
					if !bytes.Equal(bin, fakeBinary(name, d.Platform.Architecture, commit)) {
						t.Errorf("%s %s: pushed %s %q", r.Tag, d.Platform, name, bin)
					}
				}
			}
		}
		checkOutputs(t, out, reg, chartAppVersion(t), commit, DefaultArchs, epoch1700)
	}
	if n := len(Programs); !slices.Equal(digests[:n], digests[2*n:]) || slices.Equal(digests[:n], digests[n:2*n]) {
		t.Errorf("runs for commits abc1234, def5678, abc1234 made indexes %q: want the first and last the same, the second different", digests)
	}
}

// TestBuild builds the real images as `make images` does and checks each from its tarball:
// the configuration, the filesystem, the binary (static, stamped; run for --version on this
// machine's architecture) and that the chart deploys exactly these references.
//
// Architectures: this machine's only, unless IMAGES_TEST_ARCHS names more ("amd64 arm64").
// Measured on a 2-core machine: about 20 s with a warm build cache, about 3 minutes (4.4
// CPU-minutes) from an empty one, nearly all of it compiling; each further architecture costs
// as much again cold, and its binaries cannot be run here, only inspected. What differs per
// architecture in the image assembly (platform, index) TestRun checks for both.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles xds-server and extproc")
	}
	if !slices.Contains(knownArchs, runtime.GOARCH) {
		t.Skipf("no images for this machine's architecture %s", runtime.GOARCH)
	}
	archs := []string{runtime.GOARCH}
	if s := os.Getenv("IMAGES_TEST_ARCHS"); s != "" {
		archs = strings.Fields(s)
	}
	start := time.Now()
	tmp := t.TempDir()
	tool := filepath.Join(tmp, "images")
	if out, err := exec.Command("go", "build", "-o", tool, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build ./tools/images: %v\n%s", err, out)
	}
	out := filepath.Join(tmp, "out")
	const commit = "c0ffee1"
	cmd := exec.Command(tool, "-root", root, "-out", out, "-commit", commit, "-arch", strings.Join(archs, " "))
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s%s", cmd, err, stdout.Bytes(), stderr.Bytes())
	}
	t.Logf("built %s in %s\n%s", archs, time.Since(start).Round(time.Second), stdout.Bytes())

	ver := chartAppVersion(t)
	bins := checkOutputs(t, out, DefaultRegistry, ver, commit, archs, epoch1700)
	// The programs and their companions (kubectl-mvp, from the xds-server image).
	for _, p := range built() {
		for _, a := range archs {
			bin := bins[p][a]
			checkBinary(t, p, a, commit, bin)
			if a != runtime.GOARCH {
				continue
			}
			exe := filepath.Join(tmp, p+"-"+a)
			if err := os.WriteFile(exe, bin, 0o755); err != nil {
				t.Fatal(err)
			}
			wantOut := fmt.Sprintf("%s %s (commit %s)\n", p, ver, commit)
			runs := [][]string{{"--version"}}
			if p == "xds-server" || p == "kubectl-mvp" {
				runs = append(runs, []string{"version"})
			}
			for _, args := range runs {
				got, err := exec.Command(exe, args...).Output()
				if err != nil || string(got) != wantOut {
					t.Errorf("%s %s from the image: %q, %v; want %q and success", p, args[0], got, err, wantOut)
				}
			}
		}
	}

	// The chart deploys what was built: every container of ours, in either mode, runs one of
	// these references, and each image is used.
	built := map[string]bool{}
	for _, p := range Programs {
		built[DefaultRegistry+"/"+p+":"+ver] = false
	}
	for _, vals := range []map[string]any{nil, {"mode": "sidecar", "networkPolicy": map[string]any{"enabled": false}}} {
		rendered, err := deploy.RenderChart(filepath.Join(root, "deploy", "kube-mvp"), "kmvp", "kube-mvp", vals)
		if err != nil {
			t.Fatalf("rendering the chart with %v: %v", vals, err)
		}
		cs, err := deploy.ContainerImages(rendered)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if _, ok := built[c.Image]; ok {
				built[c.Image] = true
			} else if strings.HasPrefix(c.Image, DefaultRegistry+"/") {
				t.Errorf("values %v: %s %s container %s runs %s, which make images does not build (it builds %v)", vals, c.Kind, c.Name, c.Container, c.Image, slices.Sorted(maps.Keys(built)))
			}
		}
	}
	for ref, used := range built {
		if !used {
			t.Errorf("no container of the chart runs %s", ref)
		}
	}
}

// checkBinary checks a program from an image: an ELF executable for arch, static (no
// interpreter, no shared libraries), stripped, and built as a release (CGO_ENABLED=0,
// -trimpath, stamped with commit).
func checkBinary(t *testing.T, program, arch, commit string, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s/%s: %v", program, arch, err)
	}
	defer f.Close()
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV}[arch]
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("%s/%s: ELF %s %s, want %s ET_EXEC", program, arch, f.Machine, f.Type, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s/%s: dynamically linked (%s)", program, arch, p.Type)
		}
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s/%s: not stripped (-s)", program, arch)
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s/%s: %v", program, arch, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if bi.Path != "github.com/kube-mvp/kube-mvp/cmd/"+program || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" ||
		settings["GOOS"] != "linux" || settings["GOARCH"] != arch {
		t.Errorf("%s/%s: built as %s with %v", program, arch, bi.Path, settings)
	}
	// -trimpath keeps -ldflags out of the build info; the stamped commit is in the data (for
	// this machine's architecture the caller runs --version too).
	if !bytes.Contains(bin, []byte(commit)) {
		t.Errorf("%s/%s: the commit %s is nowhere in the binary: not stamped", program, arch, commit)
	}
}
