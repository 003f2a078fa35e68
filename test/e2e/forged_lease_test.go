package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/inventory/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestForgedLeases writes identity Leases as anyone allowed to write Leases in kube-system
// could, while clients keep working through kube-mvp: a fresh Lease pointing at a TLS server
// the attacker runs (a certificate for kubernetes.default.svc, but not from the cluster CA),
// one renewed "in 2099", one whose address is a URL, and one that claims the real
// apiserver's hostname. None changes where a request goes: every request succeeds, the
// attacker's server never sees an HTTP request (the TLS handshake fails before one, so no
// credential is sent), /debug/topology shows the fresh forgery as awaiting verified
// discovery and not alive, and the data plane's clusters hold only the real apiserver.
func TestForgedLeases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"})
	k := e.startKubeMVP(ctx, "forged", "")
	admin, err := e.cp.PKI.ClientCert("forged-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	through := kubernetes.NewForConfigOrDie(e.through(k, &admin, ""))
	direct := e.adminClient(e.cp.Server("cp-a"))

	// The attacker's server: TLS with a self-signed certificate for the name Envoy and
	// xds-server expect, answering anything with an aggregated discovery that claims batch.
	var attackerRequests atomic.Int64
	attacker := newAttackerServer(t, func(w http.ResponseWriter, r *http.Request) {
		attackerRequests.Add(1)
		w.Header().Set("Content-Type", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
		fmt.Fprint(w, `{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[]}`)
	})

	leases := direct.CoordinationV1().Leases("kube-system")
	forge := func(name, hostname, address string, renew time.Time) {
		t.Helper()
		holder := name + "_forged"
		rt := metav1.NewMicroTime(renew)
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system",
				Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, objects.HostnameLabel: hostname},
				Annotations: map[string]string{objects.PeerAdvertiseAnnotation: address}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &rt},
		}
		if cur, err := leases.Get(ctx, name, metav1.GetOptions{}); err == nil {
			l.ResourceVersion = cur.ResourceVersion
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			if err != nil && ctx.Err() == nil {
				t.Errorf("renewing %s: %v", name, err)
			}
			return
		}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	renewFresh := func() {
		forge("apiserver-forged-fresh", "evil", attacker, time.Now())
		forge("apiserver-forged-twin", "cp-a", attacker, time.Now()) // the real apiserver's hostname
	}
	renewFresh()
	forge("apiserver-forged-future", "evil-2", attacker, time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
	forge("apiserver-forged-url", "evil-3", "127.0.0.1:1/evil?x=1", time.Now())

	// For longer than the liveness window: the fresh forgeries are renewed every 2 s,
	// requests go through kube-mvp all the time.
	deadline := time.Now().Add(livenessWindow + 5*time.Second)
	requests := 0
	for time.Now().Before(deadline) {
		renewFresh()
		for range 5 {
			if _, err := through.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatalf("request %d through kube-mvp with forged Leases about: %v", requests, err)
			}
			if _, err := through.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatalf("request %d through kube-mvp with forged Leases about: %v", requests, err)
			}
			requests += 2
		}
		time.Sleep(2 * time.Second)
	}

	// xds-server knows the Leases and believes none of them.
	var view struct {
		APIServers []struct {
			ID         string `json:"id"`
			Alive      bool   `json:"alive"`
			Unverified bool   `json:"awaitingVerifiedDiscovery"`
		} `json:"apiservers"`
	}
	res, err := http.Get(k.XDSAdmin + "/debug/topology")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(res.Body).Decode(&view)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range view.APIServers {
		seen[s.ID] = true
		if strings.HasPrefix(s.ID, "apiserver-forged") && s.Alive {
			t.Errorf("%s counts as alive", s.ID)
		}
		if (s.ID == "apiserver-forged-fresh" || s.ID == "apiserver-forged-twin") && !s.Unverified {
			t.Errorf("%s is not shown awaiting verified discovery: %+v", s.ID, s)
		}
	}
	for _, id := range []string{"apiserver-forged-fresh", "apiserver-forged-twin"} {
		if !seen[id] {
			t.Errorf("/debug/topology does not list %s: %+v", id, view.APIServers)
		}
	}
	// The data plane's apiserver clusters hold the real apiserver only.
	hosts := clusterHosts(t, ctx, k)
	if got := hosts["kube-apiservers"]; len(got) != 1 || got[0] != e.cp.Server("cp-a").Address() {
		t.Errorf("kube-apiservers holds %v, want only cp-a at %s", got, e.cp.Server("cp-a").Address())
	}
	for name, hosts := range hosts {
		for _, h := range hosts {
			if h == attacker {
				t.Errorf("cluster %s has the attacker's address %s", name, h)
			}
		}
	}
	if n := attackerRequests.Load(); n != 0 {
		t.Errorf("the attacker's server received %d HTTP requests", n)
	}
	t.Logf("%d requests through kube-mvp, all served", requests)
}

// newAttackerServer serves h over TLS with a self-signed certificate for
// kubernetes.default.svc on a loopback address and returns that address.
func newAttackerServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ca, err := testutil.NewCA("attacker")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"kubernetes.default.svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// clusterHosts maps each cluster of k's data plane to its hosts' addresses (admin /clusters).
func clusterHosts(t *testing.T, ctx context.Context, k *harness.KubeMVP) map[string][]string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", k.DataPlane.AdminURL()+"/clusters", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v struct {
		ClusterStatuses []struct {
			Name         string `json:"name"`
			HostStatuses []struct {
				Address struct {
					SocketAddress struct {
						Address   string `json:"address"`
						PortValue int    `json:"port_value"`
					} `json:"socket_address"`
				} `json:"address"`
			} `json:"host_statuses"`
		} `json:"cluster_statuses"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, c := range v.ClusterStatuses {
		out[c.Name] = []string{}
		for _, h := range c.HostStatuses {
			a := h.Address.SocketAddress
			out[c.Name] = append(out[c.Name], net.JoinHostPort(a.Address, fmt.Sprint(a.PortValue)))
		}
	}
	return out
}
