package topology_test

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
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

func upstreamURL(method string, u *url.URL) topology.RequestInfo {
	ri, _ := upstreamFactory.NewRequestInfo(&http.Request{Method: method, URL: u})
	return topology.RequestInfo{
		IsResourceRequest: ri.IsResourceRequest,
		Path:              ri.Path,
		Verb:              ri.Verb,
		APIPrefix:         ri.APIPrefix,
		APIGroup:          ri.APIGroup,
		APIVersion:        ri.APIVersion,
		Namespace:         ri.Namespace,
		Resource:          ri.Resource,
		Subresource:       ri.Subresource,
		Name:              ri.Name,
		Parts:             ri.Parts,
	}
}

type parseCase struct {
	name   string
	method string
	target string // as in :path
	want   topology.RequestInfo
}

// res builds an expected resource-request RequestInfo.
func res(path, verb, prefix, group, version, ns, resource, sub, name string, parts ...string) topology.RequestInfo {
	return topology.RequestInfo{IsResourceRequest: true, Path: path, Verb: verb, APIPrefix: prefix, APIGroup: group,
		APIVersion: version, Namespace: ns, Resource: resource, Subresource: sub, Name: name, Parts: parts}
}

// nonRes builds an expected non-resource RequestInfo.
func nonRes(path, verb string) topology.RequestInfo {
	return topology.RequestInfo{Path: path, Verb: verb}
}

const fsFoo = "fieldSelector=metadata.name%3Dfoo"

