package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apiserverinternalv1alpha1 "k8s.io/api/apiserverinternal/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

var (
	apiServicesGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	crdsGVR        = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// When CRD and APIService changes refetch discovery (refetchWait): once nothing changed for
// apisPublish (an apiserver publishes a CRD in its discovery a moment after it is
// established), no sooner than minQuietRefetch after the last fetch, and never later than
// minRefetch after the first change not fetched yet. So a lone CRD reaches the merged
// discovery a few hundred milliseconds after the apiservers publish it, and a chart applying
// 2,000 CRDs costs at most four fetches a second (each a whole document) per apiserver.
const (
	apisPublish     = 100 * time.Millisecond
	minQuietRefetch = 250 * time.Millisecond
	minRefetch      = time.Second
)

// apisSettle: an apiserver updates its discovery a moment after a CRD or APIService changes
// (its discovery controllers run asynchronously, a CRD's once it is established), so a fetch
// right at the event may miss it; discovery is fetched once more this long after the last
// change.
const apisSettle = 3 * time.Second

// DefaultDiscoveryInterval is WatchOptions.DiscoveryInterval when zero.
const DefaultDiscoveryInterval = 60 * time.Second

// WatchOptions configure a Watcher.
type WatchOptions struct {
	objects.Options
	// DiscoveryInterval is how often each live apiserver's discovery is fetched again even
	// without a restart; zero means DefaultDiscoveryInterval.
	DiscoveryInterval time.Duration
	// ServerName is the TLS name checked on apiservers dialled at their peer address; empty
	// means "kubernetes.default.svc", as upstream's peer proxy checks.
	ServerName string
	// MaxDiscoveryBody bounds each body of a discovery fetch (FetchOptions.MaxBody); zero
	// means DefaultMaxDiscoveryBody.
	MaxDiscoveryBody int64
	// OnDiscoveryRefused, if set, is told of every discovery fetch failed by a *RefusedError,
	// with its reason.
	OnDiscoveryRefused func(reason string)
	// OnDiscoveryPruned, if set, is told of every discovery fetch used in part: groups or
	// entries over the bounds left out (logged with the apiserver when that changes).
	OnDiscoveryPruned func()
	// Clock returns the current time; nil means time.Now.
	Clock func() time.Time
	Log   *slog.Logger
	// DepartedGrace is how long a departed apiserver's last discovery is remembered after
	// its identity Lease is deleted (memory.Memory); zero means DefaultDepartedGrace.
	DepartedGrace time.Duration
	// MemoryConfigMap names the ConfigMap that keeps that memory across restarts and
	// replicas; zero keeps it in this process only.
	MemoryConfigMap MemoryConfigMap
	// MemoryCredentials sign the entries written to MemoryConfigMap and check those read
	// (memory.Read); required with it.
	MemoryCredentials MemoryCredentials
	// OnMemoryRejected, if set, is told why the ConfigMap's memory was rejected as a whole,
	// or the request-header names it keeps (an objects.Reject* reason), once per version of
	// the object.
	OnMemoryRejected func(reason string)
	// OnSkipped, if set, is told after every build how many objects were skipped or only
	// partly used (each is logged once, when it first appears).
	OnSkipped func(n int)
	// OnRequestHeaderConfig, if set, is told after every build whether the request-header
	// configuration (kube-system/extension-apiserver-authentication) was read without
	// complaint: false while it is malformed or incomplete and the last good names are used
	// (or, with none yet, nothing is published).
	OnRequestHeaderConfig func(ok bool)
}

// Watcher keeps a Topology current from a live cluster and hands every new one to OnChange.
type Watcher struct {
	cfg      *rest.Config
	opts     WatchOptions
	onChange func(*topology.Topology)

	client         kubernetes.Interface
	dynamic        dynamic.Interface
	metadata       metadata.Interface
	leases         cache.Store
	authentication cache.Store
	svs            cache.Store // nil when the StorageVersion API is off
	apisvcs        cache.Store
	crds           cache.Store // metadata only; nil until Run starts watching
	memoryStore    cache.Store // nil without WatchOptions.MemoryConfigMap

	// memory is what each apiserver served when last seen live (rebuild's own, like
	// reported); persist writes it to the ConfigMap.
	memory  memory.Memory
	persist memoryWriter
	// memoryRead caches the verdict on the ConfigMap's current version; droppedReported
	// the IDs last logged as over the memory's bounds (rebuild's own).
	memoryRead      *memoryRead
	droppedReported string
	// namesRead caches the verdict on the request-header names the ConfigMap's current
	// version keeps (rebuild's own).
	namesRead *namesRead

	kick chan struct{}
	// reported are the build errors already logged (rebuild's own: it runs on one goroutine).
	reported map[string]bool
	// apiServices are the APIServices as last converted (rebuild's own): each version of an
	// object is converted once, not at every rebuild.
	apiServices convertedAPIServices
	// memo keeps what is derived from each fetched discovery list (rebuild's own): a
	// rebuild derives only from what was fetched since the last.
	memo objects.DiscoveryMemo
	// served keeps what each discovery list in use says is served (rebuild's own).
	served servedMemo
	// built are the inputs of the last objects.Build and builtFrom the watched objects they
	// were read from (rebuild's own): a rebuild with the same builds nothing.
	built     *buildInputs
	builtFrom map[any]bool
	// skipped is how many objects that build skipped or used in part (rebuild's own).
	skipped int
	// headerNames is what the rebuilds learnt of the identity header names, and what the
	// memory ConfigMap kept of them (rebuild's own).
	headerNames memory.RequestHeaderNames

	mu        sync.Mutex
	discovery map[string]discovered // by apiserver ID
	// apisChanged is when a CRD or APIService last changed: every apiserver's discovery
	// fetched before then is refetched (the merged discovery must show new CRDs at once),
	// and again once apisSettle has passed.
	apisChanged time.Time
	// pendingFirst: the last discoveryFor saw an apiserver whose first fetch (for its
	// current instance) has not finished.
	pendingFirst bool

	// published: onChange was called once; startedAt: when the informers synced. The first
	// topology waits (up to firstDiscoveryWait) for the first fetch from every live apiserver,
	// so that a starting replica does not serve a plan in which nobody is routable yet.
	published bool
	startedAt time.Time
	// last is the topology onChange got last (rebuild's own): a rebuild that builds the same
	// one (a Lease renewal, the re-judging tick, a ConfigMap write of what is known) hands
	// nothing on, so xds-server does not plan and translate again for nothing.
	last *topology.Topology
}

// firstDiscoveryWait bounds how long the first topology waits for the first discovery fetches
// (each has a 10 s timeout).
const firstDiscoveryWait = 12 * time.Second

type discovered struct {
	// instance is the Lease's holderIdentity and address when fetched: a restart changes
	// the holder, and discovery counts only from the address the Lease names now.
	instance string
	fetched  time.Time
	// failed: the last fetch failed (the apiserver is not routable until one succeeds).
	failed bool
	rounds int // fetches started for this instance
	// changedSince is when the first CRD or APIService change after the last fetch began was
	// seen; zero: none.
	changedSince time.Time
	list         *apidiscoveryv2.APIGroupDiscoveryList
	listAt       time.Time // when list arrived
	// doc is the fetch list came from (this instance's), for the next to ask whether it
	// changed.
	doc *Fetched
	// version is its /version gitVersion, read with list (for people: routing never reads it).
	version string
	pruned  string // what pruning left out of list, as last logged
}

// settleRefetch: an apiserver that has just started may publish its discovery piecemeal
// (groups registered by post-start hooks appear later), so its discovery is fetched once
// more this long after the first time.
const settleRefetch = 5 * time.Second

// NewWatcher prepares a watcher; Run starts it.
func NewWatcher(cfg *rest.Config, opts WatchOptions, onChange func(*topology.Topology)) (*Watcher, error) {
	if opts.DiscoveryInterval == 0 {
		opts.DiscoveryInterval = DefaultDiscoveryInterval
	}
	if opts.ServerName == "" {
		opts.ServerName = "kubernetes.default.svc"
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.LivenessWindow == 0 {
		opts.LivenessWindow = objects.DefaultLivenessWindow
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.DepartedGrace == 0 {
		opts.DepartedGrace = DefaultDepartedGrace
	}
	if opts.MemoryConfigMap.Name != "" && opts.MemoryCredentials == nil {
		return nil, errors.New("inventory: a memory ConfigMap needs credentials to sign and check its entries")
	}
	hc, err := NoRedirectClient(cfg)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	meta, err := metadata.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	return &Watcher{
		cfg: cfg, opts: opts, onChange: onChange, client: client, dynamic: dyn, metadata: meta,
		kick: make(chan struct{}, 1), discovery: map[string]discovered{},
	}, nil
}

// Run watches until ctx ends. It returns an error only if the informers cannot start.
func (w *Watcher) Run(ctx context.Context) error {
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.trigger() },
		UpdateFunc: func(any, any) { w.trigger() },
		DeleteFunc: func(any) { w.trigger() },
	}
	leaseFactory := informers.NewSharedInformerFactoryWithOptions(w.client, 0,
		informers.WithNamespace(objects.IdentityLeaseNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = objects.IdentityLabel + "=" + objects.IdentityLabelValue
		}))
	leaseInformer := leaseFactory.Coordination().V1().Leases().Informer()
	leaseInformer.AddEventHandler(kick)
	w.leases = leaseInformer.GetStore()
	// The apiservers' authentication ConfigMap, for the identity header names they read;
	// the chart's RBAC allows this one object only.
	authFactory := informers.NewSharedInformerFactoryWithOptions(w.client, 0,
		informers.WithNamespace(objects.AuthenticationNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "metadata.name=" + objects.AuthenticationConfigMap
		}))
	authInformer := authFactory.Core().V1().ConfigMaps().Informer()
	authInformer.AddEventHandler(kick)
	w.authentication = authInformer.GetStore()
	synced := []cache.InformerSynced{leaseInformer.HasSynced, authInformer.HasSynced}
	if cm := w.opts.MemoryConfigMap; cm.Name != "" {
		// The memory of departed apiservers, written by every replica (see memoryWriter);
		// the chart's RBAC allows this one object only.
		memFactory := informers.NewSharedInformerFactoryWithOptions(w.client, 0,
			informers.WithNamespace(cm.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + cm.Name }))
		memInformer := memFactory.Core().V1().ConfigMaps().Informer()
		memInformer.AddEventHandler(kick)
		w.memoryStore = memInformer.GetStore()
		w.persist = memoryWriter{client: w.client, cm: cm, log: w.opts.Log, done: w.trigger}
		synced = append(synced, memInformer.HasSynced)
		memFactory.Start(ctx.Done())
	}

	if w.hasStorageVersionAPI(ctx) {
		clusterFactory := informers.NewSharedInformerFactory(w.client, 0)
		svInformer := clusterFactory.Internal().V1alpha1().StorageVersions().Informer()
		svInformer.AddEventHandler(kick)
		w.svs = svInformer.GetStore()
		synced = append(synced, svInformer.HasSynced)
		clusterFactory.Start(ctx.Done())
	} else {
		w.opts.Log.Warn("StorageVersion API (internal.apiserver.k8s.io/v1alpha1) is not served; " +
			"routing from discovery only. Enable it with --feature-gates=StorageVersionAPI=true " +
			"--runtime-config=internal.apiserver.k8s.io/v1alpha1=true")
	}
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(w.dynamic, 0)
	apisChanged := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.discoveryChanged() },
		UpdateFunc: func(any, any) { w.discoveryChanged() },
		DeleteFunc: func(any) { w.discoveryChanged() },
	}
	apisvcInformer := dynFactory.ForResource(apiServicesGVR).Informer()
	apisvcInformer.AddEventHandler(kick)
	apisvcInformer.AddEventHandler(apisChanged)
	w.apisvcs = apisvcInformer.GetStore()
	synced = append(synced, apisvcInformer.HasSynced)
	// CRDs only say when discovery changes: their metadata is watched, not their schemas
	// (often hundreds of KB each, never read). Not waited for: without the permission
	// xds-server still routes, and discovery is refetched every DiscoveryInterval anyway.
	crdFactory := metadatainformer.NewSharedInformerFactory(w.metadata, 0)
	crdInformer := crdFactory.ForResource(crdsGVR).Informer()
	crdInformer.AddEventHandler(apisChanged)
	crdInformer.AddEventHandler(kick) // a new CRD is pending at once (objects.PendingWindow)
	w.crds = crdInformer.GetStore()

	leaseFactory.Start(ctx.Done())
	authFactory.Start(ctx.Done())
	dynFactory.Start(ctx.Done())
	crdFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return errors.New("inventory: informers did not sync")
	}
	w.startedAt = w.opts.Clock()

	tick := time.NewTicker(objects.RejudgeInterval(w.opts.LivenessWindow))
	defer tick.Stop()
	w.trigger()
	w.loop(ctx, tick.C)
	return nil
}

