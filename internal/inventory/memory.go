package inventory

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// DefaultDepartedGrace is WatchOptions.DepartedGrace when zero: how long what an apiserver
// served is remembered after its identity Lease is deleted (a graceful stop deletes it; a
// restart makes a new one within seconds, an upgrade within a minute or so).
const DefaultDepartedGrace = 2 * time.Minute

// MemoryConfigMap names the ConfigMap that keeps memory.Memory.
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

// MemoryCredentials are xds-server's own control-plane TLS credentials (cptls.Credentials):
// its key signs the memory's entries, and every entry's signer must chain to the CA bundle.
type MemoryCredentials interface {
	Current() (*tls.Certificate, *x509.CertPool)
}

// remember updates the memory of what each apiserver served from this rebuild's view (the
// Leases, the verified discovery) and from the ConfigMap, starts writing it back if it says
// something new, and returns it for Build.
func (w *Watcher) remember(ctx context.Context, objs objects.Objects, opts objects.Options) memory.Memory {
	servers, _ := objects.APIServers(objs.Leases, opts)
	key := w.memoryKey()
	persisted, cm, rejected, replace := w.persistedMemory(servers, opts.Now)
	grace := w.opts.DepartedGrace
	mine := w.memory
	// Entries an operator removed (a key, or the whole ConfigMap) stay removed: forgotten
	// here too rather than written back. A live apiserver is recorded afresh by Observe.
	if removed := w.persist.removed(cm, persisted, rejected); len(removed) > 0 {
		mine = maps.Clone(mine)
		var forgotten []string
		for _, id := range removed {
			if _, ok := mine[id]; ok {
				forgotten = append(forgotten, id)
				delete(mine, id)
			}
		}
		if len(forgotten) > 0 {
			w.opts.Log.Info("apiservers removed from the memory ConfigMap are forgotten (a live one is recorded again)", "configmap", w.opts.MemoryConfigMap.String(), "apiservers", forgotten)
		}
	}
	mem := memory.Merge(mine, persisted, opts.Now, grace)

	everywhere := map[topology.GroupVersion]bool{}
	for _, svc := range objs.APIServices {
		if svc.ServedEverywhere() {
			everywhere[topology.GroupVersion{Group: svc.Spec.Group, Version: svc.Spec.Version}] = true
		}
	}
	w.served.begin(everywhere)
	leases := map[string]bool{}
	verified := map[string]memory.Remembered{}
	objects.Verify(servers, objs.Discovery)
	for _, s := range servers {
		leases[s.ID] = true
		if s.Routable() {
			verified[s.ID] = memory.Remembered{Hostname: s.Hostname, Address: s.Address, Served: w.served.by(objs.Discovery[s.ID])}
		}
	}
	live := map[string]bool{}
	for id := range verified {
		live[id] = true
	}
	observed := mem.Observe(memory.Sighting{Now: opts.Now, Leases: leases, Verified: verified, Grace: grace})
	var dropped []string
	w.memory, dropped = memory.Bound(observed, key)
	if d := strings.Join(dropped, " "); d != w.droppedReported {
		w.droppedReported = d
		if d != "" {
			w.opts.Log.Warn("apiservers not remembered: their discovery or their number exceeds the memory's bounds", "apiservers", dropped,
				"maxEntries", memory.MaxEntries, "maxGroupVersions", memory.MaxGroupVersions, "maxResources", memory.MaxResources, "maxBytes", memory.MaxBytes)
		}
	}
	// The request-header names go with the memory (memory.RequestHeaderNamesKey): merged
	// again with this version of the ConfigMap, so that a write never drops a name it holds.
	persistedNames := w.persistedNames(cm, opts.Now)
	w.headerNames = memory.MergeRequestHeaderNames(w.headerNames, persistedNames)
	needsWrite := replace || memory.NeedsWrite(persisted, w.memory, live) || w.headerNames.NeedsWrite(persistedNames)
	if needsWrite && rejected && !w.persist.mayReplace(opts.Now) {
		needsWrite = false // replaced again once the interval is over (a rebuild is due then)
	}
	if w.memoryStore != nil && needsWrite {
		data, err := memory.EncodeSigned(w.memory, key, opts.Now)
		if err == nil && !w.headerNames.IsZero() {
			var names string
			if names, err = memory.EncodeSignedRequestHeaderNames(w.headerNames, key, opts.Now); err == nil {
				data[memory.RequestHeaderNamesKey] = names
			}
		}
		if err != nil {
			if w.persist.noteWriteError(err.Error()) {
				w.opts.Log.Warn("could not sign the memory of departed apiservers and the request-header names; they are kept in this process", "configmap", w.opts.MemoryConfigMap.String(), "error", err)
			}
		} else {
			w.persist.write(ctx, data, cm)
		}
	}
	return w.memory
}

