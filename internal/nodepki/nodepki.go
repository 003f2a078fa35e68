// Package nodepki republishes a certificate and its key that another program rewrites in
// place (kubeadm's /etc/kubernetes/pki/front-proxy-client.{crt,key}, owned by root, mode
// 0600) into a directory other containers of the pod read as an unprivileged user, laid out
// as the kubelet lays out a Secret volume (a generation per directory, ..data switched
// atomically), and only a complete, matching pair read twice alike.
//
// The layout, the checks and their limit: docs/security.md#how-copy-files-publishes-a-generation.
package nodepki

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// MaxFileSize is the largest source file read: a certificate chain and key are a few KiB.
const MaxFileSize = 64 << 10

// dataLink is the symlink that names the current generation's directory.
const dataLink = "..data"

// Modes of the published files: the key readable by its owner and, with a group, by that
// group; the certificate by everyone who can enter the directory.
const (
	keyMode      os.FileMode = 0o400
	keyGroupMode os.FileMode = 0o440
	certMode     os.FileMode = 0o444
	dirMode      os.FileMode = 0o755
)

// Copier publishes Files into Dir.
type Copier struct {
	// Files are the two source files, a certificate (chain) and its private key, in PEM.
	// Each is published under its base name.
	Files []string
	// Dir is the destination directory; it must exist.
	Dir string
	// Group, when positive, is the published files' group (the copier must be a member:
	// changing a file's group to one of its own groups needs no capability); the key is
	// then readable by that group. 0: the copier's group, and the key readable by the
	// copier's user only.
	Group int

	// read reads one source file; nil: readLimited. Tests interleave a rewrite with it.
	read func(path string) ([]byte, error)
}

// Pair is what one read of the source files found: each file's base name and content, and
// which of them is the key.
type Pair struct {
	Files map[string][]byte
	Key   string // the base name of the key file
}

// Equal reports whether p and o hold the same files with the same content.
func (p Pair) Equal(o Pair) bool {
	if len(p.Files) != len(o.Files) || p.Key != o.Key {
		return false
	}
	for name, b := range p.Files {
		if ob, ok := o.Files[name]; !ok || !bytes.Equal(b, ob) {
			return false
		}
	}
	return true
}

// CheckArgs validates Files and Dir without reading the files' content.
func (c *Copier) CheckArgs() error {
	if err := CheckFiles(c.Files); err != nil {
		return err
	}
	if c.Dir == "" {
		return errors.New("no destination directory")
	}
	return nil
}

// CheckFiles validates the source file names: two, with distinct base names that can be
// published beside ..data.
func CheckFiles(files []string) error {
	if len(files) != 2 {
		return fmt.Errorf("want exactly two files, a certificate and its key; got %d", len(files))
	}
	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		if f == "" || name == "." || name == "/" || strings.HasPrefix(name, "..") {
			return fmt.Errorf("%q: not a file name that can be published", f)
		}
		if seen[name] {
			return fmt.Errorf("two files named %s: they would be published under one name", name)
		}
		seen[name] = true
	}
	return nil
}

// ReadSource reads the source files and checks that they are one certificate and the key
// that matches it, then reads them again: they must not have changed. An error says which
// file is wrong and how; nothing is published then.
//
// The second read is what rejects a file read while it was rewritten in place: such a read
// (several read(2)s, and even one is not atomic against a truncate and write) can return the
// head of the old content and the tail of the new. A spliced certificate can pass the
// checks: its public key is in its head, which is all tls.X509KeyPair compares with the key,
// and the signature in its tail is not verified (the issuer is not at hand). A read that
// begins after the first one ended cannot return that old head again, so it differs.
// Because each file's second read begins after the other file's first read, two equal reads
// also say that the files held this pair at the same moment.
func (c *Copier) ReadSource() (Pair, error) {
	if err := c.CheckArgs(); err != nil {
		return Pair{}, err
	}
	p := Pair{Files: map[string][]byte{}}
	var certName string
	for _, f := range c.Files {
		b, err := c.readFile(f)
		if err != nil {
			return Pair{}, err
		}
		name := filepath.Base(f)
		p.Files[name] = b
		switch kind := pemKind(b); kind {
		case "key":
			if p.Key != "" {
				return Pair{}, fmt.Errorf("%s and %s both hold a private key; want a certificate and its key", c.pathOf(p.Key), f)
			}
			p.Key = name
		case "cert":
			if certName != "" {
				return Pair{}, fmt.Errorf("%s and %s both hold certificates; want a certificate and its key", c.pathOf(certName), f)
			}
			certName = name
		default:
			return Pair{}, fmt.Errorf("%s holds no PEM certificate or private key (%d bytes; being rewritten?)", f, len(b))
		}
	}
	if _, err := tls.X509KeyPair(p.Files[certName], p.Files[p.Key]); err != nil {
		return Pair{}, fmt.Errorf("%s and %s are not a matching certificate and key (one of them being rewritten?): %w", c.pathOf(certName), c.pathOf(p.Key), err)
	}
	for _, f := range c.Files {
		b, err := c.readFile(f)
		if err != nil {
			return Pair{}, err
		}
		if !bytes.Equal(b, p.Files[filepath.Base(f)]) {
			return Pair{}, fmt.Errorf("%s %w", f, ErrChangedWhileRead)
		}
	}
	return p, nil
}

