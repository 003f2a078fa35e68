package snapshot

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	"k8s.io/klog/v2"

	"github.com/kube-mvp/kube-mvp/internal/contract"
)

// requestClassVM runs request_class.lua (in Lua 5.1, as Envoy's LuaJIT) and returns its
// request_class function.
func requestClassVM(t testing.TB) func(method, target string, upgrade bool) string {
	t.Helper()
	L := lua.NewState()
	t.Cleanup(L.Close)
	if err := L.DoString(requestClassScript + "\nreturn request_class"); err != nil {
		t.Fatal(err)
	}
	fn := L.Get(-1)
	L.Pop(1)
	return func(method, target string, upgrade bool) string {
		if err := L.CallByParam(lua.P{Fn: fn, NRet: 1, Protect: true}, lua.LString(method), lua.LString(target), lua.LBool(upgrade)); err != nil {
			t.Fatalf("request_class(%q, %q): %v", method, target, err)
		}
		v := L.Get(-1)
		L.Pop(1)
		return v.String()
	}
}

// apiserverClass is the class k8s.io/apiserver itself gives a request: RequestInfoFactory
// with kube-apiserver's API prefixes, and kube-apiserver's LongRunningFunc
// (BasicLongRunningRequestCheck with verbs watch and proxy and subresources attach, exec,
// proxy, log and portforward; k8s.io/kubernetes pkg/controlplane/apiserver/config.go).
func apiserverClass(t testing.TB, method, target string) string {
	path, _, _ := strings.Cut(target, "?")
	if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") || strings.Contains(path, "%") {
		return "unclassified"
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		t.Fatalf("%s: %v", target, err)
	}
	req := &http.Request{Method: method, URL: u}
	// RequestInfoFactory logs every query it cannot decode into ListOptions (limit=x).
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	rif := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	info, err := rif.NewRequestInfo(req)
	if err != nil {
		return "long-running" // the apiserver answers 500; any class without retry or timeout does
	}
	if info.IsResourceRequest && info.Name == "" && (info.Verb == "list" || info.Verb == "watch") && len(u.RawQuery) > queryParseMax {
		return "long-running" // not parsed by the script: the route without a class
	}
	if info.IsResourceRequest && info.Name == "" && (info.Verb == "list" || info.Verb == "watch") && ambiguousWatch(u.Query()) {
		// A list or a watch by whether the rest of the query decodes: the route without a class.
		return "long-running"
	}
	long := genericfilters.BasicLongRunningRequestCheck(sets.NewString("watch", "proxy"), sets.NewString("attach", "exec", "proxy", "log", "portforward"))(req, info)
	read := method == http.MethodGet || method == http.MethodHead
	switch {
	case long && read && info.Verb == "watch":
		return contract.ClassWatch
	case long:
		return "long-running"
	case read:
		return contract.ClassRead
	default:
		return contract.ClassWrite
	}
}

// ambiguousWatch: the first watch value is "false" only by Unicode case folding (the long s),
// which the apiserver reads as false when the whole query decodes into ListOptions and as a
// watch when some other parameter does not (RequestInfoFactory's fallback lowercases).
func ambiguousWatch(q url.Values) bool {
	w := q["watch"]
	return len(w) > 0 && strings.EqualFold(w[0], "false") && strings.ToLower(w[0]) != "false"
}

// queryParseMax is request_class.lua's QUERY_PARSE_MAX.
const queryParseMax = 4096