// servedMemo keeps objects.ServedBy of each discovery list in use, while the group/versions
// served everywhere stay the same: a rebuild with nothing fetched since reads no list.
type servedMemo struct {
	everywhere map[topology.GroupVersion]bool
	last, next map[*apidiscoveryv2.APIGroupDiscoveryList][]topology.Resource
}

// begin starts a rebuild's lookups: what the last rebuild did not look up is forgotten.
func (m *servedMemo) begin(everywhere map[topology.GroupVersion]bool) {
	if maps.Equal(m.everywhere, everywhere) {
		m.last = m.next
	} else {
		m.everywhere, m.last = everywhere, nil
	}
	m.next = make(map[*apidiscoveryv2.APIGroupDiscoveryList][]topology.Resource, len(m.last))
}

// by is objects.ServedBy(list, the everywhere of begin).
func (m *servedMemo) by(list *apidiscoveryv2.APIGroupDiscoveryList) []topology.Resource {
	served, ok := m.last[list]
	if !ok {
		served = objects.ServedBy(list, m.everywhere)
	}
	m.next[list] = served
	return served
}

// learnHeaderNames merges the request-header names the memory ConfigMap keeps into this
// process's (after a restart: all it knows), reads the authentication ConfigMap auth
// against them, and returns the names it read against (objects.Objects.HeaderNames) and
// what is wrong with auth.
func (w *Watcher) learnHeaderNames(auth *corev1.ConfigMap, now time.Time) (memory.RequestHeaderNames, error) {
	before := memory.MergeRequestHeaderNames(w.headerNames, w.persistedNames(w.memoryConfigMap(), now))
	next, _, _, err := objects.ObserveRequestHeaderNames(before, auth)
	w.headerNames = next.GoodSince(before, now)
	return before, err
}

// memoryConfigMap is the memory ConfigMap as the informer has it (nil: none, or absent).
func (w *Watcher) memoryConfigMap() *corev1.ConfigMap {
	if w.memoryStore == nil {
		return nil
	}
	var cm *corev1.ConfigMap
	for _, o := range w.memoryStore.List() {
		if c, ok := o.(*corev1.ConfigMap); ok && c.Name == w.opts.MemoryConfigMap.Name {
			cm = c
		}
	}
	return cm
}

// persistedNames are the request-header names cm keeps, checked
// (memory.ReadRequestHeaderNames); none when absent or rejected. A rejection is logged and
// counted once per version of cm; the next write replaces the value (this process's names
// then say more than nothing).
func (w *Watcher) persistedNames(cm *corev1.ConfigMap, now time.Time) memory.RequestHeaderNames {
	if cm == nil {
		return memory.RequestHeaderNames{}
	}
	value, ok := cm.Data[memory.RequestHeaderNamesKey]
	if !ok {
		return memory.RequestHeaderNames{}
	}
	var pool *x509.CertPool
	if w.opts.MemoryCredentials != nil {
		_, pool = w.opts.MemoryCredentials.Current()
	}
	if c := w.namesRead; c != nil && c.resourceVersion == cm.ResourceVersion && c.pool == pool {
		return c.names
	}
	names, err := memory.ReadRequestHeaderNames(value, memory.Trust{Roots: pool, Now: now})
	var why *memory.Rejected
	if errors.As(err, &why) {
		w.opts.Log.Warn("request-header names in the memory ConfigMap rejected: "+
			"starting from this process's own, which replace them",
			"configmap", w.opts.MemoryConfigMap.String(), "key", memory.RequestHeaderNamesKey, "reason", why.Reason, "error", why.Err)
		if w.opts.OnMemoryRejected != nil {
			w.opts.OnMemoryRejected(why.Reason)
		}
		names = memory.RequestHeaderNames{}
	}
	w.namesRead = &namesRead{resourceVersion: cm.ResourceVersion, pool: pool, names: names}
	return names
}

// namesRead is the verdict on the request-header names of one version of the ConfigMap,
// checked with one CA bundle.
type namesRead struct {
	resourceVersion string
	pool            *x509.CertPool
	names           memory.RequestHeaderNames
}

