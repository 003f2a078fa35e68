package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestFrozenAPIServer: one of two apiservers stops answering without closing anything (SIGSTOP:
// its TCP connections stay open, the kernel acknowledging them, and its Lease stays fresh for
// the liveness window), as a hung or partitioned apiserver does. Through kube-mvp, no watch
// stays stuck on it: the HTTP/2 keepalive pings close the data plane's connections to it, a
// watch on one ends (with a reset: Envoy cannot end a stream it did not see end) and resumes,
// like client-go's reflector, on the other apiserver, and sees what is written meanwhile;
// every read is answered 200 (one in flight on it is retried after the reset). Without the
// pings a watch on it would wait for it for ever.
func TestFrozenAPIServer(t *testing.T) {
	ctx := testutil.Context(t, 6*time.Minute)
	e := newEnv(t, ctx,
		controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"},
		controlplane.ServerSpec{Name: "cp-b", Version: "v1.37.1"},
	)
	front := e.startKubeMVP(ctx, "front", "")
	direct := e.adminClient(e.cp.Server("cp-b"))
	mark := func(name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := direct.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	tc := e.tlsConfig(&e.cp.PKI.Admin)
	tc.NextProtos = []string{"http/1.1"}
	watchClient := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	readClient := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
	base := front.Endpoint() + "/api/v1/namespaces/default/configmaps"

	// Watchers: each holds a watch and resumes it from the last resourceVersion when it ends.
	const watchers = 8
	var watching atomic.Int64 // watches opened
	var (
		mu    sync.Mutex
		seen  = make([]map[string]time.Time, watchers) // configmap name → when the watcher saw it
		ended = make([]int, watchers)                  // watches that ended, per watcher
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range watchers {
		seen[i] = map[string]time.Time{}
		wg.Go(func() {
			rv := ""
			for loadCtx.Err() == nil {
				if rv == "" {
					res, err := readClient.Get(base)
					if err != nil {
						time.Sleep(200 * time.Millisecond)
						continue
					}
					var list struct {
						Metadata struct {
							ResourceVersion string `json:"resourceVersion"`
						} `json:"metadata"`
						Items []struct {
							Metadata struct {
								Name string `json:"name"`
							} `json:"metadata"`
						} `json:"items"`
					}
					json.NewDecoder(res.Body).Decode(&list)
					res.Body.Close()
					rv = list.Metadata.ResourceVersion
					mu.Lock()
					for _, it := range list.Items {
						if _, ok := seen[i][it.Metadata.Name]; !ok {
							seen[i][it.Metadata.Name] = time.Now()
						}
					}
					mu.Unlock()
					continue
				}
				req, _ := http.NewRequestWithContext(loadCtx, "GET", base+"?watch=true&allowWatchBookmarks=true&resourceVersion="+rv, nil)
				res, err := watchClient.Do(req)
				if err != nil {
					time.Sleep(200 * time.Millisecond)
					continue
				}
				watching.Add(1)
				scanner := bufio.NewScanner(res.Body)
				for scanner.Scan() {
					var ev struct {
						Type   string `json:"type"`
						Object struct {
							Metadata struct {
								Name            string `json:"name"`
								ResourceVersion string `json:"resourceVersion"`
							} `json:"metadata"`
						} `json:"object"`
					}
					if json.Unmarshal(scanner.Bytes(), &ev) != nil || ev.Type == "ERROR" {
						rv = "" // relist
						break
					}
					rv = ev.Object.Metadata.ResourceVersion
					if ev.Type == "ADDED" {
						mu.Lock()
						seen[i][ev.Object.Metadata.Name] = time.Now()
						mu.Unlock()
					}
				}
				res.Body.Close()
				if loadCtx.Err() == nil {
					mu.Lock()
					ended[i]++
					mu.Unlock()
				}
			}
		})
	}
	// Readers: lists, each a new connection.
	var reads, failed atomic.Int64
	var slowest atomic.Int64
	var failures []string
	for range 2 {
		wg.Go(func() {
			for loadCtx.Err() == nil {
				start := time.Now()
				res, err := readClient.Get(base + "?limit=1")
				if loadCtx.Err() != nil {
					return
				}
				reads.Add(1)
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
				if err != nil || res.StatusCode != 200 {
					failed.Add(1)
					msg := fmt.Sprint(err)
					if res != nil {
						body, _ := io.ReadAll(res.Body)
						msg = fmt.Sprintf("%d %.200s", res.StatusCode, body)
					}
					mu.Lock()
					if len(failures) < 10 {
						failures = append(failures, msg)
					}
					mu.Unlock()
				}
				if res != nil {
					res.Body.Close()
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	stop := func() {
		stopLoad()
		wg.Wait()
	}
	defer stop()
	everyoneSaw := func(name string) func() error {
		return testutil.Cond(func() bool {
			mu.Lock()
			defer mu.Unlock()
			for i := range watchers {
				if _, ok := seen[i][name]; !ok {
					return false
				}
			}
			return true
		})
	}
	testutil.WaitFor(t, ctx, time.Minute, "every watcher has a watch open", testutil.Cond(func() bool { return watching.Load() >= watchers }))
	mark("before-freeze")
	testutil.WaitFor(t, ctx, time.Minute, "every watcher sees a configmap created before the freeze", everyoneSaw("before-freeze"))
	mu.Lock()
	endedBefore := make([]int, watchers)
	copy(endedBefore, ended)
	mu.Unlock()

	if err := e.cp.Freeze("cp-a"); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Logf("cp-a frozen at %s", frozen.UTC().Format("15:04:05.000"))
	defer e.cp.Thaw("cp-a")
	mark("during-freeze")
	// The keepalive closes a connection to cp-a within one interval and timeout (10 s + 15 %
	// jitter, 5 s); the bound leaves room for a slow machine and a resumed watch routed to cp-a
	// once more before the health checks take it out.
	testutil.WaitFor(t, ctx, 90*time.Second, "every watcher sees a configmap created while cp-a is frozen", everyoneSaw("during-freeze"))
	mu.Lock()
	interrupted, latest := 0, time.Duration(0)
	for i := range watchers {
		if ended[i] > endedBefore[i] {
			interrupted++
		}
		if d := seen[i]["during-freeze"].Sub(frozen); d > latest {
			latest = d
		}
	}
	mu.Unlock()
	t.Logf("while cp-a was frozen: %d of %d watchers' watches ended and resumed; the last saw the new configmap %s after the freeze; %d reads, %d failed, the slowest took %s",
		interrupted, watchers, latest.Round(time.Millisecond), reads.Load(), failed.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
	if interrupted == 0 {
		t.Errorf("no watch was on cp-a (least request spreads %d watches over two apiservers): the test proved nothing", watchers)
	}
	// Reads go on through the freeze and after the health checks took cp-a out.
	time.Sleep(10 * time.Second)
	if err := e.cp.Thaw("cp-a"); err != nil {
		t.Fatal(err)
	}
	stop()
	if n := failed.Load(); n > 0 {
		mu.Lock()
		t.Errorf("%d of %d reads failed: %q", n, reads.Load(), failures)
		mu.Unlock()
	}
}