// minRebuildInterval spaces rebuilds: in a burst (a chart applying 2,000 CRDs, each with its
// APIService events and discovery fetches) changes are taken in at most ten rebuilds a
// second, and a change after a quiet spell is taken in at once.
const minRebuildInterval = 100 * time.Millisecond

// loop rebuilds at every kick and tick, no sooner than minRebuildInterval after the last
// rebuild began, until ctx ends.
func (w *Watcher) loop(ctx context.Context, tick <-chan time.Time) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-tick:
		}
		if wait := minRebuildInterval - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			select { // what kicked meanwhile is taken in by this rebuild
			case <-w.kick:
			default:
			}
		}
		last = time.Now()
		w.rebuild(ctx)
	}
}

// discoveryChanged notes that the apiservers' discovery changed (a CRD or APIService event)
// and asks for a rebuild, which refetches it.
func (w *Watcher) discoveryChanged() {
	w.noteAPIsChanged(w.opts.Clock())
	w.trigger()
	time.AfterFunc(apisPublish, w.trigger)
	time.AfterFunc(apisSettle, w.trigger)
}

// noteAPIsChanged records a CRD or APIService change seen at now.
func (w *Watcher) noteAPIsChanged(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.apisChanged = now
	for id, d := range w.discovery {
		if d.changedSince.IsZero() {
			d.changedSince = now
			w.discovery[id] = d
		}
	}
}

