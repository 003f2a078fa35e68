package snapshot_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestDangerousAPIServers: an apiserver that takes the proxy certificate for an ordinary
// client's is in no front-proxy variant's endpoints and in every other cluster's; while another
// live apiserver is there, every route stays what it was; when every live apiserver is
// dangerous, each ":front-proxy" route that forwards to the default cluster answers a 503
// Status itself, with Retry-After and ext_proc off, naming them, within Envoy's 4 KiB limit
// on direct response bodies, and every other route is unchanged.
func TestDangerousAPIServers(t *testing.T) {
	base := loadCase(t, "batch-off")
	ids := map[string]string{}
	for _, s := range base.APIServers {
		ids[s.Hostname] = s.ID
	}
	build := func(tp *topology.Topology) *snapshot.Resources {
		t.Helper()
		res, err := snapshot.Build(mustPlan(t, tp), testConfig())
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	endpointsOf := func(res *snapshot.Resources) map[string][]string {
		out := map[string][]string{}
		for _, r := range res.Endpoints {
			cla := r.(*endpointv3.ClusterLoadAssignment)
			out[cla.GetClusterName()] = []string{}
			for _, l := range cla.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					out[cla.GetClusterName()] = append(out[cla.GetClusterName()], e.GetEndpoint().GetHostname())
				}
			}
		}
		return out
	}
	routesOf := func(res *snapshot.Resources) []*routev3.Route {
		return res.Routes[0].(*routev3.RouteConfiguration).GetVirtualHosts()[0].GetRoutes()
	}
	clean := build(base)

	// cp-c dangerous: only the front-proxy variants lose it; the routes are the same.
	one := build(base.WithDangerous(map[string]string{ids["cp-c"]: "takes it as a client's"}))
	for name, hosts := range endpointsOf(clean) {
		got := endpointsOf(one)[name]
		want := hosts
		if contract.ParseClusterName(name).ProxyCert {
			want = slices.DeleteFunc(slices.Clone(hosts), func(h string) bool { return h == "cp-c" })
		}
		if !slices.Equal(got, want) {
			t.Errorf("cp-c dangerous: %s has %v, want %v", name, got, want)
		}
	}
	if a, b := routesOf(clean), routesOf(one); len(a) != len(b) || !slices.EqualFunc(a, b, func(x, y *routev3.Route) bool {
		return x.GetName() == y.GetName() && x.GetRoute().GetCluster() == y.GetRoute().GetCluster()
	}) {
		t.Errorf("one dangerous apiserver of three changed the routes")
	}

	// Every live apiserver dangerous, one with a very long reason.
	all := map[string]string{ids["cp-a"]: strings.Repeat("<a reason & \"quotes\"> ", 300), ids["cp-b"]: "b", ids["cp-c"]: "c"}
	res := build(base.WithDangerous(all))
	for name, hosts := range endpointsOf(res) {
		if contract.ParseClusterName(name).ProxyCert != (len(hosts) == 0) {
			t.Errorf("every apiserver dangerous: %s has %v", name, hosts)
		}
	}
	cleanRoutes := map[string]*routev3.Route{}
	for _, r := range routesOf(clean) {
		cleanRoutes[r.GetName()] = r
	}
	refused := 0
	for _, r := range routesOf(res) {
		was := cleanRoutes[r.GetName()]
		if was == nil {
			t.Errorf("route %s is new", r.GetName())
			continue
		}
		if !strings.HasSuffix(r.GetName(), snapshot.RouteSuffixProxyCert) || was.GetRoute().GetCluster() == "" {
			if r.GetRoute().GetCluster() != was.GetRoute().GetCluster() || (r.GetDirectResponse() == nil) != (was.GetDirectResponse() == nil) {
				t.Errorf("route %s changed: %v, was %v", r.GetName(), r.GetAction(), was.GetAction())
			}
			continue
		}
		refused++
		d := r.GetDirectResponse()
		if d == nil || d.GetStatus() != 503 {
			t.Errorf("route %s: %v, want a direct 503", r.GetName(), r.GetAction())
			continue
		}
		body := d.GetBody().GetInlineString()
		if len(body) > 4096 {
			t.Errorf("route %s: body of %d bytes, Envoy refuses more than 4096", r.GetName(), len(body))
		}
		var st struct {
			Kind, Reason, Message string
			Code                  int
			Details               struct{ RetryAfterSeconds int }
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil || st.Kind != "Status" || st.Code != 503 || st.Reason != "ServiceUnavailable" || st.Details.RetryAfterSeconds != 1 {
			t.Errorf("route %s: body %s (%v), want a 503 Status with retryAfterSeconds 1", r.GetName(), body, err)
		}
		for _, want := range []string{"cp-a (" + ids["cp-a"] + "): <a reason", "cp-b (" + ids["cp-b"] + "): b", "cp-c (" + ids["cp-c"] + "): c"} {
			if !strings.Contains(st.Message, want) {
				t.Errorf("route %s: message lacks %q: %s", r.GetName(), want, st.Message)
			}
		}
		headers := map[string]string{}
		for _, h := range r.GetResponseHeadersToAdd() {
			headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
		if headers["retry-after"] != "1" || headers["content-type"] != "application/json" {
			t.Errorf("route %s: response headers %v, want retry-after 1 and JSON", r.GetName(), headers)
		}
		var perRoute extprocv3.ExtProcPerRoute
		if err := r.GetTypedPerFilterConfig()["envoy.filters.http.ext_proc"].UnmarshalTo(&perRoute); err != nil || !perRoute.GetDisabled() {
			t.Errorf("route %s: ext_proc %v (%v), want disabled", r.GetName(), &perRoute, err)
		}
	}
	if refused == 0 {
		t.Error("no front-proxy route answers itself")
	}
}
