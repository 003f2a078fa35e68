package dataplane

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// TestExtractTags: Envoy's default tag extraction on the stat shapes the stand-in counts
// and a few of Envoy's own examples (the regex kinds, the tokenized kinds with "**" at the
// end and in the middle, the listener extractor's "admin" exception).
func TestExtractTags(t *testing.T) {
	for _, c := range []struct{ stat, extracted, tags string }{
		{"cluster.kube-apiservers-serving/front-proxy.upstream_rq_total", "cluster.upstream_rq_total", "envoy.cluster_name=kube-apiservers-serving/front-proxy"},
		{"cluster.kube-apiservers.upstream_rq_5xx", "cluster.upstream_rq_xx", "envoy.response_code_class=5 envoy.cluster_name=kube-apiservers"},
		{"cluster.kube-apiservers.upstream_rq_503", "cluster.upstream_rq", "envoy.response_code=503 envoy.cluster_name=kube-apiservers"},
		{"http.kube-apiserver.downstream_rq_total", "http.downstream_rq_total", "envoy.http_conn_manager_prefix=kube-apiserver"},
		{"http.kube-apiserver.downstream_rq_2xx", "http.downstream_rq_xx", "envoy.response_code_class=2 envoy.http_conn_manager_prefix=kube-apiserver"},
		{"http.envoy_health.downstream_rq_active", "http.downstream_rq_active", "envoy.http_conn_manager_prefix=envoy_health"},
		{"http.kube-apiserver.ext_proc.streams_started", "http.ext_proc.streams_started", "envoy.http_conn_manager_prefix=kube-apiserver"},
		{"listener.127.0.0.1_6443.downstream_cx_total", "listener.downstream_cx_total", "envoy.listener_address=127.0.0.1_6443"},
		{"listener.admin.downstream_cx_total", "listener.admin.downstream_cx_total", ""},
		{"listener_manager.worker_1.dispatcher.loop_duration_us",
			"listener_manager.worker_dispatcher.loop_duration_us", "envoy.worker_id=1"},
		// Envoy: envoy_listener_manager_worker_dispatcher_loop_duration_us{envoy_worker_id="1"},
		{"listener_manager.listener_stopped", "listener_manager.listener_stopped", ""},
		{"mongo.mongo_filter.collection.test.callsite.abc.query.total", "mongo.collection.callsite.query.total", "envoy.mongo_callsite=abc envoy.mongo_collection=test envoy.mongo_prefix=mongo_filter"},
		{"server.dynamic_unknown_fields", "server.dynamic_unknown_fields", ""},
	} {
		extracted, tags := extractTags(c.stat)
		var got []string
		for _, tag := range tags {
			got = append(got, tag.Name+"="+tag.Value)
		}
		if extracted != c.extracted || strings.Join(got, " ") != c.tags {
			t.Errorf("%s: %s %q, want %s %q", c.stat, extracted, got, c.extracted, c.tags)
		}
	}
}

// TestWritePrometheus: one TYPE line a family, the stats of a family as its labelled series.
func TestWritePrometheus(t *testing.T) {
	w := httptest.NewRecorder()
	writePrometheus(w, []typedStat{
		{statValue{"cluster.a.upstream_rq_total", 3}, false},
		{statValue{"cluster.b.upstream_rq_total", 4}, false},
		{statValue{"http.kube-apiserver.downstream_rq_5xx", 1}, false},
		{statValue{"http.kube-apiserver.downstream_rq_active", 2}, true},
		{statValue{"server.dynamic_unknown_fields", 0}, false},
	})
	want := `# TYPE envoy_cluster_upstream_rq_total counter
envoy_cluster_upstream_rq_total{envoy_cluster_name="a"} 3
envoy_cluster_upstream_rq_total{envoy_cluster_name="b"} 4
# TYPE envoy_http_downstream_rq_active gauge
envoy_http_downstream_rq_active{envoy_http_conn_manager_prefix="kube-apiserver"} 2
# TYPE envoy_http_downstream_rq_xx counter
envoy_http_downstream_rq_xx{envoy_http_conn_manager_prefix="kube-apiserver",envoy_response_code_class="5"} 1
# TYPE envoy_server_dynamic_unknown_fields counter
envoy_server_dynamic_unknown_fields{} 0
`
	if got := w.Body.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