// refetchWait is how long a refetch of d, which a CRD or APIService change made stale, waits
// (see apisPublish); zero or less: due now. Called with w.mu held.
func (w *Watcher) refetchWait(d discovered, now time.Time) time.Duration {
	due := w.apisChanged.Add(apisPublish)
	if spaced := d.fetched.Add(minQuietRefetch); spaced.After(due) {
		due = spaced
	}
	if !d.changedSince.IsZero() {
		if latest := d.changedSince.Add(minRefetch); latest.Before(due) {
			due = latest
		}
	}
	return due.Sub(now)
}

func (w *Watcher) trigger() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *Watcher) hasStorageVersionAPI(ctx context.Context) bool {
	_, err := w.client.Discovery().ServerResourcesForGroupVersion("internal.apiserver.k8s.io/v1alpha1")
	return err == nil
}

// rebuild builds a Topology from the stores and hands it on. Discovery fetches for new or
// restarted apiservers run in the background and trigger another rebuild when done.
func (w *Watcher) rebuild(ctx context.Context) {
	var objs objects.Objects
	apisvcs := w.apisvcs.List()
	var svList []any
	if w.svs != nil {
		svList = w.svs.List()
	}
	// The store objects Build reads, but Leases (sameObjects).
	watched := make([]any, 0, 1+len(svList)+len(apisvcs))
	for _, o := range w.leases.List() {
		if l, ok := o.(*coordinationv1.Lease); ok {
			objs.Leases = append(objs.Leases, *l)
		}
	}
	for _, o := range w.authentication.List() {
		if cm, ok := o.(*corev1.ConfigMap); ok && cm.Name == objects.AuthenticationConfigMap {
			objs.Authentication = cm
			watched = append(watched, o)
		}
	}
	svs := make([]*apiserverinternalv1alpha1.StorageVersion, 0, len(svList)) // copied only to build
	for _, o := range svList {
		if sv, ok := o.(*apiserverinternalv1alpha1.StorageVersion); ok {
			svs = append(svs, sv)
			watched = append(watched, o)
		}
	}
	watched = append(watched, apisvcs...)
	objs.APIServices, w.apiServices = convertAPIServices(apisvcs, w.apiServices, w.opts.Log)
	slices.SortFunc(objs.Leases, func(a, b coordinationv1.Lease) int { return strings.Compare(a.Name, b.Name) })

	opts := w.opts.Options
	opts.Now = w.opts.Clock()
	opts.Memo = &w.memo
	objs.CRDs = youngCRDs(w.crds, opts.Now)
	objs.Discovery, objs.DiscoveredAt, objs.Versions = w.discoveryFor(ctx, objs.Leases, opts)
	var headerErr error
	objs.HeaderNames, headerErr = w.learnHeaderNames(objs.Authentication, opts.Now)
	objs.Remembered = w.remember(ctx, objs, opts)
	if w.opts.OnRequestHeaderConfig != nil {
		w.opts.OnRequestHeaderConfig(headerErr == nil)
	}
	inputs := inputsOf(objs, opts)
	if w.published && inputs.same(w.built) && sameObjects(watched, w.builtFrom) {
		// Only time passed, and no verdict changed: the same topology (already handed on).
		if w.opts.OnSkipped != nil {
			w.opts.OnSkipped(w.skipped)
		}
		return
	}
	w.built, w.builtFrom = inputs, setOf(watched)
	objs.StorageVersions = make([]apiserverinternalv1alpha1.StorageVersion, len(svs))
	for i, sv := range svs {
		objs.StorageVersions[i] = *sv
	}
	t, errs := objects.Build(objs, opts)
	w.skipped = len(errs)
	var news []error
	news, w.reported = newlyReported(w.reported, errs)
	for _, err := range news {
		w.opts.Log.Warn("inventory: object skipped or partly used", "error", err)
	}
	if w.opts.OnSkipped != nil {
		w.opts.OnSkipped(len(errs))
	}
	if t == nil {
		return
	}
	if !w.published {
		w.mu.Lock()
		waiting := w.pendingFirst && w.opts.Clock().Sub(w.startedAt) < firstDiscoveryWait
		w.mu.Unlock()
		if waiting {
			// Every fetch triggers a rebuild when it ends; the tick bounds the wait.
			return
		}
		w.published = true
	}
	if w.last != nil && reflect.DeepEqual(w.last, t) {
		return
	}
	w.last = t
	w.onChange(t)
}

