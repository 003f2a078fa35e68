package certgen

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

// Files are where KeepFiles keeps the state: Dir/<CA key> and Dir/<role>/<role key>
// (layout.go), keys mode 0600.
type Files struct {
	Dir string
	// Name is how errors name Dir (xds-server certgen: its flag, --out-dir).
	Name string
}

// KeepFiles keeps the state in files: reads them, renews (Renew at now, for specs under p),
// writes what changed, each file atomically, removes the renewal requests carried out, logs
// what it did and returns a one-line summary.
func KeepFiles(opts Files, specs []Spec, p Policy, now time.Time, log *slog.Logger) (string, error) {
	read := func(dir string, keys []string) (map[string][]byte, error) {
		data := map[string][]byte{}
		for _, k := range keys {
			b, err := os.ReadFile(filepath.Join(dir, k))
			switch {
			case errors.Is(err, os.ErrNotExist):
			case err != nil:
				return nil, fmt.Errorf("%s: %w", opts.Name, err)
			default:
				data[k] = b
			}
		}
		return data, nil
	}
	var cur State
	caData, err := read(opts.Dir, CAKeys)
	if err != nil {
		return "", err
	}
	cur.SetCAData(caData)
	// A renewal request is a file RenewFile: DIR/renew for every role, DIR/ROLE/renew
	// for one.
	requested := func(dir string) (string, error) {
		path := filepath.Join(dir, RenewFile)
		_, err := os.Lstat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return "", nil
		case err != nil:
			return "", fmt.Errorf("%s: %w", opts.Name, err)
		}
		return path, nil
	}
	allMarker, err := requested(opts.Dir)
	if err != nil {
		return "", err
	}
	if allMarker != "" {
		cur.RenewAllRequest = "file " + allMarker + ": every role's certificate"
	}
	cur.Leaves = map[cptls.Role]Leaf{}
	leafData := map[cptls.Role]map[string][]byte{}
	markers := map[cptls.Role]string{}
	for _, s := range specs {
		dir := filepath.Join(opts.Dir, string(s.Role))
		d, err := read(dir, LeafKeys)
		if err != nil {
			return "", err
		}
		leafData[s.Role] = d
		if markers[s.Role], err = requested(dir); err != nil {
			return "", err
		}
		if len(d) > 0 {
			leaf := LeafFromData(d)
			if markers[s.Role] != "" {
				leaf.RenewRequest = "file " + markers[s.Role]
			}
			cur.Leaves[s.Role] = leaf
		}
	}

	next, changes, err := Renew(now, cur, specs, p)
	if err != nil {
		return "", err
	}
	logChanges(log, changes)

	var written, removed int
	remove := func(path string) error {
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("%s: %w", opts.Name, err)
		}
		removed++
		log.Info("file removed", "path", path)
		return nil
	}
	sync := func(dir string, keys []string, old, data map[string][]byte) error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("%s: %w", opts.Name, err)
		}
		for _, k := range keys {
			path := filepath.Join(dir, k)
			v, want := data[k]
			have, had := old[k]
			switch {
			case !want && had:
				if err := remove(path); err != nil {
					return err
				}
			case want && (!had || !bytes.Equal(have, v)):
				mode := os.FileMode(0o644)
				if IsPrivateKey(k) {
					mode = 0o600
				}
				if err := writeFileAtomic(path, v, mode); err != nil {
					return fmt.Errorf("%s: %w", opts.Name, err)
				}
				written++
				log.Info("file written", "path", path)
			}
		}
		return nil
	}
	if err := sync(opts.Dir, CAKeys, caData, next.CAData()); err != nil {
		return "", err
	}
	for _, s := range specs {
		dir := filepath.Join(opts.Dir, string(s.Role))
		if err := sync(dir, LeafKeys, leafData[s.Role], next.Leaves[s.Role].Data()); err != nil {
			return "", err
		}
		// The request is carried out: its file goes (DIR/renew last, after every role's).
		if m := markers[s.Role]; m != "" {
			if err := remove(m); err != nil {
				return "", err
			}
		}
	}
	if allMarker != "" {
		if err := remove(allMarker); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("certgen: %d change(s); files in %s: %d written, %d removed", len(changes), opts.Dir, written, removed), nil
}

// writeFileAtomic replaces path with data by a rename, so a reader never sees half a file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename: nothing to remove
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
