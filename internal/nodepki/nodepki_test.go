package nodepki

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// node is a node's pki directory and a copier from it into a pod's directory.
type node struct {
	src, dst  string
	crt, key  string // source paths
	c         *Copier
	dstCrt    string // what a reader opens
	dstKey    string
	testState *testing.T
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{src: t.TempDir(), dst: t.TempDir(), testState: t}
	n.crt, n.key = filepath.Join(n.src, "front-proxy-client.crt"), filepath.Join(n.src, "front-proxy-client.key")
	n.dstCrt, n.dstKey = filepath.Join(n.dst, "front-proxy-client.crt"), filepath.Join(n.dst, "front-proxy-client.key")
	n.c = &Copier{Files: []string{n.crt, n.key}, Dir: n.dst}
	return n
}

// write rewrites one source file in place, as kubeadm does (truncate, write, mode 0600).
func (n *node) write(path string, b []byte) {
	n.testState.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		n.testState.Fatal(err)
	}
}

// replace replaces one source file at once (a rename), so that no torn read is possible.
func (n *node) replace(path string, b []byte) {
	n.testState.Helper()
	n.write(path+".tmp", b)
	if err := os.Rename(path+".tmp", path); err != nil {
		n.testState.Fatal(err)
	}
}

func (n *node) writePair(l testutil.Leaf) {
	n.testState.Helper()
	n.write(n.crt, l.CertPEM)
	n.write(n.key, l.KeyPEM)
}

func (n *node) sync(want Result) error {
	n.testState.Helper()
	got, err := n.c.Sync()
	if got != want {
		n.testState.Fatalf("Sync: %s (%v), want %s", got, err, want)
	}
	return err
}