// youngCRDs are the CRDs in store created within objects.PendingWindow of now, sorted by
// name: the only ones Build reads (pending.go), so an idle rebuild compares none.
func youngCRDs(store cache.Store, now time.Time) []objects.CRD {
	if store == nil {
		return nil
	}
	var young []objects.CRD
	for _, o := range store.List() {
		m, ok := o.(*metav1.PartialObjectMetadata)
		if !ok {
			continue
		}
		created := m.CreationTimestamp.Time
		if age := now.Sub(created); !created.IsZero() && age < objects.PendingWindow && age > -objects.PendingWindow {
			young = append(young, objects.CRD{Name: m.Name, Created: created})
		}
	}
	slices.SortFunc(young, func(a, b objects.CRD) int { return strings.Compare(a.Name, b.Name) })
	return young
}

// convertedAPIService is one version of an APIService, converted (or found malformed).
type convertedAPIService struct {
	name, resourceVersion string
	uid                   types.UID
	service               objects.APIService
	err                   error
}

// convertedAPIServices are the watched APIServices as last converted: by object, and the
// list objects.Build reads.
type convertedAPIServices struct {
	byObject map[*unstructured.Unstructured]convertedAPIService
	out      []objects.APIService
}

// convertAPIServices converts the watched APIServices (unstructured) to what objects.Build
// reads, reusing prev's conversion of every object it has seen: a rebuild costs a conversion
// per changed object, not per object, and nothing when none changed. An informer's store
// replaces an object that changes, so the same object is found by identity without reading
// it; one listed again (a relist) is found by name, UID and resourceVersion. A malformed one
// is skipped and logged once per version. It returns the services and what to pass as prev
// next time.
func convertAPIServices(list []any, prev convertedAPIServices, log *slog.Logger) ([]objects.APIService, convertedAPIServices) {
	if prev.byObject != nil && len(list) == len(prev.byObject) {
		same := true
		for _, o := range list {
			u, ok := o.(*unstructured.Unstructured)
			if _, seen := prev.byObject[u]; !ok || !seen {
				same = false
				break
			}
		}
		if same {
			return prev.out, prev
		}
	}
	next := convertedAPIServices{byObject: make(map[*unstructured.Unstructured]convertedAPIService, len(list)), out: make([]objects.APIService, 0, len(list))}
	var byName map[string]convertedAPIService // prev by name, made at the first object not in prev
	for _, o := range list {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		c, seen := prev.byObject[u]
		if !seen {
			if byName == nil {
				byName = make(map[string]convertedAPIService, len(prev.byObject))
				for _, c := range prev.byObject {
					byName[c.name] = c
				}
			}
			c, seen = byName[u.GetName()]
			if !seen || c.uid != u.GetUID() || c.resourceVersion != u.GetResourceVersion() || u.GetResourceVersion() == "" {
				c = convertedAPIService{name: u.GetName(), uid: u.GetUID(), resourceVersion: u.GetResourceVersion()}
				if c.err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c.service); c.err != nil {
					log.Warn("APIService skipped", "name", u.GetName(), "error", c.err)
				}
			}
		}
		next.byObject[u] = c
		if c.err == nil {
			next.out = append(next.out, c.service)
		}
	}
	return next.out, next
}

