// Command images builds kube-mvp's container images, ghcr.io/kube-mvp/xds-server and
// ghcr.io/kube-mvp/extproc, without a Docker daemon and without pulling a base image: each
// image is one layer on top of nothing, holding the static binary at /usr/local/bin/<name>, an
// /etc/passwd and /etc/group that name the nonroot user 65532, its home and /tmp. No shell, no
// libc, no CA certificates (the programs trust only the CAs they are given).
//
//	go run ./tools/images [-registry ghcr.io/kube-mvp] [-version V] [-commit C]
//	    [-arch "amd64 arm64"] [-out bin/images] [-push]
//
// `make images` runs it. It writes
//
//	OUT/<name>-<arch>.tar   one `docker load`-able image per program and architecture,
//	                        tagged REGISTRY/<name>:VERSION
//	OUT/oci/<name>/         an OCI image layout holding the multi-arch index of <name>
//
// and with -push pushes each index to REGISTRY/<name>:VERSION (credentials from the Docker
// config, as `docker login` leaves them). VERSION defaults to the Helm chart's appVersion, so
// the images carry the tag the chart deploys; COMMIT to `git rev-parse --short HEAD`. The
// images are reproducible: every timestamp is SOURCE_DATE_EPOCH if set, else the commit time,
// else the Unix epoch.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kube-mvp/kube-mvp/internal/ociimage"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/version"
)

const (
	// DefaultRegistry is where the chart's values.yaml points (image.*.repository).
	DefaultRegistry = "ghcr.io/kube-mvp"
	// ChartFile, relative to the module root, holds the appVersion the images are tagged with.
	ChartFile = "deploy/kube-mvp/Chart.yaml"
	// Source is the org.opencontainers.image.source label.
	Source = "https://github.com/kube-mvp/kube-mvp"
	// UID and GID of the user the images run as (distroless's "nonroot"; the chart's
	// podSecurityContext runs as the same).
	UID = 65532
	GID = 65532

	// Annotations of the index in the OCI layout: containerd's (`ctr images import`) and the
	// OCI one (`skopeo copy oci:DIR:VERSION`).
	annContainerdName = "io.containerd.image.name"
	annRefName        = "org.opencontainers.image.ref.name"
)

// Programs are the commands of this module that become images, by name (./cmd/<name>).
var Programs = []string{"xds-server", "extproc"}

// Companions are commands an image holds beside its own program, at BinaryPath: the
// xds-server image carries the kubectl plugin of the same build, so the plugin that matches a
// running control plane can always be taken from its image (docs/images.md).
var Companions = map[string][]string{"xds-server": {"kubectl-mvp"}}

// built is every command BuildBinaries compiles: the programs and their companions.
func built() []string {
	out := slices.Clone(Programs)
	for _, p := range Programs {
		out = append(out, Companions[p]...)
	}
	return out
}

// DefaultArchs are the architectures `make images` builds.
var DefaultArchs = []string{"amd64", "arm64"}

// BinaryPath is where an image holds its program.
func BinaryPath(program string) string { return "/usr/local/bin/" + program }

// Options say what to build and where.
type Options struct {
	Root     string    // module root: go.mod, cmd/, deploy/
	Go       string    // the go command
	Registry string    // images are Registry/<program>:Version
	Version  string    // the tag and the binaries' version stamp
	Commit   string    // the binaries' commit stamp and the revision label
	Created  time.Time // every timestamp in the images
	Archs    []string  // GOARCH values; the OS is linux
	Out      string    // output directory
	Push     bool      // push each multi-arch index to Registry
	Log      io.Writer // progress (go build's output included)

	// Build compiles every program for arch into dir (dir/<program>); nil means BuildBinaries.
	// Tests replace it to skip the compiler.
	Build func(ctx context.Context, o *Options, arch, dir string) error
	// Remote are extra options for pushing (tests point it at an in-process registry).
	Remote []remote.Option
}

