package dataplane

import (
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// The checks of ENVOY_CHECKS.md marked "modelled": each case mutates the golden batch-off
// configuration the way Envoy refuses (want: part of the NACK) or accepts (want "").

func vhostOf(r *snapshot.Resources) *routev3.VirtualHost {
	return r.Routes[0].(*routev3.RouteConfiguration).VirtualHosts[0]
}

func withHCM(t *testing.T, r *snapshot.Resources, f func(h *hcmv3.HttpConnectionManager)) {
	l := r.Listeners[0].(*listenerv3.Listener)
	h := hcmOf(t, l)
	f(h)
	setHCM(t, l, h)
}

// setLocalReplyMessage sets the message of the first local reply mapper's JSON body.
func setLocalReplyMessage(t *testing.T, r *snapshot.Resources, msg string) {
	withHCM(t, r, func(h *hcmv3.HttpConnectionManager) {
		h.LocalReplyConfig.Mappers[0].BodyFormatOverride.GetJsonFormat().Fields["message"] = structpb.NewStringValue(msg)
	})
}

// setDirectBody sets the body of the first direct response route.
func setDirectBody(t *testing.T, r *snapshot.Resources, body string) {
	for _, rt := range vhostOf(r).Routes {
		if dr := rt.GetDirectResponse(); dr != nil {
			dr.Body = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body}}
			return
		}
	}
	t.Fatal("no direct response route")
}

