package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/proxycert"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/dataplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestProxyCertificateCheck: extproc asks each real apiserver itself whether it accepts the
// proxy certificate as a front proxy (the extension-apiserver-authentication ConfigMap
// cannot tell). With the only apiserver refusing it (--requestheader-allowed-names without
// its CN), extproc's /readyz fails and names the apiserver and the CN to add; with one
// apiserver of three accepting it, /readyz is ready and lists the other two, one of which
// takes the certificate as a client certificate of its own (dangerous). The package's check,
// run directly against each apiserver, classifies its real answers the same way.
//
// The dangerous apiserver, cp-c, would run every request kube-mvp forwards for a client
// certificate as the proxy certificate's user, and its /readyz health checks pass: extproc
// reports it to xds-server, which leaves it out of the front-proxy clusters. What the test
// asserts of it (certificate and token users, batch/v1, cp-c alone): docs/testing.md#end-to-end.
func TestProxyCertificateCheck(t *testing.T) {
	fix := fmt.Sprintf("add its CN %q to --requestheader-allowed-names and its issuer's CA (CN=kube-mvp-test-front-proxy-ca) to --requestheader-client-ca-file", controlplane.ProxyClientCN)

	t.Run("the only apiserver refuses", func(t *testing.T) {
		ctx := testutil.Context(t, 6*time.Minute)
		start := time.Now()
		e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1", Args: []string{"--requestheader-allowed-names=someone-else"}})
		k := e.startKubeMVP(ctx, "front", "", func(o *harness.Options) { o.ExtprocUnready = true })
		t.Logf("control plane and kube-mvp up in %s", time.Since(start).Round(100*time.Millisecond))
		ids := apiserverIDs(t, ctx, k)
		cpA := e.cp.Server("cp-a")

		if r := checkDirectly(t, ctx, e, cpA); r.Verdict != proxycert.Refused || r.Status != 401 || r.Dangerous {
			t.Errorf("cp-a asked directly: %+v, want refused with 401", r)
		}
		waited := time.Now()
		var body string
		waitFor(t, ctx, "extproc's /readyz failing", func() error {
			code, b := getURL(ctx, k.ExtprocAdmin+"/readyz")
			if body = b; code != 503 {
				return fmt.Errorf("%d %s", code, b)
			}
			return nil
		})
		t.Logf("/readyz failed %s after kube-mvp was up:\n%s", time.Since(waited).Round(100*time.Millisecond), body)
		for _, want := range []string{
			"every apiserver that answered (1) refuses kube-mvp's proxy certificate",
			fmt.Sprintf("  - %s (hostname cp-a, address %s): does not accept the proxy certificate as a front proxy: %s", ids["cp-a"], cpA.Address(), fix),
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/readyz lacks %q:\n%s", want, body)
			}
		}
		if _, m := getURL(ctx, k.ExtprocAdmin+"/metrics"); !strings.Contains(m, fmt.Sprintf("kube_mvp_extproc_proxy_certificate_accepted{apiserver=%q} 0\n", ids["cp-a"])) {
			t.Errorf("/metrics lacks cp-a's gauge at 0:\n%s", grepLines(m, "proxy_certificate"))
		}
	})

	t.Run("one apiserver of three accepts", func(t *testing.T) {
		ctx := testutil.Context(t, 8*time.Minute)
		start := time.Now()
		// cp-c's client CA bundle is in the control plane's directory, so that is fixed here.
		dir, err := os.MkdirTemp("", "kmvp-cp-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		e := newEnvOptions(t, ctx, controlplane.Options{Dir: dir, Servers: []controlplane.ServerSpec{
			// batch/v1 only on cp-c: the serving set of cp-c alone, which extproc names.
			{Name: "cp-a", Version: "v1.37.1", RuntimeConfig: []string{"batch/v1=false"}},
			{Name: "cp-b", Version: "v1.37.1", RuntimeConfig: []string{"batch/v1=false"}, Args: []string{"--requestheader-allowed-names=someone-else"}},
			// Refuses the certificate as a front proxy's, but trusts its CA for clients.
			{Name: "cp-c", Version: "v1.37.1", Args: []string{"--requestheader-allowed-names=someone-else",
				"--client-ca-file=" + (&controlplane.PKI{Dir: dir}).Path("client-and-front-proxy-ca.crt")}},
		}})
		// xds-server's watches go through cp-c, which stays up to the end.
		k := e.startKubeMVP(ctx, "front", "", func(o *harness.Options) { o.WatchThrough = "cp-c" })
		t.Logf("control plane and kube-mvp up in %s", time.Since(start).Round(100*time.Millisecond))
		ids := apiserverIDs(t, ctx, k)

		for name, want := range map[string]proxycert.Result{
			"cp-a": {Verdict: proxycert.Accepted, Status: 201, User: "kube-mvp:health-check"},
			"cp-b": {Verdict: proxycert.Refused, Status: 401},
			"cp-c": {Verdict: proxycert.Refused, Status: 201, User: controlplane.ProxyClientCN, Dangerous: true},
		} {
			r := checkDirectly(t, ctx, e, e.cp.Server(name))
			reason := r.Reason
			if r.Reason = ""; r != want {
				t.Errorf("%s asked directly: %+v (%s), want %+v", name, r, reason, want)
			}
		}

		var body string
		waitFor(t, ctx, "extproc's /readyz naming cp-b and cp-c", func() error {
			code, b := getURL(ctx, k.ExtprocAdmin+"/readyz")
			if body = b; code != 200 || !strings.Contains(b, "warning: 2 of 3") {
				return fmt.Errorf("%d %s", code, b)
			}
			return nil
		})
		t.Logf("/readyz:\n%s", body)
		for _, want := range []string{
			"kube-mvp stays ready",
			fmt.Sprintf("  - %s (hostname cp-b, address %s): does not accept the proxy certificate as a front proxy: %s", ids["cp-b"], e.cp.Server("cp-b").Address(), fix),
			fmt.Sprintf("  - %s (hostname cp-c, address %s): authenticates the proxy certificate as the client %s, not as a front proxy: %s. DANGEROUS",
				ids["cp-c"], e.cp.Server("cp-c").Address(), controlplane.ProxyClientCN, fix),
			"accepted by: cp-a\n",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/readyz lacks %q:\n%s", want, body)
			}
		}
		_, m := getURL(ctx, k.ExtprocAdmin+"/metrics")
		for name, v := range map[string]int{"cp-a": 1, "cp-b": 0, "cp-c": 0} {
			if want := fmt.Sprintf("kube_mvp_extproc_proxy_certificate_accepted{apiserver=%q} %d\n", ids[name], v); !strings.Contains(m, want) {
				t.Errorf("/metrics lacks %q:\n%s", want, grepLines(m, "proxy_certificate"))
			}
		}

		dangerousAPIServer(t, ctx, e, k, ids, fix)
	})
}