// newlyReported returns the errors of a build that the previous build did not report, and
// what to remember for the next: an object that stays bad is logged once, not at every
// Lease renewal, and again if it comes back after it was fixed.
func newlyReported(prev map[string]bool, errs []error) ([]error, map[string]bool) {
	next := make(map[string]bool, len(errs))
	var news []error
	for _, err := range errs {
		msg := err.Error()
		if !prev[msg] && !next[msg] {
			news = append(news, err)
		}
		next[msg] = true
	}
	return news, next
}

// discoveryFor returns the discovery to use per live apiserver and starts fetches for those
// whose copy is missing, stale, or from before a restart.
func (w *Watcher) discoveryFor(ctx context.Context, leases []coordinationv1.Lease, opts objects.Options) (map[string]*apidiscoveryv2.APIGroupDiscoveryList, map[string]time.Time, map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pendingFirst = false
	out := map[string]*apidiscoveryv2.APIGroupDiscoveryList{}
	at := map[string]time.Time{}
	versions := map[string]string{}
	live := map[string]bool{}
	servers, _ := objects.APIServers(leases, opts)
	holders := map[string]string{}
	for i := range leases {
		if h := leases[i].Spec.HolderIdentity; h != nil {
			holders[leases[i].Name] = *h
		}
	}
	for _, s := range servers {
		if !s.Alive || s.Address == "" {
			continue // its discovery, fetched at its address, is what verifies it
		}
		live[s.ID] = true
		instance := holders[s.ID] + " at " + s.Address
		d, have := w.discovery[s.ID]
		if have && d.instance == instance && d.list != nil {
			out[s.ID], at[s.ID] = d.list, d.listAt
			if d.version != "" {
				versions[s.ID] = d.version
			}
		}
		if have && d.instance == instance && d.list == nil && !d.failed {
			w.pendingFirst = true // fetching: not known yet whether it is routable
		}
		settled := w.apisChanged.Add(apisSettle)
		stale := have && (!d.fetched.After(w.apisChanged) || (!opts.Now.Before(settled) && d.fetched.Before(settled)))
		if wait := w.refetchWait(d, opts.Now); stale && wait > 0 {
			time.AfterFunc(wait, w.trigger)
			stale = false
		}
		settling := have && d.instance == instance && (d.rounds < 2 || d.list == nil) && opts.Now.Sub(d.fetched) > settleRefetch
		if !have || d.instance != instance || stale || settling || opts.Now.Sub(d.fetched) > w.opts.DiscoveryInterval {
			rounds := 1
			if have && d.instance == instance {
				rounds = d.rounds + 1
			}
			// Mark as fetched now so one slow server is not asked again on every rebuild.
			var listAt time.Time
			var version, pruned string // a restart may be an upgrade: its version is read again
			var doc *Fetched
			if d.instance == instance {
				listAt, version, pruned, doc = d.listAt, d.version, d.pruned, d.doc
			}
			w.discovery[s.ID] = discovered{instance: instance, fetched: opts.Now, rounds: rounds, list: keepIf(d.instance == instance, d.list), listAt: listAt, version: version, pruned: pruned, doc: doc}
			if !have || d.instance != instance {
				w.pendingFirst = true
			}
			go w.fetchDiscovery(ctx, s, instance, doc)
		}
	}
	for id := range maps.Keys(w.discovery) {
		if !live[id] {
			delete(w.discovery, id)
		}
	}
	return out, at, versions
}