// ErrChangedWhileRead: a source file differed between its two reads. It is a moment's state
// (a rewrite in progress), not a problem with the files, so a copier retries at the next
// interval and says so only when it lasts (changedWhileReadLogAfter syncs in a row).
var ErrChangedWhileRead = errors.New("changed while it was read (being rewritten?)")

// changedWhileReadLogAfter: a kubeadm renewal rewrites each file once; three rewrites caught
// in three syncs in a row is a writer that never stops, worth a log line.
const changedWhileReadLogAfter = 3

// transientQuiet reports whether err is a rewrite caught in progress that has not yet lasted
// long enough to log, and counts it.
func transientQuiet(err error, inARow *int) bool {
	if !errors.Is(err, ErrChangedWhileRead) {
		*inARow = 0
		return false
	}
	*inARow++
	return *inARow < changedWhileReadLogAfter
}

func (c *Copier) readFile(path string) ([]byte, error) {
	if c.read != nil {
		return c.read(path)
	}
	return readLimited(path)
}

func (c *Copier) pathOf(name string) string {
	for _, f := range c.Files {
		if filepath.Base(f) == name {
			return f
		}
	}
	return name
}

// readLimited reads a regular file of at most MaxFileSize bytes. O_NONBLOCK keeps a FIFO in
// its place from blocking the open; the type is checked on the opened file.
func readLimited(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s is %d bytes, more than %d", path, st.Size(), MaxFileSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("%s grew past %d bytes while read", path, MaxFileSize)
	}
	return b, nil
}

// pemKind is "key" when b holds a PEM private key, "cert" when it holds certificates and no
// key, "" otherwise.
func pemKind(b []byte) string {
	kind := ""
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return kind
		}
		switch {
		case strings.HasSuffix(blk.Type, "PRIVATE KEY"):
			return "key"
		case blk.Type == "CERTIFICATE":
			kind = "cert"
		}
	}
}

// Published reads what Dir holds now under the source files' names, through their symlinks
// as a reader does; an error when something is missing.
func (c *Copier) Published() (Pair, error) {
	if err := c.CheckArgs(); err != nil {
		return Pair{}, err
	}
	p := Pair{Files: map[string][]byte{}}
	for _, f := range c.Files {
		name := filepath.Base(f)
		b, err := readLimited(filepath.Join(c.Dir, name))
		if err != nil {
			return Pair{}, err
		}
		p.Files[name] = b
		if pemKind(b) == "key" {
			p.Key = name
		}
	}
	return p, nil
}

// Result is what one Sync did.
type Result int

const (
	// Unchanged: the source pair is what Dir holds already.
	Unchanged Result = iota
	// Published: a new generation holds the source pair.
	Published
	// Skipped: the source files are not a good pair now (Sync's error says why); Dir keeps
	// what it held.
	Skipped
	// Failed: the source pair is good but could not be published (Sync's error says why).
	Failed
)

func (r Result) String() string {
	return [...]string{"unchanged", "published", "skipped", "failed"}[r]
}

