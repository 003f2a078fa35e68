package dataplane

import (
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	luafilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func inline(s string) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: s}}
}

func luaHTTPFilter(t *testing.T, name string, c *luafilterv3.Lua) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, c)}}
}

func perRoute(t *testing.T, c *luafilterv3.LuaPerRoute) map[string]*anypb.Any {
	return map[string]*anypb.Any{"lua": mustAny(t, c)}
}

// luaStream is a stream through an HCM with the given filters and route configuration.
func luaStream(t *testing.T, filters []*hcmv3.HttpFilter, rc *routev3.RouteConfiguration, hdr map[string]string) (*stream, *httptest.ResponseRecorder) {
	t.Helper()
	filters = append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}})
	h := &hcmv3.HttpConnectionManager{StatPrefix: "t", HttpFilters: filters,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "rc"}},
		LocalReplyConfig: &hcmv3.LocalReplyConfig{Mappers: []*hcmv3.ResponseMapper{{
			Filter: &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_StatusCodeFilter{StatusCodeFilter: &accesslogv3.StatusCodeFilter{
				Comparison: &accesslogv3.ComparisonFilter{Op: accesslogv3.ComparisonFilter_EQ, Value: &corev3.RuntimeUInt32{DefaultValue: 499, RuntimeKey: "k"}}}}},
			BodyFormatOverride: &corev3.SubstitutionFormatString{Format: &corev3.SubstitutionFormatString_TextFormat{TextFormat: "%RESPONSE_CODE_DETAILS%"}},
		}}}}
	hcm, err := compileHCM(h)
	if err != nil {
		t.Fatal(err)
	}
	cfg := emptyConfig()
	if rc != nil {
		if cfg.routes["rc"], err = compileRouteConfig(rc); err != nil {
			t.Fatal(err)
		}
	}
	r := httptest.NewRequest("GET", "/x", nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	d := &DataPlane{stats: newStats(), log: slog.New(slog.DiscardHandler), clusters: map[string]*liveCluster{}}
	return &stream{d: d, cfg: cfg, hcm: hcm, lc: &listenerCfg{}, w: w, r: r, method: "GET", path: "/x", host: "h", scheme: "http"}, w
}

func vhost(routes []*routev3.Route, tpfc map[string]*anypb.Any) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: "rc", VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: routes, TypedPerFilterConfig: tpfc}}}
}

func routeTo(name string, headers ...*routev3.HeaderMatcher) *routev3.Route {
	return &routev3.Route{Name: name,
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: headers},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "missing-" + name}}}}
}

func present(name string) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}
}

// respondWith is a script answering with the given status and a body naming it.
func respondWith(status, body string) string {
	return `function envoy_on_request(h) h:respond({[":status"] = "` + status + `", ["x-by"] = {"a", "b"}}, "` + body + `") error("not reached") end`
}

