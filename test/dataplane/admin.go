package dataplane

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	udpaannotations "github.com/cncf/xds/go/udpa/annotations"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// adminHandler serves a subset of Envoy's admin interface: /config_dump (serveConfigDump),
// /clusters (serveClusters), /stats (serveStats), /ready, /stats/prometheus and
// /drain_listeners (serveDrainListeners). Its own connection manager counts
// http.admin.downstream_rq_total, downstream_rq_active and downstream_cx_active, and drains
// as the listeners' do (drain.go). Each page: test/dataplane/README.md#the-admin-interface.
func (d *DataPlane) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/config_dump", d.serveConfigDump)
	mux.HandleFunc("/clusters", d.serveClusters)
	mux.HandleFunc("/stats", d.serveStats)
	mux.HandleFunc("/stats/prometheus", d.servePrometheus)
	mux.HandleFunc("/drain_listeners", postOnly(d.serveDrainListeners))
	// /ready is Envoy's ServerInfoHandler::handlerReady
	// (source/server/admin/server_info_handler.cc): the server state's name and a newline,
	// 200 only when LIVE, else 503.
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-d.readyCh:
			_, _ = w.Write([]byte("LIVE\n"))
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("PRE_INITIALIZING\n"))
		}
	})
	return mux
}

// postOnly is the admin's refusal of a method other than POST on a handler that mutates the
// server's state (source/server/admin/admin.cc: AdminImpl::makeRequest): 405 with
// "Method <method> not allowed, POST required." as plain text.
func postOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			d := "Method " + r.Method + " not allowed, POST required."
			w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = w.Write([]byte(d))
			return
		}
		h(w, r)
	}
}

// serveDrainListeners is Envoy v1.36's ListenersHandler::handlerDrainListeners
// (source/server/admin/listeners_handler.cc), without the runtime guard
// envoy.reloadable_features.non_graceful_drain_notifies_connections (newer than v1.36):
//
//   - skip_exit without graceful: 400 "skip_exit requires graceful\n";
//   - graceful: already draining, 200 "OK\n" and nothing else; else the server's drain manager
//     starts its drain sequence (drain.go), whose completion after the drain time stops the
//     listeners unless skip_exit. Until then the listeners keep accepting (Envoy: there is no
//     other version of the listeners to take new connections);
//   - otherwise: the listeners stop at once; no drain sequence starts, none is drain-closed.
//
// inboundonly (only listeners whose traffic_direction is INBOUND) is refused with 400: our
// listeners have no traffic_direction (the allowlist refuses it), so Envoy would stop none
// of them, which a test could mistake for a drain; drain directions are not modelled.
func (d *DataPlane) serveDrainListeners(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	text := func(status int, body string) { writeText(w, status, body) }
	if q.Has("inboundonly") {
		text(http.StatusBadRequest, "inboundonly is not implemented by the test stand-in (no listener has a traffic_direction)\n")
		return
	}
	graceful, skipExit := q.Has("graceful"), q.Has("skip_exit")
	if skipExit && !graceful {
		text(http.StatusBadRequest, "skip_exit requires graceful\n")
		return
	}
	if !graceful {
		d.stopListeners()
		text(http.StatusOK, "OK\n")
		return
	}
	if d.drain.isDraining() {
		text(http.StatusOK, "OK\n")
		return
	}
	d.log.Info("drain sequence started", "drain_time", d.drain.drainTime, "strategy", d.drain.strategy, "skip_exit", skipExit)
	d.drain.startDrainSequence(func() {
		if !skipExit {
			d.stopListeners()
		}
	})
	text(http.StatusOK, "OK\n")
}

