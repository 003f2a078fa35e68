package inventory

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/inventory/objects"
)

// DefaultDepartedGrace is WatchOptions.DepartedGrace when zero: how long what an apiserver
// served is remembered after its identity Lease is deleted (a graceful stop deletes it; a
// restart makes a new one within seconds, an upgrade within a minute or so).
const DefaultDepartedGrace = 2 * time.Minute

// MemoryConfigMap names the ConfigMap that keeps objects.Memory.
type MemoryConfigMap struct{ Namespace, Name string }

func (c MemoryConfigMap) String() string { return c.Namespace + "/" + c.Name }

// ParseMemoryConfigMap reads NAMESPACE/NAME.
func ParseMemoryConfigMap(s string) (MemoryConfigMap, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return MemoryConfigMap{}, fmt.Errorf("%q is not NAMESPACE/NAME", s)
	}
	return MemoryConfigMap{Namespace: ns, Name: name}, nil
}

// remember updates the memory of what each apiserver served from this rebuild's view (the
// Leases, the verified discovery) and from the ConfigMap, starts writing it back if it says
// something new, and returns it for Build.
func (w *Watcher) remember(ctx context.Context, objs objects.Objects, opts objects.Options) objects.Memory {
	persisted, cm := w.persistedMemory()
	grace := w.opts.DepartedGrace
	mem := objects.MergeMemory(w.memory, persisted, opts.Now, grace)

	everywhere := map[string]bool{}
	for _, svc := range objs.APIServices {
		if svc.ServedEverywhere() {
			everywhere[svc.Spec.Group] = true
		}
	}
	servers, _ := objects.APIServers(objs.Leases, opts)
	leases := map[string]bool{}
	verified := map[string]objects.Remembered{}
	for _, s := range servers {
		leases[s.ID] = true
		if list := objs.Discovery[s.ID]; list != nil && s.Routable() {
			verified[s.ID] = objects.Remembered{Hostname: s.Hostname, Address: s.Address, Served: objects.ServedBy(list, everywhere)}
		}
	}
	live := map[string]bool{}
	for id := range verified {
		live[id] = true
	}
	w.memory = mem.Observe(objects.Sighting{Now: opts.Now, Leases: leases, Verified: verified, Grace: grace})
	if w.memoryStore != nil && objects.NeedsWrite(persisted, w.memory, live) {
		w.persist.write(ctx, w.memory, cm)
	}
	return w.memory
}

// persistedMemory is the memory in the ConfigMap (empty when there is none or it cannot be
// read) and the ConfigMap itself (nil when absent).
func (w *Watcher) persistedMemory() (objects.Memory, *corev1.ConfigMap) {
	if w.memoryStore == nil {
		return nil, nil
	}
	var cm *corev1.ConfigMap
	for _, o := range w.memoryStore.List() {
		if c, ok := o.(*corev1.ConfigMap); ok && c.Name == w.opts.MemoryConfigMap.Name {
			cm = c
		}
	}
	if cm == nil {
		return nil, nil
	}
	m, err := objects.DecodeMemory(cm.Data)
	if err != nil {
		// Logged once per version of the object; the next write replaces its content.
		if w.persist.noteMalformed(cm.ResourceVersion) {
			w.opts.Log.Warn("memory ConfigMap is malformed: starting from an empty memory of departed apiservers", "configmap", w.opts.MemoryConfigMap.String(), "error", err)
		}
		return objects.Memory{}, cm
	}
	return m, cm
}

// memoryWriter writes the memory to its ConfigMap, one write at a time, in the background
// (the apiserver it goes through may be the one that just died; routing must not wait).
//
// Two replicas write the same object without fighting: each write is an update carrying the
// resourceVersion it read (optimistic concurrency), so a write based on an old read fails
// with a conflict instead of overwriting; the informer then brings the newer object, the
// next rebuild merges it (objects.MergeMemory: the latest sighting of each apiserver wins)
// and writes only if the merge says something new. Both replicas converge on one content.
type memoryWriter struct {
	client kubernetes.Interface
	cm     MemoryConfigMap
	log    *slog.Logger
	done   func() // asks for a rebuild

	mu        sync.Mutex
	writing   bool
	lastErr   string
	malformed string // resourceVersion last reported malformed
}

func (p *memoryWriter) noteMalformed(resourceVersion string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.malformed == resourceVersion {
		return false
	}
	p.malformed = resourceVersion
	return true
}

func (p *memoryWriter) write(ctx context.Context, m objects.Memory, current *corev1.ConfigMap) {
	p.mu.Lock()
	if p.writing {
		p.mu.Unlock()
		return // the rebuild after it ends writes again if still needed
	}
	p.writing = true
	p.mu.Unlock()
	data := objects.EncodeMemory(m)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		if current == nil {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p.cm.Namespace, Name: p.cm.Name}, Data: data}
			_, err = p.client.CoreV1().ConfigMaps(p.cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		} else {
			cm := current.DeepCopy()
			cm.Data = data
			_, err = p.client.CoreV1().ConfigMaps(p.cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
		}
		p.mu.Lock()
		p.writing = false
		msg := ""
		if err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			msg = err.Error()
		}
		report := msg != "" && msg != p.lastErr
		p.lastErr = msg
		p.mu.Unlock()
		if report {
			p.log.Warn("could not write the memory of departed apiservers; it is kept in this process and written again", "configmap", p.cm.String(), "error", err)
		}
		// A conflict: another replica wrote first; the informer brings its version and
		// the rebuild merges. Written: the rebuild sees it (nothing new to write).
		if err != nil {
			time.AfterFunc(time.Second, p.done)
		} else {
			p.done()
		}
	}()
}
