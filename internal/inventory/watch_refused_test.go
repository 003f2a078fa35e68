package inventory

import (
	"context"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestDiscoveryRefusedTooLarge: an apiserver whose /apis grows over the limit has that fetch
// refused, logged once naming it and the limit, and counted; its previous discovery stays in
// use, and the other apiserver's fetch is unaffected.
func TestDiscoveryRefusedTooLarge(t *testing.T) {
	const limit = 1 << 20
	var oversized atomic.Bool
	serve := func(big bool) *httptest.Server {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/api", "/apis":
				w.Header().Set("Content-Type", contract.MediaTypeAggregatedDiscovery)
				fmt.Fprint(w, `{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[]`)
				if big && oversized.Load() && r.URL.Path == "/apis" {
					fmt.Fprintf(w, `,"pad":"%s"`, strings.Repeat("x", limit))
				}
				fmt.Fprint(w, `}`)
			default:
				http.NotFound(w, r)
			}
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	normal, big := serve(false), serve(true)
	idN, idB := objects.APIServerIDFor("cp-normal"), objects.APIServerIDFor("cp-big")

	var (
		mu      sync.Mutex
		refused []string
	)
	logs := &testutil.SyncBuffer{}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	var now atomic.Pointer[time.Time]
	now.Store(&t0)
	w := &Watcher{
		cfg: &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: normal.Certificate().Raw})}},
		opts: WatchOptions{DiscoveryInterval: time.Hour, ServerName: "example.com", MaxDiscoveryBody: limit,
			Clock: func() time.Time { return *now.Load() },
			Log:   slog.New(slog.NewTextHandler(logs, nil)),
			OnDiscoveryRefused: func(reason string) {
				mu.Lock()
				defer mu.Unlock()
				refused = append(refused, reason)
			}},
		kick:      make(chan struct{}, 1),
		discovery: map[string]discovered{},
	}
	leases := func(at time.Time) []coordinationv1.Lease {
		renew := metav1.NewMicroTime(at)
		var ls []coordinationv1.Lease
		for _, s := range []struct {
			id, host string
			srv      *httptest.Server
		}{{idN, "cp-normal", normal}, {idB, "cp-big", big}} {
			holder := s.id + "_1"
			ls = append(ls, coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: s.id, Namespace: "kube-system",
					Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, objects.HostnameLabel: s.host},
					Annotations: map[string]string{objects.PeerAdvertiseAnnotation: s.srv.Listener.Addr().String()}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renew},
			})
		}
		return ls
	}
	ctx := testutil.Context(t, time.Minute)
	// round asks for discovery at at, waits for the fetches it starts, and returns what
	// the next build would use.
	round := func(at time.Time) map[string]bool {
		t.Helper()
		now.Store(&at)
		opts := objects.Options{Now: at, LivenessWindow: 30 * time.Second}
		w.discoveryFor(ctx, leases(at), opts)
		testutil.WaitFor(t, ctx, 30*time.Second, "both fetches done", func() error {
			w.mu.Lock()
			defer w.mu.Unlock()
			for _, id := range []string{idN, idB} {
				if d := w.discovery[id]; !d.fetched.Equal(at) || (!d.failed && !d.listAt.Equal(at)) {
					return fmt.Errorf("%s not fetched yet", id)
				}
			}
			return nil
		})
		lists, _, _ := w.discoveryFor(context.Background(), leases(at), opts)
		have := map[string]bool{}
		for id, l := range lists {
			have[id] = l != nil
		}
		return have
	}

	if have := round(t0); !have[idN] || !have[idB] {
		t.Fatalf("first round: discovery of %v, want both", have)
	}
	oversized.Store(true)
	later := t0.Add(2 * time.Hour) // past DiscoveryInterval: both are fetched again
	if have := round(later); !have[idN] || !have[idB] {
		t.Errorf("after the refusal: discovery of %v, want both (cp-big's previous copy)", have)
	}
	w.mu.Lock()
	dN, dB := w.discovery[idN], w.discovery[idB]
	w.mu.Unlock()
	if dN.failed || !dN.listAt.Equal(later) {
		t.Errorf("cp-normal: failed %v, list from %s; want fetched again", dN.failed, dN.listAt)
	}
	if !dB.failed || !dB.listAt.Equal(t0) {
		t.Errorf("cp-big: failed %v, list from %s; want failed, the first list kept", dB.failed, dB.listAt)
	}
	mu.Lock()
	if len(refused) != 1 || refused[0] != RefusedTooLarge {
		t.Errorf("refusals counted: %v, want one %s", refused, RefusedTooLarge)
	}
	mu.Unlock()
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, fmt.Sprint(limit)) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], idB) || strings.Contains(lines[0], idN) {
		t.Errorf("log lines naming the limit: %q, want one naming %s", lines, idB)
	}
}