// serveStats is Envoy's /stats (source/server/admin/stats_handler.cc, stats_params.cc
// StatsParams::parse, stats_request.cc): counters and gauges together in name order;
// filter is an RE2 regular expression matched anywhere in the name (RE2::PartialMatch;
// Go's regexp takes RE2's syntax), an invalid one 400 "Invalid re2 regex"; format json,
// text (the default: "name: value" lines) or prometheus, another value 400 with Envoy's
// usage line. Envoy's other parameters (usedonly, type, histogram_buckets, hidden, pretty,
// text_readouts) and its html formats are refused with 400 here: the stand-in does not
// implement them, and has no histograms or text readouts.
func (d *DataPlane) serveStats(w http.ResponseWriter, r *http.Request) {
	q, ok := implementedParams(w, r, "filter", "format")
	if !ok {
		return
	}
	text := func(status int, body string) { writeText(w, status, body) }
	var re *regexp.Regexp
	if q.Has("filter") {
		var err error
		if re, err = regexp.Compile(q.Get("filter")); err != nil {
			text(http.StatusBadRequest, "Invalid re2 regex")
			return
		}
	}
	var all []typedStat
	for _, s := range d.stats.all() {
		if re == nil || re.MatchString(s.Name) {
			all = append(all, s)
		}
	}
	switch format := q.Get("format"); {
	case !q.Has("format") || format == "text":
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		for _, s := range all {
			fmt.Fprintf(w, "%s: %d\n", s.Name, s.Value)
		}
	case format == "json":
		out := make([]statValue, 0, len(all))
		for _, s := range all {
			out = append(out, s.statValue)
		}
		writeJSON(w, map[string]any{"stats": out})
	case format == "prometheus":
		writePrometheus(w, all)
	case format == "html" || format == "active-html":
		text(http.StatusBadRequest, "format="+format+" is not implemented by the test stand-in\n")
	default:
		text(http.StatusBadRequest, "usage: /stats?format=(html|active-html|json|prometheus|text)\n\n")
	}
}