func TestEnvoyLoadChecks(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(t *testing.T, r *snapshot.Resources)
		want   string // "" : accepted
	}{
		// RouteEntryImplBase: the direct response body within 4096 bytes (our undecided-identity
		// route's Status is far below).
		{"direct response body of 4097 bytes", func(t *testing.T, r *snapshot.Resources) {
			setDirectBody(t, r, strings.Repeat("x", 4097))
		}, "response body size is 4097 bytes; maximum is 4096"},
		{"direct response body of 4096 bytes", func(t *testing.T, r *snapshot.Resources) {
			setDirectBody(t, r, strings.Repeat("x", 4096))
		}, ""},
		// RouteMatcher::RouteMatcher.
		{"duplicate domain, another case", func(t *testing.T, r *snapshot.Resources) {
			rc := r.Routes[0].(*routev3.RouteConfiguration)
			a := proto.Clone(rc.VirtualHosts[0]).(*routev3.VirtualHost)
			a.Name, a.Domains = "a", []string{"api.example"}
			b := proto.Clone(a).(*routev3.VirtualHost)
			b.Name, b.Domains = "b", []string{"API.example"}
			rc.VirtualHosts = append(rc.VirtualHosts, a, b)
		}, "Only unique values for domains are permitted. Duplicate entry of domain api.example in route kube-apiserver"},
		{"second wildcard domain", func(t *testing.T, r *snapshot.Resources) {
			rc := r.Routes[0].(*routev3.RouteConfiguration)
			a := proto.Clone(rc.VirtualHosts[0]).(*routev3.VirtualHost)
			a.Name = "again"
			rc.VirtualHosts = append(rc.VirtualHosts, a)
		}, "Only a single wildcard domain is permitted in route kube-apiserver"},
		{"distinct domains", func(t *testing.T, r *snapshot.Resources) {
			rc := r.Routes[0].(*routev3.RouteConfiguration)
			a := proto.Clone(rc.VirtualHosts[0]).(*routev3.VirtualHost)
			a.Name, a.Domains = "a", []string{"api.example", "*.example", "api.*"}
			rc.VirtualHosts = append(rc.VirtualHosts, a)
		}, ""},
		// Router::HeaderParser::configure.
		{"pseudo-header removed", func(t *testing.T, r *snapshot.Resources) {
			vh := vhostOf(r)
			vh.RequestHeadersToRemove = append(vh.RequestHeadersToRemove, ":path")
		}, ":-prefixed or host headers may not be removed"},
		{"host removed", func(t *testing.T, r *snapshot.Resources) {
			vh := vhostOf(r)
			vh.RequestHeadersToRemove = append(vh.RequestHeadersToRemove, "Host")
		}, ":-prefixed or host headers may not be removed"},
		{"pseudo-header added", func(t *testing.T, r *snapshot.Resources) {
			rt := vhostOf(r).Routes[0]
			rt.ResponseHeadersToAdd = append(rt.ResponseHeadersToAdd, &corev3.HeaderValueOption{
				Header: &corev3.HeaderValue{Key: ":status", Value: "200"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
		}, ":-prefixed or host headers may not be modified"},
		{"header value with a lone %", func(t *testing.T, r *snapshot.Resources) {
			rt := vhostOf(r).Routes[0]
			rt.ResponseHeadersToAdd = append(rt.ResponseHeadersToAdd, &corev3.HeaderValueOption{
				Header: &corev3.HeaderValue{Key: "x-share", Value: "50%"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
		}, "Couldn't find valid command at position 2"},
		{"health check pseudo-header", func(t *testing.T, r *snapshot.Resources) {
			hc := r.Clusters[0].(*clusterv3.Cluster).HealthChecks[0].GetHttpHealthCheck()
			hc.RequestHeadersToAdd = append(hc.RequestHeadersToAdd, &corev3.HeaderValueOption{
				Header: &corev3.HeaderValue{Key: ":authority", Value: "x"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
		}, ":-prefixed or host headers may not be modified"},
		{"outlier max_ejection_time below base", func(t *testing.T, r *snapshot.Resources) {
			od := r.Clusters[0].(*clusterv3.Cluster).OutlierDetection
			od.MaxEjectionTime = durationpb.New(5 * time.Second) // base_ejection_time is 10s
		}, "outlier detector's max_ejection_time cannot be smaller than base_ejection_time"},
		{"outlier base_ejection_time above the default max", func(t *testing.T, r *snapshot.Resources) {
			od := r.Clusters[0].(*clusterv3.Cluster).OutlierDetection
			od.MaxEjectionTime, od.BaseEjectionTime = nil, durationpb.New(301*time.Second)
		}, "outlier detector's max_ejection_time cannot be smaller than base_ejection_time"},
		// HttpConnectionManagerConfig: upgrade types compared without case.
		{"duplicate upgrade type", func(t *testing.T, r *snapshot.Resources) {
			withHCM(t, r, func(h *hcmv3.HttpConnectionManager) {
				h.UpgradeConfigs = append(h.UpgradeConfigs, &hcmv3.HttpConnectionManager_UpgradeConfig{UpgradeType: "WebSocket"})
			})
		}, "Error: multiple upgrade configs with the same name: 'WebSocket'"},
		// SubstitutionFormatParser::parse, local reply body formats.
		{"body format with a lone %", func(t *testing.T, r *snapshot.Resources) {
			setLocalReplyMessage(t, r, "100% unavailable")
		}, "Couldn't find valid command at position 3"},
		{"body format with an unknown command", func(t *testing.T, r *snapshot.Resources) {
			setLocalReplyMessage(t, r, "%NO_SUCH_FIELD%")
		}, "format command %NO_SUCH_FIELD% is not implemented"},
		{"body format command with a parameter", func(t *testing.T, r *snapshot.Resources) {
			setLocalReplyMessage(t, r, "%RESPONSE_CODE(x)%")
		}, "RESPONSE_CODE does not take any parameters or length"},
		{"body format with %%", func(t *testing.T, r *snapshot.Resources) {
			setLocalReplyMessage(t, r, "100%% unavailable (%RESPONSE_CODE%)")
		}, ""},
		// protoc-gen-validate, in a resource and inside a typed_config.
		{"PGV: virtual host without domains", func(t *testing.T, r *snapshot.Resources) {
			vhostOf(r).Domains = nil
		}, "VirtualHost.Domains: value must contain at least 1 item"},
		{"PGV: inside the HCM typed_config", func(t *testing.T, r *snapshot.Resources) {
			withHCM(t, r, func(h *hcmv3.HttpConnectionManager) { h.StatPrefix = "" })
		}, "HttpConnectionManager.StatPrefix: value length must be at least 1"},
		// Resolving an EDS endpoint's address.
		{"EDS hostname address", func(t *testing.T, r *snapshot.Resources) {
			cla := r.Endpoints[0].(*endpointv3.ClusterLoadAssignment)
			cla.Endpoints[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress().Address = "cp-a.example"
		}, "malformed IP address: cp-a.example"},
		// RetryPolicyImpl ignores retry_on tokens it does not know.
		{"unknown retry_on token", func(t *testing.T, r *snapshot.Resources) {
			rp := firstRetryPolicy(r)
			rp.RetryOn += ",no-such-condition,,Connect-Failure"
		}, ""},
		// RetryPolicyImpl copies retriable_status_codes unchecked (no PGV rule either): a
		// status no response has is accepted, and never matches.
		{"retriable status codes unchecked", func(t *testing.T, r *snapshot.Resources) {
			rp := firstRetryPolicy(r)
			rp.RetryOn += ",retriable-status-codes"
			rp.RetriableStatusCodes = []uint32{0, 999, 429}
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nacks := mutatedNACKs(t, tc.mutate)
			if tc.want == "" {
				if len(nacks) > 0 {
					t.Fatalf("NACKs %q, want none", nacks)
				}
				return
			}
			if len(nacks) != 1 || !strings.Contains(nacks[0], tc.want) {
				t.Fatalf("NACKs %q, want one containing %q", nacks, tc.want)
			}
		})
	}
}

// TestEDSDuplicateAddressFirstKept: of two endpoints with one address (here in two
// localities) Envoy keeps the first, even when it is not healthy
// (EdsClusterImpl::BatchUpdateHelper::updateLocalityEndpoints).
func TestEDSDuplicateAddressFirstKept(t *testing.T) {
	ep := func(ip, hostname string, hs corev3.HealthStatus) *endpointv3.LbEndpoint {
		return &endpointv3.LbEndpoint{HealthStatus: hs, HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Hostname: hostname,
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 6443}}}}}}}
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "c", Endpoints: []*endpointv3.LocalityLbEndpoints{
		{LbEndpoints: []*endpointv3.LbEndpoint{ep("10.0.0.1", "first", corev3.HealthStatus_HEALTHY), ep("10.0.0.2", "other", corev3.HealthStatus_HEALTHY)}},
		{LbEndpoints: []*endpointv3.LbEndpoint{ep("10.0.0.1", "second", corev3.HealthStatus_HEALTHY)}},
	}}
	hosts, err := compileHosts(cla)
	if err != nil {
		t.Fatal(err)
	}
	if len(hosts) != 2 || hosts[0].hostname != "first" || hosts[1].hostname != "other" {
		t.Fatalf("hosts %+v, want first and other", hosts)
	}
	// The first one draining: it still hides the second, and is itself left out.
	cla.Endpoints[0].LbEndpoints[0].HealthStatus = corev3.HealthStatus_DRAINING
	hosts, err = compileHosts(cla)
	if err != nil {
		t.Fatal(err)
	}
	if len(hosts) != 1 || hosts[0].hostname != "other" {
		t.Fatalf("hosts %+v, want other only", hosts)
	}
	if errs := envoyLoadChecks(cla); len(errs) != 0 {
		t.Fatalf("duplicate addresses refused: %v", errs)
	}
}

// TestLocalReplyPercentEscape: "%%" in a body format is a literal "%"
// (SubstitutionFormatParser::parse).
func TestLocalReplyPercentEscape(t *testing.T) {
	res := buildResources(t, "batch-off")
	setLocalReplyMessage(t, res, "100%% unavailable (%RESPONSE_CODE%)")
	lc, err := compileListener(res.Listeners[0].(*listenerv3.Listener))
	if err != nil {
		t.Fatal(err)
	}
	lr := lc.hcm.mapLocalReply(503, "", "d", []string{"UC"})
	if !strings.Contains(string(lr.body), `"message":"100% unavailable (503)"`) {
		t.Fatalf("body %s", lr.body)
	}
}

// firstRetryPolicy is the retry policy of the first route that has one.
func firstRetryPolicy(r *snapshot.Resources) *routev3.RetryPolicy {
	for _, rt := range vhostOf(r).Routes {
		if rp := rt.GetRoute().GetRetryPolicy(); rp != nil {
			return rp
		}
	}
	panic("no route has a retry policy")
}

// firstForwarding is the action of the first route that forwards (the first route is a
// direct response).
func firstForwarding(r *snapshot.Resources) *routev3.RouteAction {
	for _, rt := range vhostOf(r).Routes {
		if a := rt.GetRoute(); a != nil {
			return a
		}
	}
	panic("no route forwards")
}
