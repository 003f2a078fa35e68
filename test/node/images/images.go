// Package images builds the images the one-node test cluster's pods run — the pod sandbox's
// pause, busybox for test pods, CoreDNS — and the helm binary its tests deploy with. No image
// registry is reachable from our machines, so, like tools/images does for kube-mvp's own
// images, each image is made here without a Docker daemon and without a base image: one
// layer, every timestamp the Unix epoch, so the same inputs give the same image. Each is
// written as a `docker save`-style tarball that `ctr -n k8s.io images import FILE` accepts,
// tagged kube-mvp.test/<name>:<tag>.
//
// Built binaries and tarballs are cached in controlplane.CacheDir(), keyed by a hash of
// everything that decides their content, like the kube binaries: a warm call costs a few file
// reads. CoreDNS and helm come from their published Go modules, pinned by the wrapper modules
// under tools/node/coredns and tools/node/helm.
package images

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kube-mvp/kube-mvp/internal/ociimage"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// Image is one built image: its reference (e.g. "kube-mvp.test/pause:1") and its tarball.
type Image struct{ Ref, Tarball string }

const (
	// Registry is the made-up registry of every test image; nothing is ever pulled from it
	// (give pods imagePullPolicy IfNotPresent or Never, the default for a tag not "latest").
	Registry = "kube-mvp.test"
	// PauseRef and BusyboxRef are the references Pause and Busybox tag their images with;
	// CoreDNS's tag is the CoreDNS release (CoreDNSRef).
	PauseRef   = Registry + "/pause:1"
	BusyboxRef = Registry + "/busybox:1"

	// The users the images run as: the pause image's is the one upstream's pause uses, the
	// CoreDNS image's is distroless's "nonroot", as upstream's CoreDNS image.
	PauseUID   = 65535
	CoreDNSUID = 65532

	// BusyboxPath is where Debian's busybox-static package installs busybox.
	BusyboxPath = "/bin/busybox"

	// format is folded into every image's cache key: bump it when the way an image is
	// assembled changes, so cached tarballs are rebuilt.
	format = "images/1"
)

// created is every timestamp in the images, for reproducibility.
var created = time.Unix(0, 0).UTC()

// Pause builds (or reuses from the cache) the pod sandbox image: test/node/images/pause as
// /pause, the entrypoint, run as 65535:65535.
func Pause(ctx context.Context, log io.Writer) (Image, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return Image{}, err
	}
	const pkg = "test/node/images/pause"
	src, err := os.ReadFile(filepath.Join(root, pkg, "main.go"))
	if err != nil {
		return Image{}, err
	}
	ldflags := "-s -w"
	dir, err := controlplane.CachedBuild(ctx, log, controlplane.BuildSpec{
		Label:     "pause",
		What:      "the pause program",
		Key:       "pause-" + runtime.Version() + "-" + hash(runtime.GOARCH, ldflags, string(src)),
		Outputs:   []string{"pause"},
		ModuleDir: root,
		LDFlags:   ldflags,
		Packages:  []string{"./" + pkg},
		Flags:     []string{"-buildvcs=false"},
	})
	if err != nil {
		return Image{}, err
	}
	return cachedImage(ctx, log, "pause", PauseRef, func() (v1.Image, error) {
		bin, err := os.ReadFile(filepath.Join(dir, "pause"))
		if err != nil {
			return nil, err
		}
		return newImage(v1.Config{
			Entrypoint: []string{"/pause"},
			User:       fmt.Sprintf("%d:%d", PauseUID, PauseUID),
			WorkingDir: "/",
		}, "pause: /pause", []ociimage.Entry{ociimage.File("pause", 0o755, bin)})
	}, bin(dir, "pause"))
}