func keepIf(ok bool, l *apidiscoveryv2.APIGroupDiscoveryList) *apidiscoveryv2.APIGroupDiscoveryList {
	if ok {
		return l
	}
	return nil
}

// fetchDiscovery fetches apiserver s's discovery; prev is this instance's last fetch, if any.
func (w *Watcher) fetchDiscovery(ctx context.Context, s topology.APIServer, instance string, prev *Fetched) {
	var pruned []string
	doc, err := Fetch(ctx, w.cfg, s.Address, FetchOptions{ServerName: w.opts.ServerName, MaxBody: w.opts.MaxDiscoveryBody,
		OnPruned: func(notes []string) { pruned = notes }, Previous: prev})
	var list *apidiscoveryv2.APIGroupDiscoveryList
	var version string
	if err == nil {
		list, version = doc.List, doc.Version
	}
	if len(pruned) > 0 && w.opts.OnDiscoveryPruned != nil {
		w.opts.OnDiscoveryPruned()
	}
	var refused *RefusedError
	if errors.As(err, &refused) && w.opts.OnDiscoveryRefused != nil {
		w.opts.OnDiscoveryRefused(refused.Reason)
	}
	w.mu.Lock()
	d, ok := w.discovery[s.ID]
	if ok && d.instance == instance {
		if err != nil {
			if d.list == nil {
				w.opts.Log.Warn("discovery failed: this apiserver takes no part in routing until "+
					"its discovery can be fetched at its address over verified TLS", "apiserver", s.ID, "address", s.Address, "error", err)
			} else {
				w.opts.Log.Warn("discovery failed; the previous copy stays in use", "apiserver", s.ID, "address", s.Address, "error", err)
			}
			d.failed = true
		} else {
			if d.list == nil {
				w.opts.Log.Info("apiserver discovery fetched", "apiserver", s.ID, "hostname", s.Hostname, "address", s.Address,
					"groups", len(list.Items), "took", w.opts.Clock().Sub(d.fetched).Round(time.Millisecond))
			}
			if p := strings.Join(pruned, "; "); p != d.pruned {
				if p != "" { // logged when it changes, not on every fetch
					w.opts.Log.Warn("discovery over its bounds: what is over is left out, the rest is used", "apiserver", s.ID, "address", s.Address, "left_out", p)
				}
				d.pruned = p
			}
			d.list, d.listAt, d.failed, d.doc = list, w.opts.Clock(), false, doc
			if version != "" { // a failed /version keeps what this instance said before
				d.version = version
			}
		}
		w.discovery[s.ID] = d
	}
	w.mu.Unlock()
	w.trigger()
}

