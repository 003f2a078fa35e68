package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
)

// goldenDir holds the fixtures and, per case, the snapshot goldens (internal/fixtures).
var goldenDir = fixtures.Dir()

// secretFlags name the files the snapshot golden tests use (see
// internal/snapshot/golden_test.go): paths in Envoy's file system, never opened here.
var secretFlags = []string{
	"--serving-cert", "/etc/kube-mvp/serving/tls.crt", "--serving-key", "/etc/kube-mvp/serving/tls.key",
	"--client-ca", "/etc/kube-mvp/client-ca/ca.crt",
	"--proxy-client-cert", "/etc/kube-mvp/proxy-client/tls.crt", "--proxy-client-key", "/etc/kube-mvp/proxy-client/tls.key",
	"--peer-ca", "/etc/kube-mvp/peer-ca/ca.crt",
}

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// goldenTypes are the snapshot golden files of a case, <goldenDir>/<case>/<type>.yaml.
var goldenTypes = []string{"listeners", "routes", "clusters", "endpoints", "secrets"}

// TestTranslateGolden: for every snapshot golden fixture, the command prints under each
// resource type's key exactly what that type's golden file holds, for the same time, secrets
// and extproc address, in front-proxy and (case sidecar) sidecar mode; and nothing but the
// types and the version.
func TestTranslateGolden(t *testing.T) {
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"translate", "-f", fixtures.Path(name), "-o", "yaml",
				"--now", fixtures.Now.Format(time.RFC3339), "--extproc-address=unix:/run/kube-mvp/extproc.sock"}, secretFlags...)
			if id := fixtures.SidecarOf(name); id != "" {
				args = append(args, "--node-id", id)
			}
			args = append(args, fixtures.DangerousFlags(name)...)
			code, out, errOut := runCmd(args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			// The only warnings of a golden case: its apiservers that cannot be routed to
			// (TestTranslateWarnsWhenNothingIsRoutable).
			for line := range strings.Lines(errOut) {
				if !strings.Contains(line, " is not routable: ") && !strings.Contains(line, "no apiserver is routable") {
					t.Errorf("stderr: %s", line)
				}
			}
			sections, err := splitTopLevel(out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			// (all digits, YAML quotes it to keep it a string)
			if v := sections["version"]; !regexp.MustCompile(`^([0-9a-f]{16}|"[0-9a-f]{16}")\n$`).MatchString(v) {
				t.Errorf("version %q, want 16 hex digits", v)
			}
			delete(sections, "version")
			for _, typ := range goldenTypes {
				golden := filepath.Join(goldenDir, name, typ+".yaml")
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Errorf("%v (make golden writes it)", err)
					continue
				}
				got, ok := sections[typ]
				if !ok {
					t.Errorf("output has no %s", typ)
					continue
				}
				delete(sections, typ)
				if got != string(want) {
					t.Errorf("%s: output differs from %s\n%s", typ, golden, fixtures.FirstDiff(string(want), got))
				}
			}
			for key := range sections {
				t.Errorf("output has %s, which no golden file holds", key)
			}
		})
	}
}

// splitTopLevel splits a YAML mapping as ToYAML prints it (block sequences not indented
// under their key) at its top-level keys: each key's value as a YAML document of its own,
// the lines under the key, or an inline value ("[]") and a newline.
func splitTopLevel(y string) (map[string]string, error) {
	out := map[string]string{}
	key := ""
	for i, line := range strings.SplitAfter(y, "\n") {
		if line == "" {
			continue
		}
		// An empty line belongs to the block scalar it is in (the Lua script).
		if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "- ") || line == "\n" {
			if key == "" {
				return nil, fmt.Errorf("line %d is under no key", i+1)
			}
			out[key] += line
			continue
		}
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
		if !ok {
			return nil, fmt.Errorf("line %d is no top-level key: %q", i+1, line)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("key %s twice", k)
		}
		key = k
		out[k] = ""
		if v = strings.TrimPrefix(v, " "); v != "" {
			out[k] = v + "\n"
		}
	}
	return out, nil
}