// Busybox builds (or reuses from the cache) an image of Debian's static busybox: /bin/busybox
// and a symlink in /bin for each of its applets (sh, sleep, cat, wget, nslookup, ...), an
// /etc/passwd and /etc/group naming root and nobody, /root, /tmp. It runs as root, `sh` by
// default.
func Busybox(ctx context.Context, log io.Writer) (Image, error) {
	b, err := os.ReadFile(BusyboxPath)
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, fmt.Errorf("%s is missing: apt-get install busybox-static", BusyboxPath)
	}
	if err != nil {
		return Image{}, err
	}
	if !isStaticELF(b) {
		return Image{}, fmt.Errorf("%s is not a statically linked executable (the busybox package, not busybox-static, is installed?): apt-get install busybox-static", BusyboxPath)
	}
	return cachedImage(ctx, log, "busybox", BusyboxRef, func() (v1.Image, error) {
		applets, err := busyboxApplets(ctx)
		if err != nil {
			return nil, err
		}
		entries := []ociimage.Entry{
			ociimage.Dir("bin", 0o755, 0),
			ociimage.File("bin/busybox", 0o755, b),
		}
		for _, a := range applets {
			entries = append(entries, ociimage.Link("bin/"+a, "busybox"))
		}
		entries = append(entries,
			ociimage.Dir("etc", 0o755, 0),
			ociimage.File("etc/group", 0o644, []byte("root:x:0:\nnobody:x:65534:\n")),
			ociimage.File("etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n")),
			ociimage.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")),
			ociimage.Dir("root", 0o700, 0),
			ociimage.Dir("tmp", 0o1777, 0),
			ociimage.Dir("usr", 0o755, 0),
			ociimage.Dir("usr/bin", 0o755, 0),
			ociimage.Link("usr/bin/env", "../../bin/busybox"),
		)
		return newImage(v1.Config{
			Cmd:        []string{"sh"},
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			WorkingDir: "/",
		}, fmt.Sprintf("busybox: %s (%d applets), /etc/passwd, /etc/group", BusyboxPath, len(applets)), entries)
	}, b)
}

// busyboxApplets are the applets of the installed busybox, as `busybox --list` names them.
func busyboxApplets(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, BusyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", BusyboxPath, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.ContainsAny(a, "/\x00") {
			applets = append(applets, a)
		}
	}
	if !slices.Contains(applets, "sh") {
		return nil, fmt.Errorf("%s --list names no sh applet", BusyboxPath)
	}
	slices.Sort(applets)
	return slices.Compact(applets), nil
}

