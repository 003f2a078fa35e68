package snapshot_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

func mustTopology(t *testing.T, servers []topology.APIServer, served map[topology.Resource][]string) *topology.Topology {
	t.Helper()
	topo, err := topology.New(servers, served, nil)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

var jobs = topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}

// TestHostnameAddress: EDS needs IP:port. An apiserver whose address is a DNS name is left out
// with an error naming it, and the rest of the configuration is still returned.
func TestHostnameAddress(t *testing.T) {
	topo := mustTopology(t, []topology.APIServer{
		{ID: "apiserver-tqsyvnc7rs47fayzipsuqpfg4m", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "apiserver-imkgstwjs6opnbwk2ixluu6fiq", Hostname: "cp-b", Address: "cp-b.example.com:6443", Alive: true, Verified: true},
		{ID: "apiserver-npbtitaxiimvptb5rwlxt4xbci", Hostname: "cp-c", Address: "10.0.0.3", Alive: true, Verified: true},
	}, map[topology.Resource][]string{jobs: {"apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-imkgstwjs6opnbwk2ixluu6fiq"}})
	res, err := snapshot.Build(mustPlan(t, topo), testConfig())
	if err == nil {
		t.Fatal("no error for a DNS-name address")
	}
	for _, want := range []string{"apiserver apiserver-imkgstwjs6opnbwk2ixluu6fiq (hostname cp-b)", `"cp-b.example.com:6443"`, "apiserver apiserver-npbtitaxiimvptb5rwlxt4xbci (hostname cp-c)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	var ae *snapshot.AddressError
	if !errors.As(err, &ae) {
		t.Errorf("error is not an *AddressError: %v", err)
	}
	if res == nil {
		t.Fatal("no Resources beside an address error")
	}
	members := readMembers(res)
	if got := members[contract.ClusterDefault]; len(got) != 1 || got[0] != "cp-a" {
		t.Errorf("default cluster endpoints = %v, want only cp-a", got)
	}
	if _, err := res.Snapshot(); err != nil {
		t.Errorf("the degraded configuration is not a consistent snapshot: %v", err)
	}
}

// TestConfigErrors: every problem of a Config is reported at once, each naming its field.
func TestConfigErrors(t *testing.T) {
	topo := mustTopology(t, nil, nil)
	cfg := snapshot.Config{
		ListenAddress:         "localhost",
		ExtProcAddress:        "extproc",
		ExtProcMessageTimeout: time.Microsecond,
		UpstreamServerName:    "Kubernetes/default",
		Secrets: snapshot.SecretFiles{
			ServingCert:     "/etc/kube-mvp/serving/tls.crt",
			ProxyClientCert: "relative/tls.crt",
			ProxyClientKey:  "/etc/kube-mvp/proxy-client/tls.key",
		},
	}
	res, err := snapshot.Build(mustPlan(t, topo), cfg)
	if res != nil || err == nil {
		t.Fatalf("Build = %v, %v; want an error", res, err)
	}
	for _, e := range cfg.Validate() {
		var ce *snapshot.ConfigError
		if !errors.As(e, &ce) || ce.Field == "" {
			t.Errorf("Validate: %v is not a *ConfigError with a field", e)
		}
	}
	for _, want := range []string{
		"Config.ListenAddress", "Config.ExtProcAddress", "Config.ExtProcMessageTimeout",
		"Config.UpstreamServerName", "Config.Secrets.ServingKey is missing", "Config.Secrets.ProxyClientCert \"relative/tls.crt\" is not an absolute path",
		"Config.Secrets.PeerCA is missing: the proxy client certificate",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s:\n%v", want, err)
		}
	}

	cfg = snapshot.Config{Secrets: snapshot.SecretFiles{ClientCA: "/etc/kube-mvp/client-ca/ca.crt"}}
	if _, err := snapshot.Build(mustPlan(t, topo), cfg); err == nil || !strings.Contains(err.Error(), "Config.Secrets.ClientCA is given but there is no serving certificate") {
		t.Errorf("client CA without serving cert: %v", err)
	}
	if _, err := snapshot.Build(nil, snapshot.Config{}); err == nil {
		t.Error("nil topology accepted")
	}
}

// TestClusterNameCollision: two different serving sets must never share a cluster name (the
// name is made of hostnames); if they would, the plan fails naming the cluster.
func TestClusterNameCollision(t *testing.T) {
	topo := mustTopology(t, []topology.APIServer{
		{ID: "apiserver-tqsyvnc7rs47fayzipsuqpfg4m", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "apiserver-aab", Hostname: "cp-a", Address: "10.0.0.2:6443", Alive: true, Verified: true},
		{ID: "apiserver-npbtitaxiimvptb5rwlxt4xbci", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true},
	}, map[topology.Resource][]string{
		jobs: {"apiserver-tqsyvnc7rs47fayzipsuqpfg4m"},
		{Group: "batch", Version: "v1", Resource: "cronjobs"}: {"apiserver-aab"},
	})
	p, err := plan.Build(topo)
	if p != nil || err == nil || !strings.Contains(err.Error(), "kube-apiservers-only-cp-a stands for two serving sets") {
		t.Fatalf("plan.Build = %v, %v; want a collision error", p != nil, err)
	}
}