// FetchOptions say how Fetch asks an apiserver.
type FetchOptions struct {
	// ServerName is the TLS name checked (unless the configuration is insecure).
	ServerName string
	// MaxBody bounds each answer's body, decoded; zero means DefaultMaxDiscoveryBody. An
	// aggregated document may be larger: it is pruned into MaxBody as it is read.
	MaxBody int64
	// OnPruned, if set, is told what pruning left out of a fetch that succeeded.
	OnPruned func(notes []string)
	// Previous, if set, is this apiserver's last fetch: what did not change since is not
	// sent again (see Fetched).
	Previous *Fetched
	// Timeout bounds each request; zero means DefaultFetchTimeout.
	Timeout time.Duration
}

// DefaultFetchTimeout is FetchOptions.Timeout when zero.
const DefaultFetchTimeout = 10 * time.Second

// Fetch asks one apiserver, at its own address, what it serves itself: the
// aggregated discovery documents of /api and /apis with profile=nopeer (so a peer-aware
// apiserver does not add its peers' APIs), kept whole for the merged discovery (see
// objects.MergeDiscovery); failing that, whatever client-go negotiates (plain v2, then v1), reduced
// to resources and verbs. It also reads the apiserver's version for people (kubectl mvp
// status): "" when /version fails or is not a plausible version, which fails nothing.
// A redirect or a body over opts.MaxBody anywhere fails the whole fetch with a *RefusedError,
// except that an aggregated document is pruned (pruneAggregated): one bloated group costs its
// own entries, not the fetch. What it gives back is also what a later fetch of the same
// apiserver may start from (FetchOptions.Previous).
func Fetch(ctx context.Context, base *rest.Config, address string, opts FetchOptions) (*Fetched, error) {
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxDiscoveryBody
	}
	cfg := rest.CopyConfig(base)
	cfg.Host = "https://" + address
	cfg.APIPath = ""
	if !cfg.Insecure {
		cfg.TLSClientConfig.ServerName = opts.ServerName
	}
	cfg.Timeout = opts.Timeout
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultFetchTimeout
	}
	hc, err := NoRedirectClient(cfg)
	if err != nil {
		return nil, err
	}
	g := &guard{max: opts.MaxBody, ifNoneMatch: opts.Previous.etags()}
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, g.client(hc))
	if err != nil {
		return nil, err
	}
	// Every failure comes back as an error, which the caller logs; client-go would log a
	// refused body again.
	quiet := klog.NewContext(ctx, logr.Discard())
	f, err := fetchAggregated(quiet, dc.RESTClient(), g, opts.Previous)
	if errors.Is(err, errNoAggregatedDiscovery) && g.err() == nil {
		dc.NoPeerDiscovery = true
		var lists []*metav1.APIResourceList
		_, lists, err = dc.ServerGroupsAndResourcesWithContext(quiet)
		if len(lists) > 0 {
			err = nil // what was listed is used
		}
		f = &Fetched{List: fromResourceLists(lists), pruned: g.prunedNotes()}
	}
	if err == nil {
		f.Version = fetchVersion(quiet, dc.RESTClient())
	}
	// A refusal fails the fetch even where client-go dropped it (a group/version of a
	// partial list) or /version's failure fails nothing.
	if gerr := g.err(); gerr != nil {
		err = gerr
	}
	if err != nil {
		return nil, fmt.Errorf("discovery of %s: %w", address, err)
	}
	if len(f.pruned) > 0 && opts.OnPruned != nil {
		opts.OnPruned(f.pruned)
	}
	return f, nil
}

