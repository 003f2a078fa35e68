package dataplane

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// answerAll makes every apiserver of e answer every request but /readyz itself with status
// and the given headers, as an apiserver passing a backend's answer through or refusing.
func answerAll(e *env, status int, headers map[string]string) {
	for name, f := range e.apiservers {
		f.mu.Lock()
		f.serve = func(w http.ResponseWriter, r *http.Request) bool {
			for k, v := range headers {
				w.Header().Set(k, v)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"answered by %s","code":%d}`, name, status)
			return true
		}
		f.mu.Unlock()
	}
}

// attempts sends method path once through e and returns how many requests the apiservers
// got for it and the answer's status.
func attempts(t *testing.T, e *env, c *http.Client, method, path string) (int, int) {
	t.Helper()
	before := 0
	for _, f := range e.apiservers {
		before += len(f.requests())
	}
	r := e.do(c, method, path, nil)
	after := 0
	for _, f := range e.apiservers {
		after += len(f.requests())
	}
	return after - before, r.status
}

// TestNoRetryOfForwardedRequests: nothing that may have reached a backend is sent twice
// (snapshot's retryPolicy), checked end to end on the generated configuration: the Lua
// filter's class, the route variants, the retry policy and Envoy's retry decision.
//
// With every apiserver answering 503 and Retry-After — an apiserver's own refusal, or a
// backend's answer that it passed through — a POST to a node, service or pod proxy, the
// deprecated proxy verb or an aggregated group/version (metrics.k8s.io/v1beta1 in the
// fixture: its APIService names a service) reaches an apiserver once; a write to a built-in
// resource or a CRD (stable.example.com, served by the apiservers themselves) is retried on
// the 503 (twice: three attempts); reads are retried, aggregated ones included, but not
// long-running ones (a proxy GET). A 500 with Retry-After (a storage ServerTimeout, after
// which the write may have reached etcd) is retried for reads only, and a response with
// x-envoy-ratelimited never (Envoy's RetryStateImpl::wouldRetryFromHeaders).
func TestNoRetryOfForwardedRequests(t *testing.T) {
	e := newEnv(t, envOptions{fixture: "crd-apiservice"})
	c := e.client(nil)
	cases := []struct {
		status          int
		headers         map[string]string
		method, path    string
		wantTries       int
		alsoCertificate bool
	}{
		{503, retryAfter, "POST", "/api/v1/nodes/n1/proxy/configz", 1, true},
		{503, retryAfter, "POST", "/api/v1/nodes/n1:10250/proxy/", 1, false},
		{503, retryAfter, "PUT", "/api/v1/nodes/n1/proxy", 1, false},
		{503, retryAfter, "POST", "/api/v1/namespaces/default/services/https:web:443/proxy/submit", 1, true},
		{503, retryAfter, "POST", "/api/v1/namespaces/default/pods/web-0/proxy/submit", 1, true},
		{503, retryAfter, "DELETE", "/api/v1/namespaces/default/pods/web-0:8080/proxy/item/1", 1, false},
		{503, retryAfter, "POST", "/api/v1/proxy/namespaces/default/pods/web-0/submit", 1, true},
		{503, retryAfter, "POST", "/api/v1/proxy/nodes/n1/x", 1, false},
		{503, retryAfter, "GET", "/api/v1/nodes/n1/proxy/configz", 1, false},
		{503, retryAfter, "POST", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods", 1, true},
		{503, retryAfter, "PATCH", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/p", 1, false},
		{429, retryAfter, "DELETE", "/apis/metrics.k8s.io/v1beta1/nodes/n1", 1, false},
		{503, retryAfter, "GET", "/apis/metrics.k8s.io/v1beta1/nodes", 3, false},
		{503, retryAfter, "POST", "/api/v1/namespaces/default/configmaps", 3, true},
		{503, nil, "POST", "/api/v1/namespaces/default/configmaps", 3, false},
		{429, retryAfter, "PUT", "/apis/apps/v1/namespaces/default/deployments/d", 3, false},
		{503, retryAfter, "POST", "/apis/stable.example.com/v1/namespaces/default/crontabs", 3, false},
		{500, retryAfter, "POST", "/api/v1/namespaces/default/configmaps", 1, true},
		{504, retryAfter, "DELETE", "/api/v1/namespaces/default/configmaps/c", 1, false},
		{500, retryAfter, "GET", "/api/v1/namespaces/default/configmaps", 3, false},
		{503, nil, "GET", "/api/v1/namespaces/default/configmaps", 1, false},
		{503, map[string]string{"Retry-After": "1", "X-Envoy-Ratelimited": "true"}, "POST", "/api/v1/namespaces/default/configmaps", 1, false},
	}
	cert := e.userCert("alice", "devs")
	for _, tc := range cases {
		answerAll(e, tc.status, tc.headers)
		clients := map[string]*http.Client{"token": c}
		if tc.alsoCertificate {
			clients["certificate"] = e.client(cert)
		}
		for who, cl := range clients {
			tries, status := attempts(t, e, cl, tc.method, tc.path)
			if tries != tc.wantTries || status != tc.status {
				t.Errorf("%s %s (%s) answered %d %s: %d attempts, status %d; want %d, %d", tc.method, tc.path, who, tc.status, headerNames(tc.headers), tries, status, tc.wantTries, tc.status)
			}
		}
	}
}

var retryAfter = map[string]string{"Retry-After": "1"}

func headerNames(h map[string]string) string {
	var n []string
	for k := range h {
		n = append(n, k)
	}
	return "[" + strings.Join(n, " ") + "]"
}
