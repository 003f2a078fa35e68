package topology_test

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

func init() {
	// Upstream logs every ListOptions decoding error; the corpus and fuzzer provoke many.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}

var upstreamFactory = apirequest.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

// upstream runs the real RequestInfoFactory on the URL Go's HTTP server builds from the
// request-target (url.ParseRequestURI, for HTTP/1 and HTTP/2 alike).
func upstream(method, target string) (topology.RequestInfo, bool) {
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return topology.RequestInfo{}, false
	}
	return upstreamURL(method, u), true
}

// upstreamURL is upstream's answer, cut down to the fields RequestInfo keeps.
func upstreamURL(method string, u *url.URL) topology.RequestInfo {
	ri, _ := upstreamFactory.NewRequestInfo(&http.Request{Method: method, URL: u})
	if !ri.IsResourceRequest {
		return groupVersionDocument(ri.Path)
	}
	return topology.RequestInfo{
		IsResourceRequest: ri.IsResourceRequest,
		APIGroup:          ri.APIGroup,
		APIVersion:        ri.APIVersion,
		Resource:          ri.Resource,
		Subresource:       ri.Subresource,
	}
}

// groupVersionDocument is what a non-resource request's path (upstream's RequestInfo.Path,
// req.URL.Path) parses to: upstream marks no group/version document, so this splits the path
// as upstream's splitPath does (slashes trimmed around, split at every "/") and recognises
// the paths go-restful's group/version web services answer: api/<v>, apis/<g>/<v>.
func groupVersionDocument(path string) topology.RequestInfo {
	var parts []string
	if p := strings.Trim(path, "/"); p != "" {
		parts = strings.Split(p, "/")
	}
	switch {
	case len(parts) == 2 && parts[0] == "api" && parts[1] != "":
		return topology.RequestInfo{GroupVersionDocument: true, APIVersion: parts[1]}
	case len(parts) == 3 && parts[0] == "apis" && parts[1] != "" && parts[2] != "":
		return topology.RequestInfo{GroupVersionDocument: true, APIGroup: parts[1], APIVersion: parts[2]}
	}
	return topology.RequestInfo{}
}

// doc is the expected RequestInfo of a group/version document.
func doc(group, version string) topology.RequestInfo {
	return topology.RequestInfo{GroupVersionDocument: true, APIGroup: group, APIVersion: version}
}

// parseCase is a target (as in :path) and what it parses to, with any method: the corpus
// tries every one against upstream.
type parseCase struct {
	name   string
	target string
	want   topology.RequestInfo
}

// res builds an expected resource-request RequestInfo.
func res(group, version, resource, sub string) topology.RequestInfo {
	return topology.RequestInfo{IsResourceRequest: true, APIGroup: group, APIVersion: version, Resource: resource, Subresource: sub}
}

// nonRes is the expected RequestInfo of a non-resource request.
var nonRes = topology.RequestInfo{}

