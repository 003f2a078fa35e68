package adminhttp

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDoBoundsTheAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, strings.Repeat("x", 100))
	}))
	defer srv.Close()
	status, body, err := Do(t.Context(), srv.Client(), http.MethodGet, srv.URL, 100)
	if err != nil || status != http.StatusTeapot || len(body) != 100 {
		t.Errorf("at the limit: %d, %d bytes, %v", status, len(body), err)
	}
	if _, body, err := Do(t.Context(), srv.Client(), http.MethodPost, srv.URL, 99); err == nil || body != nil {
		t.Errorf("over the limit: %d bytes, %v; want an error and no body", len(body), err)
	}
	if got := FirstLine([]byte("\n  no such page\nmore")); got != "no such page" {
		t.Errorf("FirstLine %q", got)
	}
}
