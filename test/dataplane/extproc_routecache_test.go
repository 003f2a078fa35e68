package dataplane

import (
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// TestExtProcRouteCacheNeedsMutation: a request-headers response clears the route cache
// only when it carries a header mutation (DecodingProcessorState::clearRouteCache,
// source/extensions/filters/http/ext_proc/processor_state.cc); then route_cache_action
// decides. In particular DEFAULT with clear_route_cache but no mutation keeps the route
// (counted in clear_route_cache_ignored).
func TestExtProcRouteCacheNeedsMutation(t *testing.T) {
	const (
		def    = extprocfilterv3.ExternalProcessor_DEFAULT
		clr    = extprocfilterv3.ExternalProcessor_CLEAR
		retain = extprocfilterv3.ExternalProcessor_RETAIN
	)
	mut := &extprocv3.HeaderMutation{}
	for _, tc := range []struct {
		name   string
		action extprocfilterv3.ExternalProcessor_RouteCacheAction
		cr     *extprocv3.CommonResponse
		clear  bool
		stat   string
	}{
		{"DEFAULT, clear_route_cache, no mutation", def, &extprocv3.CommonResponse{ClearRouteCache: true}, false, "clear_route_cache_ignored"},
		{"CLEAR, no mutation", clr, &extprocv3.CommonResponse{}, false, ""},
		{"CLEAR, clear_route_cache, no mutation", clr, &extprocv3.CommonResponse{ClearRouteCache: true}, false, "clear_route_cache_ignored"},
		{"no response", def, nil, false, ""},
		{"DEFAULT, mutation, clear_route_cache", def, &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true}, true, ""},
		{"DEFAULT, mutation", def, &extprocv3.CommonResponse{HeaderMutation: mut}, false, ""},
		{"CLEAR, mutation", clr, &extprocv3.CommonResponse{HeaderMutation: mut}, true, ""},
		{"RETAIN, mutation, clear_route_cache", retain, &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true}, false, "clear_route_cache_disabled"},
		{"RETAIN, mutation", retain, &extprocv3.CommonResponse{HeaderMutation: mut}, false, ""},
	} {
		clear, stat := routeCacheDecision(tc.action, tc.cr)
		if clear != tc.clear || stat != tc.stat {
			t.Errorf("%s: clear %v, stat %q; want %v, %q", tc.name, clear, stat, tc.clear, tc.stat)
		}
	}
}