// memoryKey is the key that signs the memory now (zero without a ConfigMap).
func (w *Watcher) memoryKey() memory.Key {
	if w.opts.MemoryCredentials == nil {
		return memory.Key{}
	}
	cert, _ := w.opts.MemoryCredentials.Current()
	if cert == nil || cert.Leaf == nil {
		return memory.Key{}
	}
	signer, _ := cert.PrivateKey.(crypto.Signer)
	return memory.Key{Cert: cert.Leaf, Key: signer}
}

// persistedMemory is the memory in the ConfigMap, checked (memory.Read), and the
// ConfigMap itself (nil when absent). A memory that is rejected reads as empty; replace says
// that the next write should replace what the ConfigMap holds even if this process has
// nothing new to say (a rejected memory, or unsigned entries just migrated), until a write
// based on this version succeeds.
func (w *Watcher) persistedMemory(servers []topology.APIServer, now time.Time) (mem memory.Memory, cm *corev1.ConfigMap, rejected, replace bool) {
	if cm = w.memoryConfigMap(); cm == nil {
		return nil, nil, false, false
	}
	var pool *x509.CertPool
	if w.opts.MemoryCredentials != nil {
		_, pool = w.opts.MemoryCredentials.Current()
	}
	// A signed memory's verdict depends on its content and the CA bundle only (a time that
	// was not in the future is not later): it is checked once per version.
	if c := w.memoryRead; c != nil && c.resourceVersion == cm.ResourceVersion && c.pool == pool {
		return c.memory, cm, c.rejected, c.rejected && w.persist.notReplaced(cm.ResourceVersion)
	}
	trust := memory.Trust{Roots: pool, Now: now, AllowUnsigned: !w.persist.sawSigned(), Servers: servers}
	reading, err := memory.Read(cm.Data, trust)
	if reading.Signed {
		w.persist.noteSigned()
	}
	var why *memory.Rejected
	if errors.As(err, &why) {
		// Logged and counted once per version of the object; the next write replaces it.
		if w.persist.noteRejected(cm.ResourceVersion) {
			w.opts.Log.Warn("memory ConfigMap rejected as a whole: starting from this "+
				"process's own memory of departed apiservers, which replaces it",
				"configmap", w.opts.MemoryConfigMap.String(), "reason", why.Reason, "error", why.Err)
			if w.opts.OnMemoryRejected != nil {
				w.opts.OnMemoryRejected(why.Reason)
			}
		}
		if reading.Signed {
			w.memoryRead = &memoryRead{resourceVersion: cm.ResourceVersion, pool: pool, memory: memory.Memory{}, rejected: true}
		}
		return memory.Memory{}, cm, true, w.persist.notReplaced(cm.ResourceVersion)
	}
	if !reading.Signed {
		if len(reading.Migrated)+len(reading.NotMigrated) == 0 {
			return reading.Memory, cm, false, false // empty
		}
		if w.persist.noteRejected(cm.ResourceVersion) {
			w.opts.Log.Info("memory ConfigMap written before entries were signed: migrating the entries of apiservers whose identity Lease names the same hostname and address, and writing them back signed",
				"configmap", w.opts.MemoryConfigMap.String(), "migrated", reading.Migrated, "leftOut", reading.NotMigrated)
		}
		return reading.Memory, cm, false, w.persist.notReplaced(cm.ResourceVersion)
	}
	w.memoryRead = &memoryRead{resourceVersion: cm.ResourceVersion, pool: pool, memory: reading.Memory}
	return reading.Memory, cm, false, false
}

// memoryRead is the verdict on one version of the ConfigMap, checked with one CA bundle.
type memoryRead struct {
	resourceVersion string
	pool            *x509.CertPool
	memory          memory.Memory
	rejected        bool
}

