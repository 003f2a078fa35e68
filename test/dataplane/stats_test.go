package dataplane

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// The listener's connection manager stat prefix (the product's HCM stat_prefix).
const hcmPrefix = "http.kube_apiserver."

// adminDo sends a request to the data plane's admin and returns the status and body.
func adminDo(t *testing.T, e *env, method, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, e.dp.AdminURL()+path, nil)
	must(t, err)
	res, err := http.DefaultClient.Do(req)
	must(t, err)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestAdminStats: /stats takes filter (a partial RE2 match) and format, and lists gauges
// with the counters: a request in flight counts in downstream_rq_active, the admin's own
// under http.admin.; /stats/prometheus types gauges.
func TestAdminStats(t *testing.T) {
	step := make(chan struct{})
	e := newEnv(t, envOptions{tick: time.Second, ticks: 1, fake: fakeOptions{watchStep: step}})
	if n := e.dp.Gauge(hcmPrefix + "downstream_rq_active"); n != 0 {
		t.Errorf("downstream_rq_active %d before any request", n)
	}
	c := e.client(nil)
	c.Timeout = 0
	watch, err := c.Get(e.base + "/api/v1/pods?watch=true")
	if err != nil || watch.StatusCode != 200 {
		t.Fatalf("watch: %v %v", watch, err)
	}
	defer watch.Body.Close()
	var active map[string]uint64
	testutil.WaitFor(t, t.Context(), 10*time.Second, "the watch in downstream_rq_active", func() error {
		code, body := adminDo(t, e, "GET", "/stats?format=json&filter=downstream_rq_active")
		if code != 200 {
			return fmt.Errorf("/stats: %d %s", code, body)
		}
		var st struct{ Stats []statValue }
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return err
		}
		active = map[string]uint64{}
		for _, s := range st.Stats {
			if !strings.Contains(s.Name, "downstream_rq_active") {
				return fmt.Errorf("filter let %s through", s.Name)
			}
			active[s.Name] = s.Value
		}
		if active[hcmPrefix+"downstream_rq_active"] != 1 {
			return fmt.Errorf("stats %v", active)
		}
		return nil
	})
	if active["http.admin.downstream_rq_active"] != 1 {
		t.Errorf("http.admin.downstream_rq_active %d, want 1 (the /stats request itself)", active["http.admin.downstream_rq_active"])
	}
	step <- struct{}{}
	_, _ = io.Copy(io.Discard, watch.Body)
	testutil.WaitFor(t, t.Context(), 10*time.Second, "downstream_rq_active back to 0", func() error {
		if n := e.dp.Gauge(hcmPrefix + "downstream_rq_active"); n != 0 {
			return fmt.Errorf("downstream_rq_active %d", n)
		}
		return nil
	})

	code, body := adminDo(t, e, "GET", "/stats?"+url.Values{"filter": {`^http\.kube_apiserver\.downstream_(rq_active|rq_total)$`}}.Encode())
	if code != 200 || body != fmt.Sprintf("%sdownstream_rq_active: 0\n%sdownstream_rq_total: %d\n", hcmPrefix, hcmPrefix, e.stat(hcmPrefix+"downstream_rq_total")) {
		t.Errorf("text /stats: %d %q", code, body)
	}
	if code, body := adminDo(t, e, "GET", "/stats?filter=(a"); code != 400 || body != "Invalid re2 regex" {
		t.Errorf("invalid filter: %d %q", code, body)
	}
	if code, body := adminDo(t, e, "GET", "/stats?format=xml"); code != 400 || !strings.HasPrefix(body, "usage: /stats?format=") {
		t.Errorf("format=xml: %d %q", code, body)
	}
	if code, _ := adminDo(t, e, "GET", "/stats?usedonly"); code != 400 {
		t.Errorf("usedonly (not implemented): %d", code)
	}
	code, body = adminDo(t, e, "GET", "/stats/prometheus")
	if code != 200 || !strings.Contains(body, "# TYPE envoy_http_downstream_rq_active gauge\n") ||
		!strings.Contains(body, "\nenvoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"kube_apiserver\"} ") {
		t.Errorf("/stats/prometheus: %d %q", code, body)
	}
}