// isStaticELF says whether b is an ELF executable without a program interpreter (PT_INTERP),
// i.e. runs with no dynamic loader or libc beside it.
func isStaticELF(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// CoreDNSRef is the reference CoreDNS tags its image with: the release pinned in
// tools/node/coredns/go.mod.
func CoreDNSRef() (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	v, err := requiredVersion(filepath.Join(root, "tools", "node", "coredns", "go.mod"), "github.com/coredns/coredns")
	if err != nil {
		return "", err
	}
	return Registry + "/coredns:" + v, nil
}

// CoreDNS builds (or reuses from the cache) CoreDNS, the release and plugins pinned in
// tools/node/coredns, and its image: /coredns, the entrypoint, with `-conf
// /etc/coredns/Corefile` the default arguments (kubeadm's Deployment passes the same), run as
// 65532:65532. Like upstream's image, /coredns has the file capability cap_net_bind_service,
// so the non-root server binds port 53 where the pod is given NET_BIND_SERVICE (kubeadm's
// Deployment adds it, and sets allowPrivilegeEscalation false, which keeps file capabilities
// only within what the container was given). As with upstream's image, a container without
// NET_BIND_SERVICE in its bounding set cannot start it ("exec /coredns: operation not
// permitted").
func CoreDNS(ctx context.Context, log io.Writer) (Image, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return Image{}, err
	}
	mod := filepath.Join(root, "tools", "node", "coredns")
	inputs, err := readInputs(mod, "go.mod", "go.sum", "main.go")
	if err != nil {
		return Image{}, fmt.Errorf("the CoreDNS wrapper module: %w", err)
	}
	ref, err := CoreDNSRef()
	if err != nil {
		return Image{}, err
	}
	version := ref[strings.LastIndex(ref, ":")+1:]
	ldflags := "-s -w"
	binPath, err := buildTool(ctx, log, "coredns", version, mod, ldflags, inputs, ".")
	if err != nil {
		return Image{}, err
	}
	return cachedImage(ctx, log, "coredns", ref, func() (v1.Image, error) {
		b, err := os.ReadFile(binPath)
		if err != nil {
			return nil, err
		}
		coredns := ociimage.File("coredns", 0o755, b)
		coredns.PAX = map[string]string{"SCHILY.xattr.security.capability": string(netBindServiceCap)}
		id := fmt.Sprint(CoreDNSUID)
		return newImage(v1.Config{
			Entrypoint:   []string{"/coredns"},
			Cmd:          []string{"-conf", "/etc/coredns/Corefile"},
			User:         id + ":" + id,
			WorkingDir:   "/",
			ExposedPorts: map[string]struct{}{"53/tcp": {}, "53/udp": {}, "9153/tcp": {}},
		}, "coredns "+version+": /coredns", []ociimage.Entry{
			coredns,
			ociimage.Dir("etc", 0o755, 0),
			ociimage.File("etc/group", 0o644, []byte("root:x:0:\nnonroot:x:"+id+":\n")),
			ociimage.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:"+id+":"+id+":nonroot:/home/nonroot:/sbin/nologin\n")),
			ociimage.Dir("home", 0o755, 0),
			ociimage.Dir("home/nonroot", 0o700, CoreDNSUID),
			ociimage.Dir("tmp", 0o1777, 0),
		})
	}, []byte(binPath))
}

// netBindServiceCap is the security.capability extended attribute `setcap
// cap_net_bind_service=+ep` writes: struct vfs_cap_data, revision 2, effective, with
// CAP_NET_BIND_SERVICE (10) permitted.
var netBindServiceCap = []byte{
	0x01, 0x00, 0x00, 0x02, // magic_etc: VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	0x00, 0x04, 0x00, 0x00, // data[0].permitted: 1 << 10
	0x00, 0x00, 0x00, 0x00, // data[0].inheritable
	0x00, 0x00, 0x00, 0x00, // data[1].permitted
	0x00, 0x00, 0x00, 0x00, // data[1].inheritable
}

// Helm returns the path of a helm v3 binary built from the helm.sh/helm/v3 module at the
// version the repository's go.mod requires, through the wrapper module tools/node/helm (the
// main module lacks some of cmd/helm's requirements), cached.
func Helm(ctx context.Context, log io.Writer) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	const module = "helm.sh/helm/v3"
	want, err := requiredVersion(filepath.Join(root, "go.mod"), module)
	if err != nil {
		return "", err
	}
	mod := filepath.Join(root, "tools", "node", "helm")
	have, err := requiredVersion(filepath.Join(mod, "go.mod"), module)
	if err != nil {
		return "", err
	}
	if have != want {
		return "", fmt.Errorf("tools/node/helm pins %s %s but go.mod requires %s: run `go get -tool %s/cmd/helm@%s && go mod tidy` in tools/node/helm", module, have, want, module, want)
	}
	clientGo, err := requiredVersion(filepath.Join(mod, "go.mod"), "k8s.io/client-go")
	if err != nil {
		return "", err
	}
	inputs, err := readInputs(mod, "go.mod", "go.sum")
	if err != nil {
		return "", err
	}
	ldflags := helmLDFlags(want, clientGo)
	return buildTool(ctx, log, "helm", want, mod, ldflags, inputs, module+"/cmd/helm")
}