// memoryWriter writes the memory to its ConfigMap, one write at a time, in the background
// (the apiserver it goes through may be the one that just died; routing must not wait).
//
// Two replicas write the same object without fighting: each write is an update carrying the
// resourceVersion it read (optimistic concurrency), so a write based on an old read fails
// with a conflict instead of overwriting; the informer then brings the newer object, the
// next rebuild merges it (memory.Merge: the latest sighting of each apiserver wins)
// and writes only if the merge says something new. Both replicas converge on one content.
//
// It also keeps what removals are judged by: the IDs in the ConfigMap as this process last
// read (accepted) or wrote it. An ID among them that a later version lacks was removed — by
// an operator, or by another replica that forgot it — and is forgotten here too. An ID only
// in this process's memory was never persisted, so its absence from the ConfigMap is no
// removal: the merge adds it and the next write persists it.
type memoryWriter struct {
	client kubernetes.Interface
	cm     MemoryConfigMap
	log    *slog.Logger
	done   func() // asks for a rebuild

	mu       sync.Mutex
	writing  bool
	lastErr  string
	reported string // resourceVersion last reported rejected or migrated
	replaced string // resourceVersion the last successful write replaced
	signed   bool   // a signed memory was seen or written: no unsigned entry is accepted again

	// known are the IDs of the version last read or written (nil before the first);
	// stale is the resourceVersion the last write replaced (staleAbsent: it created the
	// object), which the informer may still show for a moment and which says nothing
	// about removals.
	known       map[string]bool
	stale       string
	staleAbsent bool

	// lastReplace is when a write last replaced a rejected ConfigMap, and replaceDue
	// whether a rebuild is already asked for when the next one may happen.
	lastReplace time.Time
	replaceDue  bool
}

// replaceInterval spaces the writes that replace a ConfigMap this process rejected. Another
// writer that keeps writing what this process rejects (an older xds-server replica during an
// upgrade, which in turn rejects this one's signed entries; or a hostile writer) would
// otherwise meet a write of ours for each of its own: two replicas of different versions
// rewrote the object 12 to 18 times a second. Routing never waits for the write: this
// process keeps its own memory meanwhile.
const replaceInterval = 30 * time.Second

// mayReplace reports whether a write may replace a rejected ConfigMap now; if not, it asks
// for a rebuild when one may.
func (p *memoryWriter) mayReplace(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	wait := p.lastReplace.Add(replaceInterval).Sub(now)
	if p.lastReplace.IsZero() || wait <= 0 {
		p.lastReplace = now
		return true
	}
	if !p.replaceDue {
		p.replaceDue = true
		time.AfterFunc(wait, func() {
			p.mu.Lock()
			p.replaceDue = false
			p.mu.Unlock()
			p.done()
		})
	}
	return false
}

func (p *memoryWriter) noteRejected(resourceVersion string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reported == resourceVersion {
		return false
	}
	p.reported = resourceVersion
	return true
}

// notReplaced reports whether no write based on that version of the ConfigMap succeeded.
func (p *memoryWriter) notReplaced(resourceVersion string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replaced != resourceVersion
}

func (p *memoryWriter) noteWriteError(msg string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	report := msg != p.lastErr
	p.lastErr = msg
	return report
}

func (p *memoryWriter) noteSigned() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.signed = true
}

func (p *memoryWriter) sawSigned() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.signed
}

// removed returns the IDs that were in the ConfigMap when this process last read or wrote
// it and are not in persisted, the memory of cm (nil: the ConfigMap is gone), and remembers
// persisted's IDs for the next time. A rejected memory (rejected) says nothing about
// removals, nor does the version the last write replaced.
func (p *memoryWriter) removed(cm *corev1.ConfigMap, persisted memory.Memory, rejected bool) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rejected {
		return nil
	}
	if cm == nil {
		if p.staleAbsent {
			return nil // our create is not in the informer yet
		}
	} else {
		p.staleAbsent = false
		if cm.ResourceVersion == p.stale {
			return nil // our update is not in the informer yet
		}
		p.stale = ""
	}
	var gone []string
	for id := range p.known {
		if _, ok := persisted[id]; !ok {
			gone = append(gone, id)
		}
	}
	p.known = make(map[string]bool, len(persisted))
	for id := range persisted {
		p.known[id] = true
	}
	slices.Sort(gone)
	return gone
}

func (p *memoryWriter) write(ctx context.Context, data map[string]string, current *corev1.ConfigMap) {
	p.mu.Lock()
	if p.writing {
		p.mu.Unlock()
		return // the rebuild after it ends writes again if still needed
	}
	p.writing = true
	p.mu.Unlock()
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
		if err == nil {
			p.signed = true
			p.known = make(map[string]bool, len(data))
			for id := range data {
				if id != memory.RequestHeaderNamesKey {
					p.known[id] = true
				}
			}
			if current == nil {
				p.stale, p.staleAbsent = "", true
			} else {
				p.stale, p.staleAbsent, p.replaced = current.ResourceVersion, false, current.ResourceVersion
			}
		}
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