var parseCases = []parseCase{
	// Plain CRUD.
	{"get named", "GET", "/api/v1/namespaces/default/pods/foo",
		res("/api/v1/namespaces/default/pods/foo", "get", "api", "", "v1", "default", "pods", "", "foo", "pods", "foo")},
	{"list namespaced", "GET", "/api/v1/namespaces/default/pods",
		res("/api/v1/namespaces/default/pods", "list", "api", "", "v1", "default", "pods", "", "", "pods")},
	{"list cluster-wide", "GET", "/api/v1/pods",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"HEAD is get/list", "HEAD", "/api/v1/pods",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"create", "POST", "/api/v1/namespaces/default/pods",
		res("/api/v1/namespaces/default/pods", "create", "api", "", "v1", "default", "pods", "", "", "pods")},
	{"update grouped", "PUT", "/apis/apps/v1/namespaces/kube-system/deployments/coredns",
		res("/apis/apps/v1/namespaces/kube-system/deployments/coredns", "update", "apis", "apps", "v1", "kube-system", "deployments", "", "coredns", "deployments", "coredns")},
	{"patch subresource", "PATCH", "/apis/apps/v1/namespaces/kube-system/deployments/coredns/scale",
		res("/apis/apps/v1/namespaces/kube-system/deployments/coredns/scale", "patch", "apis", "apps", "v1", "kube-system", "deployments", "scale", "coredns", "deployments", "coredns", "scale")},
	{"delete", "DELETE", "/api/v1/namespaces/default/pods/foo",
		res("/api/v1/namespaces/default/pods/foo", "delete", "api", "", "v1", "default", "pods", "", "foo", "pods", "foo")},
	{"deletecollection", "DELETE", "/api/v1/namespaces/default/pods",
		res("/api/v1/namespaces/default/pods", "deletecollection", "api", "", "v1", "default", "pods", "", "", "pods")},
	{"deletecollection ignores fieldSelector", "DELETE", "/api/v1/pods?" + fsFoo,
		res("/api/v1/pods", "deletecollection", "api", "", "v1", "", "pods", "", "", "pods")},
	{"OPTIONS has no resource verb", "OPTIONS", "/api/v1/pods",
		res("/api/v1/pods", "", "api", "", "v1", "", "pods", "", "", "pods")},
	{"CONNECT has no resource verb", "CONNECT", "/api/v1/namespaces/default/pods/foo/exec",
		res("/api/v1/namespaces/default/pods/foo/exec", "", "api", "", "v1", "default", "pods", "exec", "foo", "pods", "foo", "exec")},
	{"method is case-sensitive for resources", "get", "/api/v1/pods",
		res("/api/v1/pods", "", "api", "", "v1", "", "pods", "", "", "pods")},
	{"extra parts kept, fourth not interpreted", "GET", "/api/v1/namespaces/ns/configmaps/cm/x/y",
		res("/api/v1/namespaces/ns/configmaps/cm/x/y", "get", "api", "", "v1", "ns", "configmaps", "x", "cm", "configmaps", "cm", "x", "y")},

	// Namespaces themselves.
	{"list namespaces", "GET", "/api/v1/namespaces",
		res("/api/v1/namespaces", "list", "api", "", "v1", "", "namespaces", "", "", "namespaces")},
	{"get namespace", "GET", "/api/v1/namespaces/kube-system",
		res("/api/v1/namespaces/kube-system", "get", "api", "", "v1", "kube-system", "namespaces", "", "kube-system", "namespaces", "kube-system")},
	{"namespace finalize", "PUT", "/api/v1/namespaces/kube-system/finalize",
		res("/api/v1/namespaces/kube-system/finalize", "update", "api", "", "v1", "kube-system", "namespaces", "finalize", "kube-system", "namespaces", "kube-system", "finalize")},
	{"namespace status", "GET", "/api/v1/namespaces/kube-system/status",
		res("/api/v1/namespaces/kube-system/status", "get", "api", "", "v1", "kube-system", "namespaces", "status", "kube-system", "namespaces", "kube-system", "status")},
	{"status/finalize only special right after the namespace", "GET", "/api/v1/namespaces/ns/status/x",
		res("/api/v1/namespaces/ns/status/x", "get", "api", "", "v1", "ns", "namespaces", "status", "ns", "namespaces", "ns", "status", "x")},

	// Verbs in the path.
	{"watch prefix", "GET", "/api/v1/watch/namespaces/default/pods",
		res("/api/v1/watch/namespaces/default/pods", "watch", "api", "", "v1", "default", "pods", "", "", "pods")},
	{"watch prefix named", "GET", "/apis/apps/v1/watch/deployments/d",
		res("/apis/apps/v1/watch/deployments/d", "watch", "apis", "apps", "v1", "", "deployments", "", "d", "deployments", "d")},
	{"watch prefix ignores query", "GET", "/apis/apps/v1/watch/deployments?watch=false",
		res("/apis/apps/v1/watch/deployments", "watch", "apis", "apps", "v1", "", "deployments", "", "", "deployments")},
	{"watch prefix is the verb for any method", "POST", "/api/v1/watch/pods",
		res("/api/v1/watch/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"bare watch prefix: upstream error, partial info", "GET", "/api/v1/watch",
		topology.RequestInfo{IsResourceRequest: true, Path: "/api/v1/watch", Verb: "get", APIPrefix: "api", APIVersion: "v1"}},
	{"bare proxy prefix: upstream error, partial info", "PUT", "/apis/g/v1/proxy/",
		topology.RequestInfo{IsResourceRequest: true, Path: "/apis/g/v1/proxy/", Verb: "put", APIPrefix: "apis", APIGroup: "g", APIVersion: "v1"}},
	{"proxy has no subresource", "GET", "/api/v1/proxy/namespaces/default/pods/foo/bar",
		res("/api/v1/proxy/namespaces/default/pods/foo/bar", "proxy", "api", "", "v1", "default", "pods", "", "foo", "pods", "foo", "bar")},

	// Query: watch.
	{"watch=true", "GET", "/api/v1/namespaces/default/pods?watch=true",
		res("/api/v1/namespaces/default/pods", "watch", "api", "", "v1", "default", "pods", "", "", "pods")},
	{"watch=1", "GET", "/api/v1/pods?watch=1",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"watch=0", "GET", "/api/v1/pods?watch=0",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"watch=FALSE", "GET", "/api/v1/pods?watch=FALSE",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"empty watch value is true", "GET", "/api/v1/pods?watch=",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"watch without '=' is true", "GET", "/api/v1/pods?limit=5&watch",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"first watch wins", "GET", "/api/v1/pods?watch=false&watch=true",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"encoded key", "GET", "/api/v1/pods?w%61tch=true",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"keys are case-sensitive", "GET", "/api/v1/pods?Watch=true",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"pair with ';' is dropped", "GET", "/api/v1/pods?watch=true;x",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"pair with bad escape is dropped", "GET", "/api/v1/pods?watch=%zz&watch=true",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"'#' is part of the query", "GET", "/api/v1/pods?watch=0#x",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"named get ignores watch", "GET", "/api/v1/namespaces/ns/pods/foo?watch=true",
		res("/api/v1/namespaces/ns/pods/foo", "get", "api", "", "v1", "ns", "pods", "", "foo", "pods", "foo")},
	{"create ignores watch", "POST", "/api/v1/pods?watch=true",
		res("/api/v1/pods", "create", "api", "", "v1", "", "pods", "", "", "pods")},
	{"Unicode-folded false is false", "GET", "/api/v1/pods?watch=fal%C5%BFe",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"... but true once decoding fails (fallback only lower-cases)", "GET", "/api/v1/pods?watch=fal%C5%BFe&limit=x",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},

	// Query: fieldSelector names.
	{"list by metadata.name", "GET", "/api/v1/nodes?" + fsFoo,
		res("/api/v1/nodes", "list", "api", "", "v1", "", "nodes", "", "foo", "nodes")},
	{"watch by metadata.name", "GET", "/api/v1/namespaces/ns/pods?" + fsFoo + "&watch=true&resourceVersion=1&timeoutSeconds=30&limit=500",
		res("/api/v1/namespaces/ns/pods", "watch", "api", "", "v1", "ns", "pods", "", "foo", "pods")},
	{"'==' operator and other terms", "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn,metadata.name%3D%3Dfoo",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "foo", "pods")},
	{"raw '=' in value is fine", "GET", "/api/v1/pods?fieldSelector=metadata.name=foo",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "foo", "pods")},
	{"sorted terms: smallest wins", "GET", "/api/v1/pods?fieldSelector=metadata.name%3Db,metadata.name%3Da",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "a", "pods")},
	{"escaped value", "GET", "/api/v1/pods?fieldSelector=metadata.name%3Da%5C%2Cb",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "a,b", "pods")},
	{"'!=' gives no name", "GET", "/api/v1/pods?fieldSelector=metadata.name!%3Dfoo",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"name with '/' is not taken", "GET", "/api/v1/pods?fieldSelector=metadata.name%3Da%2Fb",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"name '..' is not taken", "GET", "/api/v1/pods?fieldSelector=metadata.name%3D..",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"bad field selector", "GET", "/api/v1/pods?fieldSelector=metadata.name%3Dfoo,bogus&watch=1",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},
	{"bad label selector voids the name", "GET", "/api/v1/pods?" + fsFoo + "&labelSelector=%3D%3D",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"good label selector keeps it", "GET", "/api/v1/pods?" + fsFoo + "&labelSelector=app+in+(a,b),!x",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "foo", "pods")},
	{"bad limit voids the name", "GET", "/api/v1/pods?" + fsFoo + "&limit=abc",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"bad timeoutSeconds voids the name", "GET", "/api/v1/pods?" + fsFoo + "&timeoutSeconds=",
		res("/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"path name wins over fieldSelector", "GET", "/api/v1/pods/bar?" + fsFoo,
		res("/api/v1/pods/bar", "get", "api", "", "v1", "", "pods", "", "bar", "pods", "bar")},

	// Path shapes.
	{"trailing slash", "GET", "/api/v1/pods/",
		res("/api/v1/pods/", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"empty segments count", "GET", "//api//v1/pods",
		res("//api//v1/pods", "get", "api", "", "", "", "v1", "", "pods", "v1", "pods")},
	{"empty namespace", "GET", "/api/v1/namespaces//pods",
		res("/api/v1/namespaces//pods", "list", "api", "", "v1", "", "pods", "", "", "pods")},
	{"empty name is no name", "GET", "/api/v1/pods//status",
		res("/api/v1/pods//status", "list", "api", "", "v1", "", "pods", "status", "", "pods", "", "status")},
	{"%2F is decoded and splits", "GET", "/api/v1/namespaces/a%2Fb/pods",
		res("/api/v1/namespaces/a/b/pods", "get", "api", "", "v1", "a", "b", "", "pods", "b", "pods")},
	{"%20 is decoded", "GET", "/api/v1/namespaces/default/pods/my%20pod",
		res("/api/v1/namespaces/default/pods/my pod", "get", "api", "", "v1", "default", "pods", "", "my pod", "pods", "my pod")},
	{"%3F is part of the path", "GET", "/api/v1/pods%3Fwatch=1",
		res("/api/v1/pods?watch=1", "list", "api", "", "v1", "", "pods?watch=1", "", "", "pods?watch=1")},
	{"'+' stays in the path", "GET", "/api/v1/pods+x",
		res("/api/v1/pods+x", "list", "api", "", "v1", "", "pods+x", "", "", "pods+x")},
	{"absolute-form target", "GET", "http://h/api/v1/pods?watch=1",
		res("/api/v1/pods", "watch", "api", "", "v1", "", "pods", "", "", "pods")},

	// Non-resource.
	{"root", "GET", "/", nonRes("/", "get")},
	{"healthz", "GET", "/healthz?verbose", nonRes("/healthz", "get")},
	{"/api", "GET", "/api", nonRes("/api", "get")},
	{"/api/v1", "GET", "/api/v1", nonRes("/api/v1", "get")},
	{"/apis/apps", "GET", "/apis/apps/", nonRes("/apis/apps/", "get")},
	{"/apis/apps/v1 keeps the prefix", "GET", "/apis/apps/v1",
		topology.RequestInfo{Path: "/apis/apps/v1", Verb: "get", APIPrefix: "apis"}},
	{"unknown prefix", "POST", "/openapi/v3/apis/apps/v1", nonRes("/openapi/v3/apis/apps/v1", "post")},
	{"any method lower-cased", "PROPFIND", "/metrics", nonRes("/metrics", "propfind")},
	{"OPTIONS *", "OPTIONS", "*", nonRes("*", "options")},

	// Targets Go's server rejects with 400.
	{"bad escape", "GET", "/api/v1/pods/%zz?watch=1", nonRes("/api/v1/pods/%zz", "get")},
	{"control byte", "GET", "/api/v1/pods\x00", nonRes("/api/v1/pods\x00", "get")},
	{"control byte in query", "GET", "/api/v1/pods?a=\x7f", nonRes("/api/v1/pods", "get")},
	{"relative", "GET", "api/v1/pods", nonRes("api/v1/pods", "get")},
	{"empty", "GET", "", nonRes("", "get")},
}

func TestParsePathHeaderTable(t *testing.T) {
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			if got := topology.ParsePathHeader(c.method, c.target); !reflect.DeepEqual(got, c.want) {
				t.Errorf("ParsePathHeader(%q, %q)\n got  %+v\n want %+v", c.method, c.target, got, c.want)
			}
		})
	}
}

