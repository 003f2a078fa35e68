package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/dataplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestForgedLeases writes identity Leases as anyone allowed to write Leases in kube-system
// could, while clients keep working through kube-mvp against cp-a (which alone serves
// batch/v1) and cp-b: a fresh Lease of a new host pointing at a TLS server the attacker runs (a
// certificate for kubernetes.default.svc, but not from the cluster CA), one renewed "in 2099",
// one whose address is a URL, one that claims cp-a's hostname under another name while
// pointing at a genuine apiserver (a forwarder to cp-b: its discovery verifies), and one of
// a new host whose ID sorts first, at cp-b's own address. None changes where a request goes:
// every list of jobs and namespaces succeeds (no 404 from cp-b, no 503), the attacker's server
// never sees an HTTP request, /debug/topology shows the fresh forgery as awaiting verified
// discovery and the two claims on real apiservers as refused, and every cluster of the data
// plane holds only the real apiservers' addresses, each once.
func TestForgedLeases(t *testing.T) {
	ctx := testutil.Context(t, 6*time.Minute)
	e := newEnv(t, ctx, controlplane.MixedServers()...)
	k := e.startKubeMVP(ctx, "forged", "")
	admin, err := e.cp.PKI.ClientCert("forged-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	through := kubernetes.NewForConfigOrDie(e.through(k, &admin, ""))
	direct := e.adminClient(e.cp.Server("cp-a"))
	cpA, cpB := e.cp.Server("cp-a").Address(), e.cp.Server("cp-b").Address()

	// The attacker's server: TLS with a self-signed certificate for the name Envoy and
	// xds-server expect, answering anything with an aggregated discovery that claims batch.
	var attackerRequests atomic.Int64
	attacker := newAttackerServer(t, func(w http.ResponseWriter, r *http.Request) {
		attackerRequests.Add(1)
		w.Header().Set("Content-Type", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
		fmt.Fprint(w, `{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[]}`)
	})
	// A second address of a real apiserver: a TCP forwarder to cp-b.
	forwarder := newForwarder(t, cpB)

	leases := direct.CoordinationV1().Leases("kube-system")
	realLeases, err := leases.List(ctx, metav1.ListOptions{LabelSelector: objects.IdentityLabel})
	if err != nil {
		t.Fatal(err)
	}
	// A host whose ID sorts before every real apiserver's, as an attacker would pick it.
	first := ""
	for i := 0; first == ""; i++ {
		host := fmt.Sprintf("impostor-%d", i)
		if !slices.ContainsFunc(realLeases.Items, func(l coordinationv1.Lease) bool { return l.Name <= objects.APIServerIDFor(host) }) {
			first = host
		}
	}
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
	fresh, lookalike, impostor := objects.APIServerIDFor("evil"), "apiserver-evil2", objects.APIServerIDFor(first)
	renewFresh := func() {
		forge(fresh, "evil", attacker, time.Now())
		forge(lookalike, "cp-a", forwarder, time.Now()) // cp-a's hostname, a genuine apiserver's address
		forge(impostor, first, cpB, time.Now())         // cp-b's own address, under an ID sorting first
	}
	renewFresh()
	forge(objects.APIServerIDFor("evil-2"), "evil-2", attacker, time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
	forge(objects.APIServerIDFor("evil-3"), "evil-3", "127.0.0.1:1/evil?x=1", time.Now())

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
			Address    string `json:"address"`
			Unverified bool   `json:"awaitingVerifiedDiscovery"`
			// NotRoutable is empty for a routable apiserver only (alive, verified, addressed).
			NotRoutable string `json:"notRoutable"`
		} `json:"apiservers"`
		Refused []struct {
			ID     string `json:"id"`
			Reason string `json:"reason"`
		} `json:"refused"`
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
	realID := map[string]bool{}
	for _, l := range realLeases.Items {
		realID[l.Name] = true
	}
	seen := map[string]bool{}
	for _, s := range view.APIServers {
		seen[s.ID] = true
		if !realID[s.ID] && s.NotRoutable == "" {
			t.Errorf("%s is routable: %+v", s.ID, s)
		}
	}
	if !seen[fresh] {
		t.Errorf("/debug/topology does not list %s (the fresh forgery, a believable Lease): %+v", fresh, view.APIServers)
	}
	for _, s := range view.APIServers {
		if s.ID == fresh && !s.Unverified {
			t.Errorf("%s is not shown awaiting verified discovery: %+v", s.ID, s)
		}
	}
	refused := map[string]string{}
	for _, r := range view.Refused {
		refused[r.ID] = r.Reason
	}
	if !strings.Contains(refused[lookalike], "names its Lease "+objects.APIServerIDFor("cp-a")) {
		t.Errorf("/debug/topology refusals %+v: want %s refused for claiming cp-a's host", view.Refused, lookalike)
	}
	if !strings.Contains(refused[impostor], "its address is also claimed by apiserver "+objects.APIServerIDFor("cp-b")) {
		t.Errorf("/debug/topology refusals %+v: want %s refused for claiming cp-b's address", view.Refused, impostor)
	}
	// The data plane's apiserver clusters hold the real apiservers only, each address once.
	for name, hosts := range clusterHosts(t, ctx, k) {
		if !strings.HasPrefix(name, "kube-apiservers") {
			continue
		}
		seen := map[string]bool{}
		for _, h := range hosts {
			if h != cpA && h != cpB {
				t.Errorf("cluster %s has the host %s, not a real apiserver's address (%s, %s)", name, h, cpA, cpB)
			}
			if seen[h] {
				t.Errorf("cluster %s has %s twice", name, h)
			}
			seen[h] = true
		}
	}
	if n := attackerRequests.Load(); n != 0 {
		t.Errorf("the attacker's server received %d HTTP requests", n)
	}
	t.Logf("%d requests through kube-mvp, all served", requests)
}

// newForwarder forwards TCP connections from a loopback address it returns to to.
func newForwarder(t *testing.T, to string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", to)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.Close() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().String()
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
	clusters, err := dataplane.ReadClusters(ctx, k.Envoy.Admin)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, c := range clusters.GetClusterStatuses() {
		out[c.GetName()] = []string{}
		for _, h := range c.GetHostStatuses() {
			a := h.GetAddress().GetSocketAddress()
			out[c.GetName()] = append(out[c.GetName()], net.JoinHostPort(a.GetAddress(), fmt.Sprint(a.GetPortValue())))
		}
	}
	return out
}