// implementedParams is the request's query when it has only parameters the stand-in
// implements; otherwise it answers 400: a page that ignored a parameter Envoy honours would
// answer what Envoy would not.
func implementedParams(w http.ResponseWriter, r *http.Request, implemented ...string) (url.Values, bool) {
	q := r.URL.Query()
	for k := range q {
		if !slices.Contains(implemented, k) {
			writeText(w, http.StatusBadRequest, fmt.Sprintf("%s parameter %q is not implemented by the test stand-in\n", r.URL.Path, k))
			return nil, false
		}
	}
	return q, true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func sortedNames[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// serveConfigDump is Envoy's /config_dump (source/server/admin/config_dump_handler.cc,
// ConfigDumpHandler::handlerConfigDump): the dynamic listeners, clusters, routes and secrets
// as they were received, secrets redacted (redact), and an EndpointsConfigDump only with
// ?include_eds. Envoy does not keep the ClusterLoadAssignments it receives: with
// include_eds it rebuilds one per active cluster from the cluster's hosts
// (dumpEndpointConfigs, endpointConfigOf). Other parameters (resource, mask, name_regex)
// are refused: the stand-in does not implement them.
func (d *DataPlane) serveConfigDump(w http.ResponseWriter, r *http.Request) {
	q, ok := implementedParams(w, r, "include_eds")
	if !ok {
		return
	}
	cfg := d.config()
	dump := &adminv3.ConfigDump{}
	add := func(m proto.Message) {
		a, err := anypb.New(m)
		if err == nil {
			dump.Configs = append(dump.Configs, a)
		}
	}
	pack := func(m proto.Message) *anypb.Any {
		a, _ := anypb.New(m)
		return a
	}
	ld := &adminv3.ListenersConfigDump{VersionInfo: cfg.version[resource.ListenerType]}
	for _, n := range sortedNames(cfg.raw[resource.ListenerType]) {
		ld.DynamicListeners = append(ld.DynamicListeners, &adminv3.ListenersConfigDump_DynamicListener{Name: n,
			ActiveState: &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: cfg.version[resource.ListenerType], Listener: pack(cfg.raw[resource.ListenerType][n].(*listenerv3.Listener))}})
	}
	add(ld)
	cd := &adminv3.ClustersConfigDump{VersionInfo: cfg.version[resource.ClusterType]}
	for _, n := range sortedNames(cfg.raw[resource.ClusterType]) {
		cd.DynamicActiveClusters = append(cd.DynamicActiveClusters, &adminv3.ClustersConfigDump_DynamicCluster{
			VersionInfo: cfg.version[resource.ClusterType], Cluster: pack(cfg.raw[resource.ClusterType][n].(*clusterv3.Cluster)),
		})
	}
	add(cd)
	rd := &adminv3.RoutesConfigDump{}
	for _, n := range sortedNames(cfg.raw[resource.RouteType]) {
		rd.DynamicRouteConfigs = append(rd.DynamicRouteConfigs, &adminv3.RoutesConfigDump_DynamicRouteConfig{
			VersionInfo: cfg.version[resource.RouteType], RouteConfig: pack(cfg.raw[resource.RouteType][n].(*routev3.RouteConfiguration)),
		})
	}
	add(rd)
	sd := &adminv3.SecretsConfigDump{}
	for _, n := range sortedNames(cfg.raw[resource.SecretType]) {
		s := proto.Clone(cfg.raw[resource.SecretType][n]).(*tlsv3.Secret)
		redact(s.ProtoReflect(), false)
		sd.DynamicActiveSecrets = append(sd.DynamicActiveSecrets, &adminv3.SecretsConfigDump_DynamicSecret{Name: n, VersionInfo: cfg.version[resource.SecretType], Secret: pack(s)})
	}
	add(sd)
	if q.Has("include_eds") {
		ed := &adminv3.EndpointsConfigDump{}
		d.mu.RLock()
		clusters := make(map[string]*liveCluster, len(d.clusters))
		for k, v := range d.clusters {
			clusters[k] = v
		}
		d.mu.RUnlock()
		for _, n := range sortedNames(clusters) {
			if cla := endpointConfigOf(clusters[n]); cla != nil {
				ed.DynamicEndpointConfigs = append(ed.DynamicEndpointConfigs, &adminv3.EndpointsConfigDump_DynamicEndpointConfig{EndpointConfig: pack(cla)})
			}
		}
		add(ed)
	}
	writeProtoJSON(w, dump)
}

// writeProtoJSON writes m as Envoy's admin does: protojson with the proto's field names.
func writeProtoJSON(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.MarshalOptions{UseProtoNames: true, Indent: "  "}.Marshal(m)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// endpointConfigOf is an active cluster's ClusterLoadAssignment as Envoy's
// ConfigDumpHandler::dumpEndpointConfigs and addLbEndpoint rebuild it from the cluster's
// hosts: named by the EDS service name or else the cluster's, the policy's overprovisioning
// factor (Envoy's default 140: the stand-in takes no other), every host in one locality
// (the stand-in has no localities or priorities) with its metadata, its weight (1: the
// stand-in takes no other), its coarse health, its hostname, its address and an empty
// health_check_config (no health check hostname or port of its own), and no version_info.
// A warming cluster has none (Envoy lists the active clusters only). EDS hosts whose
// health_status is neither UNKNOWN nor HEALTHY are missing (the stand-in drops them on
// receipt, configendpoint.go; Envoy keeps and lists them, unhealthy or degraded).
func endpointConfigOf(c *liveCluster) *endpointv3.ClusterLoadAssignment {
	cc, hosts, _ := c.snapshot()
	if cc == nil {
		return nil
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: cmp.Or(cc.edsName, cc.name),
		Policy: &endpointv3.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(140)}}
	if len(hosts) == 0 {
		return cla
	}
	group := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{}}
	now := time.Now()
	for _, h := range hosts {
		health := corev3.HealthStatus_HEALTHY
		h.mu.Lock()
		if h.failedHC || now.Before(h.ejectedUntil) {
			health = corev3.HealthStatus_UNHEALTHY
		}
		h.mu.Unlock()
		addr := addressProto(h.address)
		e := &endpointv3.LbEndpoint{
			HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Hostname: h.hostname(), Address: addr, HealthCheckConfig: &endpointv3.Endpoint_HealthCheckConfig{}}},
			HealthStatus:        health,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}
		if md := h.metadata(); md != nil {
			e.Metadata = proto.Clone(md).(*corev3.Metadata)
		}
		group.LbEndpoints = append(group.LbEndpoints, e)
	}
	cla.Endpoints = []*endpointv3.LocalityLbEndpoints{group}
	return cla
}

