package dataplane

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// kv is one request header, name lower-case as Envoy keeps them.
type kv struct{ name, value string }

// headerList is a request's headers in order, as Envoy's header map holds them.
type headerList []kv

func (h headerList) get(name string) (string, bool) {
	var vals []string
	for _, e := range h {
		if e.name == name {
			vals = append(vals, e.value)
		}
	}
	if len(vals) == 0 {
		return "", false
	}
	// Envoy joins several values with "," when a single value is needed (header matching).
	return strings.Join(vals, ","), true
}

func (h headerList) values(name string) []string {
	var out []string
	for _, e := range h {
		if e.name == name {
			out = append(out, e.value)
		}
	}
	return out
}

func (h *headerList) del(name string) {
	h.delFunc(func(n string) bool { return n == name })
}

func (h *headerList) delFunc(f func(string) bool) {
	out := (*h)[:0]
	for _, e := range *h {
		if !f(e.name) {
			out = append(out, e)
		}
	}
	*h = out
}

func (h *headerList) set(name, value string) {
	h.del(name)
	*h = append(*h, kv{name, value})
}

func (h *headerList) add(name, value string) { *h = append(*h, kv{name, value}) }

// stream is one downstream request going through the HTTP connection manager.
type stream struct {
	d      *DataPlane
	cfg    *config
	lc     *listenerCfg
	hcm    *hcmCfg
	w      http.ResponseWriter
	r      *http.Request
	method string
	path   string
	host   string // :authority
	scheme string
	hdr    headerList

	upgrade string // lower-case upgrade type, "" if none
	flags   []string
	done    bool // the response was started (upstream) or sent (local reply)

	// ext is the ext_proc stream kept open for the response headers (nil if none).
	ext *extProcStream
	// extHeld is the ext_proc stream an Envoy before 1.37 keeps for the request's life after
	// its last response (envoyVersion.extProcStreamForRequestLife); reset ends the request
	// when that stream fails.
	extHeld *extProcStream
	reset   context.CancelCauseFunc
	// extProcFailOpen is the route's overrides.failure_mode_allow, if it has one.
	extProcFailOpen *bool
	// dynamicMetadata is the request's dynamic metadata (StreamInfo::dynamicMetadata) by
	// namespace: what ext_proc accepted (receiving_namespaces). The router reads "envoy.lb".
	dynamicMetadata map[string]*structpb.Struct
}

func (st *stream) prefix() string { return "http." + st.hcm.statPrefix + "." }

func (d *DataPlane) handler(listenerName string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := d.config()
		lc := cfg.listeners[listenerName]
		if lc == nil {
			http.Error(w, "listener removed", http.StatusServiceUnavailable)
			return
		}
		w, end := d.beginStream("http."+lc.hcm.statPrefix+".", w, r)
		defer end()
		ctx, reset := context.WithCancelCause(r.Context())
		defer reset(nil)
		r = r.WithContext(ctx)
		st := &stream{d: d, cfg: cfg, lc: lc, hcm: lc.hcm, w: w, r: r, method: r.Method, host: r.Host, scheme: "http", reset: reset}
		if r.TLS != nil {
			st.scheme = "https"
		}
		// :path as received: Go's servers keep the raw request-target (HTTP/1) or :path
		// (HTTP/2) in RequestURI. An absolute-form target ("http://h/p", HTTP/1) becomes its
		// path and query, as Envoy's HTTP/1 codec makes it.
		st.path = r.RequestURI
		if !strings.HasPrefix(st.path, "/") {
			st.path = r.URL.RequestURI()
		}
		start := time.Now()
		st.serve()
		d.stats.timing("dataplane.timing.downstream_rq", start)
	})
}

