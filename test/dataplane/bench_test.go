package dataplane

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkRequestPath times the same GET straight to a fake apiserver and through the data
// plane, on a line-rate route (ext_proc off) and on a route whose decision extproc makes (the
// real extproc over a unix socket), each with a bearer token and with a client certificate
// (whose identity the Lua filter sets), in turn in one run over kept-alive TLS connections.
// It reports each path, what the data plane adds, and the client certificate's cost against
// the bearer token's on the line-rate route (goal: within 10 %), so a change to the request
// path shows up as a ratio, whatever the machine. (The stand-in runs the script on
// gopher-lua, an interpreter; Envoy runs LuaJIT.)
func BenchmarkRequestPath(b *testing.B) {
	e := newEnv(b, envOptions{})
	through := e.client(nil)
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.peerCA.Cert)
	proxy := e.pki.proxyClient.tls(b)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes.default.svc", Certificates: []tls.Certificate{proxy}}, ForceAttemptHTTP2: true}
	b.Cleanup(tr.CloseIdleConnections)
	direct := &http.Client{Transport: tr}

	get := func(c *http.Client, url string) time.Duration {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("GET %s: %d", url, resp.StatusCode)
		}
		return time.Since(start)
	}
	withCert := e.client(e.userCert("system:node:worker-1", "system:nodes"))
	lineRate, decided := e.base+"/api/v1/namespaces/default/pods", e.base+"/apis/batch/v1/namespaces/default/jobs"
	paths := []struct {
		name   string
		client *http.Client
		url    string
	}{
		{"direct", direct, "https://" + e.apiservers["cp-a"].addr() + "/api/v1/namespaces/default/pods"},
		{"line-rate", through, lineRate},
		{"line-rate-cert", withCert, lineRate},
		{"ext_proc", through, decided},
		{"ext_proc-cert", withCert, decided},
	}
	for _, p := range paths {
		get(p.client, p.url) // connections up before the clock counts
	}
	streams := e.stat(extProcStreamsStat)
	luaUS, luaCount := e.stat("dataplane.timing.lua_request_headers_us"), e.stat("dataplane.timing.lua_request_headers_count")
	sum := make([]time.Duration, len(paths))
	for b.Loop() {
		for i, p := range paths {
			sum[i] += get(p.client, p.url)
		}
	}
	n := float64(b.N)
	for i, p := range paths {
		b.ReportMetric(float64(sum[i].Microseconds())/n, p.name+"-µs/op")
		if i > 0 {
			b.ReportMetric(float64(sum[i]-sum[0])/n/1e3, p.name+"-added-µs/op")
		}
	}
	b.ReportMetric(float64(sum[2])/float64(sum[1]), "cert/token-line-rate-ratio")
	// The Lua filter's own time per request, as the data plane measured it: what gopher-lua
	// costs here (every request runs the filter; it does nothing without a certificate).
	if c := e.stat("dataplane.timing.lua_request_headers_count") - luaCount; c > 0 {
		b.ReportMetric(float64(e.stat("dataplane.timing.lua_request_headers_us")-luaUS)/float64(c), "lua-filter-µs/req")
	}
	// Only the two ext_proc paths open streams.
	b.ReportMetric(float64(e.stat(extProcStreamsStat)-streams)/n, "ext_proc-streams/op")
}