// redact hides sensitive fields as Envoy's MessageUtil::redact does
// (source/common/protobuf/utility.cc), which /config_dump applies to the whole dump: under
// a field annotated udpa.annotations.sensitive (a TlsCertificate's private_key and password,
// a GenericSecret's secret, session ticket keys), every set string or bytes field becomes
// "[redacted]" (so a DataSource stays a filename, inline_bytes or inline_string), every other
// scalar is cleared, and messages (an Any's content too) are redacted in turn.
func redact(m protoreflect.Message, sensitive bool) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return // Envoy leaves an Any of an unknown type as it is
		}
		redact(inner.ProtoReflect(), sensitive)
		if b, err := proto.Marshal(inner); err == nil {
			a.Value = b
		}
		return
	}
	type field struct {
		fd protoreflect.FieldDescriptor
		v  protoreflect.Value
	}
	var fields []field
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		fields = append(fields, field{fd, v})
		return true
	})
	const hidden = "[redacted]"
	for _, f := range fields {
		fd, v := f.fd, f.v
		s := sensitive || proto.GetExtension(fd.Options(), udpaannotations.E_Sensitive).(bool)
		text := fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.BytesKind
		switch {
		case fd.IsMap():
			vd := fd.MapValue()
			mp := m.Mutable(fd).Map()
			mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				switch {
				case vd.Kind() == protoreflect.MessageKind:
					redact(mv.Message(), s)
				case s && vd.Kind() == protoreflect.StringKind:
					mp.Set(k, protoreflect.ValueOfString(hidden))
				case s && vd.Kind() == protoreflect.BytesKind:
					mp.Set(k, protoreflect.ValueOfBytes([]byte(hidden)))
				case s:
					mp.Set(k, vd.Default())
				}
				return true
			})
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			if fd.IsList() {
				for i := range v.List().Len() {
					redact(v.List().Get(i).Message(), s)
				}
			} else {
				redact(m.Mutable(fd).Message(), s)
			}
		case s && text:
			hv := protoreflect.ValueOfString(hidden)
			if fd.Kind() == protoreflect.BytesKind {
				hv = protoreflect.ValueOfBytes([]byte(hidden))
			}
			if fd.IsList() {
				for i := range v.List().Len() {
					m.Mutable(fd).List().Set(i, hv)
				}
			} else {
				m.Set(fd, hv)
			}
		case s:
			m.Clear(fd)
		}
	}
}