// hopByHop are the connection-specific request headers Envoy's HTTP connection manager
// removes before anything else sees the request (RFC 9110 7.6.1; Envoy re-adds
// "connection: upgrade" and "upgrade" for an upgrade it accepts). te survives only as
// "trailers".
var hopByHop = []string{"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}

func (st *stream) serve() {
	d := st.d
	d.stats.inc(st.prefix() + "downstream_rq_total")
	defer st.closeExtProc()

	names := make([]string, 0, len(st.r.Header))
	for k := range st.r.Header {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		for _, v := range st.r.Header[k] {
			st.hdr.add(strings.ToLower(k), v)
		}
	}

	// Early header mutation: applied first, before routing and before any HTTP filter
	// (HttpConnectionManager.early_header_mutation_extensions).
	for _, rm := range st.hcm.early {
		if rm.matcher != nil {
			st.hdr.delFunc(rm.matcher.match)
		} else {
			st.hdr.del(rm.exact)
		}
	}

	// Upgrades (HttpConnectionManager.upgrade_configs): an HTTP/1.1 request with
	// "connection: upgrade" and an upgrade header. A type that is not configured is refused
	// with 403 (response code details "upgrade_failed").
	if up, ok := st.hdr.get("upgrade"); ok && st.r.ProtoMajor == 1 && connectionHasUpgrade(st.hdr.values("connection")) {
		st.upgrade = strings.ToLower(up)
		if !st.hcm.upgrades[st.upgrade] {
			st.localReply(http.StatusForbidden, "", "upgrade_failed")
			return
		}
	}
	upgradeValue, _ := st.hdr.get("upgrade")
	for _, h := range hopByHop {
		st.hdr.del(h)
	}
	if te, ok := st.hdr.get("te"); ok && !strings.EqualFold(strings.TrimSpace(te), "trailers") {
		st.hdr.del("te")
	}
	if st.upgrade != "" {
		st.hdr.add("connection", "upgrade")
		st.hdr.add("upgrade", upgradeValue)
	}

	st.mutateRequestHeaders()

	rt := st.matchRoute()
	d.log.Debug("request", "path", st.path, "route", routeName(rt), "tls", st.r.TLS != nil && len(st.r.TLS.PeerCertificates) > 0)
	// The HTTP filters in their configured order, then the router. A filter that clears the
	// route cache makes the route be matched again, with the headers as it left them, before
	// the next filter (the connection manager recomputes a cleared route when it is next
	// asked for it: the next filter's per-route configuration, or the router).
	for _, f := range st.hcm.filters {
		clear := false
		switch {
		case f.lua != nil:
			start := time.Now()
			c, ok := st.runLua(f.lua, rt)
			d.stats.timing("dataplane.timing.lua_request_headers", start)
			if !ok {
				return
			}
			clear = c
		case f.extProc != nil:
			ep := f.extProc
			if !ep.sendHeaders || (rt != nil && rt.extProcDisabled[ep.filterName]) {
				continue
			}
			var md []kv
			if rt != nil {
				md = rt.extProcMetadata[ep.filterName]
				if v, ok := rt.extProcFailOpen[ep.filterName]; ok {
					st.extProcFailOpen = &v
				}
			}
			start := time.Now()
			c, ok := st.runExtProc(ep, md)
			d.stats.timing("dataplane.timing.ext_proc_request_headers", start)
			if !ok {
				return
			}
			// route_cache_action / clear_route_cache.
			clear = c
		}
		if clear {
			rt = st.matchRoute()
		}
	}
	st.router(rt)
}

func connectionHasUpgrade(vals []string) bool {
	for _, v := range vals {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// mutateRequestHeaders does what Envoy's connection manager does to every request before
// routing (ConnectionManagerUtility::mutateRequestHeaders), for the options we use.
func (st *stream) mutateRequestHeaders() {
	remote, _, _ := net.SplitHostPort(st.r.RemoteAddr)
	if st.hcm.useRemoteAddress {
		// use_remote_address: the downstream address is trusted and appended to
		// x-forwarded-for (xff_num_trusted_hops 0); a request from an internal address
		// (RFC 1918 / loopback) with no x-forwarded-for before is marked x-envoy-internal,
		// any other request loses a client-sent x-envoy-internal. x-forwarded-proto is set
		// to the downstream scheme on the edge.
		// A loopback peer is replaced by the server's own address (mutateRequestHeaders:
		// isLoopbackAddress → config.localAddress()).
		appended := remote
		if ip, err := netip.ParseAddr(remote); err == nil && ip.IsLoopback() {
			appended = localAddress()
		}
		xff, had := st.hdr.get("x-forwarded-for")
		if had {
			st.hdr.set("x-forwarded-for", xff+","+appended)
		} else {
			st.hdr.set("x-forwarded-for", appended)
		}
		st.hdr.del("x-envoy-internal")
		if ip, err := netip.ParseAddr(remote); err == nil && !had && (ip.IsLoopback() || ip.IsPrivate()) {
			st.hdr.set("x-envoy-internal", "true")
		}
		st.hdr.set("x-forwarded-proto", st.scheme)
	} else if _, ok := st.hdr.get("x-forwarded-proto"); !ok {
		st.hdr.set("x-forwarded-proto", st.scheme)
	}
	// generate_request_id (default true): an edge request gets a fresh x-request-id
	// (preserve_external_request_id is false).
	if st.hcm.useRemoteAddress {
		st.hdr.set("x-request-id", uuid4())
	} else if _, ok := st.hdr.get("x-request-id"); !ok {
		st.hdr.set("x-request-id", uuid4())
	}
	// forward_client_cert_details: SANITIZE removes the client's XFCC; SANITIZE_SET also
	// sets a new one when the connection has a verified client certificate.
	st.hdr.del("x-forwarded-client-cert")
	if st.hcm.fcc == hcmv3.HttpConnectionManager_SANITIZE_SET && st.r.TLS != nil && len(st.r.TLS.PeerCertificates) > 0 {
		var local = st.localCert()
		st.hdr.set("x-forwarded-client-cert", xfccValue(local, st.r.TLS.PeerCertificates[0], st.hcm.certSubject, st.hcm.certURI))
	}
}

func (st *stream) localCert() *x509.Certificate {
	if st.lc.tls == nil {
		return nil
	}
	c, err := secretKeyPair(st.cfg.secrets[st.lc.tls.certSecret])
	if err != nil {
		return nil
	}
	return c.Leaf
}

func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// matchRoute finds the route as Envoy's router does: the virtual host by :authority (exact
// domain, then the longest suffix wildcard "*.x", then the longest prefix wildcard "x.*",
// then "*"), then the first route in order whose header, query parameter and path matchers
// all match. Like Envoy, each route checks its header matchers, then its query parameter
// matchers, and its path only when those matched: every RouteEntryImplBase subclass's
// matches() (PrefixRouteEntryImpl, PathRouteEntryImpl, RegexRouteEntryImpl,
// PathSeparatedPrefixRouteEntryImpl; source/common/router/config_impl.cc) calls
// RouteEntryImplBase::matchRoute (headers, then query parameters, each returning early on a
// mismatch) before its path matcher. The outcome is the same in any order; the order is
// Envoy's so that benchmarks do the work Envoy does.
func (st *stream) matchRoute() *route {
	rc := st.cfg.routes[st.hcm.rdsName]
	if rc == nil {
		return nil
	}
	vh := selectVirtualHost(rc.vhosts, strings.ToLower(st.host))
	if vh == nil {
		return nil
	}
	// Path matching ignores the query and fragment (Http::PathUtil::removeQueryAndFragment,
	// source/common/http/path_utility.cc): everything from the first '?' or '#'. With
	// normalize_path false, merge_slashes false and path_with_escaped_slashes_action
	// KEEP_UNCHANGED (the only values implemented) Envoy matches the :path as received:
	// %-escapes, "//" and dot-segments stay as they are.
	path := st.path
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	for _, r := range vh.routes {
		if !st.headersMatch(r.headers) || !queryMatch(st.path, r.query) {
			continue
		}
		switch {
		case r.prefix != nil:
			if !strings.HasPrefix(path, *r.prefix) {
				continue
			}
		case r.sepPrefix != nil:
			if !pathSeparatedPrefixMatch(path, *r.sepPrefix) {
				continue
			}
		case r.path != nil:
			if path != *r.path {
				continue
			}
		case r.re != nil:
			if !r.re.MatchString(path) {
				continue
			}
		}
		return r
	}
	return nil
}

// queryMatch: every matcher must match the request's query. As Envoy
// (source/common/router/config_utility.cc, QueryParameterMatcher::matches, on the query
// RouteEntryImplBase::matchRoute parses with Http::Utility::QueryParamsMulti::parseQueryString,
// source/common/http/utility.cc): the query after the first '?' is split at '&', each part
// at its first '=' (none: the value is ""); parseQueryString calls parseParameters with
// decode_params false, so neither names nor values are percent-decoded ("?%77atch=1" has no
// parameter "watch"; only parseAndDecodeQueryString decodes, and route matching does not use
// it). Only a parameter's first value is matched; present_match asks for the name only. The
// stand-in still ends the query at a '#', which parseParameters does not do (what reaches it
// depends on how Envoy's codec and HCM treat a fragment in :path, not modelled here).
func queryMatch(path string, ms []*queryMatcher) bool {
	if len(ms) == 0 {
		return true
	}
	first := map[string]string{}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		q := path[i+1:]
		if j := strings.IndexByte(q, '#'); j >= 0 {
			q = q[:j]
		}
		for _, part := range strings.Split(q, "&") {
			if part == "" {
				continue
			}
			name, value, _ := strings.Cut(part, "=")
			if _, ok := first[name]; !ok {
				first[name] = value
			}
		}
	}
	for _, m := range ms {
		v, ok := first[m.name]
		if !ok || m.str != nil && !m.str.match(v) {
			return false
		}
	}
	return true
}

// pathSeparatedPrefixMatch is RouteMatch.path_separated_prefix (case sensitive), as
// PathSeparatedPrefixRouteEntryImpl::matches does it (source/common/router/config_impl.cc):
// the path without query and fragment starts with the prefix, and is the prefix or goes on
// with '/'. "/apis/batch/v1" matches "/apis/batch/v1", "/apis/batch/v1/" and
// "/apis/batch/v1/jobs", not "/apis/batch/v1beta1" nor "/apis/batch%2Fv1".
func pathSeparatedPrefixMatch(path, prefix string) bool {
	return strings.HasPrefix(path, prefix) && (len(path) == len(prefix) || path[len(prefix)] == '/')
}

func selectVirtualHost(vhs []*virtualHost, host string) *virtualHost {
	var star, best *virtualHost
	bestLen, bestKind := -1, 3
	for _, vh := range vhs {
		for _, d := range vh.domains {
			switch {
			case d == "*":
				if star == nil {
					star = vh
				}
			case d == host:
				return vh
			case strings.HasPrefix(d, "*") && strings.HasSuffix(host, d[1:]) && len(host) > len(d)-1:
				if bestKind > 1 || (bestKind == 1 && len(d) > bestLen) {
					best, bestLen, bestKind = vh, len(d), 1
				}
			case strings.HasSuffix(d, "*") && strings.HasPrefix(host, d[:len(d)-1]) && len(host) > len(d)-1:
				if bestKind > 2 || (bestKind == 2 && len(d) > bestLen) {
					best, bestLen, bestKind = vh, len(d), 2
				}
			}
		}
	}
	if best != nil {
		return best
	}
	return star
}

// headersMatch: every matcher must match the request's headers.
func (st *stream) headersMatch(ms []*headerMatcher) bool {
	for _, m := range ms {
		if !m.matches(st.headerForMatch) {
			return false
		}
	}
	return true
}

// matches follows HeaderMatcher: present_match true matches a present header (false: an
// absent one); string_match needs the header present and matches the (","-joined) value;
// invert_match inverts the result.
func (m *headerMatcher) matches(get func(name string) (string, bool)) bool {
	v, ok := get(m.name)
	var res bool
	switch {
	case m.present != nil:
		res = ok == *m.present
	case m.str != nil:
		res = ok && m.str.match(v)
	}
	return res != m.invert
}

func (st *stream) headerForMatch(name string) (string, bool) {
	switch name {
	case ":method":
		return st.method, true
	case ":path":
		return st.path, true
	case ":authority", "host":
		return st.host, true
	case ":scheme":
		return st.scheme, true
	}
	return st.hdr.get(name)
}

// localReply answers the downstream request from the data plane itself (Envoy's
// sendLocalReply), after local_reply_config. extra are headers to add (ext_proc immediate
// responses).
func (st *stream) localReply(status int, body, details string, extra ...kv) {
	if st.done {
		return
	}
	st.done = true
	lr := st.hcm.mapLocalReply(status, body, details, st.flags)
	d := st.d
	d.stats.inc("dataplane.local_replies")
	d.stats.inc("dataplane.local_replies." + strconv.Itoa(lr.status))
	for _, f := range st.flags {
		d.stats.inc("dataplane.response_flags." + f)
	}
	d.stats.inc(fmt.Sprintf("%sdownstream_rq_%dxx", st.prefix(), lr.status/100))
	d.log.Debug("local reply", "status", lr.status, "details", details, "flags", st.flags)
	h := st.w.Header()
	for _, e := range extra {
		h.Add(e.name, e.value)
	}
	for _, e := range lr.headers {
		h.Set(e.name, e.value)
	}
	// Envoy's Utility::sendLocalReply sets the content type only when the headers (an
	// ext_proc immediate response's included) have none, or when local_reply_config
	// rewrote the body.
	if lr.contentType != "" && (h.Get("Content-Type") == "" || lr.rewritten) {
		h.Set("Content-Type", lr.contentType)
	}
	h.Set("Content-Length", strconv.Itoa(len(lr.body)))
	if !st.hcm.passThroughServer {
		h.Set("Server", "envoy")
	}
	st.w.WriteHeader(lr.status)
	_, _ = st.w.Write(lr.body)
}

func (st *stream) addFlag(f string) {
	for _, x := range st.flags {
		if x == f {
			return
		}
	}
	st.flags = append(st.flags, f)
}

func routeName(r *route) string {
	if r == nil {
		return "<none>"
	}
	return r.name
}

// localAddress is Envoy's LocalInfo address with the default --local-address-ip-version v4
// (Network::Utility::getLocalAddress): the first IPv4 address of the host's interfaces that
// is not loopback, else 127.0.0.1.
var localAddress = sync.OnceValue(func() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
})
