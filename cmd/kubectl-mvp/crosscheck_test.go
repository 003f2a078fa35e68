package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/explain"
	"github.com/kube-mvp/kube-mvp/internal/extproc"
	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/test/dataplane"
)

// crossCheckRequests cover resources some, all or no apiserver serves, core, discovery, a
// group/version's document, an escaped path, subresources, a watch and a write.
var crossCheckRequests = [][2]string{
	{"GET", "/apis/batch/v1/jobs"},
	{"GET", "/apis/batch/v1/jobs?watch=true"},
	{"POST", "/apis/batch/v1/namespaces/default/jobs"},
	{"GET", "/apis/batch/v1/namespaces/default/jobs/j/status"},
	{"GET", "/apis/batch/v1"},
	{"GET", "/apis/batch%2Fv1/jobs"},
	{"GET", "//apis/batch/v1/jobs"},
	{"GET", "/apis/apps/v1/deployments"},
	{"GET", "/api/v1/pods"},
	{"GET", "/api/v1/namespaces/default/pods/p/log"},
	{"POST", "/api/v1/namespaces/default/pods/p/eviction"},
	{"GET", "/api"},
	{"GET", "/apis"},
	{"GET", "/apis/resource.k8s.io/v1beta1/resourceclaims"},
	{"GET", "/apis/example.com/v1/widgets"},
	{"GET", "/healthz"},
}

// TestExplainMatchesDataPlane checks, for every golden fixture, request and identity,
// explain's -o json against the data plane's own pieces: the test data plane's route
// matching on the translated route configuration (the route, and again after extproc named
// a cluster), a real extproc server's answer for the request (cluster, serving set, 503),
// and the apiservers as the translated endpoints list them for that cluster and set.
func TestExplainMatchesDataPlane(t *testing.T) {
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			topo := fixtures.Topology(t, name)
			p, err := plan.Build(topo)
			if err != nil {
				t.Fatal(err)
			}
			res, err := snapshot.Build(p, snapshot.Config{Secrets: explain.SecretsAssumed})
			if res == nil {
				t.Fatal(err)
			}
			cfg, err := res.ToJSON()
			if err != nil {
				t.Fatal(err)
			}
			eds := endpointsOf(t, cfg)
			router, err := dataplane.NewRouter(cfg)
			if err != nil {
				t.Fatal(err)
			}
			table, err := plan.TableOf(topo)
			if err != nil {
				t.Fatal(err)
			}
			ask := startExtProc(t, table, fixtures.SidecarOf(name))

			args := []string{"-f", fixtures.Path(name), "--now", fixtures.Now.Format("2006-01-02T15:04:05Z"), "-o", "json"}
			if id := fixtures.SidecarOf(name); id != "" {
				args = append(args, "--node-id", id)
			}
			for id, reason := range fixtures.DangerousOf(name) {
				args = append(args, "--dangerous-apiserver", id+"="+reason)
			}
			for _, rq := range crossCheckRequests {
				for _, cert := range []bool{false, true} {
					a := append(slices.Clone(args), rq[0], rq[1])
					if cert {
						a = append(a, "--as-certificate")
					}
					var out, errOut bytes.Buffer
					if code := run(append([]string{"explain"}, a...), &out, &errOut); code != 0 {
						t.Fatalf("explain %v: exit %d: %s", a, code, errOut.String())
					}
					var x explain.Explanation
					if err := json.Unmarshal(out.Bytes(), &x); err != nil {
						t.Fatalf("explain %v: %v", a, err)
					}
					checkAgainstDataPlane(t, router, eds, ask, rq[0], rq[1], cert, &x)
				}
			}
		})
	}
}