func TestLuaPerRouteResolution(t *testing.T) {
	lua := &luafilterv3.Lua{
		DefaultSourceCode: inline(respondWith("201", "default")),
		SourceCodes: map[string]*corev3.DataSource{
			"vh": inline(respondWith("202", "vh")), "route": inline(respondWith("203", "route")),
			"md": inline(`function envoy_on_request(h) local m = h:virtualHost():metadata()
				h:respond({[":status"] = "200"}, tostring(m:get("k")) .. "/" .. tostring(m.k) .. "/" .. tostring(m:get("n"))) end`),
		},
	}
	md, _ := structpb.NewStruct(map[string]any{"k": "v", "n": 2})
	cases := []struct {
		name        string
		vh, rt      *luafilterv3.LuaPerRoute
		vhMeta      map[string]*structpb.Struct
		status      int
		body        string
		continueOn  bool // no script ran: the router answered (404/503)
		description string
	}{
		{name: "no LuaPerRoute: the default script", status: 201, body: "default"},
		{name: "virtual host's name", vh: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "vh"}}, status: 202, body: "vh"},
		{name: "the route's wins", vh: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "vh"}},
			rt: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "route"}}, status: 203, body: "route"},
		{name: "disabled on the route", vh: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "vh"}},
			rt: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Disabled{Disabled: true}}, continueOn: true},
		{name: "a name without source code runs nothing", vh: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "nope"}}, continueOn: true},
		{name: "virtual host metadata under the filter's name, read with get",
			vh: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "md"}}, vhMeta: map[string]*structpb.Struct{"lua": md},
			status: 200, body: "v/nil/2"},
		// Only the filter's configured name ("lua" here) is read: metadata under the canonical
		// envoy.filters.http.lua is another filter's (VirtualHostWrapper::getMetadata).
		{name: "virtual host metadata under the canonical name is not the filter's",
			vh: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "md"}}, vhMeta: map[string]*structpb.Struct{"envoy.filters.http.lua": md},
			status: 200, body: "nil/nil/nil"},
		{name: "virtual host metadata under another filter's name",
			vh: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "md"}}, vhMeta: map[string]*structpb.Struct{"other": md},
			status: 200, body: "nil/nil/nil"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := routeTo("r")
			if c.rt != nil {
				r.TypedPerFilterConfig = perRoute(t, c.rt)
			}
			var vtp map[string]*anypb.Any
			if c.vh != nil {
				vtp = perRoute(t, c.vh)
			}
			rc := vhost([]*routev3.Route{r}, vtp)
			if c.vhMeta != nil {
				rc.VirtualHosts[0].Metadata = &corev3.Metadata{FilterMetadata: c.vhMeta}
			}
			st, w := luaStream(t, []*hcmv3.HttpFilter{luaHTTPFilter(t, "lua", lua)}, rc, nil)
			st.serve()
			if c.continueOn {
				if w.Code != 503 {
					t.Fatalf("got %d %q, want the router's 503", w.Code, w.Body)
				}
				return
			}
			if w.Code != c.status || w.Body.String() != c.body {
				t.Fatalf("got %d %q, want %d %q", w.Code, w.Body, c.status, c.body)
			}
			if got := w.Header().Values("x-by"); c.status != 200 && strings.Join(got, ",") != "a,b" {
				t.Errorf("respond headers: %q", got)
			}
		})
	}
}

func TestLuaRespondIsALocalReply(t *testing.T) {
	lua := &luafilterv3.Lua{DefaultSourceCode: inline(`function envoy_on_request(h)
		h:respond({[":status"] = "499", ["content-type"] = "application/json"}, "{}") end`)}
	st, w := luaStream(t, []*hcmv3.HttpFilter{luaHTTPFilter(t, "lua", lua)}, vhost([]*routev3.Route{routeTo("r")}, nil), nil)
	st.serve()
	// local_reply_config maps 499 to a body of %RESPONSE_CODE_DETAILS%, which is Envoy's
	// "lua_response"; the rewritten body takes the mapper's content type.
	if w.Code != 499 || w.Body.String() != "lua_response" || w.Header().Get("Content-Type") != "text/plain" {
		t.Fatalf("got %d %q %q", w.Code, w.Body, w.Header())
	}
	if st.d.Stat("dataplane.local_replies.499") != 1 {
		t.Error("not counted as a local reply")
	}
}

func TestLuaRuntimeErrorContinues(t *testing.T) {
	for name, script := range map[string]string{
		"unimplemented API":  `function envoy_on_request(h) h:headers():add("x-before", "1") h:bodyChunks() end`,
		"Lua error":          `function envoy_on_request(h) h:headers():add("x-before", "1") local x = nil; x.y = 1 end`,
		"bad :status":        `function envoy_on_request(h) h:headers():add("x-before", "1") h:respond({[":status"] = "99"}) end`,
		"method called with": `function envoy_on_request(h) h:headers():add("x-before", "1") h.headers() end`,
	} {
		t.Run(name, func(t *testing.T) {
			lua := &luafilterv3.Lua{StatPrefix: "sp", DefaultSourceCode: inline(script)}
			// The header added before the error stays, and cleared the route cache: the
			// request goes on to the router on the route matching it.
			rc := vhost([]*routev3.Route{routeTo("with", present("x-before"))}, nil)
			st, w := luaStream(t, []*hcmv3.HttpFilter{luaHTTPFilter(t, "lua", lua)}, rc, nil)
			st.serve()
			if w.Code != 503 {
				t.Fatalf("got %d %q, want the router's 503 for route 'with'", w.Code, w.Body)
			}
			if n := st.d.Stat("http.t.lua.sp.errors"); n != 1 {
				t.Errorf("errors counter %d", n)
			}
		})
	}
}