var parseCases = []parseCase{
	// Resources and subresources.
	{"get named", "/api/v1/namespaces/default/pods/foo", res("", "v1", "pods", "")},
	{"list namespaced", "/api/v1/namespaces/default/pods", res("", "v1", "pods", "")},
	{"list cluster-wide", "/api/v1/pods", res("", "v1", "pods", "")},
	{"update grouped", "/apis/apps/v1/namespaces/kube-system/deployments/coredns", res("apps", "v1", "deployments", "")},
	{"patch subresource", "/apis/apps/v1/namespaces/kube-system/deployments/coredns/scale", res("apps", "v1", "deployments", "scale")},
	{"exec subresource", "/api/v1/namespaces/default/pods/foo/exec", res("", "v1", "pods", "exec")},
	{"cluster-scoped subresource", "/api/v1/nodes/n/status", res("", "v1", "nodes", "status")},
	{"fourth part not interpreted", "/api/v1/namespaces/ns/configmaps/cm/x/y", res("", "v1", "configmaps", "x")},

	// Namespaces themselves.
	{"list namespaces", "/api/v1/namespaces", res("", "v1", "namespaces", "")},
	{"get namespace", "/api/v1/namespaces/kube-system", res("", "v1", "namespaces", "")},
	{"namespace finalize", "/api/v1/namespaces/kube-system/finalize", res("", "v1", "namespaces", "finalize")},
	{"namespace status", "/api/v1/namespaces/kube-system/status", res("", "v1", "namespaces", "status")},
	{"status/finalize only special right after the namespace", "/api/v1/namespaces/ns/status/x", res("", "v1", "namespaces", "status")},

	// Verbs in the path.
	{"watch prefix", "/api/v1/watch/namespaces/default/pods", res("", "v1", "pods", "")},
	{"watch prefix named", "/apis/apps/v1/watch/deployments/d", res("apps", "v1", "deployments", "")},
	{"watch prefix keeps the subresource", "/apis/apps/v1/watch/deployments/d/status", res("apps", "v1", "deployments", "status")},
	{"bare watch prefix: upstream error, partial info", "/api/v1/watch",
		topology.RequestInfo{IsResourceRequest: true, APIVersion: "v1"}},
	{"bare proxy prefix: upstream error, partial info", "/apis/g/v1/proxy/",
		topology.RequestInfo{IsResourceRequest: true, APIGroup: "g", APIVersion: "v1"}},
	{"proxy has no subresource", "/api/v1/proxy/namespaces/default/pods/foo/bar", res("", "v1", "pods", "")},

	// The query routes nothing.
	{"query ignored", "/api/v1/namespaces/default/pods?watch=true&fieldSelector=metadata.name%3Dfoo", res("", "v1", "pods", "")},
	{"'#' is part of the query", "/api/v1/pods?watch=0#x/y", res("", "v1", "pods", "")},

	// Path shapes.
	{"trailing slash", "/api/v1/pods/", res("", "v1", "pods", "")},
	{"empty segments count", "//api//v1/pods", res("", "", "v1", "")},
	{"empty namespace", "/api/v1/namespaces//pods", res("", "v1", "pods", "")},
	{"empty name", "/api/v1/pods//status", res("", "v1", "pods", "status")},
	{"%2F is decoded and splits", "/api/v1/namespaces/a%2Fb/pods", res("", "v1", "b", "")},
	{"%20 is decoded", "/api/v1/namespaces/default/pods/my%20pod/st%61tus", res("", "v1", "pods", "status")},
	{"%3F is part of the path", "/api/v1/pods%3Fwatch=1", res("", "v1", "pods?watch=1", "")},
	{"'+' stays in the path", "/api/v1/pods+x", res("", "v1", "pods+x", "")},
	{"absolute-form target", "http://h/apis/batch/v1/jobs?watch=1", res("batch", "v1", "jobs", "")},

	// Group/version documents: a non-resource request to upstream, served by the group/version.
	{"core document", "/api/v1", doc("", "v1")},
	{"group document", "/apis/batch/v1?timeout=32s", doc("batch", "v1")},
	{"document, trailing slash", "/apis/batch/v1/", doc("batch", "v1")},
	{"document, leading slashes", "//apis/batch/v1", doc("batch", "v1")},
	{"document, escaped slash", "/apis/batch%2Fv1", doc("batch", "v1")},
	{"document, escaped slash resource", "/apis/batch%2Fv1/namespaces/x/jobs", res("batch", "v1", "jobs", "")},
	{"no document: empty group", "/apis//v1", nonRes},
	{"no document: group only", "/apis/batch", nonRes},
}

// nonResourceTargets parse as non-resource requests: not a version and a resource under
// /api or /apis, or rejected with 400 by Go's server before any handler runs.
var nonResourceTargets = []string{
	"/", "/healthz?verbose", "/api", "/apis/apps/", "/openapi/v3/apis/apps/v1", "*",
	// Rejected: bad escape, control bytes in the path and in the query, relative, empty.
	"/api/v1/pods/%zz?watch=1", "/api/v1/pods\x00", "/api/v1/pods?a=\x7f", "api/v1/pods", "",
}

