package xds

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Each explain answer costs a translation, so at most maxExplaining run at once and the rest
// are told to come back, rather than queueing work on xds-server.
func TestExplainBounded(t *testing.T) {
	s := New(Options{})
	get := func() int {
		rec := httptest.NewRecorder()
		s.AdminHandler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/explain?path=/api/v1/pods", nil))
		return rec.Code
	}
	for range maxExplaining {
		s.explaining <- struct{}{}
	}
	if code := get(); code != http.StatusTooManyRequests {
		t.Errorf("with %d explains running: %d, want 429", maxExplaining, code)
	}
	<-s.explaining
	if code := get(); code != http.StatusServiceUnavailable { // no topology yet
		t.Errorf("with a slot free: %d, want 503 (no topology yet)", code)
	}
	if len(s.explaining) != maxExplaining-1 {
		t.Errorf("the answered request kept its slot: %d taken", len(s.explaining))
	}
}