// fromResourceLists regroups client-go's per-group/version lists ("jobs" and "jobs/status"
// side by side) into the aggregated form objects.Build reads, with everything the legacy
// lists say of each resource (kind, scope, names, categories, verbs), so that an apiserver
// that offers only legacy discovery takes part in the merged /apis like the others rather
// than switching it off for every client.
func fromResourceLists(lists []*metav1.APIResourceList) *apidiscoveryv2.APIGroupDiscoveryList {
	out := &apidiscoveryv2.APIGroupDiscoveryList{TypeMeta: metav1.TypeMeta{Kind: objects.AggregatedKind, APIVersion: apidiscoveryv2.SchemeGroupVersion.String()}}
	groups := map[string]int{}
	kindOf := func(r metav1.APIResource, gv schema.GroupVersion) *metav1.GroupVersionKind {
		if r.Kind == "" {
			return nil
		}
		k := metav1.GroupVersionKind{Group: gv.Group, Version: gv.Version, Kind: r.Kind}
		if r.Group != "" || r.Version != "" { // a subresource of another kind (scale)
			k.Group, k.Version = r.Group, r.Version
		}
		return &k
	}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		gi, ok := groups[gv.Group]
		if !ok {
			gi = len(out.Items)
			groups[gv.Group] = gi
			out.Items = append(out.Items, apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: gv.Group}})
		}
		version := apidiscoveryv2.APIVersionDiscovery{Version: gv.Version, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}
		parents := map[string]int{}
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") {
				scope := apidiscoveryv2.ScopeCluster
				if r.Namespaced {
					scope = apidiscoveryv2.ScopeNamespace
				}
				parents[r.Name] = len(version.Resources)
				version.Resources = append(version.Resources, apidiscoveryv2.APIResourceDiscovery{
					Resource: r.Name, ResponseKind: kindOf(r, gv), Scope: scope, SingularResource: r.SingularName,
					Verbs: r.Verbs, ShortNames: r.ShortNames, Categories: r.Categories,
				})
			}
		}
		for _, r := range l.APIResources {
			parent, sub, ok := strings.Cut(r.Name, "/")
			if !ok {
				continue
			}
			pi, ok := parents[parent]
			if !ok {
				continue
			}
			version.Resources[pi].Subresources = append(version.Resources[pi].Subresources,
				apidiscoveryv2.APISubresourceDiscovery{Subresource: sub, ResponseKind: kindOf(r, gv), Verbs: r.Verbs})
		}
		out.Items[gi].Versions = append(out.Items[gi].Versions, version)
	}
	return out
}
