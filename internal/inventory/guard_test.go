package inventory_test

import (
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

const token = "secret-token"

// emptyAggregated is a valid aggregated discovery document with no group.
const emptyAggregated = `{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[]}`

// fakeAPIServer serves aggregated discovery over TLS (httptest's certificate, for
// example.com), except the paths in override.
func fakeAPIServer(t *testing.T, override map[string]http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := override[r.URL.Path]; h != nil {
			h(w, r)
			return
		}
		switch r.URL.Path {
		case "/api", "/apis":
			w.Header().Set("Content-Type", contract.MediaTypeAggregatedDiscovery)
			w.Write([]byte(emptyAggregated))
		case "/version":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"gitVersion":"v1.37.1"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// trusting is a client configuration that trusts srv's certificate and has a bearer token.
func trusting(srv *httptest.Server) *rest.Config {
	return &rest.Config{Host: srv.URL, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}}
}

func fetch(t *testing.T, srv *httptest.Server, maxBody int64) error {
	t.Helper()
	ctx := testutil.Context(t, time.Minute)
	_, _, err := inventory.FetchDiscovery(ctx, trusting(srv), srv.Listener.Addr().String(),
		inventory.FetchOptions{ServerName: "example.com", MaxBody: maxBody})
	return err
}

func refusal(err error) string {
	var r *inventory.RefusedError
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

// elsewhere is a plain-HTTP server that counts the requests it gets (and the tokens).
func elsewhere(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		t.Errorf("redirect followed: %s %s with Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestDiscoveryRedirectNotFollowed: an apiserver answering a discovery fetch with a redirect
// to a plain-HTTP server fails the fetch, with an error naming the Location, and that server
// gets nothing (client-go would have sent it the bearer token in clear). A redirect of
// /version alone fails the fetch too.
func TestDiscoveryRedirectNotFollowed(t *testing.T) {
	for _, tc := range []struct {
		path string
		code int
	}{{"/api", http.StatusFound}, {"/apis", http.StatusMovedPermanently}, {"/apis", http.StatusTemporaryRedirect}, {"/version", http.StatusPermanentRedirect}} {
		t.Run(tc.path+" "+strconv.Itoa(tc.code), func(t *testing.T) {
			plain, got := elsewhere(t)
			location := plain.URL + "/stolen" + tc.path
			srv := fakeAPIServer(t, map[string]http.HandlerFunc{tc.path: func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, location, tc.code)
			}})
			err := fetch(t, srv, 0)
			if refusal(err) != inventory.RefusedRedirect {
				t.Fatalf("fetch: %v, want a refused redirect", err)
			}
			if !strings.Contains(err.Error(), location) || !strings.Contains(err.Error(), strconv.Itoa(tc.code)) {
				t.Errorf("the error does not name the status and Location %s: %v", location, err)
			}
			if n := got.Load(); n != 0 {
				t.Errorf("%d requests reached the redirect's target", n)
			}
		})
	}
}

// TestNoRedirectClient: xds-server's own client (informers, the memory ConfigMap, certgen)
// does not follow a redirect either.
func TestNoRedirectClient(t *testing.T) {
	plain, got := elsewhere(t)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+r.URL.Path, http.StatusFound)
	}))
	defer srv.Close()
	cfg := trusting(srv)
	cfg.TLSClientConfig.ServerName = "example.com"
	hc, err := inventory.NoRedirectClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.CoreV1().ConfigMaps("kube-system").Get(testutil.Context(t, time.Minute), "x", metav1.GetOptions{})
	if refusal(err) != inventory.RefusedRedirect || !strings.Contains(err.Error(), plain.URL) {
		t.Errorf("get: %v, want a refused redirect naming %s", err, plain.URL)
	}
	if n := got.Load(); n != 0 {
		t.Errorf("%d requests reached the redirect's target", n)
	}
	if http.DefaultClient.CheckRedirect != nil {
		t.Error("http.DefaultClient changed")
	}
}

