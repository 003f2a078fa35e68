package extproc_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/extproc"
)

// TestListenDoesNotRemoveFiles: only a stale socket is removed, never a regular file.
func TestListenDoesNotRemoveFiles(t *testing.T) {
	path := filepath.Join(shortSocketDir(t), "not-a-socket")
	if err := os.WriteFile(path, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := extproc.Listen("unix:" + path); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listen on a regular file: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "keep me" {
		t.Error("file removed")
	}
}

// shortSocketDir is a directory whose paths fit a unix socket's (t.TempDir's may not).
func shortSocketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "extproc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