var (
	corpusMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT"}
	corpusQueries = []string{
		"", "watch=true", "watch=1", "watch=0", "watch=false", "watch=False", "watch=", "watch", "watch=yes",
		"watch=fal%C5%BFe", "watch=f%61lse", "w%61tch=1", "watch=1;", "watch=%zz", "watch=true%2", "watch=+0",
		fsFoo, "fieldSelector=metadata.name==foo", "fieldSelector=metadata.name%3D", "fieldSelector=",
		"fieldSelector=metadata.name%3Dfoo,metadata.name%3Dbar", "fieldSelector=metadata.name!%3Dfoo",
		"fieldSelector=spec.nodeName%3Dn1,metadata.name%3D%3Dn2", "fieldSelector=metadata.name%3Da%2Fb",
		"fieldSelector=metadata.name%3Da%25b", "fieldSelector=metadata.name%3D.", "fieldSelector=metadata.name%3Dx%5C",
		"fieldSelector=metadata.name%3Dx%5C%3Dy", "fieldSelector=metadata.name%3D%FF%5C%2C", "fieldSelector=nope",
		"fieldSelector=a%3Db,,c%3Dd", "fieldS%65lector=metadata.name%3Dq", "fieldSelector=metadata.name%3Dz;",
		"labelSelector=app%3Dx", "labelSelector=app+in+(a,b)", "labelSelector=%3D%3D", "labelSelector=a,,b",
		"labelSelector=", "labelSelector=x%3E1", "labelSelector=x%3Ea",
		"limit=500", "limit=-1", "limit=+5", "limit=", "limit=abc", "limit=99999999999999999999",
		"timeoutSeconds=30", "timeoutSeconds=", "timeoutSeconds=3.5", "resourceVersion=0", "resourceVersionMatch=NotOlderThan",
		"allowWatchBookmarks=true", "sendInitialEvents=true", "continue=abc", "=x", "&", "a=b=c", "%zz=1",
	}
	corpusSegments = []string{
		"api", "apis", "apiz", "v1", "apps", "watch", "proxy", "namespaces", "default", "status", "finalize",
		"pods", "foo", "", "a%2Fb", "my%20pod", "%2F", "x+y", "%25", "..", "log",
	}
	corpusTrailers = []string{"", "/", "//"}
)