// TestDiscoveryBodyBounded: a body over the limit fails the fetch, whether its length is
// declared, chunked, gzipped (the decoded size counts, and no more than the read limit is
// decoded) or met on client-go's legacy discovery path; a body at the limit passes. (An
// aggregated document over the limit only in its groups is pruned: TestDiscoveryPruned.)
func TestDiscoveryBodyBounded(t *testing.T) {
	const limit = 1 << 20
	padded := func(n int) []byte { // an aggregated document of exactly n bytes, compact
		b := []byte(emptyAggregated[:len(emptyAggregated)-1] + `,"pad":{`)
		for i := 0; ; i++ {
			entry := fmt.Sprintf(`"k%d":"`, i)
			if i > 0 {
				entry = "," + entry
			}
			left := n - len(b) - len(entry) - len(`"}}`)
			if left <= 1000 {
				b = append(append(b, entry...), bytes.Repeat([]byte("x"), left)...)
				return append(b, `"}}`...)
			}
			b = append(append(append(b, entry...), bytes.Repeat([]byte("x"), 900)...), '"')
		}
	}
	aggregated := func(body []byte, declare bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", contract.MediaTypeAggregatedDiscovery)
			if declare {
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			} else {
				w.(http.Flusher).Flush() // chunked
			}
			w.Write(body)
		}
	}
	var gzipAsked atomic.Bool
	const gzipped = 256 << 20 // decoded; about 256 KiB on the wire
	gzipBomb := func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			t.Errorf("no gzip asked for: Accept-Encoding %q", r.Header.Get("Accept-Encoding"))
			return
		}
		gzipAsked.Store(true)
		w.Header().Set("Content-Type", contract.MediaTypeAggregatedDiscovery)
		w.Header().Set("Content-Encoding", "gzip")
		zw, _ := gzip.NewWriterLevel(w, gzip.BestCompression)
		zw.Write([]byte(emptyAggregated[:len(emptyAggregated)-1] + `,"pad":"`))
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for range gzipped >> 20 {
			if _, err := zw.Write(chunk); err != nil {
				return // the client hung up
			}
		}
		zw.Write([]byte(`"}`))
		zw.Close()
	}
	json := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(body))
		}
	}
	// Legacy discovery: /apis not aggregated, one group/version too large.
	legacy := map[string]http.HandlerFunc{
		"/api":    json(`{"kind":"APIVersions","versions":["v1"]}`),
		"/api/v1": json(`{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"pods","namespaced":true,"kind":"Pod","verbs":["get"]}]}`),
		"/apis": json(`{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"big.example.com",` +
			`"versions":[{"groupVersion":"big.example.com/v1","version":"v1"}],` +
			`"preferredVersion":{"groupVersion":"big.example.com/v1","version":"v1"}}]}`),

		"/apis/big.example.com/v1": json(`{"kind":"APIResourceList","groupVersion":"big.example.com/v1","resources":[],"pad":"` +
			strings.Repeat("x", limit) + `"}`),
	}

	for _, tc := range []struct {
		name    string
		handler map[string]http.HandlerFunc
		refused bool
	}{
		{"at the limit", map[string]http.HandlerFunc{"/apis": aggregated(padded(limit), false)}, false},
		{"declared length", map[string]http.HandlerFunc{"/apis": aggregated(padded(limit+1), true)}, true},
		{"chunked", map[string]http.HandlerFunc{"/api": aggregated(padded(limit+1), false)}, true},
		{"gzip", map[string]http.HandlerFunc{"/apis": gzipBomb}, true},
		{"legacy", legacy, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeAPIServer(t, tc.handler)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := fetch(t, srv, limit)
			runtime.ReadMemStats(&after)
			if !tc.refused {
				if err != nil {
					t.Fatalf("fetch: %v", err)
				}
				return
			}
			if refusal(err) != inventory.RefusedTooLarge || !strings.Contains(err.Error(), fmt.Sprint(limit)) {
				t.Fatalf("fetch: %v, want too large, naming the limit", err)
			}
			if tc.name == "gzip" {
				if !gzipAsked.Load() {
					t.Fatal("the gzip bomb was not served")
				}
				// Decoding it all would allocate at least its 256 MiB.
				if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
					t.Errorf("%d MiB allocated while refusing a body over %d bytes", alloc>>20, limit)
				}
			}
		})
	}
}

// TestDiscoveryPruned: an aggregated /apis over the limit only because of one bloated group (a
// CRD with 70 versions of 7,000 categories: 31 MB) is pruned, not refused: the fetch succeeds
// with every group, the bloated one within the bounds, and says what it left out.
func TestDiscoveryPruned(t *testing.T) {
	const limit = 1 << 20
	var b strings.Builder
	b.WriteString(`{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[`)
	b.WriteString(`{"metadata":{"name":"bloated.example.com"},"versions":[`)
	for v := range 70 {
		if v > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b,
			`{"version":"v%d","resources":[{"resource":"things","responseKind":{"group":"bloated.example.com","version":"v%d","kind":"Thing"},"scope":"Namespaced","verbs":["get","list"],"categories":[`,
			v+1, v+1)
		for c := range 7000 {
			if c > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"c%d-%s"`, c, strings.Repeat("x", 56))
		}
		b.WriteString(`]}],"freshness":"Current"}`)
	}
	b.WriteString(`]},{"metadata":{"name":"batch"},"versions":[{"version":"v1",` +
		`"resources":[{"resource":"jobs","responseKind":{"group":"batch","version":"v1",` +
		`"kind":"Job"},"scope":"Namespaced","verbs":["get","list"]}],"freshness":"Current"}]}]}`)
	body := b.String()
	if len(body) < 30<<20 {
		t.Fatalf("the document is %d bytes", len(body))
	}
	srv := fakeAPIServer(t, map[string]http.HandlerFunc{"/apis": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contract.MediaTypeAggregatedDiscovery)
		io.WriteString(w, body)
	}})
	var notes []string
	list, _, err := inventory.FetchDiscovery(testutil.Context(t, time.Minute), trusting(srv), srv.Listener.Addr().String(),
		// Reading and pruning 31 MB takes about 8 s under -race on two idle cores, close to
		// the default timeout; a busy machine takes longer.
		inventory.FetchOptions{ServerName: "example.com", MaxBody: limit, OnPruned: func(n []string) { notes = n }, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if len(list.Items) != 2 || list.Items[0].Name != "bloated.example.com" || list.Items[1].Name != "batch" {
		t.Fatalf("groups: %d, want bloated.example.com and batch", len(list.Items))
	}
	bloated := list.Items[0]
	if len(bloated.Versions) != 64 || len(bloated.Versions[0].Resources[0].Categories) != 64 {
		t.Errorf("bloated group: %d versions, %d categories; want 64 of each", len(bloated.Versions), len(bloated.Versions[0].Resources[0].Categories))
	}
	if all := strings.Join(notes, "; "); !strings.Contains(all, "/apis: more than 64 versions") || !strings.Contains(all, "categories") {
		t.Errorf("notes %q: want the versions and categories left out, with the path", notes)
	}
}
