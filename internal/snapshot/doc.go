// Package snapshot translates a plan (internal/plan) into the Envoy configuration of kube-mvp:
// one listener, one route table, the apiserver clusters and their endpoints, the extproc
// cluster and the TLS secrets, all delivered over ADS. It decides nothing: which clusters
// exist, which group/versions need extproc and where each resource goes are the plan's. It
// is pure: no I/O, no clock; equal inputs give byte-identical resources and equal
// content-hash versions on every replica.
//
// # Listener "kube-apiserver"
//
//   - Downstream TLS from SDS: the serving certificate (secret kube-mvp-serving-cert) and, when
//     a client CA is configured (kube-mvp-client-ca), client certificates verified against it
//     but not required, because bearer-token clients present none. ALPN h2 and http/1.1.
//     No session resumption, by ticket or session ID: Envoy does not verify a resumed
//     session's certificate again (peerCertificateValidated false, presented true), which
//     would send its requests to the undecided-identity route's 503. Without a serving
//     certificate the listener is plain HTTP (experiments only).
//   - Early header mutation (envoy.http.early_header_mutation.header_mutation) removes every
//     client-supplied x-remote-* header (prefix match, so -user, -group, -uid and every
//     -extra-*), every x-envoy-* header (an "internal" client could otherwise set its own
//     retry policy), x-kubernetes-peer-proxied, the routing header, the identity decision
//     header and the request class header before routing and before any filter: a spoofed
//     X-Remote-User never reaches a route, a filter or an apiserver, and a client cannot
//     name its own class (a POST sent as a "read" is not retried after a reset). Only fixed
//     names: the apiservers' configured names come from a ConfigMap, and a listener change
//     drains every connection, so the Lua filter strips those (below).
//   - forward_client_cert_details SANITIZE_SET with subject and URI (not the certificate):
//     Envoy replaces any client x-forwarded-client-cert with one describing the verified
//     certificate and removes it from requests without one; routes match its presence (the
//     route configuration removes it before any apiserver).
//   - http2_protocol_options: at most 100 streams per client connection (as the apiserver
//     allows), a 1 MiB stream window (also what Envoy buffers per stream towards a client
//     that stopped reading) and a 100 MiB connection window, 100 × 1 MiB, so that one stalled
//     stream of a client cannot stall its others (as for the apiserver clusters below).
//   - upgrade_configs websocket and spdy/3.1 (exec, attach, port-forward);
//     stream_idle_timeout and request_timeout 0 (watches last as long as the client wants;
//     other requests have a route timeout, see the route configuration);
//     use_remote_address (x-forwarded-for carries the client, for the apiservers' audit log);
//     server header passed through; the router adds no x-envoy-* headers.
//   - HTTP filters: Lua "kube-mvp.identity", ext_proc, router. The Lua filter runs
//     LuaScript (request_class.lua, then identity.lua: its default_source_code) on every
//     request, with the header names from the virtual host's metadata under the filter's name
//     (handle:virtualHost():metadata(), Envoy 1.36). It first strips every configured
//     identity header name and extra prefix, in use or read before (strip_names,
//     strip_prefixes: topology.RequestHeaders.StripNames), and works out the request's class
//     as the apiserver will treat it (RequestInfoFactory and kube-apiserver's
//     LongRunningFunc: read, watch, write, upgrade, long-running, unclassified), which it
//     writes in x-kube-mvp-request-class last, after the identity; the routes match it by
//     exact value, and route 0 refuses a request without one. Then, for a verified client
//     certificate, it sets the front-proxy identity headers (under every configured name of
//     each kind) as the apiserver's x509
//     authenticator would map the certificate (CN, one group per O, Kubernetes' UID
//     attribute, the credential ID X509SHA256=<digest>), or answers 401 where the apiserver
//     would, and writes its decision in x-kube-mvp-identity. A header change makes Envoy match
//     the route again. The script is static: a listener change drains every client
//     connection, watches included.
//   - local_reply_config: Envoy's own failures become a Kubernetes Status (application/json,
//     reason ServiceUnavailable, code 503): response flags UH, UF, UC, UR, UO, NC, NR (URX,
//     retries exhausted, always comes with its attempts' UF, UC or UR), and ext_proc failures
//     (see below); Retry-After: 1 on those no apiserver received (no UC or UR); a route timeout (UT) stays a 504, a Status with
//     reason Timeout as the apiserver's own. NR is mapped to 503 too: the catch-all route makes
//     "no route" impossible unless the configuration is inconsistent, and a 404 would tell
//     the client the resource does not exist. There is no top-level body format, so every
//     other local reply, notably extproc's own 503 Status for an unavailable serving set,
//     passes untouched.
//
// # ext_proc filter
//
// gRPC to cluster kube-mvp-extproc; request headers SENT, response headers, bodies and
// trailers skipped, except that allow_mode_override lets extproc ask for one request's
// response headers (GET /apis, merged discovery); message_timeout from Config (200ms). failure_mode_allow is false: a
// request extproc cannot decide must not go on without it, because it would silently lose
// the client certificate's identity (and could reach an apiserver that does not serve it);
// it fails with status_on_error 500, which the local reply config turns into a 503 Status
// (500 is used precisely so that extproc's deliberate 503s are not rewritten).
// route_cache_action CLEAR: the route is matched again after extproc set the routing header.
// mutation_rules: everything is disallowed except setting the headers extproc owns (the
// routing header and x-kubernetes-peer-proxied, plus content-type, content-encoding, etag, vary and
// retry-after, which its immediate responses carry and which Envoy 1.32+
// checks with the same rules), and a disallowed mutation fails the request rather than
// being dropped: so extproc removes nothing, and a client identity header that reached it
// (which only a listener that does not strip it lets through) fails the request. The allow
// expression names no configurable header: its RE2 program has a fixed size (80), below
// Envoy's limit (re2.max_program_size.error_level, 100). A message_timeout is a 504 (Envoy 1.35+), mapped to a 503 Status too. Authorization, cookie,
// proxy-authorization and sec-websocket-protocol (a WebSocket client's bearer token) headers
// are not forwarded to extproc: it never needs credentials.
// The filter is disabled per route (ExtProcPerRoute disabled) where no decision is needed:
// in a control plane whose apiservers all serve the same APIs no request opens a stream. On
// the discovery route alone, failure_mode_allow is overridden to true: without extproc a
// client gets one apiserver's own discovery, as it would without kube-mvp.
//
// # Route configuration "kube-apiserver"
//
// One virtual host, domains "*". First match wins:
//
//  0. "request-unclassified": no x-kube-mvp-request-class, i.e. the Lua filter did not
//     finish (its configured-name strip or identity perhaps undone): a direct 503 Status.
//  1. "extproc-decided": the routing header is present (only extproc can have set it) →
//     cluster_header; ext_proc off.
//  2. "client-certificate-undecided" (only with a client CA): x-forwarded-client-cert is
//     present and x-kube-mvp-identity is not, i.e. the Lua filter did not decide a verified
//     certificate's identity (a script error): a direct 503 Status, never forwarded without
//     the identity the apiserver would have given it.
//  3. "discovery": path /apis or /apis/ (safe_regex /apis/?) → default cluster; when the live
//     apiservers differ in what they serve (plan.Plan.MergesDiscovery; otherwise each answers
//     what the merge would, and ext_proc is off) ext_proc ON: for GET /apis asking for
//     aggregated discovery, extproc asks for the response headers (mode_override, hence
//     allow_mode_override on the filter) and answers an apiserver's 200 with the merged
//     discovery of every live apiserver (the apiserver still authenticates and authorizes).
//  4. "escaped-path": a path (without the query) with a %-escape or a leading "//" (safe_regex
//     `//.*|.*%.*`) → ext_proc ON, which decides on the path as the apiserver decodes it (see
//     "Paths" below).
//  5. one route per published group/version, named "core/v1", "batch/v1", …,
//     path_separated_prefix "/api/v1" or "/apis/<g>/<v>" (the path itself, the
//     group/version's discovery document, or followed by "/"; "/apis/batch/v1beta1" is not
//     batch/v1's), with route metadata (filter_metadata "kube-mvp") naming the cluster each
//     resource and subresource goes to (and those that are unavailable or not served) and
//     the cluster of the document ("document": whoever serves any resource of the
//     group/version, plan.GroupVersion.Document), so /config_dump shows who serves what; the
//     clusters' metadata names the apiservers inside. When every resource of it goes to the
//     default cluster (outcome Default, or NotServed, which the default apiservers answer
//     with 404 themselves; its document then goes there too) the route goes straight there
//     with ext_proc off (line rate); otherwise ext_proc decides. Before them, one route per
//     aggregated group/version (plan.Plan.Aggregated: its APIService names a service),
//     named the same way, metadata groupVersion, extProc false and aggregated true: to the
//     default cluster with ext_proc off, as route 6 would send it, but its write variant
//     retries only what never reached an apiserver (see Retries).
//  6. "default": prefix "/" (non-resource paths, CRDs, aggregated APIs xds-server does not
//     know yet) → default cluster; ext_proc off.
//
// Routes that forward nothing themselves (2; 4 and 5 with ext_proc on: extproc names the
// cluster, or answers) are alone. Every other route comes after its variants (routespec.go
// decides them, routes.go renders them; testdata/<case>/routespec.yaml shows them per case):
// "<name>:upgrade" first where ext_proc is off and the cluster is the route's own
// (an Upgrade header: to the HTTP/1.1 variant of its cluster, no timeout; on route 1 extproc
// names that variant), then one per request class with a policy of its own, matching the class
// header's exact value: "<name>:read" (Config.UpstreamRequestTimeout, and "reset" retried),
// "<name>:watch" (no timeout, "reset" retried), "<name>:write" (the timeout). The route
// itself takes every other request — long-running (exec, attach, port-forward, proxy, log),
// unclassified (a path the apiserver decodes) — with no timeout and no retry after a reset,
// safe for any request. With a client CA each of
// these (not on route 1) comes right after its front-proxy variant "<…>:front-proxy": the same
// match plus x-kube-mvp-identity = front-proxy, to the front-proxy variant of its cluster. A
// request the Lua filter decided "own-credentials" (a certificate the apiserver would reject,
// with a bearer token) takes the ordinary routes. The virtual host removes
// x-kube-mvp-identity, x-kube-mvp-request-class and x-forwarded-client-cert before any
// apiserver. Variants carry no metadata: the route whose name they extend does. No regex
// depends on a name: routes 3 and 4 have the only two, of fixed size (11 and 34 RE2
// instructions), and the matchers Envoy evaluates before a route's path (headers, query)
// are exact values and presence, so a request to the last route costs a string comparison
// per earlier route.
//
// # Paths
//
// The apiserver routes a request by req.URL.Path: Go's server %-decodes it ("%2F" too), and
// RequestInfoFactory trims every leading and trailing "/" and splits at "/"; it resolves no
// dot-segment. Envoy matches routes against the :path as received. The two agree on every
// path that starts with a single "/" and has no %-escape: its first segments are then the
// same for both, and a path_separated_prefix route matches exactly the paths whose
// RequestInfo has that group/version. Every other path takes route 4 to extproc, whose
// parser (topology.ParsePathHeader, tested against upstream's RequestInfoFactory) decodes
// it as the apiserver does: "/apis/batch%2Fv1/namespaces/x/jobs" goes to the apiservers
// that serve batch/v1.
//
// The path is forwarded unchanged. The HCM options that would let Envoy route on a decoded
// path all change the forwarded one too, so they are set explicitly off (no runtime default
// can turn them on): normalize_path false (RFC 3986 normalization rewrites the upstream
// :path, resolves dot-segments the apiserver reads literally, and decodes escapes
// differently from Go), merge_slashes false (rewrites the upstream :path) and
// path_with_escaped_slashes_action KEEP_UNCHANGED. UNESCAPE_AND_FORWARD would forward
// "%2F" as "/" and UNESCAPE_AND_REDIRECT would answer a redirect that not every client
// follows (a POST, a watch, a WebSocket upgrade); REJECT_REQUEST would turn requests the
// apiserver serves into 400s, e.g. a "*/proxy" subresource whose tail carries "%2F" for the
// pod or service behind it. None of them covers "%61" or "//" either. Routing such paths
// through extproc costs one ext_proc round trip only for those rare paths.
//
// In a sidecar's configuration every route with ext_proc on also names the sidecar's
// apiserver in the ext_proc stream's gRPC metadata (contract.MetadataLocalAPIServer), so
// extproc decides by that sidecar's plan; the local apiserver is configured only on the
// Envoy node.
//
// Timeouts: a request the apiserver treats as long-running (its class watch, long-running,
// upgrade) has none; every other gets Config.UpstreamRequestTimeout (65s), just above the
// apiserver's --request-timeout (1m): a live apiserver has answered its own 504 by then, so
// only one that stopped answering (frozen, partitioned) meets the route timeout, Envoy's 504
// UT, which the local reply config keeps a 504 as a Timeout Status (the request may have
// been processed; a 503 would say it was not). extproc-decided requests are matched again
// after extproc set the routing header, so the routing-header route's variants choose their
// timeout the same way. idle_timeout is 0 everywhere.
//
// Retries: nothing that may have reached a backend is sent twice. 2 retries on other hosts
// (previous_hosts, 20 host selection attempts: least request favours the host that just
// refused, having nothing in flight), so a dead peer costs a retry, not an error, while a
// capable peer remains. What each route retries (envoyRetryPolicy in routes.go has why each
// is safe):
//
//   - every route: what cannot have reached an apiserver (connect-failure, refused-stream,
//     reset-before-request). The route itself (long-running: exec, attach, port-forward,
//     log, and node, service and pod proxy and the proxy verb, which pass a backend's answer
//     through; unclassified; no class) and its upgrade variant retry nothing more;
//   - the read and watch variants (GET and HEAD the apiserver reads as get, list or watch):
//     also "reset" (a connection that ends under a request Envoy just wrote: an apiserver
//     closing a kept-alive connection, the keepalive pings closing one to a frozen
//     apiserver) and any answer with Retry-After, which may run twice;
//   - the write variants: also 429 and 503 (retriable-status-codes), which kube-apiserver
//     answers itself only before it carries a request out (shutting down, max-in-flight,
//     priority and fairness, storage version or CRD not ready, admission) — not the other
//     answers with Retry-After (a storage ServerTimeout, a 504, after which the write may
//     have reached etcd) — except on an aggregated group/version (route 5), whose
//     apiservers pass the backend's own status and headers back: nothing more there.
//
// # Clusters
//
//   - The default cluster (contract.ClusterDefault: every live apiserver) or, in sidecar mode
//     (the plan's LocalID set), contract.ClusterLocal holding the local apiserver only. In
//     sidecar mode the all-live cluster is not emitted: no decision names it (what the local
//     apiserver serves stays local, what it does not goes to the subset that does), and every
//     sidecar health-checking every apiserver would cost N² probes for nothing.
//   - The serving-sets cluster (contract.ClusterServingSets), whose hosts are the plan's
//     Hosts (the live apiservers and the departed ones remembered at an address), with
//     subset load balancing (list_as_any, one selector on contract.LBSetKey, NO_FALLBACK):
//     each endpoint lists under envoy.lb the serving sets it is in — its own set of one and
//     every set of the plan, current or lingering, that has it as a member
//     (plan.SubsetClusterName, e.g. "kube-apiservers-only-cp-a+cp-c"; '~' for each '.' of an
//     FQDN hostname, as in every name Envoy may tag stats with) — and extproc names the
//     request's set in envoy.lb dynamic metadata, which the ext_proc filter accepts
//     (metadata_options.receiving_namespaces) and the router takes as the subset criteria.
//     A new serving set is an endpoint metadata change, not a cluster to warm.
//   - Each of these twice: as named, with upstream TLS that presents no client certificate,
//     for every request that carries its caller's own credentials (bearer token, Basic,
//     WebSocket token, none), so that the apiserver authenticates it as it would directly;
//     and its front-proxy variant (plan.RequestKind.ProxyCert, "<name>/front-proxy", with a
//     proxy client certificate configured), which presents the proxy client certificate
//     kube-mvp-proxy-client-cert, for the requests whose identity extproc set from a
//     verified client certificate. The proxy certificate never turns a request into anyone.
//     The front-proxy variants' endpoints leave out the apiservers the plan calls dangerous
//     (plan.Plan.ProxyCertExcluded: they take the proxy certificate for an ordinary
//     client's); where that leaves the default (or local) cluster without any, the
//     ":front-proxy" routes to it answer a 503 Status naming them themselves (a direct
//     response with Retry-After, ext_proc off, its body within Envoy's 4 KiB limit).
//   - All apiserver clusters: EDS over ADS; upstream TLS from SDS (the peer CA
//     kube-mvp-peer-ca with a DNS SAN match on UpstreamServerName; SNI UpstreamServerName);
//     explicit HTTP/2 with keepalive pings (connection_keepalive every 10s, closed when no
//     answer came within 5s: a frozen or cut-off apiserver keeps its TCP connections open,
//     and a watch on one would never end), at most 100 streams per connection (Envoy opens
//     another past them), a 1 MiB stream window and a 100 MiB (100 × 1 MiB) connection window:
//     Envoy credits the apiserver only for data its client consumed, so each stream a slow
//     reader stalled holds up to its stream window of the connection window, and with
//     Envoy's defaults (16 MiB, 24 MiB, 1024 streams) two of them stall every request on the
//     connection; here no set of stalled streams can (see the constants in clusters.go),
//     ALPN h2, and an HTTP/1.1 variant of each cluster
//     ("<name>/http1", ALPN http/1.1) for upgrades (SPDY and WebSocket cannot be forwarded over
//     HTTP/2 without extended CONNECT), which each route's ":upgrade" variant and extproc name;
//     health checks speak HTTP/1.1 over a socket of their own (transport_socket_matches);
//     an upstream idle_timeout of 50s, below
//     the apiservers' own 90s, so an idle connection is closed by Envoy, never by the
//     apiserver under a request Envoy just wrote (a 503 UC no retry policy covers); LEAST_REQUEST balancing (long watches make
//     request counts, not round robin, the fair measure); circuit breakers at 100000
//     connections/requests (default 1024 would cap the number of watches); outlier detection
//     on local-origin failures only (split_external_local_origin_errors, 2 consecutive
//     connect failures eject, max_ejection_percent 100) — 5xx answers are not ejected for,
//     since an apiserver's 500 is usually about the request (a failing webhook), not the
//     server; active health check GET /readyz every 5s (an unhealthy host every 1s, so a
//     restarted apiserver takes requests about a second after it is ready; healthy hosts of
//     a cluster that never had a connection every 10s) with the proxy certificate (a
//     caller cluster's checks take it from transport_socket_matches by their
//     transport_socket_match_criteria; no endpoint carries match labels, so requests keep
//     the cluster's own socket) as the user contract.HealthCheckUser in the apiservers' user
//     header (the proxy certificate without a user header gets a 401; that user may GET /readyz by Kubernetes' default
//     system:public-info-viewer and by the chart's own role, whatever the anonymous
//     policy); healthy_panic_threshold 0, so a
//     cluster (or serving set) with no healthy apiserver answers 503 with Retry-After at once
//     instead of trying unhealthy ones: Envoy's default (50%) would send a one-member set's
//     requests to its hung or dead apiserver, to wait there or fail after its retries, and
//     a just-restarted one is checked again within a second (unhealthy_interval);
//     ignore_health_on_host_removal, so EDS alone decides membership (without it Envoy keeps
//     an apiserver that left a cluster while its /readyz still answers 200);
//     no metadata, nor anything else that changes with membership or role (a lingering
//     cluster is the same resource as before): Envoy rebuilds a cluster whose CDS resource
//     changed, warming it up again with its hosts' health and outlier state lost; who is
//     inside is in the endpoints' metadata.
//   - "kube-mvp-extproc": static (STRICT_DNS for a host name) cluster for cmd/extproc,
//     HTTP/2, a unix socket or host:port from Config.
//
// # Endpoints
//
// A ClusterLoadAssignment per apiserver cluster with its apiservers' addresses, each endpoint
// with its hostname and metadata (apiserver ID, hostname; in the serving-sets cluster also
// its serving sets under envoy.lb). EDS endpoints must be
// IP:port: an apiserver whose address is a DNS name is left out with an *AddressError naming
// it (Build still returns the rest). A cluster with nobody live is emitted with no endpoints,
// so requests to it get a 503 Status.
//
// # Secrets
//
// kube-mvp-serving-cert, kube-mvp-client-ca, kube-mvp-proxy-client-cert and kube-mvp-peer-ca,
// as file references (paths in Envoy's file system) with the file's directory watched: no
// private key is ever in a resource. Each only when Config provides it (see SecretFiles for
// what leaving one out means).
//
// # Validation
//
// Every typed config is ValidateAll()ed before it is packed into an Any (with deterministic
// marshalling), and every top-level resource after; all errors are collected. Reference
// checks beyond Snapshot.Consistent: every cluster a route or extproc can name exists, the
// ext_proc cluster exists, every SDS secret referred to exists, every EDS cluster has its
// endpoints. Nothing the oldest supported Envoy lacks: every resource's wire form, typed
// configs unpacked, is checked by internal/oldestenvoy against the messages, fields and enum
// values of that Envoy's protos, as tools/envoyprotos lists them.
//
// # Versions
//
// Each type's version is a hash of its resources' deterministic bytes; nothing depends on map
// iteration order, so two replicas with the same inputs serve the same versions and an Envoy
// switching between them sees no change.
package snapshot