// buildTool builds the binary name at version from the package pkg of the wrapper module in
// mod (whose go.mod and go.sum make inputs) with ldflags, or finds it cached; it returns the
// binary's path.
func buildTool(ctx context.Context, log io.Writer, name, version, mod, ldflags, inputs, pkg string) (string, error) {
	dir, err := controlplane.CachedBuild(ctx, log, controlplane.BuildSpec{
		Label:     name + " " + version,
		What:      name,
		Key:       fmt.Sprintf("%s-%s-%s-%s", name, version, runtime.Version(), hash(runtime.GOARCH, ldflags, inputs)),
		Outputs:   []string{name},
		ModuleDir: mod,
		LDFlags:   ldflags,
		Packages:  []string{pkg},
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

// helmLDFlags stamp a helm release build as helm's Makefile does: the version `helm version`
// prints, and the Kubernetes version (from the client-go it is built with, v0.X.Y is 1.X)
// that `helm template` and `helm lint` assume without a cluster.
func helmLDFlags(version, clientGo string) string {
	flags := []string{"-s", "-w",
		"-X", "helm.sh/helm/v3/internal/version.version=" + version,
		"-X", "helm.sh/helm/v3/internal/version.gitTreeState=clean",
	}
	if _, rest, ok := strings.Cut(clientGo, "v0."); ok {
		if minor, _, ok := strings.Cut(rest, "."); ok {
			for _, pkg := range []string{"helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"} {
				flags = append(flags, "-X", pkg+".k8sVersionMajor=1", "-X", pkg+".k8sVersionMinor="+minor)
			}
		}
	}
	return strings.Join(flags, " ")
}

// requiredVersion is the version of module that the go.mod at path requires.
func requiredVersion(path, module string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[0] == "require" {
			fields = fields[1:]
		}
		if len(fields) >= 2 && fields[0] == module {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s does not require %s", path, module)
}

// readInputs is the named files of dir, each preceded by its name and size.
func readInputs(dir string, files ...string) (string, error) {
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s %d\n%s", f, len(data), data)
	}
	return b.String(), nil
}

// hash is a short hex digest of parts.
func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d\n%s", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// bin is a cache-key input standing for the built binary dir/name: its path, which the build's
// cache key names (CachedBuild never rewrites a finished directory).
func bin(dir, name string) []byte { return []byte(filepath.Join(dir, name)) }

// cachedImage returns the cached tarball of the image named ref that build makes from key
// (all of build's inputs), making and writing it first when it is missing. The tarball is
// written to a temporary file renamed into place, so a reader never sees half of one;
// concurrent first calls may both make it, with the same result.
func cachedImage(ctx context.Context, log io.Writer, short, ref string, build func() (v1.Image, error), key []byte) (Image, error) {
	cache, err := controlplane.CacheDir()
	if err != nil {
		return Image{}, err
	}
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return Image{}, err
	}
	dir := filepath.Join(cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Image{}, err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-%s.tar", short, tag.TagStr(), hash(format, ref, runtime.GOARCH, string(key))))
	if _, err := os.Stat(path); err == nil {
		fmt.Fprintf(log, "image %s: using cached %s\n", ref, path)
		return Image{Ref: ref, Tarball: path}, nil
	}
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	start := time.Now()
	img, err := build()
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", ref, err)
	}
	tmp, err := os.CreateTemp(dir, ".build-*.tar")
	if err != nil {
		return Image{}, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := tarball.WriteToFile(tmp.Name(), tag, img); err != nil {
		return Image{}, fmt.Errorf("image %s: writing the tarball: %w", ref, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return Image{}, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return Image{}, err
	}
	fmt.Fprintf(log, "image %s: made in %s, cached in %s\n", ref, time.Since(start).Round(time.Millisecond), path)
	return Image{Ref: ref, Tarball: path}, nil
}

// newImage is an image for this machine's platform with cfg and one layer of entries.
func newImage(cfg v1.Config, createdBy string, entries []ociimage.Entry) (v1.Image, error) {
	cfg.Labels = map[string]string{"org.opencontainers.image.description": "kube-mvp test image, built by test/node/images"}
	return ociimage.New(runtime.GOARCH, created, cfg, v1.History{CreatedBy: "test/node/images: " + createdBy}, entries)
}
