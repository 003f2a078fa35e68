package dataplane

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestRoutesToRightCluster runs the real ADS server (internal/xds fed by internal/snapshot
// from the batch-off fixture), the real extproc over a unix socket and three fake
// apiservers: batch/v1 (served by cp-a and cp-c only) must never reach cp-b, through
// ext_proc and cluster_header; core/v1 goes to the default cluster at line rate.
func TestRoutesToRightCluster(t *testing.T) {
	e := newEnv(t, envOptions{})
	if n := e.dp.NACKs(); len(n) > 0 {
		t.Fatalf("NACKs: %q", n)
	}
	for _, typ := range []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType, resource.SecretType} {
		if e.dp.Versions()[typ] == "" {
			t.Errorf("type %s not acked", typ)
		}
	}
	c := e.client(nil)
	servers, clusters := e.spread(c, "/apis/batch/v1/namespaces/default/jobs", 30)
	if servers["cp-b"] > 0 || servers["cp-a"]+servers["cp-c"] != 30 {
		t.Errorf("batch/v1 requests went to %v; want only cp-a and cp-c", servers)
	}
	if clusters[contract.ClusterServingSets] != 30 {
		t.Errorf("batch/v1 routing headers %v, want %s on all", clusters, contract.ClusterServingSets)
	}
	core, clusters := e.spread(c, "/api/v1/namespaces/default/pods", 30)
	if clusters[""] != 30 {
		t.Errorf("line-rate route went through ext_proc: routing headers %v", clusters)
	}
	if len(core) < 2 {
		t.Errorf("core/v1 requests all went to %v; want them spread over the default cluster", core)
	}
	// The serving set extproc named (in dynamic metadata) chose the hosts.
	if got := e.stat("cluster.kube-apiservers-serving.upstream_rq_total"); got != 30 {
		t.Errorf("serving-sets cluster upstream_rq_total = %d, want 30", got)
	}
	if got := e.stat("cluster.kube-apiservers-serving.lb_subsets_selected"); got != 30 {
		t.Errorf("serving-sets cluster lb_subsets_selected = %d, want 30", got)
	}
	if got := e.stat("cluster.kube-apiservers.upstream_rq_200"); got != 30 {
		t.Errorf("default cluster upstream_rq_200 = %d, want 30", got)
	}

	// Admin: /clusters shows the serving-sets cluster with every host; /config_dump's
	// endpoints show each host's metadata listing the serving sets it is in (Envoy's
	// /clusters has no metadata).
	status, err := ReadClusters(t.Context(), e.dp.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, cs := range status.GetClusterStatuses() {
		if cs.GetName() == contract.ClusterServingSets {
			found = true
			if len(cs.GetHostStatuses()) != 3 {
				t.Errorf("serving-sets cluster status: %v", cs)
			}
		}
	}
	if !found {
		t.Errorf("/clusters: no serving-sets cluster in %v", status)
	}
	// Without format=json, /clusters is Envoy's text; a parameter the stand-in does not
	// implement is refused rather than ignored.
	if code, body := get(t, e.dp.AdminURL()+"/clusters"); code != http.StatusOK ||
		!regexp.MustCompile(`(?m)^`+contract.ClusterServingSets+`::[0-9.]+:[0-9]+::hostname::cp-b$`).MatchString(body) ||
		!strings.Contains(body, "::health_flags::healthy\n") {
		t.Errorf("/clusters as text: %d\n%s", code, body)
	}
	if code, _ := get(t, e.dp.AdminURL()+"/clusters?filter=serving"); code != http.StatusBadRequest {
		t.Errorf("/clusters?filter: %d, want 400", code)
	}
	endpoints := 0
	for _, ep := range configDumpEndpoints(t, e.dp.AdminURL(), contract.ClusterServingSets) {
		endpoints++
		b, _ := protojson.Marshal(ep.GetMetadata())
		host := ep.GetEndpoint().GetHostname()
		if in := strings.Contains(string(b), `"kube-apiservers-only-cp-a+cp-c"`); in == (host == "cp-b") {
			t.Errorf("host %s: metadata %s: in the serving set of batch/v1 %v", host, b, in)
		}
	}
	if endpoints != 3 {
		t.Errorf("/config_dump?include_eds: %d endpoints of the serving-sets cluster, want 3", endpoints)
	}
	var dump map[string]any
	getJSON(t, e.dp.AdminURL()+"/config_dump", &dump)
	if b, _ := json.Marshal(dump); !strings.Contains(string(b), contract.ClusterServingSets) || strings.Contains(string(b), "PRIVATE KEY") {
		t.Errorf("config_dump lacks the serving-sets cluster or shows a private key")
	}
	checkConfigDumpAsEnvoys(t, e.dp.AdminURL())
	var st struct{ Stats []statValue }
	getJSON(t, e.dp.AdminURL()+"/stats?format=json", &st)
	if len(st.Stats) == 0 {
		t.Errorf("no stats")
	}
}

// TestGroupVersionDocumentAndEscapedPaths: batch/v1's document and resource paths that
// reach batch/v1 only once decoded (as Go's server and kube-apiserver's RequestInfoFactory
// decode them) go, through the real extproc, only to the apiservers that serve batch/v1 (cp-a
// and cp-c; cp-b would answer 404), and every path reaches the apiserver exactly as sent.
func TestGroupVersionDocumentAndEscapedPaths(t *testing.T) {
	e := newEnv(t, envOptions{})
	if n := e.dp.NACKs(); len(n) > 0 {
		t.Fatalf("NACKs: %q", n)
	}
	c := e.client(nil)
	const subset = contract.ClusterServingSets // with serving set kube-apiservers-only-cp-a+cp-c
	for _, path := range []string{
		"/apis/batch/v1",
		"/apis/batch/v1/",
		"/apis/batch/v1?timeout=32s",
		"/apis/batch%2Fv1",
		"/apis/batch%2Fv1/namespaces/default/jobs",
		"/apis/batch%2fv1/namespaces/default/jobs?limit=500", // (a watch would stream: the fake apiserver answers it so)
		"/apis/b%61tch/v1/jobs",
		"//apis/batch/v1/namespaces/default/jobs",
	} {
		servers, clusters := map[string]int{}, map[string]int{}
		for range 12 {
			r := e.do(c, "GET", path, nil)
			if r.status != 200 {
				t.Fatalf("GET %s: status %d: %s", path, r.status, r.body)
			}
			servers[r.seen.Server]++
			clusters[r.seen.Header.Get("X-Kube-Mvp-Cluster")]++
			if r.seen.Target != path {
				t.Errorf("GET %s reached %s as %q, want it unchanged", path, r.seen.Server, r.seen.Target)
			}
		}
		if servers["cp-b"] > 0 || clusters[subset] != 12 {
			t.Errorf("GET %s went to %v with routing headers %v; want only cp-a and cp-c, by %s", path, servers, clusters, subset)
		}
	}
	// Served by every apiserver: the core document and a path whose escapes decode to a
	// core resource go to the default cluster; dot-segments are neither resolved nor
	// routed on (the apiserver reads them literally too).
	for path, wantExtProc := range map[string]bool{
		"/api/v1":                               false,
		"/api/v1/namespaces/default/pods/p%2Fq": true,
		"/api/v1/namespaces/default/pods/p/proxy/a/../../../../../apis/batch/v1/jobs": false,
		"/apis/apps/v1/namespaces/default/deployments/./../x":                         false,
	} {
		r := e.do(c, "GET", path, nil)
		if r.status != 200 || r.seen.Target != path {
			t.Errorf("GET %s: status %d, reached %s as %q; want 200 and the path unchanged", path, r.status, r.seen.Server, r.seen.Target)
		}
		if got := r.seen.Header.Get("X-Kube-Mvp-Cluster"); (got != "") != wantExtProc || (got != "" && got != "kube-apiservers") {
			t.Errorf("GET %s: routing header %q, want the default cluster (through extproc: %v)", path, got, wantExtProc)
		}
	}
}

// checkConfigDumpAsEnvoys: /config_dump is shaped as Envoy's (ConfigDumpHandler): no
// endpoints without ?include_eds; with it, each cluster's endpoints as Envoy rebuilds them
// (no version_info, the default overprovisioning factor, weight 1, health, an empty
// health_check_config); a private key redacted in place (the file name hidden, the kind
// kept); a parameter the stand-in does not implement refused.
func checkConfigDumpAsEnvoys(t *testing.T, admin string) {
	t.Helper()
	type endpoints struct {
		DynamicEndpointConfigs []struct {
			VersionInfo    string `json:"version_info"`
			EndpointConfig struct {
				ClusterName string `json:"cluster_name"`
				Policy      struct {
					OverprovisioningFactor int `json:"overprovisioning_factor"`
				} `json:"policy"`
				Endpoints []struct {
					LbEndpoints []struct {
						Endpoint struct {
							HealthCheckConfig json.RawMessage `json:"health_check_config"`
						} `json:"endpoint"`
						HealthStatus        string `json:"health_status"`
						LoadBalancingWeight int    `json:"load_balancing_weight"`
					} `json:"lb_endpoints"`
				} `json:"endpoints"`
			} `json:"endpoint_config"`
		} `json:"dynamic_endpoint_configs"`
	}
	var dump struct {
		Configs []struct {
			Type string `json:"@type"`
			endpoints
			DynamicActiveSecrets []struct {
				Secret struct {
					TLSCertificate *struct {
						PrivateKey map[string]string `json:"private_key"`
					} `json:"tls_certificate"`
				} `json:"secret"`
			} `json:"dynamic_active_secrets"`
		} `json:"configs"`
	}
	getJSON(t, admin+"/config_dump", &dump)
	keys := 0
	for _, c := range dump.Configs {
		if strings.HasSuffix(c.Type, "EndpointsConfigDump") {
			t.Errorf("/config_dump without include_eds has endpoints")
		}
		for _, s := range c.DynamicActiveSecrets {
			if tc := s.Secret.TLSCertificate; tc != nil {
				keys++
				if len(tc.PrivateKey) != 1 || tc.PrivateKey["filename"] != "[redacted]" {
					t.Errorf("private key %v, want {filename: [redacted]}", tc.PrivateKey)
				}
			}
		}
	}
	if keys == 0 {
		t.Errorf("no tls_certificate secret in /config_dump")
	}
	dump.Configs = nil
	getJSON(t, admin+"/config_dump?include_eds", &dump)
	hosts := 0
	for _, c := range dump.Configs {
		for _, ec := range c.DynamicEndpointConfigs {
			cla := ec.EndpointConfig
			if ec.VersionInfo != "" || cla.ClusterName == "" || cla.Policy.OverprovisioningFactor != 140 {
				t.Errorf("endpoints of %s: version %q, overprovisioning factor %d", cla.ClusterName, ec.VersionInfo, cla.Policy.OverprovisioningFactor)
			}
			for _, l := range cla.Endpoints {
				for _, h := range l.LbEndpoints {
					hosts++
					if h.HealthStatus != "HEALTHY" || h.LoadBalancingWeight != 1 || string(h.Endpoint.HealthCheckConfig) != "{}" {
						t.Errorf("endpoints of %s: host %+v", cla.ClusterName, h)
					}
				}
			}
		}
	}
	if hosts == 0 {
		t.Errorf("/config_dump?include_eds lists no host")
	}
	resp, err := http.Get(admin + "/config_dump?resource=dynamic_listeners")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("/config_dump?resource=: %d, want 400 (not implemented)", resp.StatusCode)
	}
}