// published checks that a reader finds l's pair at the symlinks, and returns the generation
// ..data names.
func (n *node) published(l testutil.Leaf) string {
	t := n.testState
	t.Helper()
	crt, err1 := os.ReadFile(n.dstCrt)
	key, err2 := os.ReadFile(n.dstKey)
	if err1 != nil || err2 != nil || !bytes.Equal(crt, l.CertPEM) || !bytes.Equal(key, l.KeyPEM) {
		t.Fatalf("published pair is not the expected one (%v %v)", err1, err2)
	}
	gen, err := os.Readlink(filepath.Join(n.dst, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

func generations(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && isGeneration(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestLayout: the Secret-volume layout, the modes, and nothing republished without a change.
func TestLayout(t *testing.T) {
	n := newNode(t)
	p := testutil.ProxyClientPairs(t, 1)[0]
	n.writePair(p)
	n.sync(Published)
	gen := n.published(p)
	if !isGeneration(gen) || strings.Contains(gen, "/") {
		t.Errorf("..data -> %q, want a generation directory beside it", gen)
	}
	for name, mode := range map[string]os.FileMode{"front-proxy-client.crt": 0o444, "front-proxy-client.key": 0o400} {
		link, err := os.Readlink(filepath.Join(n.dst, name))
		if err != nil || link != "..data/"+name {
			t.Errorf("%s -> %q (%v), want ..data/%s", name, link, err, name)
		}
		st, err := os.Lstat(filepath.Join(n.dst, gen, name))
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != mode {
			t.Errorf("%s/%s: %v %v, want a regular file of mode %v", gen, name, st.Mode(), err, mode)
		}
	}
	entries, _ := os.ReadDir(n.dst)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 4 {
		t.Errorf("%s holds %v, want ..data, one generation and the two symlinks", n.dst, names)
	}

	n.sync(Unchanged)
	if again := n.published(p); again != gen {
		t.Errorf("an unchanged pair was published again: %s, then %s", gen, again)
	}
	// A restarted copier (no memory) compares with what the directory holds.
	c2 := &Copier{Files: n.c.Files, Dir: n.dst}
	if res, err := c2.Sync(); res != Unchanged || err != nil {
		t.Errorf("a new copier over the same directory: %s %v, want unchanged", res, err)
	}
}

// TestRenewal: a renewed pair is published as a new generation; the one it replaced stays
// (a reader may be opening a file through it) and older ones are removed.
func TestRenewal(t *testing.T) {
	n := newNode(t)
	ps := testutil.ProxyClientPairs(t, 3)
	var gens []string
	for _, p := range ps {
		n.writePair(p)
		n.sync(Published)
		gens = append(gens, n.published(p))
	}
	got := generations(t, n.dst)
	if len(got) != 2 || !contains(got, gens[1]) || !contains(got, gens[2]) {
		t.Errorf("generations %v, want the last two of %v", got, gens)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestTornReads: while kubeadm rewrites the pair in place (the certificate renewed and the
// key not yet, a file being written), nothing is published; the last good pair stays.
func TestTornReads(t *testing.T) {
	n := newNode(t)
	ps := testutil.ProxyClientPairs(t, 2)
	n.writePair(ps[0])
	n.sync(Published)
	gen := n.published(ps[0])

	for _, c := range []struct {
		name     string
		crt, key []byte
		want     string
	}{
		{"certificate renewed, key not yet", ps[1].CertPEM, ps[0].KeyPEM, "not a matching certificate and key"},
		{"key renewed, certificate not yet", ps[0].CertPEM, ps[1].KeyPEM, "not a matching certificate and key"},
		{"certificate truncated", nil, ps[1].KeyPEM, "holds no PEM certificate or private key"},
		{"certificate half written", ps[1].CertPEM[:len(ps[1].CertPEM)/2], ps[1].KeyPEM, "holds no PEM certificate or private key"},
		{"key half written", ps[1].CertPEM, ps[1].KeyPEM[:len(ps[1].KeyPEM)-40], "holds no PEM certificate or private key"},
		{"certificate body damaged", bytes.Replace(ps[1].CertPEM, []byte("MII"), []byte("MIJ"), 1), ps[1].KeyPEM, "not a matching certificate and key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n.testState = t
			n.write(n.crt, c.crt)
			n.write(n.key, c.key)
			err := n.sync(Skipped)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
			if g := n.published(ps[0]); g != gen {
				t.Errorf("..data moved to %s", g)
			}
			if note, err := n.c.Check(); err != nil || !strings.Contains(note, "not a good pair now") {
				t.Errorf("Check: %q %v, want a note and no error", note, err)
			}
		})
	}
	n.testState = t
	n.writePair(ps[1])
	if note, err := n.c.Check(); err == nil {
		t.Errorf("Check with a good new pair not yet published: %q, want an error", note)
	}
	n.sync(Published)
	n.published(ps[1])
	if _, err := n.c.Check(); err != nil {
		t.Errorf("Check after publishing: %v", err)
	}
}

// TestSplicedRead: kubeadm rewrites the certificate in place while the copier reads it, so
// the copier's read is the head of the old certificate and the tail of the new one (a read of
// a 574-byte file is io.ReadAll's read(2) of 512 bytes, then the rest, then one that should
// find the end). Such a splice can parse and match the old key, which is still in place;
// the copier must not publish it, and publishes the new pair once kubeadm wrote its key.
func TestSplicedRead(t *testing.T) {
	ps := testutil.ProxyClientPairs(t, 100) // certificates of 574 bytes and some of 579 (the signature's length varies)
	for _, c := range []struct {
		name string
		// at is where the rewrite falls in the read of old; ok says whether a new
		// certificate can be used (the splice it makes must pass the checks)
		at func(old, new []byte) int
		ok func(old, new []byte) bool
	}{
		{"after the first 512 bytes", func(_, _ []byte) int { return 512 }, func(old, new []byte) bool { return len(old) == len(new) }},
		{"at the old certificate's end", func(old, _ []byte) int { return len(old) }, func(old, new []byte) bool { return len(new) > len(old) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var old, nw testutil.Leaf
			var splice []byte
		find:
			for _, o := range ps {
				for _, w := range ps {
					if bytes.Equal(o.CertPEM, w.CertPEM) || !c.ok(o.CertPEM, w.CertPEM) {
						continue
					}
					at := c.at(o.CertPEM, w.CertPEM)
					s := append(o.CertPEM[:at:at], w.CertPEM[at:]...)
					if _, err := tls.X509KeyPair(s, o.KeyPEM); err == nil {
						old, nw, splice = o, w, s
						break find
					}
				}
			}
			if splice == nil {
				t.Fatalf("no two of %d certificates make a splice that passes the checks", len(ps))
			}
			n := newNode(t)
			n.writePair(old)
			n.sync(Published)
			gen := n.published(old)

			var first []byte
			n.c.read = func(path string) ([]byte, error) {
				if path != n.crt || first != nil {
					return readLimited(path)
				}
				f, err := os.Open(path)
				if err != nil {
					return nil, err
				}
				defer f.Close()
				head := make([]byte, c.at(old.CertPEM, nw.CertPEM))
				if _, err := io.ReadFull(f, head); err != nil {
					return nil, err
				}
				n.write(n.crt, nw.CertPEM) // kubeadm, between two read(2)s
				rest, err := io.ReadAll(f)
				first = append(head, rest...)
				return first, err
			}
			err := n.sync(Skipped)
			if !bytes.Equal(first, splice) {
				t.Fatalf("the interleaved read returned %d bytes, not the %d-byte splice", len(first), len(splice))
			}
			if !errors.Is(err, ErrChangedWhileRead) {
				t.Errorf("error %v, want one saying the certificate changed while it was read", err)
			}
			if g := n.published(old); g != gen {
				t.Errorf("..data moved to %s", g)
			}
			n.write(n.key, nw.KeyPEM)
			n.sync(Published)
			n.published(nw)
		})
	}
}

// TestSourceChecks: what is refused before anything is published.
func TestSourceChecks(t *testing.T) {
	ps := testutil.ProxyClientPairs(t, 2)
	for _, c := range []struct {
		name  string
		setup func(n *node)
		want  string
	}{
		{"missing key", func(n *node) { n.write(n.crt, ps[0].CertPEM) }, "no such file"},
		{"directory", func(n *node) {
			n.write(n.crt, ps[0].CertPEM)
			os.Mkdir(n.key, 0o700)
		}, "not a regular file"},
		{"fifo", func(n *node) {
			n.write(n.crt, ps[0].CertPEM)
			if err := syscall.Mkfifo(n.key, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"too large", func(n *node) {
			n.write(n.crt, append(bytes.Repeat(ps[0].CertPEM, MaxFileSize/len(ps[0].CertPEM)), ps[0].CertPEM...))
			n.write(n.key, ps[0].KeyPEM)
		}, "more than 65536"},
		{"two certificates", func(n *node) {
			n.write(n.crt, ps[0].CertPEM)
			n.write(n.key, ps[1].CertPEM)
		}, "both hold certificates"},
		{"two keys", func(n *node) {
			n.write(n.crt, ps[0].KeyPEM)
			n.write(n.key, ps[1].KeyPEM)
		}, "both hold a private key"},
		{"not PEM", func(n *node) {
			n.write(n.crt, []byte("hello"))
			n.write(n.key, ps[0].KeyPEM)
		}, "holds no PEM"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t)
			c.setup(n)
			err := n.sync(Skipped)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
			if g := generations(t, n.dst); len(g) != 0 {
				t.Errorf("published %v", g)
			}
			if _, err := n.c.Check(); err == nil {
				t.Error("Check passes with nothing published")
			}
		})
	}
	for _, c := range []struct {
		files []string
		want  string
	}{
		{[]string{"/a/tls.crt"}, "exactly two files"},
		{[]string{"/a/tls.crt", "/b/tls.crt"}, "two files named tls.crt"},
		{[]string{"/a/tls.crt", "/a/..data"}, "not a file name"},
	} {
		if err := (&Copier{Files: c.files, Dir: "/d"}).CheckArgs(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.files, err, c.want)
		}
	}
}

// TestGroup: with a group, the files are that group's and the key is readable by it.
func TestGroup(t *testing.T) {
	n := newNode(t)
	gid := os.Getgid()
	if os.Geteuid() == 0 {
		gid = 65532 // root may give any group; a container's copier is a member of it
	}
	n.c.Group = gid
	p := testutil.ProxyClientPairs(t, 1)[0]
	n.writePair(p)
	n.sync(Published)
	gen := n.published(p)
	for name, mode := range map[string]os.FileMode{gen: 0o755 | fs.ModeDir, gen + "/front-proxy-client.crt": 0o444, gen + "/front-proxy-client.key": 0o440} {
		st, err := os.Lstat(filepath.Join(n.dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != mode || int(st.Sys().(*syscall.Stat_t).Gid) != gid {
			t.Errorf("%s: %v group %d, want %v group %d", name, st.Mode(), st.Sys().(*syscall.Stat_t).Gid, mode, gid)
		}
	}
}

// TestReadersSeeMatchingPairs: readers that open <dir>/<name> as Envoy does, while kubeadm
// rewrites the node's pair in place and the copier syncs as fast as it can. Every file a
// reader opens is one of kubeadm's files, byte for byte, and the two files it reads are one
// pair unless ..data switched between its two reads — then the switch's move event makes
// Envoy read both again, and that read (with no switch in between) is one pair. Byte for
// byte, not only a certificate that matches the key: a certificate spliced from two (a read
// across a rewrite) can match the key, the public key being in its head.
func TestReadersSeeMatchingPairs(t *testing.T) {
	n := newNode(t)
	ps := testutil.ProxyClientPairs(t, 4)
	n.writePair(ps[0])
	n.sync(Published)
	known := map[string]bool{}
	pairOf := map[string]int{} // a file's content: the pair it is of
	for i, p := range ps {
		known[string(p.CertPEM)], known[string(p.KeyPEM)] = true, true
		pairOf[string(p.CertPEM)], pairOf[string(p.KeyPEM)] = i, i
	}

	// Two seconds, and then until enough happened: a loaded machine (go test ./... beside
	// other packages' tests) can publish only two generations in two seconds.
	ctx, stop := context.WithCancel(testutil.Context(t, 30*time.Second))
	defer stop()
	var wg sync.WaitGroup
	var published, renewals atomic.Int64
	var results [4]atomic.Int64
	var reads, switched, stable atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for start := time.Now(); ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
			if time.Since(start) >= 2*time.Second && published.Load() >= 3 && stable.Load() >= 100 {
				stop()
			}
		}
	}()
	wg.Add(2)
	go func() { // kubeadm: renew in place, the certificate first, then the key a little later
		defer wg.Done()
		for i := 1; ctx.Err() == nil; i++ {
			p := ps[i%len(ps)]
			os.WriteFile(n.crt, p.CertPEM, 0o600)
			time.Sleep(time.Millisecond) // torn: the new certificate with the old key
			os.WriteFile(n.key, p.KeyPEM, 0o600)
			renewals.Add(1)
			time.Sleep(10 * time.Millisecond) // quiet (a year, on a real node)
		}
	}()
	go func() { // the copier, without an interval
		defer wg.Done()
		for ctx.Err() == nil {
			res, err := n.c.Sync()
			results[res].Add(1)
			if res == Failed {
				t.Errorf("Sync: %v", err)
				return
			} else if res == Published {
				published.Add(1)
			}
		}
	}()
	for range 4 {
		wg.Add(1)
		go func() { // Envoy
			defer wg.Done()
			for ctx.Err() == nil {
				before, _ := os.Readlink(filepath.Join(n.dst, "..data"))
				crt, err1 := os.ReadFile(n.dstCrt)
				key, err2 := os.ReadFile(n.dstKey)
				after, _ := os.Readlink(filepath.Join(n.dst, "..data"))
				reads.Add(1)
				if before != after {
					// A switch between the two opens: a file may come from either
					// generation, or be gone with one two switches old.
					switched.Add(1)
					for _, b := range [][]byte{crt, key} {
						if b != nil && !known[string(b)] {
							t.Errorf("a reader read a file no pair holds (%d bytes): %s", len(b), describe(b, ps))
						}
					}
					continue
				}
				stable.Add(1)
				if err := errors.Join(err1, err2); err != nil {
					t.Errorf("a reader failed with ..data at %s: %v", before, err)
					continue
				}
				for _, b := range [][]byte{crt, key} {
					if !known[string(b)] {
						t.Errorf("a reader read a file no pair holds (%d bytes) with ..data at %s: %s", len(b), before, describe(b, ps))
					}
				}
				if !known[string(crt)] || !known[string(key)] {
					continue
				}
				if _, err := tls.X509KeyPair(crt, key); err != nil || pairOf[string(crt)] != pairOf[string(key)] {
					t.Errorf("a reader read a mismatched pair with ..data at %s: pair %d's certificate, pair %d's key (%v)", before, pairOf[string(crt)], pairOf[string(key)], err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d renewals, %d generations published, %d reads (%d across a switch); syncs: %d unchanged, %d published, %d skipped",
		renewals.Load(), published.Load(), reads.Load(), switched.Load(), results[Unchanged].Load(),
		results[Published].Load(), results[Skipped].Load())
	if published.Load() < 3 || stable.Load() < 100 {
		t.Errorf("too little happened: %d generations, %d reads without a switch", published.Load(), stable.Load())
	}
	// Quiet again: the copier catches up, and a read after the last switch matches.
	n.writePair(ps[0])
	n.c.Sync()
	n.published(ps[0])
	if g := generations(t, n.dst); len(g) > 2 {
		t.Errorf("%d generations left, want at most 2", len(g))
	}
}

// describe says what b, a file no pair holds, has in common with the pairs' files: the
// longest head and tail it shares with one of them (a file read across an in-place rewrite
// is the head of one and the tail of another).
func describe(b []byte, ps []testutil.Leaf) string {
	type file struct {
		name string
		b    []byte
	}
	var files []file
	for i, p := range ps {
		files = append(files, file{fmt.Sprintf("pair %d's certificate", i), p.CertPEM}, file{fmt.Sprintf("pair %d's key", i), p.KeyPEM})
	}
	var head, tail file
	nh, nt := 0, 0
	for _, f := range files {
		h := 0
		for h < len(b) && h < len(f.b) && b[h] == f.b[h] {
			h++
		}
		tl := 0
		for tl < len(b) && tl < len(f.b) && b[len(b)-1-tl] == f.b[len(f.b)-1-tl] {
			tl++
		}
		if h > nh {
			head, nh = f, h
		}
		if tl > nt {
			tail, nt = f, tl
		}
	}
	return fmt.Sprintf("its first %d bytes are %s (%d bytes), its last %d %s (%d bytes)", nh, head.name, len(head.b), nt, tail.name, len(tail.b))
}

// TestRunQuietOnARewriteInProgress: a file caught changing between its two reads is retried
// at the next interval without a log line, unless it happens changedWhileReadLogAfter syncs
// in a row.
func TestRunQuietOnARewriteInProgress(t *testing.T) {
	for _, changes := range []int{changedWhileReadLogAfter - 1, changedWhileReadLogAfter} {
		t.Run(fmt.Sprintf("%d syncs in a row", changes), func(t *testing.T) {
			n := newNode(t)
			ps := testutil.ProxyClientPairs(t, 1)
			n.writePair(ps[0])
			var mu sync.Mutex
			certReads := 0
			n.c.read = func(path string) ([]byte, error) {
				b, err := readLimited(path)
				if path != n.crt || err != nil {
					return b, err
				}
				mu.Lock()
				defer mu.Unlock()
				certReads++
				// each sync reads the certificate twice; the second read of the first
				// `changes` syncs sees it rewritten
				if certReads%2 == 0 && certReads/2 <= changes {
					return append(b, '\n'), nil
				}
				return b, nil
			}
			var buf testutil.SyncBuffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); n.c.Run(ctx, time.Millisecond, log) }()
			if err := testutil.Until(context.Background(), 5*time.Second, "publication", testutil.Cond(func() bool {
				return strings.Contains(buf.String(), "published the source files")
			})); err != nil {
				t.Fatal(err, "\n", buf.String())
			}
			cancel()
			<-done
			want := 0
			if changes >= changedWhileReadLogAfter {
				want = 1
			}
			if c := strings.Count(buf.String(), "changed while it was read"); c != want {
				t.Errorf("%d syncs in a row saw a rewrite: logged %d times, want %d:\n%s", changes, c, want, buf.String())
			}
			n.published(ps[0])
		})
	}
}

// TestRunLogsOnce: a lasting problem is logged once, not every interval, and the recovery
// and each publication are logged.
func TestRunLogsOnce(t *testing.T) {
	n := newNode(t)
	ps := testutil.ProxyClientPairs(t, 2)
	n.writePair(ps[0])
	var buf testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.c.Run(ctx, 5*time.Millisecond, log) }()
	wait := func(what string, ok func() bool) {
		t.Helper()
		if err := testutil.Until(context.Background(), 5*time.Second, what, testutil.Cond(ok)); err != nil {
			t.Fatal(err, "\n", buf.String())
		}
	}
	wait("first publication", func() bool { return strings.Contains(buf.String(), "published the source files") })
	n.replace(n.crt, ps[1].CertPEM) // the key stays old: a mismatch for many intervals
	wait("the mismatch logged", func() bool { return strings.Contains(buf.String(), "not a matching certificate and key") })
	time.Sleep(50 * time.Millisecond)
	n.replace(n.key, ps[1].KeyPEM)
	wait("the new pair published", func() bool { return strings.Count(buf.String(), "published the source files") == 2 })
	cancel()
	<-done
	if c := strings.Count(buf.String(), "source files skipped"); c != 1 {
		t.Errorf("the lasting mismatch was logged %d times, want once:\n%s", c, buf.String())
	}
	n.published(ps[1])
}