func TestParsePathHeaderTable(t *testing.T) {
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			if got := topology.ParsePathHeader("GET", c.target); got != c.want {
				t.Errorf("ParsePathHeader(GET, %q)\n got  %+v\n want %+v", c.target, got, c.want)
			}
		})
	}
	for _, target := range nonResourceTargets {
		if got := topology.ParsePathHeader("GET", target); got != nonRes {
			t.Errorf("ParsePathHeader(GET, %q) = %+v, want non-resource", target, got)
		}
	}
}

var (
	corpusMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT", "PROXY", "watch"}
	// The query routes nothing; these check that the path ends where upstream's does.
	corpusQueries = []string{
		"", "watch=true", "watch", "fieldSelector=metadata.name%3Dfoo", "limit=abc", "a=b?c/d", "%zz=1", "x#y/z", "a=%2F",
	}
	corpusSegments = []string{
		"api", "apis", "apiz", "v1", "apps", "watch", "proxy", "namespaces", "default", "status", "finalize",
		"pods", "foo", "", "a%2Fb", "my%20pod", "%2F", "x+y", "%25", "..", "log",
	}
	corpusTrailers = []string{"", "/", "//"}
)

// tableTargets are the targets of parseCases and nonResourceTargets.
func tableTargets() []string {
	targets := slices.Clone(nonResourceTargets)
	for _, c := range parseCases {
		targets = append(targets, c.target)
	}
	return targets
}

