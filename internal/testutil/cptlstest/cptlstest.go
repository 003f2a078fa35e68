// Package cptlstest makes control-plane TLS material for tests: a CA and a certificate per
// role (internal/certgen, as `xds-server certgen` makes them), written in the mounted-Secret
// layout cptls.DirFiles reads.
package cptlstest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/certgen"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

// PKI is one control plane's material on disk: Dir(role) holds tls.crt, tls.key, ca.crt.
type PKI struct {
	Root  string
	State certgen.State
}

// Dir is the directory of role's files.
func (p *PKI) Dir(role cptls.Role) string { return filepath.Join(p.Root, string(role)) }

// Files are role's files.
func (p *PKI) Files(role cptls.Role) cptls.Files { return cptls.DirFiles(p.Dir(role)) }

// New makes a CA and a certificate for every role under root (xds-server's for 127.0.0.1
// and localhost).
func New(t testing.TB, root string) *PKI {
	t.Helper()
	var specs []certgen.Spec
	for _, r := range cptls.Roles {
		s := certgen.Spec{Role: r}
		if r == cptls.RoleXDSServer {
			s.DNSNames = []string{"localhost"}
		}
		specs = append(specs, s)
	}
	st, _, err := certgen.Renew(time.Now(), certgen.State{}, specs, certgen.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{Root: root, State: st}
	for role, leaf := range st.Leaves {
		if err := WriteLeaf(p.Dir(role), leaf); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// WriteLeaf writes a role's material into dir (created if need be).
func WriteLeaf(dir string, leaf certgen.Leaf) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range leaf.Data() {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