// corpus is the table plus generated targets: a systematic part on the common shapes and a
// seeded random part over segments, queries and methods.
func corpus() [][2]string {
	var out [][2]string
	for _, c := range parseCases {
		out = append(out, [2]string{c.method, c.target})
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

func TestManyQueryParameters(t *testing.T) {
	// Past net/url's limit of 10000 parameters the query is ignored as a whole.
	for _, n := range []int{9999, 10000, 10001} {
		target := "/api/v1/pods?watch=1" + strings.Repeat("&", n-1)
		checkAgainstUpstream(t, "GET", target)
	}
}

// checkAgainstUpstream compares ParsePathHeader with upstream on the decoded target and
// ParseRequest with upstream on the undecoded halves taken as an already decoded path.
func checkAgainstUpstream(t *testing.T, method, target string) {
	t.Helper()
	got := topology.ParsePathHeader(method, target)
	if want, ok := upstream(method, target); ok {
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ParsePathHeader(%q, %q)\n got  %+v\n want %+v", method, target, got, want)
		}
	} else {
		rawPath, _, _ := strings.Cut(target, "?")
		if want := (topology.RequestInfo{Path: rawPath, Verb: strings.ToLower(method)}); !reflect.DeepEqual(got, want) {
			t.Errorf("ParsePathHeader(%q, %q) on a rejected target\n got  %+v\n want %+v", method, target, got, want)
		}
	}

	path, query, _ := strings.Cut(target, "?")
	got = topology.ParseRequest(method, path, query)
	if want := upstreamURL(method, &url.URL{Path: path, RawQuery: query}); !reflect.DeepEqual(got, want) {
		t.Errorf("ParseRequest(%q, %q, %q)\n got  %+v\n want %+v", method, path, query, got, want)
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, c := range parseCases {
		f.Add(c.method, c.target)
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
	ri := topology.ParsePathHeader("GET", "/apis/apps/v1/namespaces/default/deployments?watch=1")
	fmt.Println(ri.Verb, ri.APIGroup, ri.APIVersion, ri.Namespace, ri.Resource)
	// Output: watch apps v1 default deployments
}
