package explain

import (
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// TestUnknownMatchersAreErrors: a matcher internal/snapshot does not use yet is refused,
// not guessed at, so a new kind of route shows up as an error rather than a wrong answer.
func TestUnknownMatchersAreErrors(t *testing.T) {
	for name, m := range map[string]*routev3.RouteMatch{
		"path": {PathSpecifier: &routev3.RouteMatch_Path{Path: "/x"}},
		"header": {PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
			Headers: []*routev3.HeaderMatcher{{Name: "h",
				HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "a"}}}}}},
	} {
		e := &Explainer{routes: []*routev3.Route{{Name: name, Match: m}}}
		if _, err := e.match("/x", map[string]string{"h": "a"}); err == nil || !strings.Contains(err.Error(), "not one explain knows") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestMatch: Envoy's first match, for the matchers the route table uses.
func TestMatch(t *testing.T) {
	route := func(name string, m *routev3.RouteMatch) *routev3.Route { return &routev3.Route{Name: name, Match: m} }
	present := func(h string, invert bool) []*routev3.HeaderMatcher {
		return []*routev3.HeaderMatcher{{Name: h, InvertMatch: invert, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}}
	}
	e := &Explainer{routes: []*routev3.Route{
		route("no-class", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: present("class", true)}),
		route("regex", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "/apis/?"}}}),
		route("gv", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/apis/batch/v1"}}),
		route("rest", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}),
	}}
	for target, want := range map[string]string{
		"/apis":                   "regex",
		"/apis/?x=1":              "regex",
		"/apisx":                  "rest", // the regex is anchored
		"/apis/batch/v1":          "gv",
		"/apis/batch/v1/jobs?a=b": "gv",
		"/apis/batch/v10":         "rest",
	} {
		r, err := e.match(target, map[string]string{"class": "read"})
		if err != nil || r.GetName() != want {
			t.Errorf("%s: %s, %v; want %s", target, r.GetName(), err, want)
		}
	}
	if r, _ := e.match("/apis", nil); r.GetName() != "no-class" {
		t.Errorf("without the class header: %s, want no-class", r.GetName())
	}
}