// TestTranslateJSON: the default output is one JSON object with the resources by type; without
// --now every Lease is live, and without secret flags no secret is emitted.
func TestTranslateJSON(t *testing.T) {
	code, out, errOut := runCmd("translate", "-f", filepath.Join(goldenDir, "dead-lease.in.yaml"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Version   string            `json:"version"`
		Listeners []json.RawMessage `json:"listeners"`
		Routes    []json.RawMessage `json:"routes"`
		Clusters  []json.RawMessage `json:"clusters"`
		Endpoints []struct {
			ClusterName string `json:"cluster_name"`
			Endpoints   []struct {
				LbEndpoints []json.RawMessage `json:"lb_endpoints"`
			} `json:"endpoints"`
		} `json:"endpoints"`
		Secrets []json.RawMessage `json:"secrets"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if doc.Version == "" || len(doc.Listeners) != 1 || len(doc.Routes) != 1 || len(doc.Secrets) != 0 {
		t.Errorf("version %q, %d listeners, %d routes, %d secrets", doc.Version, len(doc.Listeners), len(doc.Routes), len(doc.Secrets))
	}
	// Without --now every Lease is live: cp-c too, which alone serves storagemigration.
	members := map[string]int{}
	for _, e := range doc.Endpoints {
		for _, l := range e.Endpoints {
			members[e.ClusterName] += len(l.LbEndpoints)
		}
	}
	if want := map[string]int{"kube-apiservers": 3, "kube-apiservers-serving": 3, "kube-apiservers/http1": 3, "kube-apiservers-serving/http1": 3}; !maps.Equal(members, want) {
		t.Errorf("endpoints per cluster = %v, want %v", members, want)
	}
	if !strings.Contains(out, `"kube-apiservers-only-cp-c"`) {
		t.Error("no endpoint lists the serving set kube-apiservers-only-cp-c")
	}
	if !strings.Contains(out, `"@type": "type.googleapis.com/envoy.config.listener.v3.Listener"`) {
		t.Error("elements lack their @type")
	}
}

func TestTranslateBadInput(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte(`apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: apiserver-tqsyvnc7rs47fayzipsuqpfg4m, namespace: kube-system}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: apiserver-imkgstwjs6opnbwk2ixluu6fiq, namespace: kube-system}
spec: {holderIdentity: [not, a, string]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"missing file", []string{"translate", "-f", filepath.Join(dir, "nope.yaml")}, []string{"nope.yaml", "no such file"}},
		{"undecodable document", []string{"translate", "-f", broken}, []string{"broken.yaml", "document 2", "apiserver-imkgstwjs6opnbwk2ixluu6fiq"}},
		{"directory", []string{"translate", "-f", dir}, []string{dir}},
		{"flags, all at once", []string{"translate", "--now", "yesterday", "-o", "xml", "--listen-port", "99999", "--bogus", "x",
			"--peer-ca", "relative/peer-ca.crt", "--extproc-address", "nowhere", "--serving-cert", "/etc/tls.crt",
			"--proxy-client-cert", "/etc/proxy.crt", "--proxy-client-key", "/etc/proxy.key"},
			[]string{"-f FILE is required", `--now "yesterday"`, `--output "xml"`, `--listen-port "99999"`, `unknown flag "--bogus"`,
				`--peer-ca "relative/peer-ca.crt" is not an absolute path`, `--extproc-address "nowhere"`, "--serving-key is missing"}},
		{"proxy certificate without peer CA", []string{"translate", "-f", broken, "--proxy-client-cert", "/etc/proxy.crt", "--proxy-client-key", "/etc/proxy.key"},
			[]string{"--peer-ca is missing: the proxy client certificate"}},
		{"stray argument", []string{"translate", "-f", broken, "extra"}, []string{`unexpected argument "extra"`}},
		{"repeated flag", []string{"translate", "-f", broken, "--file", broken}, []string{"--file given more than once"}},
		{"no command", nil, []string{"usage: xds-server COMMAND"}},
		{"unknown command", []string{"serve-forever"}, []string{`unknown command "serve-forever"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(tc.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if out != "" {
				t.Errorf("stdout: %s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, errOut)
				}
			}
		})
	}
}

// TestTranslateWarnings: objects the inventory skips and an unknown --node-id are warned
// about, naming them, and the translation still succeeds.
func TestTranslateWarnings(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "fixture.yaml")
	if err := os.WriteFile(f, []byte(`apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: apiserver-tqsyvnc7rs47fayzipsuqpfg4m
  namespace: kube-system
  labels: {apiserver.kubernetes.io/identity: kube-apiserver, kubernetes.io/hostname: cp-a}
  annotations: {kubernetes.io/peer-advertise-address: "10.0.0.1:6443"}
spec: {holderIdentity: apiserver-tqsyvnc7rs47fayzipsuqpfg4m_1, renewTime: "2026-11-23T10:00:00.000000Z"}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: leader-election
  namespace: kube-system
spec: {holderIdentity: someone}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd("translate", "-f", f, "--node-id", "apiserver-zzz")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, w := range []string{"warning:", "Lease kube-system/leader-election", "--node-id apiserver-zzz"} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, errOut)
		}
	}
	if !strings.Contains(out, `"kube-apiserver-local"`) {
		t.Error("sidecar output lacks the local cluster")
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"help", "translate"}, {"translate", "--help"}} {
		code, out, errOut := runCmd(args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "usage: xds-server") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// TestTranslateAnonymousAuthIgnored: --anonymous-auth, which made kube-mvp forward
// credential-less requests as system:anonymous, is deprecated: accepted (existing command
// lines keep working) with a warning saying it has no effect, and it changes nothing, since
// such requests now reach the apiservers as they are. Only true or false are accepted.
func TestTranslateAnonymousAuthIgnored(t *testing.T) {
	base := append([]string{"translate", "-f", filepath.Join(goldenDir, "batch-off.in.yaml")}, secretFlags...)
	_, want, _ := runCmd(base...)
	for _, flag := range []string{"--anonymous-auth", "--anonymous-auth=true", "--anonymous-auth=false"} {
		code, out, errOut := runCmd(append(append([]string{}, base...), flag)...)
		if code != 0 || out != want {
			t.Errorf("%s: exit %d, output differs: %v: %s", flag, code, out != want, errOut)
		}
		if !strings.Contains(errOut, "anonymous-auth") || !strings.Contains(errOut, "no effect") {
			t.Errorf("%s: no deprecation warning: %q", flag, errOut)
		}
		if strings.Contains(out, `"name": "anonymous"`) {
			t.Errorf("%s: an anonymous route", flag)
		}
	}
	if code, _, errOut := runCmd(append(append([]string{}, base...), "--anonymous-auth=no")...); code != 2 || !strings.Contains(errOut, "--anonymous-auth") {
		t.Errorf("--anonymous-auth=no: exit %d, %s; want 2 naming the flag", code, errOut)
	}
}

// Leases and StorageVersions alone make a configuration without a single endpoint: translate
// names each apiserver that cannot be routed to and why, and says every request would be a
// 503. Where they all route, it says nothing of the kind.
func TestTranslateWarnsWhenNothingIsRoutable(t *testing.T) {
	now := "--now=" + fixtures.Now.Format(time.RFC3339)
	code, _, errOut := runCmd("translate", "-f", fixtures.Path("storageversion-only"), now)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		`apiserver apiserver-tqsyvnc7rs47fayzipsuqpfg4m (hostname "cp-a") is not routable: its own discovery was never read`,
		`apiserver apiserver-imkgstwjs6opnbwk2ixluu6fiq (hostname "cp-b") is not routable`,
		"no apiserver is routable: every request would be answered 503",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}

	code, _, errOut = runCmd("translate", "-f", fixtures.Path("dead-lease"), now)
	if code != 0 {
		t.Fatalf("dead-lease: exit %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, `(hostname "cp-c") is not routable: its Lease was not renewed within the liveness window`) || strings.Contains(errOut, "no apiserver is routable") {
		t.Errorf("dead-lease: want cp-c's stale Lease named and nothing more:\n%s", errOut)
	}

	code, _, errOut = runCmd("translate", "-f", fixtures.Path("all-equal"), now)
	if code != 0 {
		t.Fatalf("all-equal: exit %d: %s", code, errOut)
	}
	if strings.Contains(errOut, "routable") {
		t.Errorf("all-equal: warned although every apiserver routes:\n%s", errOut)
	}
}