// configDumpEndpoints are the endpoints of one cluster in /config_dump?include_eds, read as
// the envoy.admin.v3.ConfigDump it is.
func configDumpEndpoints(t *testing.T, adminURL, cluster string) []*endpointv3.LbEndpoint {
	t.Helper()
	code, body := get(t, adminURL+"/config_dump?include_eds")
	dump := &adminv3.ConfigDump{}
	if err := protojson.Unmarshal([]byte(body), dump); code != http.StatusOK || err != nil {
		t.Fatalf("/config_dump?include_eds: %d %v", code, err)
	}
	var out []*endpointv3.LbEndpoint
	for _, c := range dump.GetConfigs() {
		eds := &adminv3.EndpointsConfigDump{}
		if c.UnmarshalTo(eds) != nil {
			continue
		}
		for _, d := range eds.GetDynamicEndpointConfigs() {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := d.GetEndpointConfig().UnmarshalTo(cla); err != nil {
				t.Fatal(err)
			}
			if cla.GetClusterName() == cluster {
				for _, l := range cla.GetEndpoints() {
					out = append(out, l.GetLbEndpoints()...)
				}
			}
		}
	}
	return out
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

// TestClientCertificateIdentity: for a verified client certificate the Lua filter
// (identity.lua) sets X-Remote-User/-Group and the credential ID, and the request goes, at
// line rate (no ext_proc) on the group/version's front-proxy route, or through extproc where
// the group/version needs a decision, to the front-proxy variant cluster, whose connections
// present the proxy client certificate. A bearer token and a request without credentials
// reach the apiserver as they came: no client certificate, no identity headers. Spoofed
// identity and decision headers never arrive.
func TestClientCertificateIdentity(t *testing.T) {
	e := newEnv(t, envOptions{})
	cert := e.userCert("alice", "team-a", "team-b")
	c := e.client(cert)
	spoof := map[string]string{"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters", "X-Remote-Extra-Scopes": "all",
		"X-Kubernetes-Peer-Proxied": "true", "X-Kube-Mvp-Cluster": "kube-apiservers-only-cp-a", "X-Forwarded-Client-Cert": "Hash=00;Subject=\"CN=root\"",
		"X-Kube-Mvp-Identity": "front-proxy", "X-Envoy-Retry-On": "5xx", "X-Envoy-Max-Retries": "10", "X-Kube-Mvp-Request-Class": "read"}
	streams := e.stat(extProcStreamsStat)
	r := e.do(c, "GET", "/api/v1/namespaces", spoof)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	h := r.seen.Header
	if got := h.Get("X-Remote-User"); got != "alice" {
		t.Errorf("X-Remote-User = %q, want alice", got)
	}
	if got := h.Values("X-Remote-Group"); strings.Join(got, ",") != "team-a,team-b" {
		t.Errorf("X-Remote-Group = %q, want team-a, team-b", got)
	}
	if h.Get("X-Remote-Extra-Scopes") != "" || h.Get("X-Kubernetes-Peer-Proxied") != "" {
		t.Errorf("spoofed headers arrived: %v", h)
	}
	if r.seen.ClientCert != proxyClientCert || h.Get("X-Kube-Mvp-Cluster") != "" || h.Get("X-Kube-Mvp-Identity") != "" {
		t.Errorf("certificate user: client certificate %q, routing header %q, decision %q; want the proxy's, none, none", r.seen.ClientCert, h.Get("X-Kube-Mvp-Cluster"), h.Get("X-Kube-Mvp-Identity"))
	}
	if n := e.stat(extProcStreamsStat) - streams; n != 0 {
		t.Errorf("core/v1 with a client certificate opened %d ext_proc streams, want 0 (line rate)", n)
	}
	// The route configuration removes the XFCC header Envoy built; the credential ID the Lua
	// filter set from Envoy's digest is the certificate's SHA-256.
	if xfcc := h.Get("X-Forwarded-Client-Cert"); xfcc != "" {
		t.Errorf("XFCC reached the apiserver: %q", xfcc)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	if got, want := h.Get("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id"), "X509SHA256="+hex.EncodeToString(sum[:]); got != want {
		t.Errorf("credential id %q, want %q", got, want)
	}

	// A bearer token: nothing spoofed arrives, no XFCC, the token does; x-forwarded-for
	// names the client. The request took a line-rate route (no routing header).
	r = e.do(e.client(nil), "GET", "/api/v1/namespaces", spoof)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	for _, k := range []string{"X-Remote-User", "X-Remote-Group", "X-Remote-Extra-Scopes", "X-Kubernetes-Peer-Proxied", "X-Kube-Mvp-Cluster", "X-Forwarded-Client-Cert", "X-Kube-Mvp-Identity",
		"X-Envoy-Retry-On", "X-Envoy-Max-Retries", "X-Kube-Mvp-Request-Class"} {
		if v := r.seen.Header.Get(k); v != "" {
			t.Errorf("%s = %q arrived", k, v)
		}
	}
	if got := r.seen.Header.Get("Authorization"); got != "Bearer "+testToken {
		t.Errorf("Authorization = %q arrived, want the token", got)
	}
	if r.seen.ClientCert != "" {
		t.Errorf("bearer token: the apiserver saw client certificate %q, want none", r.seen.ClientCert)
	}
	// The client is on loopback: Envoy names itself instead.
	if got := r.seen.Header.Get("X-Forwarded-For"); got != localAddress() {
		t.Errorf("X-Forwarded-For = %q, want the data plane's own address %s", got, localAddress())
	}
	if got := r.seen.Header.Get("X-Forwarded-Proto"); got != "https" {
		t.Errorf("X-Forwarded-Proto = %q", got)
	}
	if r.header.Get("Server") != "fake-apiserver" {
		t.Errorf("server header not passed through: %q", r.header.Get("Server"))
	}
	// No credentials at all: the request reaches the apiserver as it came, without a client
	// certificate and without identity headers, so the apiserver authenticates it as it
	// would directly (anonymous, or 401 where anonymous requests are off). Line rate
	// (core/v1, /version) and through ext_proc (batch/v1 needs a decision) alike.
	for _, path := range []string{"/api/v1/namespaces", "/apis/batch/v1/jobs", "/version"} {
		r = e.do(e.noTokenClient(nil), "GET", path, spoof)
		if r.status != 200 {
			t.Fatalf("%s: status %d: %s", path, r.status, r.body)
		}
		h := r.seen.Header
		for k, v := range h {
			if strings.HasPrefix(strings.ToLower(k), "x-remote-") || k == "Authorization" || k == "X-Forwarded-Client-Cert" {
				t.Errorf("%s: no credentials, yet %s %q arrived", path, k, v)
			}
		}
		if r.seen.ClientCert != "" {
			t.Errorf("%s: no credentials, yet the apiserver saw client certificate %q", path, r.seen.ClientCert)
		}
		wantCluster := map[string]string{"/apis/batch/v1/jobs": contract.ClusterServingSets}[path]
		if got := h.Get("X-Kube-Mvp-Cluster"); got != wantCluster {
			t.Errorf("%s: routing header %q, want %q", path, got, wantCluster)
		}
		if path == "/apis/batch/v1/jobs" && r.seen.Server == "cp-b" {
			t.Errorf("batch/v1 without credentials reached cp-b, which does not serve it")
		}
	}
}

// TestFQDNClusterStats: with hostnames that have dots (FQDNs) the serving sets' names have
// contract.ClusterNameDot for each dot (as every cluster name would), and the requests extproc
// routes to one count under the serving-sets cluster's stats, whose name has no dot.
func TestFQDNClusterStats(t *testing.T) {
	e := newEnv(t, envOptions{hostSuffix: ".example.com"})
	if n := e.dp.NACKs(); len(n) > 0 {
		t.Fatalf("NACKs: %q", n)
	}
	const set = "kube-apiservers-only-cp-a~example~com+cp-c~example~com"
	servers, clusters := e.spread(e.client(nil), "/apis/batch/v1/namespaces/default/jobs", 10)
	if clusters[contract.ClusterServingSets] != 10 || servers["cp-b.example.com"]+servers["cp-b"] != 0 {
		t.Fatalf("routing headers %v, servers %v: want %s on all, never cp-b", clusters, servers, contract.ClusterServingSets)
	}
	for _, stat := range []string{"upstream_rq_total", "lb_subsets_selected"} {
		if got := e.stat("cluster." + contract.ClusterServingSets + "." + stat); got != 10 {
			t.Errorf("%s of %s: %d, want 10", stat, contract.ClusterServingSets, got)
		}
	}
	var dump map[string]any
	getJSON(t, e.dp.AdminURL()+"/config_dump?include_eds", &dump)
	if b, _ := json.Marshal(dump); !strings.Contains(string(b), set) {
		t.Errorf("no endpoint lists serving set %s", set)
	}
}

// TestOtherRequestHeaderNames: apiservers that read other identity headers
// (--requestheader-username-headers=X-User, …): the listener strips those names (and their
// extra prefix) from every client, extproc's mutation of them passes the filter's rules, a
// certificate user arrives in them, and a bearer token or no credentials arrive with none.
func TestOtherRequestHeaderNames(t *testing.T) {
	e := newEnv(t, envOptions{requestHeaders: topology.RequestHeaders{User: []string{"x-user"}, UID: []string{"x-uid"}, Group: []string{"x-groups"}, ExtraPrefix: []string{"x-extra-"}}})
	spoof := map[string]string{"X-User": "system:admin", "X-Groups": "system:masters", "X-Uid": "0", "X-Extra-Scopes": "all"}
	// /api/v1/namespaces: a line-rate route for a bearer token (only the listener strips);
	// /apis/batch/v1/jobs: extproc decides (and removes the names too).
	for _, path := range []string{"/api/v1/namespaces", "/apis/batch/v1/jobs"} {
		for name, c := range map[string]*http.Client{"bearer token": e.client(nil), "certificate": e.client(e.userCert("alice", "team-a")), "no credentials": e.noTokenClient(nil)} {
			checkOtherRequestHeaderNames(t, e, c, path, name, spoof)
		}
	}
}

func checkOtherRequestHeaderNames(t *testing.T, e *env, c *http.Client, path, name string, spoof map[string]string) {
	t.Helper()
	r := e.do(c, "GET", path, spoof)
	if r.status != 200 {
		t.Fatalf("%s %s: status %d: %s", name, path, r.status, r.body)
	}
	h := r.seen.Header
	want := map[string]string{"bearer token": "", "certificate": "alice", "no credentials": ""}[name]
	if got := strings.Join(h.Values("X-User"), ","); got != want {
		t.Errorf("%s %s: X-User %q, want %q", name, path, got, want)
	}
	if got := strings.Join(h.Values("X-Groups"), ","); got == "system:masters" || (name != "certificate" && got != "") {
		t.Errorf("%s %s: X-Groups %q", name, path, got)
	}
	if wantCert := map[string]string{"certificate": proxyClientCert}[name]; r.seen.ClientCert != wantCert {
		t.Errorf("%s %s: the apiserver saw client certificate %q, want %q", name, path, r.seen.ClientCert, wantCert)
	}
	if h.Get("X-Uid") != "" || h.Get("X-Extra-Scopes") != "" || h.Get("X-Remote-User") != "" {
		t.Errorf("%s %s: spoofed or default-named headers arrived: %v", name, path, h)
	}
}

// TestStreamingWatch: a watch is streamed as the upstream writes it, never buffered; the
// route has no timeout. The fake writes each event only after the previous one reached the
// client, one a second: 60 s, 3 s with -short. A proxy that buffered would never deliver an
// event the fake waits on.
func TestStreamingWatch(t *testing.T) {
	ticks := 60
	if testing.Short() {
		ticks = 3
	}
	step := make(chan struct{})
	e := newEnv(t, envOptions{tick: time.Second, ticks: ticks, fake: fakeOptions{watchStep: step}})
	req, _ := http.NewRequest("GET", e.base+"/api/v1/pods?watch=true", nil)
	c := e.client(nil)
	c.Timeout = 0
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	type line struct {
		s   string
		err error
	}
	lines := make(chan line)
	go func() {
		br := bufio.NewReader(resp.Body)
		for {
			s, err := br.ReadString('\n')
			select {
			case lines <- line{s, err}:
			case <-t.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// Generous: the event is written and flushed before the wait starts, a streaming proxy
	// passes it on at once, a buffering one never (the fake writes nothing more).
	const eventWait = 20 * time.Second
	start := time.Now()
	for i := 0; i < ticks; i++ {
		if i > 0 {
			time.Sleep(time.Second)
		}
		select {
		case step <- struct{}{}:
		case <-time.After(eventWait):
			t.Fatalf("the fake did not take event %d", i)
		}
		var l line
		select {
		case l = <-lines:
		case <-time.After(eventWait):
			t.Fatalf("event %d not delivered within %v of being written: buffered?", i, eventWait)
		}
		var ev struct {
			N int `json:"n"`
		}
		if l.err != nil || json.Unmarshal([]byte(l.s), &ev) != nil || ev.N != i {
			t.Fatalf("event %d: %q %v", i, l.s, l.err)
		}
	}
	select {
	case l := <-lines:
		if l.err != io.EOF {
			t.Errorf("stream end: %q %v", l.s, l.err)
		}
	case <-time.After(eventWait):
		t.Errorf("the stream did not end after the last event")
	}
	t.Logf("%d events in %v", ticks, time.Since(start))
}

// TestUpgrade: an upgrade of a configured type (websocket, SPDY/3.1) becomes a raw
// bidirectional stream after the upstream's 101; another type is refused with 403.
func TestUpgrade(t *testing.T) {
	e := newEnv(t, envOptions{})
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.servingCA.Cert)
	for _, typ := range []string{"SPDY/3.1", "websocket"} {
		conn, err := tls.Dial("tcp", e.dp.ListenerAddr("kube-apiserver"), &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /api/v1/namespaces/default/pods/p/exec?command=sh HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: %s\r\nX-Remote-User: system:admin\r\n\r\n", typ)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 101 {
			t.Fatalf("%s: status %d", typ, resp.StatusCode)
		}
		server := resp.Header.Get("X-Served-By")
		for _, msg := range []string{"hello\n", "world\n"} {
			_, _ = io.WriteString(conn, msg)
			if got := readLine(br); got != server+":"+msg {
				t.Errorf("%s: echo %q, want %q", typ, got, server+":"+msg)
			}
		}
		conn.Close()
	}
	upgrades := 0
	for _, f := range e.apiservers {
		for _, r := range f.requests() {
			upgrades++
			// No credentials: none arrive, neither the spoofed user nor a client certificate.
			if got := r.Header.Values("X-Remote-User"); len(got) != 0 || r.ClientCert != "" {
				t.Errorf("X-Remote-User %q, client certificate %q reached %s on an upgrade without credentials, want none", got, r.ClientCert, f.name)
			}
		}
	}
	if upgrades != 2 {
		t.Errorf("the apiservers saw %d upgrades, want 2", upgrades)
	}
	// Not configured: 403.
	conn, err := tls.Dial("tcp", e.dp.ListenerAddr("kube-apiserver"), &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/v1/pods HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("unconfigured upgrade: status %d, want 403", resp.StatusCode)
	}
}

// TestDeadPeerRetried: a dead apiserver costs a retry on another host (connect-failure,
// previous_hosts), not an error.
func TestDeadPeerRetried(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.apiservers["cp-b"].srv.Close()
	c := e.client(nil)
	if servers, _ := e.spread(c, "/api/v1/namespaces/default/configmaps", 30); servers["cp-b"] > 0 {
		t.Fatalf("dead server answered: %v", servers)
	}
	retries, fails := e.stat("cluster.kube-apiservers.upstream_rq_retry"), e.stat("cluster.kube-apiservers.health_check.failure")
	if retries == 0 && fails == 0 {
		t.Errorf("neither a retry nor a failed health check: the dead host was never noticed")
	}
	t.Logf("retries %d, failed health checks %d", retries, fails)
}

// TestRetryAfterRetried: an apiserver's 503 while it shuts down, or 429 when overloaded, with
// Retry-After, means the request was not processed: a read is retried on another apiserver
// (retriable-headers: any answer with Retry-After), and so is a write to a resource the
// apiservers serve themselves (retriable-status-codes 429 and 503; TestNoRetryOfForwardedRequests
// has what is not retried). A read's 503 without Retry-After reaches the client, and when
// every apiserver refuses, the client gets the last apiserver's own answer (URX).
func TestRetryAfterRetried(t *testing.T) {
	e := newEnv(t, envOptions{})
	c := e.client(nil)
	b := e.apiservers["cp-b"]
	b.refuse(&refusal{status: http.StatusServiceUnavailable, retryAfter: true})
	for i := 0; i < 30; i++ {
		method := "GET"
		if i%2 == 1 {
			method = "POST"
		}
		r := e.do(c, method, "/api/v1/namespaces/default/configmaps", nil)
		if r.status != 200 {
			t.Fatalf("%s %d: status %d: %s", method, i, r.status, r.body)
		}
		if r.seen.Server == "cp-b" {
			t.Fatal("the refusing server answered")
		}
	}
	if len(b.requests()) == 0 {
		t.Fatal("cp-b was never tried: the test proves nothing about retries")
	}
	if got := e.stat("cluster.kube-apiservers.upstream_rq_retry"); got != uint64(len(b.requests())) {
		t.Errorf("upstream_rq_retry = %d, want one per refusal (%d)", got, len(b.requests()))
	}

	// Without Retry-After the apiserver's answer is the answer.
	b.refuse(&refusal{status: http.StatusServiceUnavailable})
	before := len(b.requests())
	passed := 0
	for i := 0; i < 30; i++ {
		r := e.do(c, "GET", "/api/v1/namespaces/default/configmaps", nil)
		if r.status == 503 {
			if !strings.Contains(string(r.body), "refused by cp-b") {
				t.Fatalf("503 not from cp-b: %s", r.body)
			}
			passed++
		}
	}
	if tried := len(b.requests()) - before; passed != tried || tried == 0 {
		t.Errorf("cp-b got %d requests, %d of its 503s reached the client; want all, and some", tried, passed)
	}

	// Everyone refuses: the last refusal is forwarded (not a local reply), retries exhausted.
	for _, f := range e.apiservers {
		f.refuse(&refusal{status: http.StatusTooManyRequests, retryAfter: true})
	}
	r := e.do(c, "GET", "/api/v1/namespaces/default/configmaps", nil)
	if r.status != 429 || !strings.Contains(string(r.body), "refused by") || r.header.Get("Retry-After") != "1" {
		t.Fatalf("status %d, Retry-After %q: %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if got := e.stat("cluster.kube-apiservers.upstream_rq_retry_limit_exceeded"); got != 1 {
		t.Errorf("upstream_rq_retry_limit_exceeded = %d, want 1", got)
	}
}

// TestNoApiserverAvailable: when every apiserver of the chosen cluster is down, the client
// gets our Kubernetes Status 503 (local_reply_config on UF/URX/UH).
func TestNoApiserverAvailable(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.apiservers["cp-a"].srv.Close()
	e.apiservers["cp-c"].srv.Close()
	r := e.do(e.client(nil), "GET", "/apis/batch/v1/jobs", nil)
	if r.status != 503 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	// Both hosts still pass for healthy (their first checks passed before they were
	// closed): every attempt is refused and the retries run out (flags UF and URX, no UC or
	// UR): no apiserver received the request, so the answer invites a retry, which client-go
	// makes by itself (TestLocalReplyMapping).
	if ra := r.header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1 after retries that never connected", ra)
	}
	var st map[string]any
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	if st["kind"] != "Status" || st["reason"] != "ServiceUnavailable" || st["code"] != float64(503) ||
		!strings.Contains(fmt.Sprint(st["message"]), "no apiserver that can serve this request is available") {
		t.Errorf("body %s", r.body)
	}
	t.Logf("body: %s", r.body)
}

// TestExtProcFailure: with extproc unreachable, failure_mode_allow false fails the request
// with status_on_error 500, which local_reply_config turns into a 503 Status; line-rate
// routes do not need extproc and keep working.
func TestExtProcFailure(t *testing.T) {
	e := newEnv(t, envOptions{noExtProc: true})
	c := e.client(nil)
	r := e.do(c, "GET", "/apis/batch/v1/jobs", nil)
	if r.status != 503 || !strings.Contains(string(r.body), "the routing decision failed") {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if r := e.do(c, "GET", "/api/v1/pods", nil); r.status != 200 {
		t.Fatalf("line rate: status %d: %s", r.status, r.body)
	}
	if e.stat("http.kube_apiserver.ext_proc.kube_mvp.streams_failed") == 0 {
		t.Errorf("no ext_proc failure counted")
	}
}

// TestSidecar: node metadata kube-mvp.io/local-apiserver gets the sidecar snapshot:
// non-resource requests stay on the local apiserver.
func TestSidecar(t *testing.T) {
	e := newEnv(t, envOptions{fixture: "sidecar", local: "cp-a"})
	c := e.client(nil)
	for i := 0; i < 10; i++ {
		r := e.do(c, "GET", "/healthz", nil)
		if r.status != 200 || r.seen.Server != "cp-a" {
			t.Fatalf("status %d from %q: %s", r.status, r.seen.Server, r.body)
		}
	}
}

// TestWaitReadyTimeout: WaitReady honours its context.
func TestWaitReadyTimeout(t *testing.T) {
	dp, err := Start(context.Background(), Options{XDSAddress: "127.0.0.1:1", NodeID: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	ctx := testutil.Context(t, 200*time.Millisecond)
	if err := dp.WaitReady(ctx); err == nil {
		t.Fatal("ready without a control plane")
	}
}

// TestRouteTimeout: a request to an apiserver that stopped answering ends at the route
// timeout with Envoy's 504 (UT), mapped to a Timeout Status, and is not retried; a watch
// (watch query parameter, or /watch/ path) and a pod's logs outlive the timeout.
func TestRouteTimeout(t *testing.T) {
	const timeout = time.Second
	e := newEnv(t, envOptions{upstreamRequestTimeout: timeout, tick: 400 * time.Millisecond, ticks: 5})
	c := e.client(nil)
	for _, f := range e.apiservers {
		f.mu.Lock()
		f.stall = func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/stalled") }
		f.mu.Unlock()
	}
	// The client's connection first, so that the time below is the route's.
	if r := e.do(c, "GET", "/api/v1/namespaces/default/configmaps", nil); r.status != 200 {
		t.Fatalf("warm-up: status %d", r.status)
	}
	start := time.Now()
	r := e.do(c, "GET", "/api/v1/namespaces/default/configmaps/stalled", nil)
	took := time.Since(start)
	if r.status != http.StatusGatewayTimeout || !strings.Contains(string(r.body), `"reason":"Timeout"`) {
		t.Fatalf("status %d, want the 504 Timeout Status: %s", r.status, r.body)
	}
	// Not before the timeout; and from it, not from something much later (a busy machine
	// may add a little).
	if took < timeout || took > timeout+5*time.Second {
		t.Errorf("answered after %v, want the route timeout %v", took, timeout)
	}
	if got := e.stat("cluster.kube-apiservers.upstream_rq_timeout"); got != 1 {
		t.Errorf("upstream_rq_timeout = %d, want 1", got)
	}
	if got := e.stat("cluster.kube-apiservers.upstream_rq_retry"); got != 0 {
		t.Errorf("upstream_rq_retry = %d: a timed-out request was retried", got)
	}
	// Long-running requests keep no timeout: each streams for 2 s, twice the route timeout.
	for _, path := range []string{
		"/api/v1/namespaces/default/configmaps?watch=true",
		"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0",
		"/api/v1/namespaces/default/configmaps?watch",
		"/api/v1/watch/namespaces/default/configmaps",
		"/apis/batch/v1/namespaces/default/jobs?watch=true", // extproc decides
		"/apis/batch/v1/watch/namespaces/default/jobs",      // extproc decides
	} {
		start := time.Now()
		r := e.do(c, "GET", path, nil)
		if r.status != 200 || strings.Count(string(r.body), "ADDED") != 5 {
			t.Errorf("GET %s: status %d after %v, want all 5 events: %s", path, r.status, time.Since(start), r.body)
		}
	}
}

// TestConnectionClosedAfterRequest: an apiserver that closes a kept-alive connection once a
// request was written to it. The data plane does not re-send the request by itself (Go's
// transport would, for a GET, on a new connection to the same apiserver; Envoy does not):
// what happens is the route's retry policy. A POST gets Envoy's 503 UC (connection
// termination), mapped to our Status: reset-before-request covers only requests not yet
// sent, and the apiserver may have executed it. A GET takes the read variant, whose policy
// retries a reset, so it is answered by another apiserver (previous_hosts) with one counted
// retry.
func TestConnectionClosedAfterRequest(t *testing.T) {
	e := newEnv(t, envOptions{})
	c := e.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	// Every apiserver has kept-alive connections from the data plane.
	e.reachEvery(c, path, len(e.apiservers), 200)
	var once sync.Once
	var hungUp atomic.Int32
	for _, f := range e.apiservers {
		f.mu.Lock()
		f.hangup = func(r *http.Request) bool {
			if r.URL.Query().Get("fieldSelector") != "hangup" {
				return false
			}
			first := false
			once.Do(func() { first = true })
			if first {
				hungUp.Add(1)
			}
			return first
		}
		f.mu.Unlock()
	}
	// seen is, by apiserver, how many times the apiservers saw the request.
	seen := func() map[string]int {
		n := map[string]int{}
		for name, f := range e.apiservers {
			for _, r := range f.requests() {
				if strings.Contains(r.Path, "fieldSelector=hangup") {
					n[name]++
				}
			}
		}
		return n
	}
	total := func(m map[string]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	const cx, retry = "cluster.kube-apiservers.upstream_cx_destroy_remote_with_active_rq", "cluster.kube-apiservers.upstream_rq_retry"
	cxBefore, retryBefore := e.stat(cx), e.stat(retry)

	// POST: not retried.
	r := e.do(c, "POST", path+"?fieldSelector=hangup", nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "upstream_reset_before_response_started{connection_termination}") {
		t.Fatalf("POST: status %d, want the 503 Status of a UC: %s", r.status, r.body)
	}
	if got := total(seen()); got != 1 {
		t.Errorf("POST: the apiservers saw the request %d times, want once (no hidden retry)", got)
	}
	if got := e.stat(retry) - retryBefore; got != 0 {
		t.Errorf("POST: upstream_rq_retry = %d, want 0", got)
	}
	// A client that names its POST a read changes nothing: the listener strips the class
	// header, and the Lua filter writes the request's own.
	once = sync.Once{}
	r = e.do(c, "POST", path+"?fieldSelector=hangup", map[string]string{contract.HeaderRequestClass: contract.ClassRead})
	if r.status != http.StatusServiceUnavailable || total(seen()) != 2 || e.stat(retry)-retryBefore != 0 {
		t.Errorf("POST with the class header read: status %d, seen %d times in all, %d retries; want a 503, twice, none", r.status, total(seen()), e.stat(retry)-retryBefore)
	}
	cxBefore += 1

	// GET: retried once by the route, on another apiserver.
	once = sync.Once{}
	before := seen()
	r = e.do(c, "GET", path+"?fieldSelector=hangup", nil)
	if r.status != 200 {
		t.Fatalf("GET: status %d, want 200 from the route's retry: %s", r.status, r.body)
	}
	after := seen()
	var on []string
	for name, n := range after {
		for range n - before[name] {
			on = append(on, name)
		}
	}
	if len(on) != 2 || on[0] == on[1] {
		t.Errorf("GET: seen by %v, want by two apiservers once each (a hidden retry goes to the same one)", on)
	}
	if got := e.stat(retry) - retryBefore; got != 1 {
		t.Errorf("GET: upstream_rq_retry = %d, want 1", got)
	}
	if got := e.stat(cx) - cxBefore; got != 2 {
		t.Errorf("upstream_cx_destroy_remote_with_active_rq = %d, want 2", got)
	}
	if hungUp.Load() != 3 {
		t.Errorf("hung up %d times, want 3", hungUp.Load())
	}
	// The next request is served as usual.
	if r := e.do(c, "GET", path, nil); r.status != 200 {
		t.Errorf("after: status %d", r.status)
	}
}
