// Package ociimage makes the images kube-mvp builds without a Docker daemon and without a
// base image: one layer, every timestamp one given time, so the same inputs give the same
// image. tools/images makes the product's images with it, test/node/standin and
// test/node/images the one-node test cluster's.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entry is one file, directory or symlink of a layer, owned by root unless UID says
// otherwise (the group is the same number).
type Entry struct {
	Name string
	Type byte // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	Mode int64
	UID  int
	Data []byte
	Link string
	PAX  map[string]string
}

// File is a regular file of root's.
func File(name string, mode int64, data []byte) Entry {
	return Entry{Name: name, Type: tar.TypeReg, Mode: mode, Data: data}
}

// Dir is a directory owned by uid.
func Dir(name string, mode int64, uid int) Entry {
	return Entry{Name: name + "/", Type: tar.TypeDir, Mode: mode, UID: uid}
}

// Link is a symbolic link to target.
func Link(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeSymlink, Mode: 0o777, Link: target}
}

// Nonroot is the tree of an image that runs one static binary as the user "nonroot" (uid,
// group gid): /etc/passwd and /etc/group naming root and nonroot, nonroot's home, /tmp, and
// the binary at binaryPath (absolute, under /usr/local/bin).
func Nonroot(uid, gid int, binaryPath string, binary []byte) []Entry {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, gid)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", gid)
	return []Entry{
		Dir("etc", 0o755, 0),
		File("etc/group", 0o644, []byte(group)),
		File("etc/passwd", 0o644, []byte(passwd)),
		Dir("home", 0o755, 0),
		Dir("home/nonroot", 0o700, uid),
		Dir("tmp", 0o1777, 0),
		Dir("usr", 0o755, 0),
		Dir("usr/local", 0o755, 0),
		Dir("usr/local/bin", 0o755, 0),
		File(strings.TrimPrefix(binaryPath, "/"), 0o755, binary),
	}
}

// New is an OCI image for linux/arch with cfg and one layer of entries, created (and every
// file in it modified) at created; history describes the layer.
func New(arch string, created time.Time, cfg v1.Config, history v1.History, entries []Entry) (v1.Image, error) {
	created = created.UTC()
	layer, err := Layer(entries, created)
	if err != nil {
		return nil, err
	}
	t := v1.Time{Time: created}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(base, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      t,
		Config:       cfg,
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	history.Created = t
	return mutate.Append(img, mutate.Addendum{Layer: layer, History: history, MediaType: types.OCILayer})
}

// Layer is a gzipped tar of entries, each modified at mod, compressed once here
// (go-containerregistry would compress again on every read).
func Layer(entries []Entry, mod time.Time) (v1.Layer, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		h := &tar.Header{
			Typeflag:   e.Type,
			Name:       e.Name,
			Linkname:   e.Link,
			Mode:       e.Mode,
			Uid:        e.UID,
			Gid:        e.UID,
			Size:       int64(len(e.Data)),
			ModTime:    mod,
			PAXRecords: e.PAX,
			Format:     tar.FormatPAX,
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	compressed := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