// serveClusters is Envoy's /clusters (source/server/admin/clusters_handler.cc): with
// format=json an envoy.admin.v3.Clusters in protojson with the proto's field names
// (buildClusterStatus: name, observability_name, eds_service_name, added_via_api, each host's
// address, hostname, counters and gauges as SimpleMetric, health flags, weight, an empty
// locality), else Envoy's text ("cluster::host::stat::value" lines, writeClusterAsText).
// Warming clusters are not listed (Envoy lists the active ones). Clusters and hosts carry no
// metadata there (it is in /config_dump); circuit breakers and success rates are left out.
// Envoy's filter parameter is refused with 400: the stand-in does not implement it.
func (d *DataPlane) serveClusters(w http.ResponseWriter, r *http.Request) {
	q, ok := implementedParams(w, r, "format")
	if !ok {
		return
	}
	clusters := d.clustersStatus()
	if q.Get("format") == "json" {
		writeProtoJSON(w, clusters)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	for _, c := range clusters.GetClusterStatuses() {
		name := c.GetName()
		fmt.Fprintf(w, "%s::observability_name::%s\n", name, c.GetObservabilityName())
		fmt.Fprintf(w, "%s::added_via_api::%t\n", name, c.GetAddedViaApi())
		if eds := c.GetEdsServiceName(); eds != "" {
			fmt.Fprintf(w, "%s::eds_service_name::%s\n", name, eds)
		}
		for _, h := range c.GetHostStatuses() {
			addr := addressString(h.GetAddress())
			stats := h.GetStats()
			slices.SortFunc(stats, func(a, b *adminv3.SimpleMetric) int { return strings.Compare(a.GetName(), b.GetName()) })
			for _, st := range stats {
				fmt.Fprintf(w, "%s::%s::%s::%d\n", name, addr, st.GetName(), st.GetValue())
			}
			fmt.Fprintf(w, "%s::%s::hostname::%s\n", name, addr, h.GetHostname())
			fmt.Fprintf(w, "%s::%s::health_flags::%s\n", name, addr, healthFlags(h.GetHealthStatus()))
			fmt.Fprintf(w, "%s::%s::weight::%d\n", name, addr, h.GetWeight())
			fmt.Fprintf(w, "%s::%s::priority::%d\n", name, addr, h.GetPriority())
		}
	}
}

// clustersStatus is /clusters' content: every active cluster, by name, with its hosts.
func (d *DataPlane) clustersStatus() *adminv3.Clusters {
	d.mu.RLock()
	clusters := make(map[string]*liveCluster, len(d.clusters))
	for k, v := range d.clusters {
		clusters[k] = v
	}
	d.mu.RUnlock()
	out := &adminv3.Clusters{}
	now := time.Now()
	for _, n := range sortedNames(clusters) {
		cc, hosts, _ := clusters[n].snapshot()
		if cc == nil {
			continue // warming
		}
		cs := &adminv3.ClusterStatus{Name: n, ObservabilityName: cmp.Or(cc.raw.GetAltStatName(), n), AddedViaApi: true}
		if cc.kind == clusterv3.Cluster_EDS {
			cs.EdsServiceName = cc.edsName
		}
		for _, h := range hosts {
			hs := &adminv3.HostStatus{Address: addressProto(h.address), Hostname: h.hostname(), Weight: 1, Locality: &corev3.Locality{}}
			h.mu.Lock()
			for _, st := range []struct {
				name  string
				value uint64
				typ   adminv3.SimpleMetric_Type
			}{
				{"rq_total", h.rqTotal, adminv3.SimpleMetric_COUNTER},
				{"rq_success", h.rqSuccess, adminv3.SimpleMetric_COUNTER},
				{"rq_error", h.rqErrs, adminv3.SimpleMetric_COUNTER},
				{"rq_active", uint64(max(0, h.active.Load())), adminv3.SimpleMetric_GAUGE},
			} {
				hs.Stats = append(hs.Stats, &adminv3.SimpleMetric{Name: st.name, Value: st.value, Type: st.typ})
			}
			hs.HealthStatus = &adminv3.HostHealthStatus{
				EdsHealthStatus:         corev3.HealthStatus_HEALTHY,
				FailedActiveHealthCheck: h.failedHC,
				PendingActiveHc:         h.hcPending,
				FailedOutlierCheck:      now.Before(h.ejectedUntil),
				PendingDynamicRemoval:   h.pendingRemoval,
			}
			h.mu.Unlock()
			cs.HostStatuses = append(cs.HostStatuses, hs)
		}
		out.ClusterStatuses = append(out.ClusterStatuses, cs)
	}
	return out
}

// healthFlags is Envoy's HostUtility::healthFlagsToString (source/common/upstream/
// host_utility.cc) for the flags the stand-in sets: "healthy" with none, else each as
// "/name" in the order of Host::HealthFlag.
func healthFlags(h *adminv3.HostHealthStatus) string {
	var s string
	for _, f := range []struct {
		set  bool
		name string
	}{
		{h.GetFailedActiveHealthCheck(), "failed_active_hc"},
		{h.GetFailedOutlierCheck(), "failed_outlier_check"},
		{h.GetPendingDynamicRemoval(), "pending_dynamic_removal"},
		{h.GetPendingActiveHc(), "pending_active_hc"},
	} {
		if f.set {
			s += "/" + f.name
		}
	}
	return cmp.Or(s, "healthy")
}

// addressProto is a host's address as Envoy reports it: a socket address, or a pipe for a
// unix socket ("unix:" prefix or a path).
func addressProto(address string) *corev3.Address {
	if host, port, err := net.SplitHostPort(address); err == nil {
		p, _ := strconv.Atoi(port)
		return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}}
	}
	return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: strings.TrimPrefix(address, "unix:")}}}
}

