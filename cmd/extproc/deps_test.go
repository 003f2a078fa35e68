package main

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoClientGo: extproc links no k8s.io/client-go. It reads fixtures and builds topologies
// through internal/objects; the watcher with its informers and REST clients
// (internal/inventory) belongs to xds-server. An import that pulls client-go in again, even
// indirectly, fails here with the chain of imports that does. (About a second: go list.)
func TestNoClientGo(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list dependencies with:", err)
	}
	for _, pkg := range []string{
		"github.com/kube-mvp/kube-mvp/cmd/extproc",
		"github.com/kube-mvp/kube-mvp/internal/objects",
	} {
		out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pkg).Output()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
		} else if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		imports := map[string][]string{}
		for line := range strings.Lines(string(out)) {
			if f := strings.Fields(line); len(f) > 0 {
				imports[f[0]] = f[1:]
			}
		}
		// Not vacuous: the listing holds the package and the objects → topology path.
		for _, want := range []string{pkg, "github.com/kube-mvp/kube-mvp/internal/objects", "k8s.io/apimachinery/pkg/apis/meta/v1"} {
			if _, ok := imports[want]; !ok {
				t.Errorf("go list -deps %s: %s missing from %d packages", pkg, want, len(imports))
			}
		}
		if chain := importChain(imports, pkg, isClientGo); chain != nil {
			t.Errorf("%s links k8s.io/client-go, which it must not (see internal/objects):\n\t%s",
				pkg, strings.Join(chain, "\n\timports "))
		}
	}
}

func isClientGo(p string) bool {
	return p == "k8s.io/client-go" || strings.HasPrefix(p, "k8s.io/client-go/")
}

// importChain returns a shortest chain of imports from root to a package that matches, or nil.
func importChain(imports map[string][]string, root string, match func(string) bool) []string {
	from := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if match(p) {
			var chain []string
			for ; p != ""; p = from[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, next := range imports[p] {
			if _, seen := from[next]; !seen {
				from[next] = p
				queue = append(queue, next)
			}
		}
	}
	return nil
}
