package main

import (
	"bytes"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
)

var update = flag.Bool("update", false, "rewrite testdata/explain/<case>.txt from the current output (make golden)")

// goldenRequests are the requests whose explanations the golden files keep, per fixture.
var goldenRequests = [][]string{
	{"GET", "/apis/batch/v1/jobs"},
	{"GET", "/apis/batch/v1/jobs", "--as-certificate"},
	{"GET", "/apis/batch/v1/namespaces/default/jobs?watch=true"},
	{"POST", "/api/v1/namespaces/default/pods/p/eviction"},
	{"GET", "/apis"},
	{"GET", "/apis/batch%2Fv1/jobs"},
}

// caseRequests are more requests whose explanations a case's golden file keeps.
var caseRequests = map[string][][]string{
	"new-crd": {
		{"GET", "/apis/stable.example.com/v1/namespaces/default/widgets"},
		{"POST", "/apis/fresh.example.com/v1/namespaces/default/gadgets"},
		{"GET", "/apis/stable.example.com/v1/namespaces/default/listed"},
		{"GET", "/apis/stable.example.com/v1/namespaces/default/stale"},
	},
}

// TestGoldenExplain keeps explain's text answers for every fixture: a change of what kube-mvp
// decides, or of how explain says it, shows in review.
func TestGoldenExplain(t *testing.T) {
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			var got bytes.Buffer
			for _, rq := range append(goldenRequests, caseRequests[name]...) {
				args := append([]string{"explain", "-f", fixtures.Path(name), "--now", fixtures.Now.Format("2006-01-02T15:04:05Z")}, rq...)
				if id := fixtures.SidecarOf(name); id != "" {
					args = append(args, "--node-id", id)
				}
				args = append(args, fixtures.DangerousFlags(name)...)
				fmt.Fprintf(&got, "$ kubectl mvp explain %s\n", strings.Join(rq, " "))
				var errOut bytes.Buffer
				if code := run(args, &got, &errOut); code != 0 {
					t.Fatalf("%v: exit %d: %s", rq, code, errOut.String())
				}
				got.WriteString("\n")
			}
			fixtures.Golden(t, filepath.Join("testdata", "explain", name+".txt"), got.Bytes(), *update)
		})
	}
}

// TestExplainCommandLine: bad command lines are refused with what to fix.
func TestExplainCommandLine(t *testing.T) {
	for _, help := range [][]string{{"explain", "--help"}, {"explain", "-h", "/apis"}, {"status", "--help"}, {"help", "explain"}} {
		var out, errOut bytes.Buffer
		if code := run(help, &out, &errOut); code != 0 || !strings.Contains(out.String(), "usage: kubectl mvp") {
			t.Errorf("%v: exit %d, %q %q", help, code, out.String(), errOut.String())
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"/apis", "-f", "x.yaml", "--xds-admin", "http://x"}, "exclude each other"},
		{[]string{"/apis", "--now", "2026-11-23T10:00:10Z"}, "go with -f FIXTURE"},
		{[]string{"-f", "x.yaml"}, "want [METHOD] PATH"},
		{[]string{"-f", "x.yaml", "GET", "/a", "/b"}, "want [METHOD] PATH"},
		{[]string{"-f", "x.yaml", "apis"}, "must start with /"},
		{[]string{"-f", "x.yaml", "/apis", "--as-token", "--as-certificate"}, "exclude each other"},
		{[]string{"-f", "x.yaml", "/apis", "-o", "table"}, "is not text, json or yaml"},
		{[]string{"-f", "/nonexistent.yaml", "/apis"}, "no such file"},
	} {
		var out, errOut bytes.Buffer
		if code := run(append([]string{"explain"}, tc.args...), &out, &errOut); code != 2 || !bytes.Contains(errOut.Bytes(), []byte(tc.want)) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// Offline, explain warns as translate does (they share objects.LoadFixtureTopology): a
// fixture whose apiservers have no discovery of their own routes nothing.
func TestExplainWarnsWhenNothingIsRoutable(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"explain", "-f", fixtures.Path("storageversion-only"), "--now", fixtures.Now.Format(time.RFC3339), "GET", "/apis/batch/v1/jobs"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{`(hostname "cp-a") is not routable: its own discovery was never read`, "no apiserver is routable"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut.String())
		}
	}
}
