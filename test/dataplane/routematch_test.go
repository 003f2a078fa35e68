package dataplane

import (
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// TestQueryParametersNotDecoded: route matching reads the query as sent. Envoy's
// RouteEntryImplBase::matchRoute parses it with Http::Utility::QueryParamsMulti::
// parseQueryString, which decodes neither names nor values (source/common/http/utility.cc,
// parseParameters with decode_params false): "?%77atch=1" has no parameter "watch", and
// "?v=%31" has the value "%31", not "1".
func TestQueryParametersNotDecoded(t *testing.T) {
	watch := routeTo("watch")
	watch.Match.QueryParameters = []*routev3.QueryParameterMatcher{{Name: "watch",
		QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true}}}
	one := routeTo("one")
	one.Match.QueryParameters = []*routev3.QueryParameterMatcher{{Name: "v",
		QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "1"}}}}}
	escaped := routeTo("escaped")
	escaped.Match.QueryParameters = []*routev3.QueryParameterMatcher{{Name: "v",
		QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "%31"}}}}}
	rc, err := compileRouteConfig(vhost([]*routev3.Route{watch, one, escaped, routeTo("default")}, nil))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/x?watch=1":          "watch",
		"/x?watch":            "watch",
		"/x?%77atch=1":        "default",
		"/x?watc%68=1":        "default",
		"/x?a=1&%77atch=true": "default",
		"/x?v=1":              "one",
		"/x?v=%31":            "escaped",
		"/x?v=1&v=%31":        "one", // the first value only
		"/x?v=%31&v=1":        "escaped",
	} {
		st := &stream{cfg: &config{routes: map[string]*routeConfig{"r": rc}}, hcm: &hcmCfg{rdsName: "r"}, host: "h", path: path}
		if got := routeName(st.matchRoute()); got != want {
			t.Errorf("%s: route %s, want %s", path, got, want)
		}
	}
}