// TestLuaRouteRematch: a header the script changes makes the route be
// matched again before the next filter, which then sees the new route's per-route config.
func TestLuaRouteRematch(t *testing.T) {
	second := &luafilterv3.Lua{SourceCodes: map[string]*corev3.DataSource{"answer": inline(respondWith("418", "second"))}}
	rc := vhost([]*routev3.Route{
		{Name: "decided", Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: []*routev3.HeaderMatcher{present("x-d")}},
			Action:               &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "missing"}}},
			TypedPerFilterConfig: map[string]*anypb.Any{"second": mustAny(t, &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "answer"}})}},
	}, nil)
	for name, c := range map[string]struct {
		script string
		code   int
	}{
		"replace clears the route cache": {`function envoy_on_request(h) h:headers():replace("x-d", "1") end`, 418},
		"remove clears it too":           {`function envoy_on_request(h) h:headers():remove("x-none") end`, 404},
		"reading does not":               {`function envoy_on_request(h) local _ = h:headers():get("x-d") end`, 404},
		"an API the script may not use":  {`function envoy_on_request(h) h:clearRouteCache() end`, 404},
	} {
		t.Run(name, func(t *testing.T) {
			hdr := map[string]string{}
			if strings.Contains(name, "header present") {
				hdr["x-d"] = "1"
			}
			first := &luafilterv3.Lua{DefaultSourceCode: inline(c.script)}
			st, w := luaStream(t, []*hcmv3.HttpFilter{luaHTTPFilter(t, "first", first), luaHTTPFilter(t, "second", second)}, rc, hdr)
			st.serve()
			if w.Code != c.code {
				t.Fatalf("got %d %q, want %d", w.Code, w.Body, c.code)
			}
		})
	}
	// The order of http_filters is the order they run: with the second first, it sees no route.
	first := &luafilterv3.Lua{DefaultSourceCode: inline(`function envoy_on_request(h) h:headers():replace("x-d", "1") end`)}
	st, w := luaStream(t, []*hcmv3.HttpFilter{luaHTTPFilter(t, "second", second), luaHTTPFilter(t, "first", first)}, rc, nil)
	st.serve()
	if w.Code != 503 {
		t.Fatalf("reversed order: got %d %q, want the router's 503 on route 'decided'", w.Code, w.Body)
	}
}

// TestLuaGlobalsPerState: a state's globals outlive a request; states are not shared.
func TestLuaGlobalsPerState(t *testing.T) {
	f, err := compileLua("lua", &luafilterv3.Lua{DefaultSourceCode: inline(`n = 0
		function envoy_on_request(h) n = n + 1; h:respond({[":status"] = "200"}, tostring(n)) end`)})
	if err != nil {
		t.Fatal(err)
	}
	req := func() string {
		r := &luaRequest{hdr: &headerList{}, pseudo: func(string) (string, bool) { return "", false }}
		if out := f.run(nil, r, func(string, string) {}); out.err != nil {
			t.Fatal(out.err)
		}
		return r.reply.body
	}
	if a, b := req(), req(); a != "1" || b != "2" {
		t.Fatalf("one state: %s then %s", a, b)
	}
	vm, _ := f.def.get() // the only state is now taken: the next request gets a fresh one
	defer f.def.put(vm)
	if c := req(); c != "1" {
		t.Fatalf("a second state saw the first's globals: %s", c)
	}
}

