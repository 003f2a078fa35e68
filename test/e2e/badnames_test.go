package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestInvalidNamesFromAnAPIServer: a compromised apiserver (a serving certificate of the
// peer CA, a Lease as kube-apiserver writes it, everything else proxied to cp-a, so it serves
// batch/v1 like cp-a) lists a group Envoy's path rules refuse, a version ending in '/' and an
// upper-case resource beside batch/v1 jobs. The names are left out (shown on
// /debug/topology), the rest of its discovery is used, and jobs, which only cp-a and it
// serve, are listed through kube-mvp without one failure: Envoy and extproc never disagree
// about the serving set.
func TestInvalidNamesFromAnAPIServer(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	e := newEnv(t, ctx, controlplane.MixedServers()...) // cp-b does not serve batch/v1
	k := e.startKubeMVP(ctx, "front", "")
	admin, err := e.cp.PKI.ClientCert("names-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	hc := e.rawClient(&admin)
	cpA := e.cp.Server("cp-a")

	// The compromised apiserver: cp-a's discovery with the bad names added; everything
	// else forwarded to cp-a as a front proxy forwards (the proxy client pair, the identity
	// headers as Envoy sent them).
	pki := e.cp.PKI
	proxyPair, err := tls.X509KeyPair(pki.ProxyClient.CertPEM, pki.ProxyClient.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.ServerCA.CertPEM)
	upstream := &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{proxyPair}, RootCAs: roots, ServerName: "localhost"}}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "https", Host: cpA.Address()})
	proxy.Transport = upstream
	// A request without identity headers (xds-server's own, a bearer token's) is forwarded
	// with the admin's certificate: this server authenticates nobody itself.
	asAdmin := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "https", Host: cpA.Address()})
	asAdmin.Transport = &http.Transport{TLSClientConfig: e.tlsConfig(&admin)}
	var discoveryServed, requests atomic.Int64
	discoveryClient := &http.Client{Transport: &http.Transport{TLSClientConfig: e.tlsConfig(&admin)}}
	evil := func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path != "/apis" || !strings.Contains(r.Header.Get("Accept"), "apidiscovery.k8s.io") {
			if r.Header.Get("X-Remote-User") != "" {
				proxy.ServeHTTP(w, r)
			} else {
				asAdmin.ServeHTTP(w, r)
			}
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), "GET", "https://"+cpA.Address()+"/apis", nil)
		req.Header.Set("Accept", r.Header.Get("Accept"))
		res, err := discoveryClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		var doc map[string]any
		if err := json.NewDecoder(res.Body).Decode(&doc); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		items, _ := doc["items"].([]any)
		resource := func(name string) map[string]any {
			return map[string]any{"resource": name, "scope": "Namespaced", "singularResource": "thing",
				"responseKind": map[string]any{"group": "", "version": "", "kind": "Thing"}, "verbs": []any{"get", "list"}}
		}
		group := func(name, version, res string) map[string]any {
			return map[string]any{"metadata": map[string]any{"name": name}, "versions": []any{map[string]any{
				"version": version, "freshness": "Current", "resources": []any{resource(res)}}}}
		}
		doc["items"] = append(items, group("evil#x.example.com", "v1", "things"), group("a.example.com", "v1/", "things"), group("b.example.com", "v1", "Things"))
		w.Header().Set("Content-Type", res.Header.Get("Content-Type"))
		_ = json.NewEncoder(w).Encode(doc)
		discoveryServed.Add(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := tls.X509KeyPair(pki.Serving.CertPEM, pki.Serving.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(evil), ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{serving}, ClientAuth: tls.RequestClientCert}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	jobs := k.Endpoint() + "/apis/batch/v1/namespaces/default/jobs"
	list := func() (int, string) {
		res, err := hc.Get(jobs)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return res.StatusCode, string(b)
	}
	for i := range 10 {
		if code, body := list(); code != http.StatusOK {
			t.Fatalf("job list %d before the compromised apiserver: %d %s", i, code, body)
		}
	}

	// Its Lease, renewed as kube-apiserver renews it, until the test ends.
	leases := e.adminClient(cpA).CoordinationV1().Leases("kube-system")
	id, holder := objects.APIServerIDFor("evil"), objects.APIServerIDFor("evil")+"_6f1c2d4e-0b7a-4c55-9a51-908995940539"
	renew := func() error {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: "kube-system",
				Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, objects.HostnameLabel: "evil"},
				Annotations: map[string]string{objects.PeerAdvertiseAnnotation: ln.Addr().String()}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now}}
			_, err = leases.Create(ctx, l, metav1.CreateOptions{})
			return err
		}
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	if err := renew(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Second):
				_ = renew()
			}
		}
	}()

	var failures []string
	check := func(when string) {
		if code, body := list(); code != http.StatusOK {
			failures = append(failures, fmt.Sprintf("%s: %d %.200s", when, code, body))
		}
	}
	// xds-server verifies it (its discovery at its address over verified TLS) and leaves
	// the names out.
	testutil.WaitFor(t, ctx, 90*time.Second, "xds-server takes the compromised apiserver in, without its bad names", func() error {
		check("while xds-server takes it in")
		topo := httpGet(t, k.XDSAdmin+"/debug/topology")
		if !strings.Contains(topo, "kube-apiservers-only-cp-a+evil") {
			return fmt.Errorf("batch/v1 is not yet served by cp-a and evil (%d requests to it, %d discovery fetches)", requests.Load(), discoveryServed.Load())
		}
		for _, name := range []string{`evil#x.example.com`, `a.example.com/v1/`, `Things`} {
			if !strings.Contains(topo, name) {
				return fmt.Errorf("/debug/topology does not show %s refused", name)
			}
		}
		return nil
	})
	// The routing table follows after its delay; Envoy must have what it names all along.
	deadline := time.Now().Add(15 * time.Second)
	n := 0
	for ; time.Now().Before(deadline); n++ {
		check("after xds-server took it in")
		time.Sleep(50 * time.Millisecond)
	}
	if len(failures) > 0 {
		t.Errorf("%d of the job lists through kube-mvp failed while an apiserver listed invalid names (want none):\n%s", len(failures), strings.Join(failures, "\n"))
	}
	if m := httpGet(t, k.XDSAdmin+"/metrics"); !strings.Contains(m, "\nkube_mvp_xds_plan_held 0\n") {
		t.Errorf("xds-server held a plan back (kube_mvp_xds_plan_held):\n%s", grepLines(m, "kube_mvp_xds_plan_held"))
	}
	t.Logf("%d job lists after xds-server took the compromised apiserver in", n)
}