// TestNoSecrets: with no certificates at all the configuration is still valid: a plain-HTTP
// listener, no client-certificate routes (neither the undecided-identity route nor
// front-proxy variants), upstream TLS without a client certificate or verification.
func TestNoSecrets(t *testing.T) {
	res, err := snapshot.Build(mustPlan(t, loadCase(t, "batch-off")), snapshot.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Secrets) != 0 {
		t.Errorf("%d secrets, want none", len(res.Secrets))
	}
	l := res.Listeners[0].(*listenerv3.Listener)
	if ts := l.GetFilterChains()[0].GetTransportSocket(); ts != nil {
		t.Errorf("listener has a transport socket without a serving certificate: %v", ts)
	}
	for _, r := range readRoutes(t, res) {
		if r.name == snapshot.RouteIdentityUndecided || strings.HasSuffix(r.name, snapshot.RouteSuffixProxyCert) {
			t.Errorf("client-certificate route %s without a client CA", r.name)
		}
	}
	if _, err := res.Snapshot(); err != nil {
		t.Error(err)
	}
}

// TestExtProcAddress: the extproc cluster follows the address form.
func TestExtProcAddress(t *testing.T) {
	topo := mustTopology(t, nil, nil)
	for addr, want := range map[string]string{
		"unix:/run/x.sock":           "STATIC pipe /run/x.sock",
		"unix:///run/x.sock":         "STATIC pipe /run/x.sock",
		"127.0.0.1:9001":             "STATIC 127.0.0.1:9001",
		"[::1]:9001":                 "STATIC ::1:9001",
		"extproc.kube-system.svc:91": "STRICT_DNS extproc.kube-system.svc:91",
	} {
		res, err := snapshot.Build(mustPlan(t, topo), snapshot.Config{ExtProcAddress: addr})
		if err != nil {
			t.Errorf("%s: %v", addr, err)
			continue
		}
		var got string
		for _, r := range res.Clusters {
			c := r.(*clusterv3.Cluster)
			if c.GetName() != snapshot.ExtProcClusterName {
				continue
			}
			a := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress()
			if p := a.GetPipe(); p != nil {
				got = c.GetType().String() + " pipe " + p.GetPath()
			} else {
				got = c.GetType().String() + " " + a.GetSocketAddress().GetAddress() + ":" + strconv.Itoa(int(a.GetSocketAddress().GetPortValue()))
			}
		}
		if got != want {
			t.Errorf("%s: extproc cluster %q, want %q", addr, got, want)
		}
	}
	for _, bad := range []string{"unix:", "tcp://x:1", "host:0", ":9001"} {
		if _, err := snapshot.Build(mustPlan(t, topo), snapshot.Config{ExtProcAddress: bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestEmptyCluster: a cluster with nobody live is still defined, without endpoints.
func TestEmptyCluster(t *testing.T) {
	topo := mustTopology(t, []topology.APIServer{
		{ID: "apiserver-tqsyvnc7rs47fayzipsuqpfg4m", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: false},
	}, nil)
	res, err := snapshot.Build(mustPlan(t, topo), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{contract.ClusterDefault, contract.ClusterServingSets}
	for _, c := range slices.Clone(want) {
		want = append(want, contract.ClusterName{Base: c, HTTP1: true}.String(), contract.ClusterName{Base: c,
			ProxyCert: true}.String(), contract.ClusterName{Base: c, ProxyCert: true, HTTP1: true}.String())
	}
	slices.Sort(want)
	var got []string
	for _, e := range res.Endpoints {
		cla := e.(*endpointv3.ClusterLoadAssignment)
		got = append(got, cla.GetClusterName())
		if len(cla.GetEndpoints()) != 0 {
			t.Errorf("endpoints = %v, want none", cla)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("endpoint resources %v, want %v (each apiserver cluster, HTTP/2 and HTTP/1.1, and their front-proxy variants)", got, want)
	}
	if _, err := res.Snapshot(); err != nil {
		t.Error(err)
	}
	// Sidecar mode beside an apiserver nobody knows: an empty local cluster, no error (it may
	// just not have published its Lease yet).
	res, err = snapshot.Build(mustPlan(t, topo.WithLocal("apiserver-new")), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if m := readMembers(res); len(m) != 8 || len(m[contract.ClusterLocal]) != 0 || len(m[contract.ClusterName{Base: contract.ClusterLocal, ProxyCert: true}.String()]) != 0 {
		t.Errorf("sidecar of an unknown apiserver: members %v", m)
	}
}

// TestEnvoyValidation: what Config's own checks let through, Envoy's proto rules catch before
// anything is packed; the error names the part of the configuration.
func TestEnvoyValidation(t *testing.T) {
	// Envoy limits SNI to 255 bytes.
	res, err := snapshot.Build(mustPlan(t, mustTopology(t, nil, nil)), snapshot.Config{UpstreamServerName: strings.Repeat("a", 300)})
	if res != nil || err == nil {
		t.Fatalf("Build = %v, %v; want a validation error", res != nil, err)
	}
	for _, want := range []string{"apiserver clusters: upstream TLS", "Sni"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
}