// requestClassTargets are the request targets the differential tests try, with every method.
var requestClassTargets = []string{
	"/", "/api", "/apis", "/api/v1", "/apis/batch", "/apis/batch/v1", "/apis/batch/v1/",
	"/healthz", "/readyz?verbose", "/livez", "/version", "/openapi/v2", "/openapi/v3/apis/batch/v1",
	"/debug/pprof/", "/debug/pprof/profile?seconds=30", "/debug/pprof", "/debug/flags/v", "/metrics",
	"/api/v1/pods", "/api/v1/pods?watch=1", "/api/v1/pods?watch=true", "/api/v1/pods?watch=0",
	"/api/v1/pods?watch=false", "/api/v1/pods?watch=FALSE", "/api/v1/pods?watch=False&watch=1",
	"/api/v1/pods?watch=1&watch=0", "/api/v1/pods?watch", "/api/v1/pods?watch=", "/api/v1/pods?%77atch=1",
	"/api/v1/pods?w%61tch=true", "/api/v1/pods?watch=%66alse", "/api/v1/pods?watch=fal%C5%BFe",
	"/api/v1/pods?limit=x&watch=fal%C5%BFe", "/api/v1/pods?watch=FAL%C5%BFE&limit=x", "/api/v1/pods?watch=%C5%BFalse",
	"/api/v1/pods?watch=+false", "/api/v1/pods?watch=%zz", "/api/v1/pods?watch=%zz&watch=1",
	"/api/v1/pods?watch;x=1", "/api/v1/pods?a=1;watch=1", "/api/v1/pods?watch=1;", "/api/v1/pods?&&watch=1&",
	"/api/v1/pods?limit=x&watch=1", "/api/v1/pods?resourceVersion=0&watch=1&allowWatchBookmarks=true",
	"/api/v1/pods?fieldSelector=metadata.name%3Dp&watch=1", "/api/v1/pods?wat%ch=1",
	"/api/v1/namespaces/default/pods", "/api/v1/namespaces/default/pods?watch=1",
	"/api/v1/namespaces/default/pods/p", "/api/v1/namespaces/default/pods/p?watch=1",
	"/api/v1/namespaces/default/pods/p/status", "/api/v1/namespaces/default/pods/p/exec?command=ls",
	"/api/v1/namespaces/default/pods/p/attach", "/api/v1/namespaces/default/pods/p/portforward",
	"/api/v1/namespaces/default/pods/p/log?follow=true", "/api/v1/namespaces/default/pods/p/proxy",
	"/api/v1/namespaces/default/pods/p/proxy/a/b", "/api/v1/namespaces/default/pods/p/eviction",
	"/api/v1/namespaces/default/pods/p/ephemeralcontainers", "/api/v1/namespaces/default/services/s/proxy/x",
	"/api/v1/namespaces/default/services/https:s:443/proxy/", "/api/v1/nodes/n/proxy", "/api/v1/nodes/n/proxy/metrics",
	"/api/v1/nodes/n/proxy/logs/exec", "/api/v1/proxy/namespaces/default/services/s", "/api/v1/proxy",
	"/api/v1/proxy/", "/api/v1/watch", "/api/v1/watch/", "/api/v1/watch/pods", "/api/v1/watch/namespaces/d/pods",
	"/api/v1/watch/namespaces/d/pods/p", "/api/v1/watch/namespaces/d/pods/p/exec", "/api/v1/proxy/nodes/n/exec",
	"/api/v1/namespaces", "/api/v1/namespaces/d", "/api/v1/namespaces/d/status", "/api/v1/namespaces/d/finalize",
	"/api/v1/namespaces/d/exec", "/api/v1/namespaces/d/log", "/api/v1/namespaces/status/log",
	"/api/v1/namespaces/d/pods/log/exec", "/api/v1/namespaces/d/configmaps/log", "/api/v1/namespaces//pods/p/exec",
	"/api/v1//pods/p/exec", "/api/v1/pods//exec", "/api/v1/pods/p/exec/", "/api/v1/pods/p/exec/x/y",
	"/apis/batch/v1/jobs", "/apis/batch/v1/jobs?watch=1", "/apis/batch/v1/namespaces/d/jobs/j/status",
	"/apis/batch/v1/namespaces/d/jobs/j/log", "/apis/batch/v1/watch/jobs", "/apis/batch/v1/watch",
	"/apis/example.io/v1/namespaces/d/things/t/proxy", "/apis/example.io/v1/proxy/things/t",
	"/apis/batch//jobs", "/apis//v1/jobs?watch=1", "/apis/batch/v1/jobs/", "/api/v1/pods/",
	"/api/v1/pods?watch=1#frag", "/debug/pprof/../../api/v1/pods", "/api/v1/namespaces/./pods/p/exec",
	"/api/v1/namespaces/d/pods/p/../exec", "/apis/batch%2Fv1/jobs", "//api/v1/pods", "/api/v1/pods/p/%65xec",
	"*", "api/v1/pods",
	// At and over the longest query the script parses: a watch, a list, a get.
	"/api/v1/pods?watch=1&a=" + strings.Repeat("x", queryParseMax-10),
	"/api/v1/pods?watch=1&a=" + strings.Repeat("x", queryParseMax-9),
	"/api/v1/pods?a=" + strings.Repeat("%61=1&", 2000),
	"/api/v1/pods?%77%61%74%63%67=1&%77%61%74%63%68=1", "/api/v1/pods?%77%61%74%63%68=%zz&watch=1",
	"/api/v1/pods?watch%3D1=1&watch=0", "/api/v1/pods?wwatch=1&watch=0", "/api/v1/pods?%57atch=1",
	"/api/v1/namespaces/d/pods/p?watch=1&a=" + strings.Repeat("x", 2*queryParseMax),
}

var requestClassMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "WATCH", "PROXY", "get", ""}

// TestRequestClass: request_class.lua classes every request as k8s.io/apiserver itself does
// (apiserverClass), with every method; and an Upgrade header makes any request "upgrade".
func TestRequestClass(t *testing.T) {
	class := requestClassVM(t)
	for _, target := range requestClassTargets {
		if strings.Contains(target, "#") || target == "*" || target == "api/v1/pods" {
			// Not a request-target Go's server takes as a path (a fragment; no leading /):
			// unclassified by the script.
			if got := class("GET", target, false); got != "unclassified" && !strings.Contains(target, "#") {
				t.Errorf("GET %s: %s, want unclassified", target, got)
			}
			continue
		}
		for _, method := range requestClassMethods {
			if got, want := class(method, target, false), apiserverClass(t, method, target); got != want {
				t.Errorf("%s %s: %s, the apiserver's %s", method, target, got, want)
			}
			if got := class(method, target, true); got != contract.ClassUpgrade {
				t.Errorf("%s %s with Upgrade: %s, want upgrade", method, target, got)
			}
		}
	}
}

// FuzzRequestClass: whatever the method and path, request_class.lua and the apiserver agree,
// and a request the script reads as a read (retried after a reset) or a watch is one to the
// apiserver.
func FuzzRequestClass(f *testing.F) {
	for _, t := range requestClassTargets {
		f.Add("GET", t)
	}
	f.Add("POST", "/api/v1/namespaces/d/pods/p/exec")
	class := requestClassVM(f)
	f.Fuzz(func(t *testing.T, method, target string) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, "# \t\r\n\x00") || strings.ContainsFunc(method, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			t.Skip()
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			t.Skip()
		}
		if got, want := class(method, target, false), apiserverClass(t, method, target); got != want {
			t.Errorf("%q %q: %s, the apiserver's %s", method, target, got, want)
		}
	})
}

// BenchmarkRequestClass: what the classifier costs for a short list and for 60 KiB queries
// (15,000 pairs, plain and escaped), which it does not parse: compare them as ratios in one
// run (gopher-lua here; Envoy runs LuaJIT).
func BenchmarkRequestClass(b *testing.B) {
	class := requestClassVM(b)
	for _, c := range []struct{ name, target string }{
		{"short", "/api/v1/pods?limit=500"},
		{"query-4KiB-plain", "/api/v1/pods?" + strings.Repeat("a=1&", queryParseMax/4)},
		{"query-4KiB-escaped", "/api/v1/pods?" + strings.Repeat("%61=1&", queryParseMax/6)},
		{"query-4KiB-almost-watch", "/api/v1/pods?" + strings.Repeat("%77%61%74%63%67=1&", queryParseMax/18)},
		{"query-60KiB", "/api/v1/pods?" + strings.Repeat("a=1&", 15000)},
		{"query-60KiB-escaped", "/api/v1/pods?" + strings.Repeat("%61=1&", 10000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				class("GET", c.target, false)
			}
		})
	}
}