// addressString is Envoy's Address::asString: "host:port", or a pipe's path.
func addressString(a *corev3.Address) string {
	if sa := a.GetSocketAddress(); sa != nil {
		return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	}
	return a.GetPipe().GetPath()
}

// servePrometheus writes every counter and gauge in Prometheus' text format as Envoy's
// /stats/prometheus does (source/server/admin/prometheus_stats.cc): stats grouped into
// families by their tag-extracted name (Envoy's default tag extractors, tags.go), one TYPE
// line (counter or gauge) per family, then each stat of the family with its tags as labels
// ("{}" when it has none).
func (d *DataPlane) servePrometheus(w http.ResponseWriter, _ *http.Request) {
	writePrometheus(w, d.stats.all())
}

func writePrometheus(w http.ResponseWriter, all []typedStat) {
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	type family struct {
		typ    string
		series map[string]uint64 // labels -> value
	}
	families := map[string]*family{}
	for _, s := range all {
		ps := prometheusSeries(s.Name)
		typ := "counter"
		if s.gauge {
			typ = "gauge"
		}
		f := families[ps.family]
		if f == nil {
			f = &family{typ: typ, series: map[string]uint64{}}
			families[ps.family] = f
		}
		if f.typ != typ {
			continue // Envoy keeps counters and gauges of one name apart; none here collide
		}
		if _, dup := f.series[ps.labels]; !dup {
			f.series[ps.labels] = s.Value
		}
	}
	for _, name := range slices.Sorted(maps.Keys(families)) {
		f := families[name]
		fmt.Fprintf(w, "# TYPE %s %s\n", name, f.typ)
		for _, labels := range slices.Sorted(maps.Keys(f.series)) {
			fmt.Fprintf(w, "%s%s %d\n", name, labels, f.series[labels])
		}
	}
}

// promName is prefix and name with every character other than [a-zA-Z0-9_] made "_".
func promName(name, prefix string) string {
	b := []byte(prefix + name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// writeText answers with status and body as Envoy's admin answers in plain text.
func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// AdminGet is one GET of an Envoy admin's path (this stand-in's or a real Envoy's), at most
// 64 MiB of it; a status other than 200 is an error quoting the answer.
func AdminGet(ctx context.Context, adminURL, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+path, nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s%s: %s: %s", adminURL, path, res.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// ReadClusters reads an Envoy admin's /clusters?format=json (this stand-in's or a real
// Envoy's) as the envoy.admin.v3.Clusters it is.
func ReadClusters(ctx context.Context, adminURL string) (*adminv3.Clusters, error) {
	b, err := AdminGet(ctx, adminURL, "/clusters?format=json")
	if err != nil {
		return nil, err
	}
	out := &adminv3.Clusters{}
	// A newer Envoy may add fields this go-control-plane does not know.
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("GET %s/clusters?format=json: %w", adminURL, err)
	}
	return out, nil
}
