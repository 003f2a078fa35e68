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
	"github.com/kube-mvp/kube-mvp/test/dataplane"
)

// TestFrozenAPIServer: one of two apiservers stops answering without closing anything (SIGSTOP:
// its TCP connections stay open, the kernel acknowledging them, and its Lease stays fresh for
// the liveness window), as a hung or partitioned apiserver does. Through kube-mvp, no watch
// stays stuck on it: the HTTP/2 keepalive pings close the data plane's connections to it, a
// watch on one ends (with a reset: Envoy cannot end a stream it did not see end) and resumes,
// like client-go's reflector, on the other apiserver, and sees what is written meanwhile;
// every read is answered 200 (one in flight on it is retried after the reset). Without the
// pings a watch on it would wait for it for ever.
//
// The test does not leave to the balancer whether a watch is on the apiserver it freezes: it
// asks each apiserver (its own /metrics) how many of the watchers' watches it holds, and
// freezes the one that holds more; the marks the watchers wait for are written through the
// other one, directly.
func TestFrozenAPIServer(t *testing.T) {
	ctx := testutil.Context(t, 6*time.Minute)
	servers := []string{"cp-a", "cp-b"}
	e := newEnv(t, ctx,
		controlplane.ServerSpec{Name: servers[0], Version: "v1.37.1"},
		controlplane.ServerSpec{Name: servers[1], Version: "v1.37.1"},
	)
	front := e.startKubeMVP(ctx, "front", "")
	mark := func(through, name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := e.adminClient(e.cp.Server(through)).CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The watchers watch the ConfigMaps of every namespace: scope "cluster" in the
	// apiservers' apiserver_longrunning_requests gauge, where the apiservers' own informers
	// and xds-server watch those of kube-system only (scope "namespace"). So an apiserver's
	// count of these is the watchers' alone, which is checked before they start.
	watchesOn := func(name string) (int, error) {
		n, err := e.apiserverMetric(ctx, e.cp.Server(name), "apiserver_longrunning_requests",
			map[string]string{"verb": "WATCH", "group": "", "version": "v1", "resource": "configmaps", "subresource": "", "scope": "cluster"})
		return int(n), err
	}
	for _, s := range servers {
		if n, err := watchesOn(s); err != nil || n != 0 {
			t.Fatalf("before the watchers start, %s counts %d watches of every namespace's ConfigMaps (%v): something else watches them, so the count would not be the watchers'", s, n, err)
		}
	}

	tc := e.tlsConfig(&e.cp.PKI.Admin)
	tc.NextProtos = []string{"http/1.1"}
	watchClient := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	readClient := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
	base := front.Endpoint() + "/api/v1/namespaces/default/configmaps"
	watchBase := front.Endpoint() + "/api/v1/configmaps"

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
					res, err := readClient.Get(watchBase)
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
				req, _ := http.NewRequestWithContext(loadCtx, "GET", watchBase+"?watch=true&allowWatchBookmarks=true&resourceVersion="+rv, nil)
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
	mark(servers[1], "before-freeze")
	testutil.WaitFor(t, ctx, time.Minute, "every watcher sees a configmap created before the freeze", everyoneSaw("before-freeze"))

	// Where the watches are, as the apiservers themselves count them.
	held := map[string]int{}
	testutil.WaitFor(t, ctx, 30*time.Second, fmt.Sprintf("the apiservers' own metrics to count the watchers' %d watches", watchers), func() error {
		total := 0
		for _, s := range servers {
			n, err := watchesOn(s)
			if err != nil {
				return err
			}
			held[s] = n
			total += n
		}
		if total != watchers {
			return fmt.Errorf("the apiservers count %v, %d in all", held, total)
		}
		return nil
	})
	victim, other := servers[0], servers[1]
	if held[other] > held[victim] {
		victim, other = other, victim
	}
	t.Logf("the apiservers' own metrics: %s holds %d of the %d watches, %s %d: freezing %s", servers[0], held[servers[0]], watchers, servers[1], held[servers[1]], victim)
	if held[victim] == 0 {
		t.Fatalf("neither apiserver holds a watch by its own metrics (%v), although every watcher has one open", held)
	}
	mu.Lock()
	endedBefore := make([]int, watchers)
	copy(endedBefore, ended)
	mu.Unlock()

	if err := e.cp.Freeze(victim); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Logf("%s frozen at %s", victim, frozen.UTC().Format("15:04:05.000"))
	defer e.cp.Thaw(victim)
	mark(other, "during-freeze")
	// The keepalive closes a connection to the frozen apiserver within one interval and
	// timeout (10 s + 15 % jitter, 5 s); the bound leaves room for a slow machine and a
	// resumed watch routed to it once more before the health checks take it out.
	testutil.WaitFor(t, ctx, 90*time.Second, fmt.Sprintf("every watcher sees a configmap created while %s is frozen", victim), everyoneSaw("during-freeze"))
	mu.Lock()
	interrupted, endedWatches, latest := 0, 0, time.Duration(0)
	for i := range watchers {
		if ended[i] > endedBefore[i] {
			interrupted++
		}
		endedWatches += ended[i] - endedBefore[i]
		if d := seen[i]["during-freeze"].Sub(frozen); d > latest {
			latest = d
		}
	}
	mu.Unlock()
	t.Logf("while %s was frozen: %d watches of %d of %d watchers ended and resumed; the last saw the new configmap %s after the freeze; %d reads, %d failed, the slowest took %s",
		victim, endedWatches, interrupted, watchers, latest.Round(time.Millisecond), reads.Load(), failed.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
	if interrupted == 0 {
		t.Errorf("no watch ended while %s was frozen, although it held %d of them", victim, held[victim])
	}
	if endedWatches < held[victim] {
		t.Errorf("%d watches ended while %s was frozen, fewer than the %d it held", endedWatches, victim, held[victim])
	}
	// Every watch resumed on the other apiserver, as it counts them.
	testutil.WaitFor(t, ctx, 30*time.Second, fmt.Sprintf("%s to hold all %d watches", other, watchers), func() error {
		if n, err := watchesOn(other); err != nil || n != watchers {
			return fmt.Errorf("%s holds %d (%v)", other, n, err)
		}
		return nil
	})
	// Reads go on through the freeze and after the data plane's health checks took the frozen
	// apiserver out: wait until no cluster of the data plane has it usable, then for more reads.
	testutil.WaitFor(t, ctx, time.Minute, fmt.Sprintf("the data plane to take %s out", victim), func() error {
		clusters, err := dataplane.ReadClusters(ctx, front.Envoy.Admin)
		if err != nil {
			return err
		}
		for _, c := range clusters.GetClusterStatuses() {
			for _, h := range c.GetHostStatuses() {
				if hs := h.GetHealthStatus(); h.GetHostname() == victim && !hs.GetFailedActiveHealthCheck() && !hs.GetFailedOutlierCheck() {
					return fmt.Errorf("%s still usable in %s", victim, c.GetName())
				}
			}
		}
		return nil
	})
	t.Logf("the data plane took %s out %s after the freeze", victim, time.Since(frozen).Round(time.Millisecond))
	readsThen := reads.Load()
	testutil.WaitFor(t, ctx, 30*time.Second, "20 more reads", testutil.Cond(func() bool { return reads.Load() >= readsThen+20 }))
	if err := e.cp.Thaw(victim); err != nil {
		t.Fatal(err)
	}
	stop()
	if n := failed.Load(); n > 0 {
		mu.Lock()
		t.Errorf("%d of %d reads failed: %q", n, reads.Load(), failures)
		mu.Unlock()
	}
}
