package dataplane

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

// HealthListener is a static listener of the bootstrap (the chart's and envoy/*.yaml's
// "envoy-health"): an HTTP connection manager with an inline route configuration of exact
// path routes, each with exact header matches, to a STATIC cluster (the bootstrap's
// "envoy-admin", the admin's address), and the router filter.
type HealthListener struct {
	Name       string
	Address    string // host:port (Options.ListenerAddress may override it by Name)
	StatPrefix string
	Routes     []StaticRoute
}

// StaticRoute is one route of a HealthListener.
type StaticRoute struct {
	Path    string            // match.path: the path without the query, exactly
	Headers map[string]string // match.headers: name -> string_match.exact (":method" too)
	Cluster string            // route.cluster
	// Upstream is the cluster's one endpoint (host:port) and ConnectTimeout its
	// connect_timeout.
	Upstream       string
	ConnectTimeout time.Duration
}

// startHealthListener binds the static listener. What it does, as Envoy's HCM and router: a
// request matching no route is a 404 with an empty body (NR); a matching one is forwarded to
// the route's cluster, and a connection failure is a 503 with Envoy's local reply body (UF)
// (source/common/router/router.cc). HTTP/1.1 only (Envoy's codec_type AUTO also takes
// HTTP/2 with prior knowledge: the kubelet's probes and Prometheus speak HTTP/1.1). Its
// connection manager drains as the listeners' do and it stops with them
// (drain.go, DRAIN.md); its stats are http.<stat_prefix>.*.
func (d *DataPlane) startHealthListener(h HealthListener) error {
	addr := h.Address
	if o, ok := d.opts.ListenerAddress[h.Name]; ok {
		addr = o
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("dataplane: static listener %s: %w", h.Name, err)
	}
	type route struct {
		StaticRoute
		proxy *httputil.ReverseProxy
	}
	var routes []route
	for _, r := range h.Routes {
		target := &url.URL{Scheme: "http", Host: r.Upstream}
		timeout := r.ConnectTimeout
		if timeout <= 0 {
			timeout = 5 * time.Second
		}
		p := httputil.NewSingleHostReverseProxy(target)
		p.Transport = &http.Transport{
			DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
				return (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, a)
			},
			DisableCompression: true,
		}
		cluster := r.Cluster
		p.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
			d.log.Debug("static route: upstream failed", "listener", h.Name, "cluster", cluster, "error", err)
			d.stats.inc("cluster." + cluster + ".upstream_cx_connect_fail")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("upstream connect error or disconnect/reset before headers. reset reason: connection failure"))
		}
		routes = append(routes, route{r, p})
	}
	prefix := "http." + h.StatPrefix + "."
	d.health = &http.Server{ConnContext: connContext, ConnState: d.countConns(func() string { return prefix }), Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		d.stats.inc(prefix + "downstream_rq_total")
		w, end := d.beginStream(prefix, w, req)
		defer end()
		for _, r := range routes {
			if req.URL.Path != r.Path {
				continue
			}
			match := true
			for name, want := range r.Headers {
				got := req.Header.Get(name)
				if name == ":method" {
					got = req.Method
				}
				if got != want {
					match = false
					break
				}
			}
			if match {
				d.stats.inc("cluster." + r.Cluster + ".upstream_rq_total")
				r.proxy.ServeHTTP(w, req)
				return
			}
		}
		d.stats.inc(prefix + "no_route")
		w.WriteHeader(http.StatusNotFound)
	})}
	d.healthAdr = lis.Addr().String()
	d.mu.Lock() // the admin's /drain_listeners may already run (stopListeners)
	d.healthLn = lis
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		_ = d.health.Serve(lis)
	}()
	return nil
}

// HealthListenerAddr is the bound address of the static health listener, "" without one.
func (d *DataPlane) HealthListenerAddr() string { return d.healthAdr }