// dangerousAPIServer: kube-mvp keeps certificate users away from cp-c, which takes the proxy
// certificate for an ordinary client's (see TestProxyCertificateCheck).
func dangerousAPIServer(t *testing.T, ctx context.Context, e *env, k *harness.KubeMVP, ids map[string]string, fix string) {
	start := time.Now()
	// xds-server learns it from extproc's report: /debug/topology and its metric say so.
	waitFor(t, ctx, "xds-server's /debug/topology showing cp-c dangerous", func() error {
		_, body := getURL(ctx, k.XDSAdmin+"/debug/topology")
		var v xds.TopologyView
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			return err
		}
		for _, s := range v.APIServers {
			if (s.Dangerous != "") != (s.Hostname == "cp-c") {
				return fmt.Errorf("%s dangerous %q", s.Hostname, s.Dangerous)
			}
		}
		if !slices.Equal(v.ProxyCertExcluded, []string{"cp-c"}) {
			return fmt.Errorf("frontProxyExcluded %v", v.ProxyCertExcluded)
		}
		return nil
	})
	if _, m := getURL(ctx, k.XDSAdmin+"/metrics"); !strings.Contains(m, "kube_mvp_xds_dangerous_apiservers 1\n") {
		t.Errorf("xds-server's /metrics lacks kube_mvp_xds_dangerous_apiservers 1:\n%s", grepLines(m, "dangerous"))
	}
	// Then the data plane: its front-proxy variant of the default cluster leaves cp-c out (a
	// bounded wait that does not stop the test, so that the requests below show what
	// happens when it does not).
	deadline := time.Now().Add(time.Minute)
	for hosts := proxyCertHosts(ctx, k); ; hosts = proxyCertHosts(ctx, k) {
		if slices.Equal(hosts, []string{"cp-a", "cp-b"}) {
			t.Logf("cp-c left out of the front-proxy clusters %s after extproc's /readyz named it", time.Since(start).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the data plane's %s still has %v, want cp-a and cp-b", contract.ClusterName{Base: contract.ClusterDefault, ProxyCert: true}.String(), hosts)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	alice, err := e.cp.PKI.ClientCert("alice", "developers")
	if err != nil {
		t.Fatal(err)
	}
	hc := e.rawClient(&alice)
	want := selfSubjectReview(t, ctx, hc, "https://"+e.cp.Server("cp-a").Address(), "", nil)
	if !strings.Contains(want, `"alice"`) {
		t.Fatalf("directly, cp-a answered %s; want alice", want)
	}
	// cp-b fails the health checks (it answers them 401): without kube-mvp's check, cp-a and
	// cp-c would take these in turn.
	for i := range 30 {
		if got := selfSubjectReview(t, ctx, hc, k.Endpoint(), "", nil); got != want {
			t.Fatalf("request %d through kube-mvp: %s\nwant what cp-a answers directly: %s", i, got, want)
		}
	}
	// A request with its own credentials may still go to cp-c, which authenticates it as the
	// caller: a bearer token works through kube-mvp with cp-c the only apiserver left below.
	bobToken := serviceAccountToken(t, ctx, e.adminClient(e.cp.Server("cp-a")), "bob")
	plain := e.rawClient(nil)

	// batch/v1 is cp-c's alone: extproc answers a certificate user itself.
	req, _ := http.NewRequestWithContext(ctx, "GET", k.Endpoint()+"/apis/batch/v1/namespaces/default/jobs", nil)
	r, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	checkRefusal(t, r, ids, fix)
	// With its own credentials the request goes to cp-c, which says who it was.
	if got := selfSubjectReview(t, ctx, plain, k.Endpoint(), bobToken, nil); !strings.Contains(got, `"system:serviceaccount:default:bob"`) {
		t.Errorf("a bearer token through kube-mvp: %s, want bob", got)
	}
	req, _ = http.NewRequestWithContext(ctx, "GET", k.Endpoint()+"/apis/batch/v1/namespaces/default/jobs", nil)
	req.Header.Set("Authorization", "Bearer "+bobToken)
	if r, err := plain.Do(req); err != nil {
		t.Error(err)
	} else if st := decodeStatus(t, r); r.StatusCode != http.StatusForbidden || !strings.Contains(st.Message, `"system:serviceaccount:default:bob" cannot list resource "jobs"`) {
		t.Errorf("bob lists jobs through kube-mvp: %d %s, want cp-c's 403 naming bob", r.StatusCode, st.Message)
	}

	// cp-a and cp-b stop: cp-c alone could serve.
	stopped := time.Now()
	var wg sync.WaitGroup
	for _, name := range []string{"cp-a", "cp-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.cp.Stop(name); err != nil {
				t.Errorf("stopping %s: %v", name, err)
			}
		}()
	}
	wg.Wait()
	var res *http.Response
	waitFor(t, ctx, "a certificate user's 503 naming cp-c", func() error {
		req, _ := http.NewRequestWithContext(ctx, "POST", k.Endpoint()+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
			strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
		req.Header.Set("Content-Type", "application/json")
		r, err := hc.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if strings.Contains(string(b), proxyClientUserJSON) {
			t.Fatalf("a certificate user ran as the proxy certificate's user: %d %s", r.StatusCode, b)
		}
		if r.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "cp-c ("+ids["cp-c"]+")") {
			return fmt.Errorf("%d %s", r.StatusCode, b)
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		res = r
		return nil
	})
	t.Logf("503 naming cp-c %s after cp-a and cp-b were stopped", time.Since(stopped).Round(100*time.Millisecond))
	checkRefusal(t, res, ids, fix)
	if got := selfSubjectReview(t, ctx, plain, k.Endpoint(), bobToken, nil); !strings.Contains(got, `"system:serviceaccount:default:bob"`) {
		t.Errorf("a bearer token through kube-mvp, cp-c alone live: %s, want bob", got)
	}
}

// checkRefusal: res is the 503 Status a certificate user gets when only cp-c, dangerous,
// could serve: Retry-After, and a message naming cp-c and what to fix.
func checkRefusal(t *testing.T, res *http.Response, ids map[string]string, fix string) {
	t.Helper()
	st := decodeStatus(t, res)
	if res.StatusCode != http.StatusServiceUnavailable || st.Kind != "Status" || st.Code != 503 || st.Reason != "ServiceUnavailable" {
		t.Errorf("%s %s: %d %+v, want a 503 Status", res.Request.Method, res.Request.URL.Path, res.StatusCode, st)
	}
	if ra := res.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("%s: Retry-After %q, want 1", res.Request.URL.Path, ra)
	}
	for _, want := range []string{
		fmt.Sprintf("cp-c (%s): authenticates the proxy certificate as the client %s, not as a front proxy: %s.", ids["cp-c"], controlplane.ProxyClientCN, fix),
		"would run as the certificate's user",
	} {
		if !strings.Contains(st.Message, want) {
			t.Errorf("%s: 503 message lacks %q:\n%s", res.Request.URL.Path, want, st.Message)
		}
	}
	t.Logf("%s %s: %d %s", res.Request.Method, res.Request.URL.Path, res.StatusCode, st.Message)
}

