package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/configdiff"
	"github.com/kube-mvp/kube-mvp/internal/explain"
	"github.com/kube-mvp/kube-mvp/internal/opstatus"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestAgainstRunningKubeMVP runs status and explain against a real xds-server, extproc and data
// plane in front of the usual mixed control plane (cp-a serves batch/v1, cp-b does not).
func TestAgainstRunningKubeMVP(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Servers: controlplane.MixedServers()})
	bin := t.TempDir()
	if err := harness.BuildBinaries(ctx, bin); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/tmp", "kmvp-status-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k, err := harness.Start(ctx, harness.Options{ControlPlane: cp, BinDir: bin, Dir: dir, Name: "front"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })

	var out, errOut bytes.Buffer
	if code := run([]string{"status", "--xds-admin", k.XDSAdmin, "--extproc-admin", k.ExtprocAdmin, "-o", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut.String())
	}
	var r opstatus.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var hosts []string
	versions := map[string]string{}
	for _, s := range controlplane.MixedServers() {
		versions[s.Name] = s.Version
	}
	for _, a := range r.APIServers {
		hosts = append(hosts, a.Hostname)
		if a.State != "live" || a.CapabilitiesFrom != "discovery" || a.Since.IsZero() || a.ProxyCertificate != "accepted" || a.NotRoutable != "" {
			t.Errorf("apiserver %+v: want live, capabilities from discovery with a time, proxy certificate accepted, routable", a)
		}
		if a.Version != versions[a.Hostname] {
			t.Errorf("apiserver %s: version %q, want its own %q", a.Hostname, a.Version, versions[a.Hostname])
		}
	}
	if slices.Sort(hosts); !slices.Equal(hosts, []string{"cp-a", "cp-b"}) {
		t.Errorf("apiservers %v, want cp-a and cp-b", hosts)
	}
	jobs := slices.IndexFunc(r.PartiallyServed, func(p opstatus.Partial) bool { return p.Resource == "batch/v1/jobs" })
	if jobs < 0 || r.PartiallyServed[jobs].Outcome != "subset" || !slices.Equal(r.PartiallyServed[jobs].ServedBy, []string{"cp-a"}) {
		t.Errorf("partially served: %+v; want batch/v1/jobs a subset served by cp-a", r.PartiallyServed)
	}
	if len(r.Envoys) != 1 || r.Envoys[0].Node != "front" || r.Envoys[0].State != "ACK" || r.Envoys[0].Version == "" {
		t.Errorf("envoys %+v, want node front, ACK, with a version", r.Envoys)
	}
	if len(r.ExtProcs) != 1 || !r.ExtProcs[0].Ready || r.ExtProcs[0].TableVersion == "" || r.ExtProcs[0].TableAgeSeconds == nil || r.ExtProcs[0].UpdateFailing {
		t.Errorf("extprocs %+v, want one ready with a table", r.ExtProcs)
	}
	if len(r.Problems) > 0 {
		t.Errorf("problems: %q", r.Problems)
	}

	out.Reset()
	if code := run([]string{"status", "--xds-admin", k.XDSAdmin, "--extproc-admin", k.ExtprocAdmin}, &out, &errOut); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"APISERVERS", "cp-a", "batch/v1/jobs", "front", "ACK", "EXTPROCS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("kubectl mvp status:\n%s", out.String())

	// explain against the running xds-server names the apiservers the data plane uses.
	explainLive := func(args ...string) explain.Explanation {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := run(append([]string{"explain", "--xds-admin", k.XDSAdmin, "-o", "json"}, args...), &out, &errOut); code != 0 {
			t.Fatalf("explain %v: exit %d: %s", args, code, errOut.String())
		}
		var x explain.Explanation
		if err := json.Unmarshal(out.Bytes(), &x); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		return x
	}
	ids := map[string]string{}
	for _, a := range r.APIServers {
		ids[a.Hostname] = a.ID
	}
	cpA, cpB := ids["cp-a"], ids["cp-b"]
	jx := explainLive("GET", "/apis/batch/v1/jobs", "--as-certificate")
	if jx.Route != "batch/v1" || jx.FinalRoute != "extproc-decided:read" || jx.Outcome != "subset" || jx.Cluster != "kube-apiservers-serving/front-proxy" ||
		jx.ServingSet != "kube-apiservers-only-cp-a" || len(jx.APIServers) != 1 || jx.APIServers[0].ID != cpA {
		t.Errorf("explain GET /apis/batch/v1/jobs: %+v; want cp-a alone, through extproc", jx)
	}
	px := explainLive("GET", "/api/v1/pods")
	if ids := []string{px.APIServers[0].ID,
		px.APIServers[len(px.APIServers)-1].ID}; px.Route != "core/v1:read" || px.Outcome != "default" ||
		len(px.APIServers) != 2 || !slices.Contains(ids, cpA) || !slices.Contains(ids, cpB) {
		t.Errorf("explain GET /api/v1/pods: %+v; want both, at line rate", px)
	}
	// The data plane agrees: cp-b does not serve batch/v1, so a 200 came from cp-a, through
	// the serving set.
	before := k.Envoy.MustStat(t, "cluster.kube-apiservers-serving/front-proxy.upstream_rq_total")
	if code := getThrough(t, k.Endpoint()+"/apis/batch/v1/jobs", cp); code != http.StatusOK {
		t.Errorf("GET /apis/batch/v1/jobs through kube-mvp: %d", code)
	}
	if after := k.Envoy.MustStat(t, "cluster.kube-apiservers-serving/front-proxy.upstream_rq_total"); after != before+1 {
		t.Errorf("the serving-sets cluster's front-proxy variant counted %d requests, want %d", after, before+1)
	}

	checkConfigDump(t, k)

	// extproc gone: said, and the rest still printed.
	k.StopExtproc()
	out.Reset()
	if code := run([]string{"status", "--xds-admin", k.XDSAdmin, "--extproc-admin", k.ExtprocAdmin}, &out, &errOut); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "extproc's admin at "+k.ExtprocAdmin+" does not answer") {
		t.Errorf("status without extproc:\n%s", out.String())
	}
}

