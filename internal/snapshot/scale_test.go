package snapshot_test

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// scaleTopology is a control plane of three apiservers serving gvs group/versions of two
// resources each: every other group/version is served by cp-0 and cp-1 only (ext_proc
// routes), the rest by all three (line-rate routes).
func scaleTopology(t testing.TB, gvs int) *topology.Topology {
	ss := liveAPIServers(3)
	served := map[topology.Resource][]string{}
	for g := range gvs {
		ids := []string{ss[0].ID, ss[1].ID, ss[2].ID}
		if g%2 == 1 {
			ids = ids[:2]
		}
		for r := range 2 {
			served[topology.Resource{Group: fmt.Sprintf("group%d.example.io", g), Version: "v1", Resource: fmt.Sprintf("things%d", r)}] = ids
		}
	}
	topo, err := topology.New(ss, served, nil)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// matchWork counts what Envoy does to match one request against a route table, in Envoy's
// order (RouteEntryImplBase::matchRoute, source/common/router/config_impl.cc: the header
// matchers, then the query parameters, parsed from the path for every route that has
// query parameter matchers, then the path): routes tried, header matchers evaluated (of
// them regexes), query strings parsed, path checks (of them regexes).
type matchWork struct {
	route                                 string
	routes, headers, headerRegexes, query int
	paths, pathRegexes                    int
}

func (w matchWork) String() string {
	return fmt.Sprintf("matched %q after %d routes: %d header matchers (%d regex), %d query parses, %d path checks (%d regex)",
		w.route, w.routes, w.headers, w.headerRegexes, w.query, w.paths, w.pathRegexes)
}

// countMatch walks rc's routes for a request with the given headers (":path" with its
// query, ":method", others lower-case) as Envoy would and counts the work. Only the matchers
// kube-mvp emits are modelled.
func countMatch(t testing.TB, rc *routev3.RouteConfiguration, headers map[string]string) matchWork {
	t.Helper()
	full := headers[":path"]
	path, rawQuery, _ := strings.Cut(full, "?")
	var w matchWork
	re := func(s string) *regexp.Regexp { return regexp.MustCompile(`^(?:` + s + `)$`) }
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		w.routes++
		m := r.GetMatch()
		ok := true
		for _, h := range m.GetHeaders() {
			w.headers++
			v, present := headers[h.GetName()]
			var hit bool
			switch s := h.GetHeaderMatchSpecifier().(type) {
			case *routev3.HeaderMatcher_PresentMatch:
				hit = present == s.PresentMatch
			case *routev3.HeaderMatcher_StringMatch:
				switch p := s.StringMatch.GetMatchPattern().(type) {
				case *matcherv3.StringMatcher_Exact:
					hit = present && v == p.Exact
				case *matcherv3.StringMatcher_SafeRegex:
					w.headerRegexes++
					hit = present && re(p.SafeRegex.GetRegex()).MatchString(v)
				default:
					t.Fatalf("route %s: header matcher %v not modelled", r.GetName(), h)
				}
			default:
				t.Fatalf("route %s: header matcher %v not modelled", r.GetName(), h)
			}
			if h.GetInvertMatch() {
				hit = !hit
			}
			if !hit {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if qs := m.GetQueryParameters(); len(qs) > 0 {
			w.query++
			q, _ := url.ParseQuery(rawQuery)
			for _, qp := range qs {
				if _, present := q[qp.GetName()]; !present || !qp.GetPresentMatch() {
					ok = false
					break
				}
			}
			if !ok {
				continue
			}
		}
		w.paths++
		switch p := m.GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Prefix:
			ok = strings.HasPrefix(path, p.Prefix)
		case *routev3.RouteMatch_Path:
			ok = path == p.Path
		case *routev3.RouteMatch_PathSeparatedPrefix:
			ok = path == p.PathSeparatedPrefix || strings.HasPrefix(path, p.PathSeparatedPrefix+"/")
		case *routev3.RouteMatch_SafeRegex:
			w.pathRegexes++
			ok = re(p.SafeRegex.GetRegex()).MatchString(path)
		default:
			t.Fatalf("route %s: path matcher %T not modelled", r.GetName(), p)
		}
		if ok {
			w.route = r.GetName()
			return w
		}
	}
	t.Fatalf("no route matched %v", headers)
	return w
}

// TestRouteScale reports, for control planes of 100 and 1,000 group/versions (half of them
// served by two of three apiservers), the number of routes, the size of the route
// configuration and the matching work of typical requests. The figures are in docs/performance.md
// ("Route matching at scale"); the assertions only keep them from silently growing.
func TestRouteScale(t *testing.T) {
	for _, gvs := range []int{100, 1000} {
		t.Run(fmt.Sprint(gvs), func(t *testing.T) {
			res, err := snapshot.Build(mustPlan(t, scaleTopology(t, gvs)), testConfig())
			if err != nil {
				t.Fatal(err)
			}
			rc := res.Routes[0].(*routev3.RouteConfiguration)
			routes := len(rc.GetVirtualHosts()[0].GetRoutes())
			size := proto.Size(rc)
			t.Logf("%d group/versions: %d routes, RDS %d bytes", gvs, routes, size)
			// As the routes see them after the Lua filter, which sets the request class.
			class := contract.HeaderRequestClass
			requests := []map[string]string{
				{":method": "GET", ":path": "/healthz", class: contract.ClassRead},
				{":method": "GET", ":path": "/apis/group0.example.io/v1/things0", class: contract.ClassRead},
				{":method": "GET", ":path": fmt.Sprintf("/apis/group%d.example.io/v1/things0?watch=1", gvs-2), class: contract.ClassWatch},
				{":method": "POST", ":path": fmt.Sprintf("/apis/group%d.example.io/v1/namespaces/n/things0", gvs-2), class: contract.ClassWrite},
			}
			for _, h := range requests {
				w := countMatch(t, rc, h)
				t.Logf("  %s %s: %v", h[":method"], h[":path"], w)
			}
		})
	}
}
