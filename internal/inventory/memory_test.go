package inventory

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-mvp/kube-mvp/internal/inventory/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestMalformedMemoryConfigMap: content that cannot be read is logged once, naming the
// ConfigMap, and the memory starts empty; the watcher goes on.
func TestMalformedMemoryConfigMap(t *testing.T) {
	var logs bytes.Buffer
	w := &Watcher{opts: WatchOptions{MemoryConfigMap: MemoryConfigMap{Namespace: "kube-mvp", Name: "mem"},
		Log: slog.New(slog.NewTextHandler(&logs, nil)), DepartedGrace: time.Minute}}
	w.memoryStore = cache.NewStore(cache.MetaNamespaceKeyFunc)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-mvp", Name: "mem", ResourceVersion: "7"},
		Data: map[string]string{objects.APIServerIDFor("a"): `{"lastSeen": 12`}}
	if err := w.memoryStore.Add(cm); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m, got := w.persistedMemory()
		if len(m) != 0 || got == nil {
			t.Fatalf("memory %v, ConfigMap %v: want empty, and the ConfigMap to overwrite", m, got)
		}
	}
	if n := strings.Count(logs.String(), "malformed"); n != 1 || !strings.Contains(logs.String(), "kube-mvp/mem") {
		t.Errorf("want one line naming kube-mvp/mem, got:\n%s", logs.String())
	}

	// A well-formed one is read (what a restarted xds-server starts from).
	jobs := topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	good := cm.DeepCopy()
	good.ResourceVersion = "8"
	good.Data = objects.EncodeMemory(objects.Memory{objects.APIServerIDFor("a"): {Hostname: "cp-a", Served: []topology.Resource{jobs}, LastSeen: time.Unix(1700000000, 0)}})
	if err := w.memoryStore.Update(good); err != nil {
		t.Fatal(err)
	}
	m, _ := w.persistedMemory()
	if r := m[objects.APIServerIDFor("a")]; len(r.Served) != 1 || r.Served[0] != jobs || r.Hostname != "cp-a" {
		t.Errorf("read back %+v", m)
	}
}