// checkConfigDump: once the data plane acknowledged everything, config-dump finds every
// resource of xds-server's equal to the data plane's (endpoints, rebuilt by the data plane
// as Envoy does, included), and says what is wrong with its command line or an admin.
func checkConfigDump(t *testing.T, k *harness.KubeMVP) {
	t.Helper()
	configDump := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(append([]string{"config-dump"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	live := []string{"--xds-admin", k.XDSAdmin, "--envoy-admin", k.Envoy.Admin}
	var r configdiff.Report
	// A new apiserver Lease or discovery can change the configuration between the two
	// reads; what matters is that a settled one compares equal.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out, errOut := configDump(append(live, "-o", "json")...)
		if code != 0 {
			t.Fatalf("config-dump: exit %d: %s", code, errOut)
		}
		r = configdiff.Report{}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if len(r.Nodes) == 1 && r.Nodes[0].Sync == "ACK" && len(r.Nodes[0].Resources) > 0 && r.Nodes[0].Summary[configdiff.Equal] == len(r.Nodes[0].Resources) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("config-dump: not every resource equal after the data plane acknowledged:\n%s", out)
		}
		time.Sleep(time.Second)
	}
	n := r.Nodes[0]
	seen := map[string]int{}
	for _, res := range n.Resources {
		seen[res.Type]++
		if !strings.HasPrefix(res.XDSServer, "acked ") || res.Envoy != "active" || (res.EnvoyVersion == "") != (res.Type == "ClusterLoadAssignment") {
			t.Errorf("%+v: want acked by the data plane, active, with Envoy's version_info (none for endpoints)", res)
		}
	}
	for _, typ := range []string{"Listener", "RouteConfiguration", "Cluster", "ClusterLoadAssignment", "Secret"} {
		if seen[typ] == 0 {
			t.Errorf("no %s compared: %v", typ, seen)
		}
	}
	if n.Node != "front" || len(r.Problems) > 0 {
		t.Errorf("node %s, problems %q", n.Node, r.Problems)
	}
	code, out, errOut := configDump(append(live, "--node", "front", "--exit-code")...)
	if code != 0 || !strings.Contains(out, "NODE front at "+k.Envoy.Admin+" (xds-server: ACK; ") || !strings.Contains(out, "TYPE  ") || strings.Contains(out, "PRIVATE KEY") {
		t.Errorf("config-dump table: exit %d: %s\n%s", code, errOut, out)
	}
	t.Logf("kubectl mvp config-dump:\n%s", out)

	// An Envoy admin seen through a proxy that drops ?include_eds: the endpoints go unread,
	// so the report is out of sync, which only --exit-code turns into exit 3.
	noEDS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := http.Get(k.Envoy.Admin + r.URL.Path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		w.WriteHeader(res.StatusCode)
		_, _ = io.Copy(w, res.Body)
	}))
	defer noEDS.Close()
	withoutEDS := []string{"--xds-admin", k.XDSAdmin, "--envoy-admin", noEDS.URL}
	if code, out, errOut := configDump(withoutEDS...); code != 0 || !strings.Contains(out, "include_eds") {
		t.Errorf("config-dump without endpoints: exit %d, want 0 without --exit-code: %s\n%s", code, errOut, out)
	}
	if code, out, errOut := configDump(append(withoutEDS, "--exit-code")...); code != 3 || !strings.Contains(out, configdiff.OnlyXDSServer) {
		t.Errorf("config-dump --exit-code without endpoints: exit %d, want 3: %s\n%s", code, errOut, out)
	}

	if code, _, errOut := configDump("--xds-admin", k.XDSAdmin); code != 2 || !strings.Contains(errOut, "--xds-admin and --envoy-admin go together") {
		t.Errorf("--xds-admin alone: exit %d, %q", code, errOut)
	}
	if code, _, errOut := configDump(append(live, "--node", "nobody")...); code != 1 || !strings.Contains(errOut, "node nobody: xds-server's admin") || !strings.Contains(errOut, "answered 404") {
		t.Errorf("unknown node: exit %d, %q", code, errOut)
	}
	if code, _, errOut := configDump("--xds-admin", k.XDSAdmin, "--envoy-admin", k.XDSAdmin); code != 1 || !strings.Contains(errOut, "answered 404") {
		t.Errorf("--envoy-admin not Envoy's: exit %d, %q", code, errOut)
	}
}

// getThrough GETs url with the control plane's admin certificate and returns the status.
func getThrough(t *testing.T, url string, cp *controlplane.ControlPlane) int {
	t.Helper()
	cert, err := cp.PKI.Admin.TLS()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cp.PKI.ServerCA.CertPEM)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "kubernetes.default.svc"}}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