// Result is what Run produced for one program.
type Result struct {
	Program  string
	Tag      name.Tag
	Tarballs map[string]string // arch -> OUT/<program>-<arch>.tar
	Images   map[string]v1.Image
	Layout   string // OUT/oci/<program>
	Index    v1.ImageIndex
	Pushed   bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	o, err := ParseArgs(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(2)
	}
	o.Log = os.Stderr
	start := time.Now()
	results, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(1)
	}
	for _, r := range results {
		d, _ := r.Index.Digest()
		fmt.Printf("%s  %s@%s  %s\n", r.Tag, r.Tag.Context(), d, pushedOr(r))
		for _, arch := range o.Archs {
			fmt.Printf("  %-6s %s\n", arch, r.Tarballs[arch])
		}
	}
	fmt.Fprintf(os.Stderr, "images: done in %s\n", time.Since(start).Round(100*time.Millisecond))
}

func pushedOr(r Result) string {
	if r.Pushed {
		return "pushed"
	}
	return "layout " + r.Layout
}

// ParseArgs reads the command line; getenv supplies SOURCE_DATE_EPOCH. Whatever is not given
// is filled in by Defaults.
func ParseArgs(args []string, getenv func(string) string) (*Options, error) {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	o := &Options{}
	var archs string
	fs.StringVar(&o.Root, "root", ".", "module root")
	fs.StringVar(&o.Go, "go", "go", "the go command")
	fs.StringVar(&o.Registry, "registry", DefaultRegistry, "images are REGISTRY/<program>:VERSION")
	fs.StringVar(&o.Version, "version", "", "tag and version stamp (default: the chart's appVersion, "+ChartFile+")")
	fs.StringVar(&o.Commit, "commit", "", `commit stamp and revision label (default: git rev-parse --short HEAD, or "unknown")`)
	fs.StringVar(&archs, "arch", strings.Join(DefaultArchs, " "), "architectures, space- or comma-separated")
	fs.StringVar(&o.Out, "out", filepath.Join("bin", "images"), "output directory")
	fs.BoolVar(&o.Push, "push", false, "push each multi-arch index to REGISTRY (credentials from the Docker config)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: every option is a -flag", fs.Args())
	}
	o.Archs = strings.FieldsFunc(archs, func(r rune) bool { return r == ',' || r == ' ' })
	if err := Defaults(o, getenv); err != nil {
		return nil, err
	}
	return o, nil
}

var (
	reCommit = regexp.MustCompile(`^[0-9A-Za-z._+-]{1,64}$`)
	// Architectures the images are built for; each must be a GOARCH the chart's nodes run.
	knownArchs = []string{"amd64", "arm64", "ppc64le", "s390x", "riscv64"}
)

// Defaults fills in what o leaves empty — Version from the chart, Commit and Created from git
// (Created from SOURCE_DATE_EPOCH first) — and checks the result.
func Defaults(o *Options, getenv func(string) string) error {
	if o.Root == "" {
		o.Root = "."
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Registry == "" {
		o.Registry = DefaultRegistry
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if len(o.Archs) == 0 {
		o.Archs = slices.Clone(DefaultArchs)
	}
	if o.Version == "" {
		v, err := ChartAppVersion(filepath.Join(o.Root, ChartFile))
		if err != nil {
			return err
		}
		o.Version = v
	}
	commit, commitTime := GitHead(o.Root)
	if o.Commit == "" {
		o.Commit = commit
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0).UTC()
		if s := getenv("SOURCE_DATE_EPOCH"); s != "" {
			sec, err := strconv.ParseInt(s, 10, 64)
			if err != nil || sec < 0 {
				return fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
			}
			o.Created = time.Unix(sec, 0).UTC()
		} else if !commitTime.IsZero() {
			o.Created = commitTime.UTC()
		}
	}

	if !reCommit.MatchString(o.Commit) {
		return fmt.Errorf("commit %q: want a git commit (letters, digits, . _ + -)", o.Commit)
	}
	for _, arch := range o.Archs {
		if !slices.Contains(knownArchs, arch) {
			return fmt.Errorf("architecture %q: want one of %s", arch, strings.Join(knownArchs, ", "))
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(o.Archs)))) != len(o.Archs) {
		return fmt.Errorf("architectures %q: each at most once", o.Archs)
	}
	for _, p := range Programs {
		if _, err := o.Tag(p); err != nil {
			return err
		}
	}
	return nil
}

