package inventory_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// statusRecorder records the status of each discovery document's answer.
type statusRecorder struct {
	rt http.RoundTripper
	mu sync.Mutex
	by map[string][]int // by path
}

func (r *statusRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := r.rt.RoundTrip(req)
	if err == nil && (req.URL.Path == "/api" || req.URL.Path == "/apis") {
		r.mu.Lock()
		r.by[req.URL.Path] = append(r.by[req.URL.Path], res.StatusCode)
		r.mu.Unlock()
	}
	return res, err
}

// take returns what was recorded since the last take.
func (r *statusRecorder) take() map[string][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.by
	r.by = map[string][]int{}
	return out
}

// TestFetchAsksWhetherDiscoveryChanged: a real apiserver's aggregated discovery is asked for
// again with If-None-Match. Unchanged, both documents answer 304 and the fetch gives back the
// previous list itself (nothing sent, nothing decoded); after a new CRD, /apis is read again
// and /api (the core group, unchanged) is not.
func TestFetchAsksWhetherDiscoveryChanged(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	cp := controlplane.ForTest(t, ctx, controlplane.Options{Log: testutil.LogWriter(t), Servers: []controlplane.ServerSpec{{Name: "cp-a", Version: "v1.37.1"}}})
	server := cp.Server("cp-a")
	rec := &statusRecorder{by: map[string][]int{}}
	cfg := server.RESTConfig()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { rec.rt = rt; return rec })
	fetch := func(prev *inventory.Fetched) *inventory.Fetched {
		t.Helper()
		f, err := inventory.Fetch(ctx, cfg, server.Address(), inventory.FetchOptions{ServerName: controlplane.UpstreamServerName, Previous: prev})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	hasGroup := func(f *inventory.Fetched, name string) bool {
		return slices.ContainsFunc(f.List.Items, func(g apidiscoveryv2.APIGroupDiscovery) bool { return g.Name == name })
	}

	first := fetch(nil)
	if got := rec.take(); !slices.Equal(got["/api"], []int{200}) || !slices.Equal(got["/apis"], []int{200}) {
		t.Fatalf("first fetch: %v; want one 200 for each document", got)
	}
	if !hasGroup(first, "") || !hasGroup(first, "apps") {
		t.Fatalf("first fetch: %d groups, without the core group or apps", len(first.List.Items))
	}
	again := fetch(first)
	if got := rec.take(); !slices.Equal(got["/api"], []int{304}) || !slices.Equal(got["/apis"], []int{304}) {
		t.Errorf("fetch with nothing changed: %v; want 304 for each document", got)
	}
	if again.List != first.List || again.Version != first.Version {
		t.Errorf("fetch with nothing changed gave a new list (%p, was %p) or version %q (was %q); want the previous list itself", again.List, first.List, again.Version, first.Version)
	}

	createCRD(t, ctx, server.RESTConfig(), "conditional.kube-mvp.io", "sprocket", "Sprocket")
	prev := again
	testutil.WaitFor(t, ctx, time.Minute, "the new CRD's group in a fetch", func() error {
		f := fetch(prev)
		got := rec.take()
		if !hasGroup(f, "conditional.kube-mvp.io") {
			prev = f // the apiserver publishes a CRD once it is established
			return fmt.Errorf("not yet (%v)", got)
		}
		if !slices.Equal(got["/api"], []int{304}) || !slices.Equal(got["/apis"], []int{200}) {
			t.Errorf("fetch after the CRD: %v; want 304 for /api (unchanged) and 200 for /apis", got)
		}
		if !hasGroup(f, "") || !hasGroup(f, "apps") {
			t.Errorf("fetch after the CRD: %d groups, without the core group or apps (the unchanged /api's groups must stay)", len(f.List.Items))
		}
		return nil
	})
}

// TestFetchETagsFromAnyone: an apiserver's ETag is only sent back if it is a plain, short
// header value (anything else would fail every later request to it), and a 304 to a request
// that sent no ETag is an error, never an empty discovery.
func TestFetchETagsFromAnyone(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	for _, c := range []struct {
		name, etag string
		sentBack   bool
	}{
		{"an apiserver's", `"6DBE2BF5"`, true},
		{"a tab", "\"a\tb\"", false}, // other control bytes Go's client refuses as a malformed header
		{"a space", `"a b"`, false},
		{"non-ASCII", `"café"`, false},
		{"too long", `"` + strings.Repeat("x", 300) + `"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got sync.Map // path -> If-None-Match of the second fetch
			second := false
			serve := func(w http.ResponseWriter, r *http.Request) {
				if second {
					got.Store(r.URL.Path, r.Header.Get("If-None-Match"))
				}
				w.Header().Set("ETag", c.etag)
				w.Header().Set("Content-Type", contract.MediaTypeAggregatedDiscovery)
				io.WriteString(w, emptyAggregated)
			}
			srv := fakeAPIServer(t, map[string]http.HandlerFunc{"/api": serve, "/apis": serve})
			opts := inventory.FetchOptions{ServerName: "example.com"}
			first, err := inventory.Fetch(ctx, trusting(srv), srv.Listener.Addr().String(), opts)
			if err != nil {
				t.Fatal(err)
			}
			second = true
			opts.Previous = first
			if _, err := inventory.Fetch(ctx, trusting(srv), srv.Listener.Addr().String(), opts); err != nil {
				t.Fatalf("second fetch: %v", err)
			}
			for _, path := range []string{"/api", "/apis"} {
				sent, _ := got.Load(path)
				if want := map[bool]string{true: c.etag, false: ""}[c.sentBack]; sent != want {
					t.Errorf("%s: If-None-Match %q; want %q", path, sent, want)
				}
			}
		})
	}

	t.Run("304 unasked", func(t *testing.T) {
		srv := fakeAPIServer(t, map[string]http.HandlerFunc{"/apis": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotModified)
		}})
		if f, err := inventory.Fetch(ctx, trusting(srv), srv.Listener.Addr().String(), inventory.FetchOptions{ServerName: "example.com"}); err == nil {
			t.Errorf("a 304 with no earlier answer: %d groups, no error; want the fetch to fail", len(f.List.Items))
		}
	})
}
