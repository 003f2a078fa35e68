package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/frontproxy"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestProxyCertificateCheck: extproc asks each real apiserver itself whether it accepts the
// proxy certificate as a front proxy (the extension-apiserver-authentication ConfigMap
// cannot tell). With the only apiserver refusing it (--requestheader-allowed-names without
// its CN), extproc's /readyz fails and names the apiserver and the CN to add; with one
// apiserver of three accepting it, /readyz is ready and lists the other two, one of which
// takes the certificate as a client certificate of its own (dangerous). The package's check,
// run directly against each apiserver, classifies its real answers the same way.
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

		if r := checkDirectly(t, ctx, e, cpA); r.Verdict != frontproxy.Refused || r.Status != 401 || r.Dangerous {
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
			{Name: "cp-a", Version: "v1.37.1"},
			{Name: "cp-b", Version: "v1.37.1", Args: []string{"--requestheader-allowed-names=someone-else"}},
			// Refuses the certificate as a front proxy's, but trusts its CA for clients.
			{Name: "cp-c", Version: "v1.37.1", Args: []string{"--requestheader-allowed-names=someone-else",
				"--client-ca-file=" + (&controlplane.PKI{Dir: dir}).Path("client-and-front-proxy-ca.crt")}},
		}})
		k := e.startKubeMVP(ctx, "front", "")
		t.Logf("control plane and kube-mvp up in %s", time.Since(start).Round(100*time.Millisecond))
		ids := apiserverIDs(t, ctx, k)

		for name, want := range map[string]frontproxy.Result{
			"cp-a": {Verdict: frontproxy.Accepted, Status: 201, User: "kube-mvp:health-check"},
			"cp-b": {Verdict: frontproxy.Refused, Status: 401},
			"cp-c": {Verdict: frontproxy.Refused, Status: 201, User: controlplane.ProxyClientCN, Dangerous: true},
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
	})
}

// checkDirectly asks the apiserver as extproc does, with the files the harness gives it.
func checkDirectly(t *testing.T, ctx context.Context, e *env, s *controlplane.Server) frontproxy.Result {
	t.Helper()
	p := e.cp.PKI
	c, err := frontproxy.Files{Cert: p.Path("proxy-client.crt"), Key: p.Path("proxy-client.key"), PeerCA: p.Path("server-ca.crt")}.Load()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.Check(ctx, s.Address(), "x-remote-user")
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