// Tag is the reference of program's image.
func (o *Options) Tag(program string) (name.Tag, error) {
	ref := fmt.Sprintf("%s/%s:%s", strings.TrimSuffix(o.Registry, "/"), program, o.Version)
	t, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q (registry %q, version %q): %w", ref, o.Registry, o.Version, err)
	}
	return t, nil
}

// ChartAppVersion reads appVersion from a Chart.yaml.
func ChartAppVersion(chartYAML string) (string, error) {
	b, err := os.ReadFile(chartYAML)
	if err != nil {
		return "", fmt.Errorf("reading the chart's appVersion: %w", err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("%s: %w", chartYAML, err)
	}
	if c.AppVersion == "" {
		return "", fmt.Errorf("%s: no appVersion", chartYAML)
	}
	return c.AppVersion, nil
}

// GitHead is the short commit hash and the commit time of HEAD in dir, or "unknown" and the
// zero time where there is no git or no repository.
func GitHead(dir string) (string, time.Time) {
	out, err := exec.Command("git", "-C", dir, "log", "-1", "--format=%h %ct", "HEAD").Output()
	if err != nil {
		return "unknown", time.Time{}
	}
	h, ct, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	sec, err := strconv.ParseInt(ct, 10, 64)
	if !ok || err != nil || h == "" {
		return "unknown", time.Time{}
	}
	return h, time.Unix(sec, 0).UTC()
}

// LDFlags are the linker flags of a release binary: no symbol table or DWARF, the version
// stamp set.
func LDFlags(ver, commit string) string {
	return fmt.Sprintf("-s -w -X %s.Version=%s -X %s.Commit=%s", version.Path, ver, version.Path, commit)
}

// BuildBinaries compiles every program, static (CGO_ENABLED=0) and stamped, for linux/arch
// into dir.
func BuildBinaries(ctx context.Context, o *Options, arch, dir string) error {
	args := []string{"build", "-trimpath", "-ldflags", LDFlags(o.Version, o.Commit), "-o", dir + string(filepath.Separator)}
	for _, p := range built() {
		args = append(args, "./cmd/"+p)
	}
	cmd := exec.CommandContext(ctx, o.Go, args...)
	cmd.Dir = o.Root
	// Baseline instruction sets, so the images run on every machine of the architecture.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOAMD64=v1", "GOARM64=v8.0")
	cmd.Stdout, cmd.Stderr = o.Log, o.Log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for linux/%s: %w", arch, err)
	}
	return nil
}

// Run builds every program for every architecture and writes (and pushes) the images.
func Run(ctx context.Context, o *Options) ([]Result, error) {
	build := o.Build
	if build == nil {
		build = BuildBinaries
	}
	if o.Version != "" {
		if v, err := ChartAppVersion(filepath.Join(o.Root, ChartFile)); err == nil && v != o.Version {
			fmt.Fprintf(o.Log, "images: note: version %s is not the chart's appVersion %s; deploy with --set image.xdsServer.tag=%s,image.extproc.tag=%s\n", o.Version, v, o.Version, o.Version)
		}
	}
	tmp, err := os.MkdirTemp("", "kube-mvp-images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}

	results := make([]Result, len(Programs))
	for i, p := range Programs {
		tag, err := o.Tag(p)
		if err != nil {
			return nil, err
		}
		results[i] = Result{Program: p, Tag: tag, Tarballs: map[string]string{}, Images: map[string]v1.Image{}}
	}
	for _, arch := range o.Archs {
		dir := filepath.Join(tmp, arch)
		fmt.Fprintf(o.Log, "images: building %s for linux/%s (version %s, commit %s)\n", strings.Join(built(), ", "), arch, o.Version, o.Commit)
		if err := build(ctx, o, arch, dir); err != nil {
			return nil, err
		}
		for i := range results {
			r := &results[i]
			bin, err := os.ReadFile(filepath.Join(dir, r.Program))
			if err != nil {
				return nil, fmt.Errorf("the build left no %s: %w", r.Program, err)
			}
			companions := map[string][]byte{}
			for _, c := range Companions[r.Program] {
				if companions[c], err = os.ReadFile(filepath.Join(dir, c)); err != nil {
					return nil, fmt.Errorf("the build left no %s: %w", c, err)
				}
			}
			img, err := NewImage(Spec{Program: r.Program, Arch: arch, Version: o.Version, Commit: o.Commit, Created: o.Created, Binary: bin, Companions: companions})
			if err != nil {
				return nil, fmt.Errorf("%s for %s: %w", r.Program, arch, err)
			}
			path := filepath.Join(o.Out, fmt.Sprintf("%s-%s.tar", r.Program, arch))
			if err := writeTarball(path, r.Tag, img); err != nil {
				return nil, err
			}
			r.Images[arch], r.Tarballs[arch] = img, path
		}
	}
	for i := range results {
		r := &results[i]
		idx, err := NewIndex(r.Program, o.Version, o.Commit, o.Archs, r.Images)
		if err != nil {
			return nil, err
		}
		r.Index = idx
		r.Layout = filepath.Join(o.Out, "oci", r.Program)
		if err := writeLayout(r.Layout, r.Tag, idx); err != nil {
			return nil, err
		}
		if o.Push {
			fmt.Fprintf(o.Log, "images: pushing %s\n", r.Tag)
			opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, o.Remote...)
			if err := remote.WriteIndex(r.Tag, idx, opts...); err != nil {
				return nil, fmt.Errorf("pushing %s: %w", r.Tag, err)
			}
			r.Pushed = true
		}
	}
	return results, nil
}