// proxyClientUserJSON is how a SelfSubjectReview names the proxy certificate's user.
var proxyClientUserJSON = fmt.Sprintf(`"username":%q`, controlplane.ProxyClientCN)

// proxyCertHosts are the hostnames of the data plane's front-proxy variant of the default
// cluster (its /clusters), sorted.
func proxyCertHosts(ctx context.Context, k *harness.KubeMVP) []string {
	clusters, err := dataplane.ReadClusters(ctx, k.Envoy.Admin)
	if err != nil {
		return nil
	}
	var hosts []string
	for _, c := range clusters.GetClusterStatuses() {
		if c.GetName() == (contract.ClusterName{Base: contract.ClusterDefault, ProxyCert: true}).String() {
			for _, h := range c.GetHostStatuses() {
				hosts = append(hosts, h.GetHostname())
			}
		}
	}
	slices.Sort(hosts)
	return hosts
}

// checkDirectly asks the apiserver as extproc does, with the files the harness gives it.
func checkDirectly(t *testing.T, ctx context.Context, e *env, s *controlplane.Server) proxycert.Result {
	t.Helper()
	p := e.cp.PKI
	c, err := proxycert.Files{Cert: p.Path("proxy-client.crt"), Key: p.Path("proxy-client.key"), PeerCA: p.Path("server-ca.crt")}.Load()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.Check(ctx, s.Address(), []string{"x-remote-user"})
}

// apiserverIDs are the apiservers' IDs by hostname, from xds-server's topology.
func apiserverIDs(t *testing.T, ctx context.Context, k *harness.KubeMVP) map[string]string {
	t.Helper()
	_, body := getURL(ctx, k.XDSAdmin+"/debug/topology")
	var v xds.TopologyView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/debug/topology: %v\n%s", err, body)
	}
	ids := map[string]string{}
	for _, s := range v.APIServers {
		ids[s.Hostname] = s.ID
	}
	return ids
}

// getURL is the status and body of a GET; a failed request fails the test.
func getURL(ctx context.Context, url string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		panic(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}