// Run syncs at once and then every interval until ctx ends. A published generation is
// logged each time; a skipped or failed round when its reason differs from the last
// round's (a lasting problem is logged once, not every interval), and the return to a good
// pair after one.
func (c *Copier) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := ""
	changing := 0
	for {
		res, err := c.Sync()
		switch {
		case transientQuiet(err, &changing):
		case err != nil:
			if msg := res.String() + ": " + err.Error(); msg != last {
				if res == Skipped {
					log.Warn("source files skipped; the last good pair stays published, trying again every interval", "error", err, "interval", interval)
				} else {
					log.Error("could not publish the source files; trying again every interval", "error", err, "interval", interval)
				}
				last = msg
			}
		case res == Published:
			log.Info("published the source files", "files", c.Files, "dir", c.Dir)
			last = ""
		case last != "":
			log.Info("the source files are a good pair again, the one published", "files", c.Files, "dir", c.Dir)
			last = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// WaitPublished publishes the source pair once it can: until then it logs why not (each new
// reason once, with hint) and tries again every interval. It returns nil once Dir holds the
// pair, or ctx's error.
func (c *Copier) WaitPublished(ctx context.Context, interval time.Duration, log *slog.Logger, hint string) error {
	last := ""
	changing := 0
	for {
		res, err := c.Sync()
		if err == nil && res != Skipped {
			log.Info("the files are published", "result", res.String(), "files", c.Files, "dir", c.Dir)
			return nil
		}
		if err == nil {
			err = errors.New("nothing to publish")
		}
		if transientQuiet(err, &changing) {
			// a rewrite in progress: try again at the next interval
		} else if msg := err.Error(); msg != last {
			log.Warn("waiting: the files cannot be published yet; trying again every interval", "error", err, "interval", interval, "fix", hint)
			last = msg
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted before the files could be published: %w", ctx.Err())
		case <-time.After(interval):
		}
	}
}

// Check is a liveness check of a running copier: an error when the source files are a good
// pair that Dir has not published (a copier that publishes every interval catches up within
// one), or Dir's files are missing. A source pair that is not good now is no fault of the
// copier: the returned note says so, with a nil error.
func (c *Copier) Check() (note string, err error) {
	pub, perr := c.Published()
	src, serr := c.ReadSource()
	switch {
	case perr != nil:
		return "", fmt.Errorf("nothing published in %s: %w", c.Dir, perr)
	case serr != nil:
		return fmt.Sprintf("the source files are not a good pair now (%v); %s keeps the last good one", serr, c.Dir), nil
	case !pub.Equal(src):
		return "", fmt.Errorf("%s does not hold the source files' current pair yet", c.Dir)
	}
	return fmt.Sprintf("%s holds the source files' current pair", c.Dir), nil
}

// Sync reads the source files and, when they are a good pair that Dir does not hold yet,
// publishes them as a new generation.
func (c *Copier) Sync() (Result, error) {
	src, err := c.ReadSource()
	if err != nil {
		return Skipped, err
	}
	if cur, err := c.Published(); err == nil && cur.Equal(src) {
		return Unchanged, nil
	}
	if err := c.publish(src); err != nil {
		return Failed, fmt.Errorf("publishing into %s: %w", c.Dir, err)
	}
	return Published, nil
}

// publish writes p as a new generation, switches ..data to it, makes the per-file symlinks
// that are missing, and removes generations older than the one it replaced (a reader may
// still be opening a file through the one just replaced).
func (c *Copier) publish(p Pair) error {
	gen, err := os.MkdirTemp(c.Dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(gen)
		}
	}()
	if err := c.own(gen, dirMode); err != nil {
		return err
	}
	for name, b := range p.Files {
		mode := certMode
		if name == p.Key {
			mode = keyMode
			if c.Group > 0 {
				mode = keyGroupMode
			}
		}
		if err := c.writeFile(filepath.Join(gen, name), b, mode); err != nil {
			return err
		}
	}
	previous, _ := os.Readlink(filepath.Join(c.Dir, dataLink))
	if err := c.replaceLink(filepath.Base(gen), dataLink); err != nil {
		return err
	}
	ok = true
	for name := range p.Files {
		target := filepath.Join(dataLink, name)
		if t, err := os.Readlink(filepath.Join(c.Dir, name)); err == nil && t == target {
			continue
		}
		if err := c.replaceLink(target, name); err != nil {
			return err
		}
	}
	return c.removeOld(filepath.Base(gen), previous)
}

// writeFile creates path (which must not exist) with b, then gives it its group and mode.
func (c *Copier) writeFile(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return c.own(path, mode)
}

// own gives path the copier's group (when set) and mode: the group first, so that the
// mode never applies to another group.
func (c *Copier) own(path string, mode os.FileMode) error {
	if c.Group > 0 {
		if err := os.Chown(path, -1, c.Group); err != nil {
			return fmt.Errorf("giving %s group %d (the copier must run with that group): %w", path, c.Group, err)
		}
	}
	return os.Chmod(path, mode)
}

// replaceLink makes Dir/name a symlink to target, atomically: a new symlink renamed over it.
func (c *Copier) replaceLink(target, name string) error {
	tmp := filepath.Join(c.Dir, name+"_tmp")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(c.Dir, name)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// removeOld removes the generation directories other than current and previous.
func (c *Copier) removeOld(current, previous string) error {
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() || !isGeneration(n) || n == current || n == previous {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.Dir, n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isGeneration: a directory name publish makes, "..2006_01_02_15_04_05.<random>".
func isGeneration(name string) bool {
	return len(name) > 3 && strings.HasPrefix(name, "..") && name[2] >= '0' && name[2] <= '9'
}
