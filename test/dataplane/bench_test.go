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
// real extproc over a unix socket), in turn in one run over kept-alive TLS connections. It
// reports each path and what the data plane adds, so a change to the request path shows up as
// a ratio, whatever the machine.
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
	urls := []string{
		"https://" + e.apiservers["cp-a"].addr() + "/api/v1/namespaces/default/pods", // direct
		e.base + "/api/v1/namespaces/default/pods",                                   // line rate
		e.base + "/apis/batch/v1/namespaces/default/jobs",                            // ext_proc
	}
	clients := []*http.Client{direct, through, through}
	for i, u := range urls {
		get(clients[i], u) // connections up before the clock counts
	}
	var sum [3]time.Duration
	for b.Loop() {
		for i, u := range urls {
			sum[i] += get(clients[i], u)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(sum[0].Microseconds())/n, "direct-µs/op")
	b.ReportMetric(float64(sum[1].Microseconds())/n, "line-rate-µs/op")
	b.ReportMetric(float64(sum[2].Microseconds())/n, "ext_proc-µs/op")
	b.ReportMetric(float64(sum[1]-sum[0])/n/1e3, "line-rate-added-µs/op")
	b.ReportMetric(float64(sum[2]-sum[0])/n/1e3, "ext_proc-added-µs/op")
}
