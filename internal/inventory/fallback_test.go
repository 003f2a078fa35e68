package inventory_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestLegacyFallbackOnlyWithoutAggregatedDiscovery: legacy discovery is read only from an
// apiserver that does not offer aggregated discovery at all (404, 406, or the legacy
// document in answer); a transient failure of the aggregated fetch (429, 503) fails the
// fetch, so the apiserver's previous aggregated discovery stays in use rather than a legacy
// one that switches the merged /apis off.
func TestLegacyFallbackOnlyWithoutAggregatedDiscovery(t *testing.T) {
	// The legacy documents client-go reads (only they list pods), served whatever the Accept header says when
	// the aggregated form is not answered.
	legacy := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api":
			w.Write([]byte(`{"kind":"APIVersions","versions":["v1"]}`))
		case "/apis":
			w.Write([]byte(`{"kind":"APIGroupList","apiVersion":"v1","groups":[]}`))
		case "/api/v1":
			w.Write([]byte(`{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"pods","namespaced":true,"kind":"Pod","verbs":["get","list"]}]}`))
		}
	}
	// onlyAggregated: the request accepts aggregated discovery only (xds-server's own
	// fetch), not also the legacy document (client-go's legacy discovery asks for both).
	onlyAggregated := func(r *http.Request) bool {
		for _, a := range strings.Split(r.Header.Get("Accept"), ",") {
			if a = strings.TrimSpace(a); strings.HasPrefix(a, "application/json") && !strings.Contains(a, "apidiscovery.k8s.io") {
				return false
			}
		}
		return true
	}
	aggregatedAnswer := func(status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if onlyAggregated(r) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":` + strconv.Itoa(status) + `}`))
				return
			}
			legacy(w, r)
		}
	}
	for _, c := range []struct {
		name       string
		apis       http.HandlerFunc
		wantLegacy bool // a list read from legacy discovery; else the fetch fails
	}{
		{"404", aggregatedAnswer(http.StatusNotFound), true},
		{"406", aggregatedAnswer(http.StatusNotAcceptable), true},
		{"the legacy document", legacy, true},
		{"429", aggregatedAnswer(http.StatusTooManyRequests), false},
		{"503", aggregatedAnswer(http.StatusServiceUnavailable), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := fakeAPIServer(t, map[string]http.HandlerFunc{"/apis": c.apis, "/api/v1": legacy, "/api": func(w http.ResponseWriter, r *http.Request) {
				if c.name == "the legacy document" {
					legacy(w, r)
					return
				}
				if onlyAggregated(r) {
					w.Header().Set("Content-Type", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
					w.Write([]byte(emptyAggregated))
					return
				}
				legacy(w, r)
			}})
			ctx := testutil.Context(t, time.Minute)
			list, _, err := inventory.FetchDiscovery(ctx, trusting(srv), srv.Listener.Addr().String(), inventory.FetchOptions{ServerName: "example.com"})
			switch {
			case c.wantLegacy && (err != nil || list == nil || len(list.Items) != 1 || list.Items[0].Versions[0].Resources[0].Resource != "pods"):
				t.Errorf("an apiserver without aggregated discovery: %v, %+v; want its legacy discovery", err, list)
			case !c.wantLegacy && err == nil:
				t.Errorf("a transient failure of aggregated discovery fell back to legacy discovery: %+v; want the fetch to fail", list)
			}
		})
	}
}
