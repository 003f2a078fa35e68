package main

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/testutil/cptlstest"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestServeAgainstMixedControlPlane runs `xds-server serve` on a real two-version control
// plane (A v1.37.1, B v1.36.4 with batch/v1 off) and reads what a real ADS client receives:
// /apis/batch/v1/ goes through extproc to a cluster holding only A, /apis/apps/v1/ straight to
// both; when A dies it leaves every cluster, and it returns after a restart.
func TestServeAgainstMixedControlPlane(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Servers: controlplane.MixedServers()})
	// xds-server watches through B: A is the one that dies below, and a watch through a dead
	// server would (rightly) make every Lease look stale rather than A's alone.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfigFor(kubeconfig, "https://"+cp.Server("cp-b").Address()); err != nil {
		t.Fatal(err)
	}
	pki := cp.PKI
	cpTLS := cptlstest.New(t, t.TempDir())
	args := []string{
		"--kubeconfig", kubeconfig, "--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0",
		"--xds-tls-dir", cpTLS.Dir(cptls.RoleXDSServer),
		"--liveness-window", "15s", "--extproc-address", "unix:" + filepath.Join(t.TempDir(), "extproc.sock"),
		"--serving-cert", pki.Path("serving.crt"), "--serving-key", pki.Path("serving.key"),
		"--client-ca", pki.Path("client-ca.crt"), "--peer-ca", pki.Path("server-ca.crt"),
		"--proxy-client-cert", pki.Path("proxy-client.crt"), "--proxy-client-key", pki.Path("proxy-client.key"),
		"--shutdown-delay", "3s",
	}
	ready := make(chan [2]string, 1)
	var stderr testutil.SyncBuffer
	var stderrW io.Writer = &stderr
	if os.Getenv("KUBE_MVP_TEST_VERBOSE") != "" {
		stderrW = io.MultiWriter(&stderr, os.Stderr)
	}
	done := make(chan int, 1)
	serveCtx, stopServe := context.WithCancel(ctx) // SIGTERM
	go func() { done <- runServe(serveCtx, args, io.Discard, stderrW, ready) }()
	var addrs [2]string
	select {
	case addrs = <-ready:
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	stopped := false
	defer func() {
		if !stopped {
			stopServe()
			<-done
		}
	}()

	envoyCreds, err := cptls.Load(cpTLS.Files(cptls.RoleEnvoyFront), cptls.RoleEnvoyFront, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(credentials.NewTLS(envoyCreds.ClientConfig())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := newADS(t, ctx, conn)

	a := cp.Server("cp-a").Address()
	b := cp.Server("cp-b").Address()
	ads.await(t, "batch/v1 routed via extproc to A only, apps/v1 straight to both", func(s *adsState) error {
		if err := s.routeUsesExtProc("batch/v1", true); err != nil {
			return err
		}
		if err := s.routeUsesExtProc("apps/v1", false); err != nil {
			return err
		}
		if got := s.endpoints["kube-apiservers-only-cp-a"]; !slices.Equal(got, []string{a}) {
			return fmt.Errorf("kube-apiservers-only-cp-a endpoints %v, want [%s]", got, a)
		}
		if got := s.endpoints["kube-apiservers"]; !sameSet(got, []string{a, b}) {
			return fmt.Errorf("kube-apiservers endpoints %v, want %s and %s", got, a, b)
		}
		return nil
	})

	// The admin pages answer.
	for _, path := range []string{"/readyz", "/metrics", "/debug/topology", "/debug/syncz", "/debug/config_dump"} {
		resp, err := http.Get("http://" + addrs[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		if path == "/debug/topology" && !strings.Contains(string(body), `"cluster": "kube-apiservers-only-cp-a"`) {
			t.Errorf("/debug/topology does not route batch/v1 to cp-a: %s", body)
		}
		if path == "/metrics" && (!strings.Contains(string(body), `kube_mvp_xds_apiservers{state="live"} 2`) || !strings.Contains(string(body), "kube_mvp_xds_objects_skipped 0")) {
			t.Errorf("/metrics lacks the live apiserver count or the skipped objects (none on real apiservers)")
		}
		if path == "/metrics" {
			// Its own certificate, and the connected Envoy's.
			for _, role := range []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront} {
				want := fmt.Sprintf(`kube_mvp_certificate_expiry_timestamp_seconds{certificate="control-plane",role="%s"} %s`,
					role, strconv.FormatFloat(float64(certNotAfter(t, cpTLS.Files(role).Cert).Unix()), 'g', -1, 64))
				if !strings.Contains(string(body), want+"\n") {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		}
		if path == "/debug/syncz" {
			// The Envoy's client certificate, by serial and expiry.
			envoyCert := certOf(t, cpTLS.Files(cptls.RoleEnvoyFront).Cert)
			var nodes []struct {
				Certificate struct {
					Serial   string    `json:"serial"`
					NotAfter time.Time `json:"notAfter"`
				} `json:"certificate"`
			}
			if err := json.Unmarshal(body, &nodes); err != nil || len(nodes) != 1 {
				t.Errorf("/debug/syncz: %v, %d nodes: %s", err, len(nodes), body)
			} else if c := nodes[0].Certificate; c.Serial != hex.EncodeToString(envoyCert.SerialNumber.Bytes()) || !c.NotAfter.Equal(envoyCert.NotAfter) {
				t.Errorf("/debug/syncz certificate %+v, want serial %x expiring %s", c, envoyCert.SerialNumber, envoyCert.NotAfter)
			}
		}
		if path == "/debug/config_dump" && (strings.Contains(string(body), "PRIVATE KEY") || !strings.Contains(string(body), `"filename": "`+pki.Path("proxy-client.crt")+`"`)) {
			t.Errorf("/debug/config_dump: the proxy client certificate is not a file reference, or a key is in it")
		}
	}

	cp.Kill("cp-a")
	// Killed, A is remembered: it stays a host of the serving-sets cluster, in its set of one
	// only (health checks keep requests off it), so that its return needs no new host.
	ads.await(t, "A gone from every cluster and serving set but its own once its Lease is stale", func(s *adsState) error {
		for name, eps := range s.endpoints {
			base := contract.ParseClusterName(name).Base
			if kept := base == contract.ClusterServingSets || name == "kube-apiservers-only-cp-a"; slices.Contains(eps, a) != kept {
				return fmt.Errorf("cluster or serving set %s: has %s %v, want %v", name, a, !kept, kept)
			}
		}
		return s.routeUsesExtProc("batch/v1", true) // batch/v1 now answers 503 from extproc
	})
	testutil.WaitFor(t, ctx, 30*time.Second, "cp-a departed in /metrics", func() error {
		resp, err := http.Get("http://" + addrs[1] + "/metrics")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`hostname="cp-a",state="departed"} 1`, `hostname="cp-b",state="live"} 1`} {
			if !strings.Contains(string(body), want) {
				return fmt.Errorf("no kube_mvp_xds_apiserver_state line ends %s", want)
			}
		}
		return nil
	})
	if err := cp.Restart(ctx, "cp-a", ""); err != nil {
		t.Fatal(err)
	}
	ads.await(t, "A back", func(s *adsState) error {
		if got := s.endpoints["kube-apiservers-only-cp-a"]; !slices.Equal(got, []string{a}) {
			return fmt.Errorf("kube-apiservers-only-cp-a endpoints %v", got)
		}
		return nil
	})

	// SIGTERM with --shutdown-delay: /readyz fails at once, but whoever still dials this
	// replica (a DNS cache) is served until the delay is over; then every stream ends.
	stopServe()
	testutil.WaitFor(t, ctx, 10*time.Second, "/readyz to fail while stopping", func() error {
		resp, err := http.Get("http://" + addrs[1] + "/readyz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "stopping") {
			return fmt.Errorf("%d %s", resp.StatusCode, body)
		}
		return nil
	})
	late, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(credentials.NewTLS(envoyCreds.ClientConfig())))
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	newADS(t, ctx, late).await(t, "a stream opened while stopping gets the configuration", func(s *adsState) error {
		return s.routeUsesExtProc("batch/v1", true)
	})
	select {
	case code := <-done:
		stopped = true
		if code != 0 {
			t.Errorf("serve exited %d after the delay: %s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve still running 30 s after SIGTERM with --shutdown-delay 3s")
	}
	testutil.WaitFor(t, ctx, 10*time.Second, "the first ADS stream to end", func() error {
		ads.mu.Lock()
		defer ads.mu.Unlock()
		if !ads.ended {
			return fmt.Errorf("still open")
		}
		return nil
	})
}

// adsState is what an ADS client has received so far.
type adsState struct {
	routes    map[string]*route.Route // by route name
	endpoints map[string][]string     // cluster -> addresses
	clusters  map[string]bool
}

func (s *adsState) routeUsesExtProc(name string, want bool) error {
	r, ok := s.routes[name]
	if !ok {
		return fmt.Errorf("no route %q", name)
	}
	_, disabled := r.TypedPerFilterConfig["envoy.filters.http.ext_proc"]
	if disabled == want {
		return fmt.Errorf("route %s: ext_proc engaged=%v, want %v", name, !disabled, want)
	}
	return nil
}

type adsClient struct {
	mu      sync.Mutex
	latest  *adsState
	ended   bool
	changed chan struct{} // one pending signal is enough: await re-reads latest
}

func (c *adsClient) publish(st *adsState, ended bool) {
	c.mu.Lock()
	c.latest, c.ended = st, ended
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// newADS subscribes to everything over one ADS stream, ACKs every response and publishes the
// accumulated state after each.
func newADS(t *testing.T, ctx context.Context, conn *grpc.ClientConn) *adsClient {
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: "serve-test", Cluster: "test"}
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.RouteType} {
		if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
	}
	c := &adsClient{changed: make(chan struct{}, 1)}
	go func() {
		st := &adsState{routes: map[string]*route.Route{}, endpoints: map[string][]string{}, clusters: map[string]bool{}}
		for {
			resp, err := stream.Recv()
			if err != nil {
				c.publish(st, true)
				return
			}
			next := &adsState{routes: st.routes, endpoints: st.endpoints, clusters: st.clusters}
			switch resp.TypeUrl {
			case resourcev3.RouteType:
				next.routes = map[string]*route.Route{}
				for _, a := range resp.Resources {
					var rc route.RouteConfiguration
					if a.UnmarshalTo(&rc) == nil {
						for _, vh := range rc.VirtualHosts {
							for _, r := range vh.Routes {
								next.routes[r.Name] = proto.Clone(r).(*route.Route)
							}
						}
					}
				}
			case resourcev3.EndpointType:
				next.endpoints = map[string][]string{}
				for _, a := range resp.Resources {
					var cla endpoint.ClusterLoadAssignment
					if a.UnmarshalTo(&cla) == nil {
						var addrs []string
						for _, le := range cla.Endpoints {
							for _, lb := range le.LbEndpoints {
								sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
								addr := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
								addrs = append(addrs, addr)
								// A serving set's members are the serving-sets cluster's
								// endpoints that list it: recorded under the set's name.
								if cla.ClusterName == contract.ClusterServingSets {
									for _, v := range lb.GetMetadata().GetFilterMetadata()[contract.MetadataNamespaceLB].GetFields()[contract.LBSetKey].GetListValue().GetValues() {
										next.endpoints[v.GetStringValue()] = append(next.endpoints[v.GetStringValue()], addr)
									}
								}
							}
						}
						next.endpoints[cla.ClusterName] = addrs
					}
				}
			case resourcev3.ClusterType:
				next.clusters = map[string]bool{}
				for _, a := range resp.Resources {
					var cl cluster.Cluster
					if a.UnmarshalTo(&cl) == nil {
						next.clusters[cl.Name] = true
					}
				}
			}
			st = next
			stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce})
			c.publish(st, false)
		}
	}()
	return c
}

func (c *adsClient) await(t *testing.T, what string, check func(*adsState) error) {
	t.Helper()
	timeout := time.After(90 * time.Second)
	for {
		c.mu.Lock()
		st, ended := c.latest, c.ended
		c.mu.Unlock()
		last := fmt.Errorf("nothing received")
		if st != nil {
			if last = check(st); last == nil {
				return
			}
		}
		if ended {
			t.Fatalf("%s: ADS stream ended: %v", what, last)
		}
		select {
		case <-c.changed:
		case <-timeout:
			t.Fatalf("%s: %v", what, last)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

// TestServeMemoryNeedsTLS: the memory ConfigMap's entries are signed with xds-server's own
// key, so --memory-configmap without --xds-tls-dir is a flag error that says what to do.
func TestServeMemoryNeedsTLS(t *testing.T) {
	_, err := parseServe([]string{"--xds-insecure-plaintext", "--memory-configmap", "kube-mvp/mem"})
	if err == nil || !strings.Contains(err.Error(), "--memory-configmap needs --xds-tls-dir") || !strings.Contains(err.Error(), "leave --memory-configmap out") {
		t.Errorf("--memory-configmap with --xds-insecure-plaintext: %v", err)
	}
	_, err = parseServe([]string{"--xds-insecure-plaintext"})
	if err != nil && strings.Contains(err.Error(), "--memory-configmap") {
		t.Errorf("without --memory-configmap: %v", err)
	}
}

// TestServeFlagsLeaveTheEnvironment: parsing serve's flags builds the rest config with the
// HTTP/2 health check as an option (internal/inventory's test proves it works) and changes
// no environment variable.
func TestServeFlagsLeaveTheEnvironment(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
contexts: [{name: c, context: {cluster: c}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "")
	t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "")
	opts, err := parseServe([]string{"--xds-insecure-plaintext", "--kubeconfig", kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	if opts.rest == nil || opts.rest.WrapTransport == nil {
		t.Errorf("rest config %+v: want the HTTP/2 health check's transport wrapper", opts.rest)
	}
	for _, k := range []string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS", "HTTP2_PING_TIMEOUT_SECONDS"} {
		if v := os.Getenv(k); v != "" {
			t.Errorf("%s=%q after parsing flags, want it unset", k, v)
		}
	}
}

// TestServeLingerOutlivesDelay: a serving set must outlive the routing tables that name it,
// so --cluster-linger at or below --routing-table-delay is a flag error naming both.
func TestServeLingerOutlivesDelay(t *testing.T) {
	_, err := parseServe([]string{"--xds-insecure-plaintext", "--routing-table-delay", "3s", "--cluster-linger", "3s"})
	if err == nil || !strings.Contains(err.Error(), "--routing-table-delay 3s, --cluster-linger 3s: cluster linger 3s must be longer than routing table delay 3s") {
		t.Errorf("linger equal to the delay: %v", err)
	}
	for _, args := range [][]string{{"--cluster-linger", "0s"}, {"--routing-table-delay", "0s", "--cluster-linger", "1s"}} {
		if _, err := parseServe(append([]string{"--xds-insecure-plaintext"}, args...)); err != nil && strings.Contains(err.Error(), "linger") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func certOf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func certNotAfter(t *testing.T, path string) time.Time { return certOf(t, path).NotAfter }

// TestServeMaxDiscoveryBody: --max-discovery-body takes bytes, Ki or Mi from 1Mi to 256Mi;
// anything else is a flag error saying what to give.
func TestServeMaxDiscoveryBody(t *testing.T) {
	opts, err := parseServe([]string{"--xds-insecure-plaintext"})
	if err != nil && strings.Contains(err.Error(), "--max-discovery-body") {
		t.Fatal(err)
	}
	if opts.watch.MaxDiscoveryBody != inventory.DefaultMaxDiscoveryBody {
		t.Errorf("default %d, want %d", opts.watch.MaxDiscoveryBody, inventory.DefaultMaxDiscoveryBody)
	}
	for in, want := range map[string]int64{"16Mi": 16 << 20, "2048Ki": 2 << 20, "1048576": 1 << 20, "256Mi": 256 << 20} {
		opts, err := parseServe([]string{"--xds-insecure-plaintext", "--max-discovery-body", in})
		if err != nil && strings.Contains(err.Error(), "--max-discovery-body") {
			t.Errorf("%s: %v", in, err)
		} else if opts.watch.MaxDiscoveryBody != want {
			t.Errorf("%s: %d, want %d", in, opts.watch.MaxDiscoveryBody, want)
		}
	}
	for _, in := range []string{"", "0", "-1Mi", "1023Ki", "257Mi", "16MB", "16M", "1.5Mi", "Mi", "99999999999999999999"} {
		_, err := parseServe([]string{"--xds-insecure-plaintext", "--max-discovery-body", in})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("--max-discovery-body %q is not a size from 1Mi to 256Mi", in)) {
			t.Errorf("%q: %v", in, err)
		}
	}
}