func checkAgainstDataPlane(t *testing.T, router *dataplane.Router,
	eds map[string]*endpointv3.ClusterLoadAssignment, ask func(method, path string,
		cert bool) *extprocv3.ProcessingResponse, method, target string, cert bool, x *explain.Explanation) {
	t.Helper()
	what := method + " " + target
	if cert {
		what += " (certificate)"
	}
	headers := map[string]string{contract.HeaderRequestClass: x.Class}
	if cert {
		headers[contract.HeaderXFCC] = "By=x"
		headers[contract.HeaderIdentityDecision] = contract.IdentityProxyCert
	}
	route, cluster, err := router.Route(method, target, headers)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if route != x.Route {
		t.Errorf("%s: the data plane matches route %s, explain says %s", what, route, x.Route)
	}
	set := ""
	if x.ExtProc == "decides" {
		resp := ask(method, target, cert)
		if ir := resp.GetImmediateResponse(); ir != nil {
			if x.Status != int(ir.GetStatus().GetCode()) {
				t.Errorf("%s: extproc answers %d itself, explain says outcome %s, status %d", what, ir.GetStatus().GetCode(), x.Outcome, x.Status)
			}
			return
		}
		for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == contract.HeaderRoutingCluster {
				cluster = string(h.GetHeader().GetRawValue())
			}
		}
		if lb := resp.GetDynamicMetadata().GetFields()[contract.MetadataNamespaceLB]; lb != nil {
			set = lb.GetStructValue().GetFields()[contract.LBSetKey].GetStringValue()
		}
		headers[contract.HeaderRoutingCluster] = cluster
		final, _, err := router.Route(method, target, headers)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if final != x.FinalRoute {
			t.Errorf("%s: after extproc the data plane matches route %s, explain says %s", what, final, x.FinalRoute)
		}
	}
	if cluster == "" { // a direct response of Envoy's own
		if x.Status == 0 {
			t.Errorf("%s: the data plane's route %s forwards nothing, explain says cluster %s", what, route, x.Cluster)
		}
		return
	}
	if x.Status != 0 {
		t.Errorf("%s: the data plane forwards it, explain says status %d", what, x.Status)
	}
	if cluster != x.Cluster || set != x.ServingSet {
		t.Errorf("%s: the data plane goes to cluster %s set %q, explain says %s set %q", what, cluster, set, x.Cluster, x.ServingSet)
	}
	want, got := membersOf(eds[cluster], set), []string{}
	for _, s := range x.APIServers {
		got = append(got, s.ID)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		t.Errorf("%s: cluster %s set %q holds %v in the endpoints, explain says %v", what, cluster, set, want, got)
	}
}

// endpointsOf are a translated configuration's ClusterLoadAssignments by cluster.
func endpointsOf(t *testing.T, cfg []byte) map[string]*endpointv3.ClusterLoadAssignment {
	var dump struct {
		Endpoints []json.RawMessage `json:"endpoints"`
	}
	if err := json.Unmarshal(cfg, &dump); err != nil {
		t.Fatal(err)
	}
	out := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, raw := range dump.Endpoints {
		a := &anypb.Any{}
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := protojson.Unmarshal(raw, a); err != nil {
			t.Fatal(err)
		}
		if err := a.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		out[cla.GetClusterName()] = cla
	}
	return out
}

// membersOf are the apiserver IDs of cla's endpoints, only those of serving set set if any.
func membersOf(cla *endpointv3.ClusterLoadAssignment, set string) []string {
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			md := e.GetMetadata().GetFilterMetadata()
			if set != "" && !inSet(md[contract.MetadataNamespaceLB].GetFields()[contract.LBSetKey].GetListValue().GetValues(), set) {
				continue
			}
			out = append(out, md[snapshot.MetadataNamespace].GetFields()["apiserverID"].GetStringValue())
		}
	}
	return out
}

func inSet(values []*structpb.Value, set string) bool {
	for _, v := range values {
		if v.GetStringValue() == set {
			return true
		}
	}
	return false
}

// startExtProc serves table from a real extproc server and returns how to ask it about a
// request's headers, as the Envoy beside local ("" front) asks.
func startExtProc(t *testing.T, table *plan.Table, local string) func(method, path string, cert bool) *extprocv3.ProcessingResponse {
	srv := extproc.New(extproc.Options{})
	srv.SetTable(table, "crosscheck")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := extprocv3.NewExternalProcessorClient(conn)
	return func(method, path string, cert bool) *extprocv3.ProcessingResponse {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if local != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, contract.MetadataLocalAPIServer, local)
		}
		st, err := client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte(method)}, {Key: ":path", RawValue: []byte(path)}}
		if cert {
			hs = append(hs, &corev3.HeaderValue{Key: contract.HeaderIdentityDecision, RawValue: []byte(contract.IdentityProxyCert)})
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
}
