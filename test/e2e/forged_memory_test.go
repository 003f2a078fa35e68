package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
	"github.com/kube-mvp/kube-mvp/test/harness"
)

// TestForgedMemory writes the memory ConfigMap as anyone allowed to write it could, while
// clients keep listing jobs through kube-mvp. (a) Beside xds-server's own signed entries: an
// entry claiming the real apiserver's hostname at another address, its Lease "deleted in
// 2099"; an entry of 1,000 group/versions; a real signed entry copied to another ID; then a
// ConfigMap of unsigned entries only. xds-server believes none of it: every request is
// served (no 404, no 503), /debug/topology lists none of the forged IDs, the routes do not
// grow, the rejections are counted, and xds-server writes its own memory back. (b) An
// operator deletes the entry of a departed apiserver, then the whole ConfigMap: it stays
// deleted (xds-server does not write it back), and the live apiserver is recorded again.
func TestForgedMemory(t *testing.T) {
	ctx := testutil.Context(t, 8*time.Minute)
	e := newEnv(t, ctx,
		controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"},
		controlplane.ServerSpec{Name: "cp-b", Version: "v1.37.1"})
	k := e.startKubeMVP(ctx, "memory", "", func(o *harness.Options) {
		o.XDSServerArgs = []string{"--memory-configmap", "default/kube-mvp-memory", "--departed-apiserver-grace", "10m"}
	})
	admin := e.adminClient(e.cp.Server("cp-a"))
	configMaps := admin.CoreV1().ConfigMaps("default")
	idA, idB := leaseOf(t, ctx, admin, "cp-a"), leaseOf(t, ctx, admin, "cp-b")
	if idA != objects.APIServerIDFor("cp-a") {
		t.Fatalf("cp-a's identity Lease is %s, the test derives %s", idA, objects.APIServerIDFor("cp-a"))
	}
	for _, id := range []string{idA, idB} {
		waitFor(t, ctx, id+" in the memory ConfigMap", func() error { return rememberedIn(ctx, admin, id, "batch/v1") })
	}
	if cm, err := configMaps.Get(ctx, "kube-mvp-memory", metav1.GetOptions{}); err == nil {
		var entry struct{ Served map[string]string }
		_ = json.Unmarshal([]byte(cm.Data[idA]), &entry)
		m, _ := memory.Decode(cm.Data)
		t.Logf("cp-a's signed entry: %d bytes, %d group/versions, %d resources", len(cm.Data[idA]), len(entry.Served), len(m[idA].Served))
	}
	// cp-b departs (killed: its Lease stays, stale): remembered.
	e.cp.Kill("cp-b")
	waitFor(t, ctx, "cp-b remembered", func() error {
		if src := sourceOf(t, k, idB); src.From != topology.SourceRemembered {
			return fmt.Errorf("source of cp-b %+v", src)
		}
		return nil
	})
	routes := routeCount(t, ctx, k)

	// (a) The forgeries.
	hc := e.rawClient(&e.cp.PKI.Admin)
	jobsURL := k.Endpoint() + "/apis/batch/v1/namespaces/default/jobs"
	codes := map[int]int{}
	request := func() {
		res, err := hc.Get(jobsURL)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		codes[res.StatusCode]++
	}
	now := time.Now().UTC().Truncate(time.Second)
	variantID, wideID, movedID := "apiserver-forged-variant", objects.APIServerIDFor("evil"), objects.APIServerIDFor("cp-c")
	var wide []topology.Resource
	for i := range 1000 {
		wide = append(wide, topology.Resource{Group: fmt.Sprintf("g%d.evil.example", i), Version: "v1", Resource: "things"})
	}
	forged := memory.Encode(memory.Memory{
		variantID: {Hostname: "cp-a", Address: "192.0.2.1:6443", Served: []topology.Resource{{Group: "batch", Version: "v1", Resource: "jobs"}},
			LastSeen: now, LeaseGone: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)},
		wideID: {Hostname: "evil", Address: "192.0.2.2:6443", Served: wide, LastSeen: now},
	})
	editMemory(t, ctx, configMaps, func(data map[string]string) map[string]string {
		maps.Copy(data, forged)
		data[movedID] = data[idA]
		return data
	})
	forgedIDs := []string{variantID, wideID, movedID}
	cleaned := func() error {
		cm, err := configMaps.Get(ctx, "kube-mvp-memory", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, id := range forgedIDs {
			if _, ok := cm.Data[id]; ok {
				return fmt.Errorf("%s still in the ConfigMap", id)
			}
		}
		if _, ok := cm.Data[idA]; !ok {
			return fmt.Errorf("cp-a's entry is gone")
		}
		for id, v := range cm.Data {
			if !strings.Contains(v, `"signature":`) {
				return fmt.Errorf("%s's entry is not signed", id)
			}
		}
		return nil
	}
	hold := func(what string, d time.Duration, check func() error) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
			request()
			if err := check(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	notInTopology := func() error {
		for _, id := range forgedIDs {
			if src := sourceOf(t, k, id); src.From != "" {
				return fmt.Errorf("/debug/topology lists forged %s: %+v", id, src)
			}
		}
		return nil
	}
	// Some rebuilds (every few seconds, and at each change of the ConfigMap) with the
	// forgeries in place; then xds-server has written its own memory over them.
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		request()
	}
	if err := notInTopology(); err != nil {
		t.Error(err)
	}
	if got := routeCount(t, ctx, k); got > routes || routes == 0 {
		t.Errorf("%d routes after the forgeries, %d before", got, routes)
	}
	if codes[http.StatusOK] == 0 || len(codes) != 1 {
		t.Errorf("requests for jobs through kube-mvp with the forged memory: %v, want only 200", codes)
	}
	waitFor(t, ctx, "xds-server writes its own memory over the forgeries", func() error { request(); return cleaned() })
	hold("after the forgeries", 5*time.Second, notInTopology)

	// An unsigned memory, as before signatures, that migration would accept (cp-b's ID, its
	// Lease's hostname and address): xds-server has seen signed ones.
	unsigned := memory.Encode(memory.Memory{idB: {Hostname: "cp-b", Address: e.cp.Server("cp-b").Address(),
		Served: []topology.Resource{{Group: "batch", Version: "v1", Resource: "jobs"}}, LastSeen: now}})
	editMemory(t, ctx, configMaps, func(map[string]string) map[string]string { return unsigned })
	waitFor(t, ctx, "xds-server writes its own memory over the unsigned one", func() error { request(); return cleaned() })
	hold("after the unsigned memory", 5*time.Second, notInTopology)
	if codes[http.StatusOK] == 0 || len(codes) != 1 {
		t.Errorf("requests for jobs through kube-mvp while the memory was forged: %v, want only 200", codes)
	}
	metrics := httpGet(t, k.XDSAdmin+"/metrics")
	if !strings.Contains(metrics, "kube_mvp_xds_memory_rejected_total{reason=") || !strings.Contains(metrics, `reason="unsigned"`) {
		t.Errorf("the rejections are not counted in /metrics:\n%s", grepLines(metrics, "kube_mvp_xds_memory"))
	}
	t.Logf("requests %v; %d routes; %s", codes, routes, grepLines(metrics, "kube_mvp_xds_memory_rejected_total"))

	// (b) The operator deletes departed cp-b's entry: it stays deleted.
	editMemory(t, ctx, configMaps, func(data map[string]string) map[string]string { delete(data, idB); return data })
	forgotten := func() error {
		if err := rememberedIn(ctx, admin, idB, ""); err == nil {
			return fmt.Errorf("cp-b's entry is back in the ConfigMap")
		}
		if src := sourceOf(t, k, idB); src.From == topology.SourceRemembered {
			return fmt.Errorf("cp-b is still remembered: %+v", src)
		}
		return nil
	}
	waitFor(t, ctx, "cp-b forgotten", forgotten)
	hold("cp-b's entry deleted", 15*time.Second, forgotten)

	// The whole ConfigMap deleted: written again with live cp-a only.
	if err := configMaps.Delete(ctx, "kube-mvp-memory", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the memory ConfigMap written again with cp-a", func() error { return rememberedIn(ctx, admin, idA, "batch/v1") })
	hold("the ConfigMap deleted", 10*time.Second, forgotten)
}

// editMemory changes the memory ConfigMap's data as a writer of it would, retrying on
// conflicts with xds-server's own writes.
func editMemory(t *testing.T, ctx context.Context, c corev1client.ConfigMapInterface, edit func(map[string]string) map[string]string) {
	t.Helper()
	for {
		cm, err := c.Get(ctx, "kube-mvp-memory", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data = edit(maps.Clone(cm.Data))
		if _, err = c.Update(ctx, cm, metav1.UpdateOptions{}); err == nil {
			return
		} else if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

// routeCount is the number of routes in xds-server's configuration of the front proxy.
func routeCount(t *testing.T, ctx context.Context, k *harness.KubeMVP) int {
	t.Helper()
	var dump struct {
		Routes []struct {
			VirtualHosts []struct {
				Routes []json.RawMessage `json:"routes"`
			} `json:"virtualHosts"`
		} `json:"routes"`
	}
	if err := json.Unmarshal([]byte(httpGet(t, k.XDSAdmin+"/debug/config_dump")), &dump); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rc := range dump.Routes {
		for _, vh := range rc.VirtualHosts {
			n += len(vh.Routes)
		}
	}
	return n
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, res.StatusCode, err)
	}
	return string(b)
}
