package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/testutil/cptlstest"
	"github.com/kube-mvp/kube-mvp/internal/xds"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestControlPlaneChannel tries xds-server's gRPC port of a running deployment (real
// xds-server and extproc processes) as an attacker in the cluster would: without a
// certificate, with one of another CA, with the wrong role, or a node that does not fit its
// role, nobody gets a snapshot or a table; a rightful Envoy gets its snapshot, and no xDS
// response carries a private key; a flood of node IDs leaves nothing behind.
func TestControlPlaneChannel(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Minute)
	e := newEnv(t, ctx, controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"})
	k := e.startKubeMVP(ctx, "sec", "")
	own := func(r cptls.Role) credentials.TransportCredentials {
		c, err := cptls.Load(cptls.DirFiles(k.ControlPlaneTLS(r)), r, nil)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(c.ClientConfig())
	}
	other := cptlstest.New(t, t.TempDir()) // a control plane of another CA, every role
	otherCreds := func(r cptls.Role) credentials.TransportCredentials {
		c, err := cptls.Load(other.Files(r), r, nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.ClientConfig()
		// Trust the real xds-server, so that only the server's refusal is tested.
		cfg.VerifyConnection = nil
		return credentials.NewTLS(cfg)
	}
	noCert := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the attacker does not care who answers
	front := &core.Node{Id: "attacker", Cluster: "kube-mvp"}
	sidecar := &core.Node{Id: "attacker-sidecar", Cluster: "kube-mvp", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		xds.LocalAPIServerMetadataKey: structpb.NewStringValue("cp-a")}}}

	for _, c := range []struct {
		name  string
		creds credentials.TransportCredentials
		node  *core.Node
		code  codes.Code // for ADS; Unavailable: the handshake failed
	}{
		{"no certificate", noCert, front, codes.Unavailable},
		{"another CA's Envoy certificate", otherCreds(cptls.RoleEnvoyFront), front, codes.Unavailable},
		{"extproc's certificate", own(cptls.RoleExtproc), front, codes.PermissionDenied},
		{"a front Envoy posing as a sidecar", own(cptls.RoleEnvoyFront), sidecar, codes.PermissionDenied},
		{"a sidecar Envoy posing as a front proxy", own(cptls.RoleEnvoySidecar), front, codes.PermissionDenied},
		{"xds-server's own certificate as a client", own(cptls.RoleXDSServer), front, codes.Unavailable},
	} {
		t.Run("ads/"+c.name, func(t *testing.T) {
			resp, err := adsOnce(ctx, k.XDSAddress, c.creds, c.node, resourcev3.SecretType)
			if err == nil {
				t.Fatalf("got a response: %d resources of %s", len(resp.GetResources()), resp.GetTypeUrl())
			}
			if got := grpcstatus.Code(err); got != c.code {
				t.Errorf("error %v (code %s), want code %s", err, got, c.code)
			}
		})
	}
	for _, c := range []struct {
		name  string
		creds credentials.TransportCredentials
		code  codes.Code
	}{
		{"no certificate", noCert, codes.Unavailable},
		{"another CA's extproc certificate", otherCreds(cptls.RoleExtproc), codes.Unavailable},
		{"a front Envoy's certificate", own(cptls.RoleEnvoyFront), codes.PermissionDenied},
	} {
		t.Run("table/"+c.name, func(t *testing.T) {
			if err := tableOnce(ctx, k.XDSAddress, c.creds); grpcstatus.Code(err) != c.code {
				t.Errorf("error %v, want code %s", err, c.code)
			}
		})
	}
	t.Run("table/extproc", func(t *testing.T) {
		if err := tableOnce(ctx, k.XDSAddress, own(cptls.RoleExtproc)); err != nil {
			t.Errorf("extproc's certificate: %v", err)
		}
	})

	t.Run("no private key in any xDS response", func(t *testing.T) {
		resp, err := adsOnce(ctx, k.XDSAddress, own(cptls.RoleEnvoyFront), front, resourcev3.SecretType,
			"kube-mvp-serving-cert", "kube-mvp-proxy-client-cert", "kube-mvp-client-ca", "kube-mvp-peer-ca")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) != 4 {
			t.Fatalf("%d secrets, want 4", len(resp.GetResources()))
		}
		for _, a := range resp.GetResources() {
			var s tlsv3.Secret
			if err := a.UnmarshalTo(&s); err != nil {
				t.Fatal(err)
			}
			for what, d := range map[string]*core.DataSource{"certificate_chain": s.GetTlsCertificate().GetCertificateChain(),
				"private_key": s.GetTlsCertificate().GetPrivateKey(), "trusted_ca": s.GetValidationContext().GetTrustedCa()} {
				if d != nil && d.GetFilename() == "" {
					t.Errorf("secret %s: %s is not a file reference: %v", s.GetName(), what, d)
				}
			}
			if strings.Contains(string(a.GetValue()), "PRIVATE KEY") {
				t.Errorf("secret %s carries a PEM private key", s.GetName())
			}
		}
		for _, typ := range []string{resourcev3.ListenerType, resourcev3.ClusterType} {
			resp, err := adsOnce(ctx, k.XDSAddress, own(cptls.RoleEnvoyFront), front, typ)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range resp.GetResources() {
				if strings.Contains(string(a.GetValue()), "PRIVATE KEY") {
					t.Errorf("a %s resource carries a PEM private key", typ)
				}
			}
		}
	})

	t.Run("node flood", func(t *testing.T) {
		metrics := k.XDSAdmin + "/metrics"
		before := metric(t, metrics, "go_memstats_heap_inuse_bytes")
		const nodes, parallel = 2000, 16
		var wg sync.WaitGroup
		errs := make(chan error, nodes)
		ids := make(chan int)
		for range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range ids {
					n := &core.Node{Id: "flood-" + strconv.Itoa(i), Cluster: "kube-mvp"}
					if _, err := adsOnce(ctx, k.XDSAddress, own(cptls.RoleEnvoyFront), n, resourcev3.ClusterType); err != nil {
						errs <- err
					}
				}
			}()
		}
		for i := range nodes {
			ids <- i
		}
		close(ids)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("a flood node got no snapshot: %v", err)
		}
		// Every flood node's state goes with its stream: only the data plane remains.
		waitFor(t, ctx, "the flood's node state dropped", func() error {
			if n := metric(t, metrics, "kube_mvp_xds_connected_nodes"); n != 1 {
				return fmt.Errorf("%v nodes connected, want 1 (the data plane)", n)
			}
			var nodes []xdsstatus.NodeStatus
			res, err := http.Get(k.XDSAdmin + "/debug/syncz")
			if err != nil {
				return err
			}
			defer res.Body.Close()
			if err := json.NewDecoder(res.Body).Decode(&nodes); err != nil {
				return err
			}
			if len(nodes) != 1 || nodes[0].NodeID != "sec" {
				return fmt.Errorf("%d nodes on /debug/syncz, want only the data plane", len(nodes))
			}
			return nil
		})
		after := metric(t, metrics, "go_memstats_heap_inuse_bytes")
		t.Logf("xds-server heap in use: %.1f MB before %d node IDs, %.1f MB after", before/1e6, nodes, after/1e6)
		// Before nodes were dropped and translations shared, 5,000 node IDs took the heap
		// from 67 MB to 805 MB. Allow for garbage not yet collected, not for per-node state.
		if after > 2*before+32e6 {
			t.Errorf("heap in use grew from %.1f MB to %.1f MB", before/1e6, after/1e6)
		}
	})

	// The deployment still works for its own Envoy.
	if _, err := e.rawClient(nil).Get(k.Endpoint() + "/readyz"); err != nil {
		t.Errorf("the data plane no longer answers: %v", err)
	}
}

// adsOnce opens an ADS stream as node, asks for typ (and names) and returns the first
// response or the error the stream ends with.
func adsOnce(ctx context.Context, addr string, creds credentials.TransportCredentials, node *core.Node, typ string, names ...string) (*discovery.DiscoveryResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typ, ResourceNames: names}); err != nil {
		_, err = stream.Recv() // the reason the stream ended
		return nil, err
	}
	return stream.Recv()
}

// tableOnce subscribes to the routing table and returns nil once a first chunk arrived.
func tableOnce(ctx context.Context, addr string, creds credentials.TransportCredentials) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := tablev1.NewTableServiceClient(conn).Subscribe(ctx, &tablev1.SubscribeRequest{ClientId: "attacker"})
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// metric reads one unlabelled sample from a Prometheus text page.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%s has no %s", url, name)
	return 0
}