// Spec is one image: a program built for one architecture.
type Spec struct {
	Program, Arch   string
	Version, Commit string
	Created         time.Time
	Binary          []byte
	// Companions are other commands the image holds, by name, each at BinaryPath(name).
	Companions map[string][]byte
}

// Labels are the image's OCI labels (and its index's annotations).
func Labels(program, ver, commit string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":   Source,
		"org.opencontainers.image.url":      Source,
		"org.opencontainers.image.title":    program,
		"org.opencontainers.image.version":  ver,
		"org.opencontainers.image.revision": commit,
	}
}

// NewImage builds the image of s: empty, plus one layer with the binary and the nonroot user.
func NewImage(s Spec) (v1.Image, error) {
	if len(s.Binary) == 0 {
		return nil, errors.New("empty binary")
	}
	entries := ociimage.Nonroot(UID, GID, BinaryPath(s.Program), s.Binary)
	paths := []string{BinaryPath(s.Program)}
	for _, name := range slices.Sorted(maps.Keys(s.Companions)) {
		if len(s.Companions[name]) == 0 || name == s.Program {
			return nil, fmt.Errorf("companion %q: empty, or the program itself", name)
		}
		entries = append(entries, ociimage.File(strings.TrimPrefix(BinaryPath(name), "/"), 0o755, s.Companions[name]))
		paths = append(paths, BinaryPath(name))
	}
	return ociimage.New(s.Arch, s.Created, v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, GID),
		Entrypoint: []string{BinaryPath(s.Program)},
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin"},
		Labels:     Labels(s.Program, s.Version, s.Commit),
	}, v1.History{
		CreatedBy: fmt.Sprintf("tools/images: %s (linux/%s), /etc/passwd, /etc/group", strings.Join(paths, ", "), s.Arch),
		Comment:   "kube-mvp " + s.Version,
	}, entries)
}

// NewIndex is the multi-arch index of a program's images, in the order of archs.
func NewIndex(program, ver, commit string, archs []string, imgs map[string]v1.Image) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range archs {
		img, ok := imgs[arch]
		if !ok {
			return nil, fmt.Errorf("%s: no image for %s", program, arch)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture}},
		})
	}
	return mutate.Annotations(idx, Labels(program, ver, commit)).(v1.ImageIndex), nil
}

// writeTarball writes img as `docker save` would, tagged tag; the file appears whole or not at
// all.
func writeTarball(path string, tag name.Tag, img v1.Image) error {
	tmp := path + ".partial"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

// writeLayout replaces dir with an OCI image layout holding idx, named tag.
func writeLayout(dir string, tag name.Tag, idx v1.ImageIndex) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		annContainerdName: tag.String(),
		annRefName:        tag.TagStr(),
	})); err != nil {
		return fmt.Errorf("writing %s: %w", dir, err)
	}
	return nil
}