// corpus is the table plus generated targets: a systematic part on the common shapes and a
// seeded random part over segments, queries and methods.
func corpus() [][2]string {
	var out [][2]string
	for _, target := range tableTargets() {
		for _, m := range corpusMethods {
			out = append(out, [2]string{m, target})
		}
	}
	prefixes := []string{"/api/v1", "/apis/apps/v1", "/api", "/apis/apps", "/apiz/v1", "//api/v1", "/apis//v1"}
	middles := []string{"", "/watch", "/proxy"}
	scopes := []string{"", "/namespaces", "/namespaces/ns", "/namespaces/a%2Fb", "/namespaces/", "/namespaces//"}
	tails := []string{"", "/pods", "/pods/foo", "/pods/foo/status", "/pods//log", "/status", "/finalize", "/pods/a%20b/x/y"}
	for _, p := range prefixes {
		for _, m := range middles {
			for _, s := range scopes {
				for _, tl := range tails {
					for _, tr := range corpusTrailers {
						method := corpusMethods[len(out)%len(corpusMethods)]
						query := corpusQueries[len(out)%len(corpusQueries)]
						target := p + m + s + tl + tr
						if query != "" {
							target += "?" + query
						}
						out = append(out, [2]string{method, target})
					}
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 4000 {
		var b strings.Builder
		for range rng.IntN(8) {
			b.WriteByte('/')
			b.WriteString(corpusSegments[rng.IntN(len(corpusSegments))])
		}
		b.WriteString(corpusTrailers[rng.IntN(len(corpusTrailers))])
		if b.Len() == 0 {
			b.WriteByte('/')
		}
		if n := rng.IntN(4); n > 0 {
			b.WriteByte('?')
			for i := range n {
				if i > 0 {
					b.WriteByte('&')
				}
				b.WriteString(corpusQueries[rng.IntN(len(corpusQueries))])
			}
		}
		out = append(out, [2]string{corpusMethods[rng.IntN(len(corpusMethods))], b.String()})
	}
	return out
}

func TestParsePathHeaderMatchesUpstream(t *testing.T) {
	cases := corpus()
	if len(cases) < 3000 {
		t.Fatalf("corpus has only %d cases", len(cases))
	}
	for _, c := range cases {
		checkAgainstUpstream(t, c[0], c[1])
	}
}

func TestNewRequestAgrees(t *testing.T) {
	// The brief's way of building the request (http.NewRequest on an absolute URL) and the
	// server's (url.ParseRequestURI on the target) agree wherever both apply.
	for _, c := range corpus() {
		method, target := c[0], c[1]
		if !strings.HasPrefix(target, "/") || strings.Contains(target, "#") {
			continue
		}
		r, err := http.NewRequest(method, "https://h"+target, nil)
		u, err2 := url.ParseRequestURI(target)
		if err != nil || err2 != nil {
			if (err == nil) != (err2 == nil) {
				t.Errorf("%q: NewRequest error %v, ParseRequestURI error %v", target, err, err2)
			}
			continue
		}
		if r.URL.Path != u.Path || r.URL.RawQuery != u.RawQuery {
			t.Errorf("%q: NewRequest gives %q?%q, ParseRequestURI %q?%q", target, r.URL.Path, r.URL.RawQuery, u.Path, u.RawQuery)
		}
	}
}

// checkAgainstUpstream compares ParsePathHeader with upstream on the decoded target and
// ParsePath with upstream on the undecoded path taken as an already decoded one.
func checkAgainstUpstream(t *testing.T, method, target string) {
	t.Helper()
	got := topology.ParsePathHeader(method, target)
	if want, ok := upstream(method, target); ok {
		if got != want {
			t.Errorf("ParsePathHeader(%q, %q)\n got  %+v\n want %+v", method, target, got, want)
		}
	} else if got != nonRes {
		t.Errorf("ParsePathHeader(%q, %q) on a rejected target\n got  %+v\n want non-resource", method, target, got)
	}

	path, query, _ := strings.Cut(target, "?")
	got = topology.ParsePath(path)
	if want := upstreamURL(method, &url.URL{Path: path, RawQuery: query}); got != want {
		t.Errorf("ParsePath(%q)\n got  %+v\n want %+v", path, got, want)
	}
}

func FuzzParsePathHeader(f *testing.F) {
	for _, target := range tableTargets() {
		f.Add("GET", target)
	}
	for i, q := range corpusQueries {
		f.Add(corpusMethods[i%len(corpusMethods)], "/apis/g/v1/namespaces/n/r?"+q)
	}
	f.Fuzz(func(t *testing.T, method, target string) {
		checkAgainstUpstream(t, method, target)
	})
}

var benchTargets = []struct{ name, method, target string }{
	{"get", "GET", "/api/v1/namespaces/default/pods/nginx-7c5ddbdf54-2xkqz"},
	{"list", "GET", "/apis/apps/v1/namespaces/kube-system/deployments?limit=500&resourceVersion=0"},
	{"watch", "GET", "/api/v1/namespaces/default/pods?allowWatchBookmarks=true&resourceVersion=1234&timeoutSeconds=412&watch=true"},
	{"watch-by-name", "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-1&resourceVersion=1234&timeoutSeconds=300&watch=true"},
	{"update-lease", "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1"},
	{"patch-status", "PATCH", "/api/v1/nodes/node-1/status"},
	{"watch-prefix", "GET", "/apis/apps/v1/watch/namespaces/default/deployments"},
	{"healthz", "GET", "/healthz"},
}

func BenchmarkParsePathHeader(b *testing.B) {
	for _, t := range benchTargets {
		b.Run(t.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = topology.ParsePathHeader(t.method, t.target)
			}
		})
	}
}

// BenchmarkUpstreamRequestInfo does what the apiserver does with the same targets: build
// req.URL from the target, then run RequestInfoFactory.
func BenchmarkUpstreamRequestInfo(b *testing.B) {
	for _, t := range benchTargets {
		b.Run(t.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				u, err := url.ParseRequestURI(t.target)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := upstreamFactory.NewRequestInfo(&http.Request{Method: t.method, URL: u}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func ExampleParsePathHeader() {
	ri := topology.ParsePathHeader("PUT", "/apis/apps/v1/namespaces/default/deployments/web/scale?dryRun=All")
	fmt.Println(ri.IsResourceRequest, ri.APIGroup, ri.APIVersion, ri.Resource, ri.Subresource)
	// Output: true apps v1 deployments scale
}