func TestLuaNACK(t *testing.T) {
	ok := inline(`function envoy_on_request(h) end`)
	cases := map[string]struct {
		lua   *luafilterv3.Lua
		route *luafilterv3.LuaPerRoute
		want  string
	}{
		"syntax error":                {lua: &luafilterv3.Lua{DefaultSourceCode: inline(`function envoy_on_request(h`)}, want: "script load error"},
		"top-level error":             {lua: &luafilterv3.Lua{SourceCodes: map[string]*corev3.DataSource{"a": inline(`error("boom")`)}}, want: "script load error"},
		"clear_route_cache set":       {lua: &luafilterv3.Lua{DefaultSourceCode: ok, ClearRouteCache: wrapperspb.Bool(true)}, want: "clear_route_cache is not implemented"},
		"filter-level filter_context": {lua: &luafilterv3.Lua{DefaultSourceCode: ok, FilterContext: &structpb.Struct{}}, want: "filter_context is not implemented"},
		"package_paths":               {lua: &luafilterv3.Lua{DefaultSourceCode: ok, PackagePaths: []string{"/x/?.lua"}}, want: "package_paths is not implemented"},
		"source code from a file": {lua: &luafilterv3.Lua{SourceCodes: map[string]*corev3.DataSource{"a": {Specifier: &corev3.DataSource_Filename{Filename: "/x.lua"}}}},
			want: "source_codes.filename is not implemented"},
		"inline_code":              {lua: &luafilterv3.Lua{InlineCode: "function envoy_on_request(h) end"}, want: "inline_code is not implemented"},
		"per-route source_code":    {route: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_SourceCode{SourceCode: ok}}, want: "source_code is not implemented"},
		"per-route disabled false": {route: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Disabled{Disabled: false}}, want: "Disabled"},
		"per-route filter_context": {route: &luafilterv3.LuaPerRoute{Override: &luafilterv3.LuaPerRoute_Name{Name: "s"}, FilterContext: &structpb.Struct{}}, want: "filter_context is not implemented"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var typeURL string
			var res proto.Message
			if c.lua != nil {
				h := &hcmv3.HttpConnectionManager{StatPrefix: "t", RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "rc"}},
					HttpFilters: []*hcmv3.HttpFilter{luaHTTPFilter(t, "lua", c.lua),
						{Name: "router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}}}}
				typeURL, res = resource.ListenerType, &listenerv3.Listener{Name: "l",
					Address:      &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{}}}},
					FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{Name: "hcm", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, h)}}}}}}
			} else {
				typeURL, res = resource.RouteType, vhost([]*routev3.Route{routeTo("r")}, perRoute(t, c.route))
			}
			_, errs := emptyConfig().withType(typeURL, "1", []proto.Message{res})
			if len(errs) == 0 {
				t.Fatal("accepted")
			}
			var all []string
			for _, e := range errs {
				all = append(all, e.Error())
			}
			if got := strings.Join(all, "\n"); !strings.Contains(got, c.want) {
				t.Fatalf("errors %q, want one with %q", got, c.want)
			}
		})
	}
	// The configuration the snapshot emits is accepted.
	good := &luafilterv3.Lua{StatPrefix: "kube_mvp_identity", DefaultSourceCode: ok}
	h := &hcmv3.HttpConnectionManager{StatPrefix: "t", RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "rc"}},
		HttpFilters: []*hcmv3.HttpFilter{luaHTTPFilter(t, "lua", good), {Name: "router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}}}}
	if errs := checkFields(h); len(errs) > 0 {
		t.Fatal(errs)
	}
	names, _ := structpb.NewStruct(map[string]any{"decision_header": "x"})
	rc := vhost([]*routev3.Route{routeTo("r")}, nil)
	rc.VirtualHosts[0].Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"lua": names}}
	if errs := checkFields(rc); len(errs) > 0 {
		t.Fatal(errs)
	}
}
