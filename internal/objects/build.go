package objects

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/cryptobyte"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apiserverinternalv1alpha1 "k8s.io/api/apiserverinternal/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Upstream names (k8s.io/apiserver controlplane/apiserver identity and peerproxy).
const (
	IdentityLeaseNamespace  = "kube-system"
	IdentityLabel           = "apiserver.kubernetes.io/identity"
	IdentityLabelValue      = "kube-apiserver"
	HostnameLabel           = "kubernetes.io/hostname"
	PeerAdvertiseAnnotation = "kubernetes.io/peer-advertise-address"
	// AutomanagedLabel marks APIServices that kube-aggregator creates itself: "onstart" for
	// built-in groups, "true" for CRD groups.
	AutomanagedLabel = "kube-aggregator.kubernetes.io/automanaged"
)

// APIService is the part of an apiregistration.k8s.io/v1 APIService that routing needs.
type APIService struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Group   string `json:"group"`
		Version string `json:"version"`
		Service *struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service,omitempty"`
		// GroupPriorityMinimum orders the groups in discovery (kube-aggregator: higher first).
		GroupPriorityMinimum int32 `json:"groupPriorityMinimum"`
	} `json:"spec"`
}

// ServedEverywhere reports whether every apiserver serves this group/version through its own
// chain: an aggregated API (proxied to its service by any apiserver) or a CRD's
// group/version. Anyone who may create a CRD or an APIService can make this claim, for any
// group/version (topology.Topology.ServedEverywhere says what it is worth).
func (s *APIService) ServedEverywhere() bool {
	return s.Spec.Service != nil || s.Labels[AutomanagedLabel] == "true"
}

// Objects is everything Build reads.
type Objects struct {
	Leases          []coordinationv1.Lease
	StorageVersions []apiserverinternalv1alpha1.StorageVersion
	APIServices     []APIService
	// Discovery holds each apiserver's own discovery (the items of /api and /apis together),
	// by apiserver ID. An apiserver without an entry is described by StorageVersions instead.
	Discovery map[string]*apidiscoveryv2.APIGroupDiscoveryList
	// DiscoveredAt is when each apiserver's Discovery was fetched, by ID (optional: for
	// /debug/topology).
	DiscoveredAt map[string]time.Time
	// Versions are the apiservers' versions (gitVersion), read with their Discovery, by ID
	// (optional: for /debug/topology and kubectl mvp status; routing never reads them).
	Versions map[string]string
	// CRDs are the CustomResourceDefinitions, by name and creation time: a new one's
	// resources that no apiserver lists yet are pending (pending.go).
	CRDs []CRD
	// Remembered is what departed apiservers served (see memory.Memory): used for every apiserver
	// without Discovery, as StorageVersions are, so that what only they served is
	// Unavailable (503) rather than not served (404). One whose Lease is gone is listed as
	// a dead apiserver while it is remembered.
	Remembered memory.Memory
	// Authentication is kube-system/extension-apiserver-authentication (nil: not published),
	// for the identity header names the apiservers read.
	Authentication *corev1.ConfigMap
	// HeaderNames is what earlier builds learnt of those names (ObserveRequestHeaderNames):
	// the last good configuration and every name read before.
	HeaderNames memory.RequestHeaderNames
}

// RequestHeaderConfigError is a malformed or incomplete request-header configuration.
type RequestHeaderConfigError struct{ Err error }

func (e *RequestHeaderConfigError) Error() string { return e.Err.Error() }
func (e *RequestHeaderConfigError) Unwrap() error { return e.Err }

// Options tune Build.
type Options struct {
	// Now is the time liveness is judged at; zero means every Lease counts as alive.
	Now time.Time
	// LivenessWindow is how recent a Lease renewal must be; zero means DefaultLivenessWindow.
	LivenessWindow time.Duration
	// Addresses maps hostname to host:port for Leases without the peer-advertise annotation
	// (the MVP feature gate off, or apiservers older than 1.36).
	Addresses map[string]string
	// Memo, when set, keeps what is derived from each discovery list between builds (its
	// names check, the merged document), so a rebuild derives only from the lists fetched
	// since the one before. The lists must not be changed after they are passed to Build.
	Memo *DiscoveryMemo
}

// APIServers are the apiservers the Leases describe, alive by their renewTime (see
// judgeAsOfLastRenewalSeen for when our Lease watch went quiet), with an error for each Lease
// skipped or partly used.
func APIServers(leases []coordinationv1.Lease, opts Options) ([]topology.APIServer, []error) {
	var errs []error
	var servers []topology.APIServer
	var renewed []time.Time // of each server's Lease; zero: none
	for i := range leases {
		s, err := APIServerFromLease(&leases[i], opts)
		if err != nil {
			errs = append(errs, err)
		}
		if s.ID != "" {
			servers = append(servers, s)
			var rt time.Time
			if leases[i].Spec.RenewTime != nil {
				rt = leases[i].Spec.RenewTime.Time
			}
			renewed = append(renewed, rt)
		}
	}
	if err := judgeAsOfLastRenewalSeen(servers, renewed, opts.Now, opts.livenessWindow()); err != nil {
		errs = append(errs, err)
	}
	return servers, errs
}

// Build turns watched objects into a Topology. It never stops at a bad object: each one it
// cannot use is skipped and reported in the returned errors, which name it.
func Build(objs Objects, opts Options) (*topology.Topology, []error) {
	servers, errs := APIServers(objs.Leases, opts)
	// Names Kubernetes would not accept never reach the plan, nor the merged discovery.
	if len(objs.Discovery) > 0 {
		valid := make(map[string]*apidiscoveryv2.APIGroupDiscoveryList, len(objs.Discovery))
		for _, id := range slices.Sorted(maps.Keys(objs.Discovery)) {
			list, nerrs := opts.Memo.valid(id, objs.Discovery[id])
			valid[id] = list
			errs = append(errs, nerrs...)
		}
		opts.Memo.keepOnly(objs.Discovery)
		objs.Discovery = valid
	}
	awaiting := Verify(servers, objs.Discovery)

	var everywhere []topology.GroupVersion
	var aggregated []topology.GroupVersion
	for _, svc := range objs.APIServices {
		if svc.Spec.Group == "" || svc.Spec.Version == "" {
			continue // the legacy core group's APIService, or one naming nothing
		}
		if err := checkResource("APIService "+svc.Name, topology.Resource{Group: svc.Spec.Group, Version: svc.Spec.Version, Resource: "x"}); err != nil {
			errs = append(errs, err)
			continue
		}
		gv := topology.GroupVersion{Group: svc.Spec.Group, Version: svc.Spec.Version}
		if svc.ServedEverywhere() {
			everywhere = append(everywhere, gv)
		}
		if svc.Spec.Service != nil {
			aggregated = append(aggregated, gv)
		}
	}

	// An aggregated group/version is proxied to its service by every apiserver whatever the
	// apiserver's own discovery lists (which is the backend's, when the aggregator could
	// fetch it), so its listings decide nothing. A CRD's group/version is not skipped: its
	// claim may cover built-in resources too (topology.Topology.ServedEverywhere).
	isAggregated := map[topology.GroupVersion]bool{}
	for _, gv := range aggregated {
		isAggregated[gv] = true
	}
	served := map[topology.Resource][]string{}
	badNames := map[string]bool{} // reported once per build
	// addChecked takes names already checked (validDiscovery's); add checks them first.
	addChecked := func(r topology.Resource, id string) {
		if !isAggregated[r.GroupVersion()] {
			served[r] = append(served[r], id)
		}
	}
	add := func(r topology.Resource, id string) {
		if err := checkResource("what apiserver "+id+" serves (memory or StorageVersions)", r); err != nil {
			if msg := err.Error(); !badNames[msg] {
				badNames[msg] = true
				errs = append(errs, err)
			}
			return
		}
		addChecked(r, id)
	}
	hasLease := map[string]bool{}
	for _, s := range servers {
		hasLease[s.ID] = true
	}
	for id, list := range objs.Discovery {
		if list == nil || !hasLease[id] {
			continue // no believable Lease claims it (the watcher fetches none for such)
		}
		for _, g := range list.Items {
			for _, v := range g.Versions {
				for _, res := range v.Resources {
					if res.Resource == "" || v.Version == "" {
						errs = append(errs, fmt.Errorf("discovery of %s: group %q version %q: resource without a name or version skipped", id, g.Name, v.Version))
						continue
					}
					r := topology.Resource{Group: g.Name, Version: v.Version, Resource: res.Resource}
					addChecked(r, id)
					for _, sub := range res.Subresources {
						if sub.Subresource != "" {
							r.Subresource = sub.Subresource
							addChecked(r, id)
						}
					}
				}
			}
		}
	}
	// What departed apiservers served: the same mechanism as StorageVersions, an ID that
	// serves the resource but is not live (Capability.Known), so Decide answers Unavailable.
	remembered := map[string]bool{}
	for _, id := range slices.Sorted(maps.Keys(objs.Remembered)) {
		r := objs.Remembered[id]
		if objs.Discovery[id] != nil && hasLease[id] {
			continue
		}
		if want := APIServerIDFor(r.Hostname); r.Hostname == "" || id != want {
			errs = append(errs, &RefusedError{topology.Refusal{Object: "memory entry " + id, ID: id, Hostname: r.Hostname, Address: r.Address,
				Reason: fmt.Sprintf("the kube-apiserver on host %q has the ID %s", r.Hostname, want)}})
			continue
		}
		remembered[id] = true
		for _, res := range r.Served {
			add(res, id)
		}
		if !hasLease[id] {
			servers = append(servers, topology.APIServer{ID: id, Hostname: r.Hostname, Address: r.Address})
			continue
		}
		// Its Lease is stale or unverified (no discovery): the address that counts is the one
		// it was last verified at, not what the Lease now claims (topology.Topology.Hosts).
		for i := range servers {
			if servers[i].ID == id {
				servers[i].Address = r.Address
			}
		}
	}
	var refused []topology.Refusal
	servers, refused = oneHostPerAddress(servers, objs, remembered)
	for _, r := range refused {
		errs = append(errs, &RefusedError{r})
	}
	// A StorageVersion entry naming an ID no Lease or memory knows decides nothing (such a
	// resource goes to the default set either way) and would cost a route: 5,000 of them
	// gave 50,056 routes.
	known := map[string]bool{}
	for _, s := range servers {
		known[s.ID] = true
	}
	fromStorageVersions := map[string]bool{}
	addFromSV := func(r topology.Resource, id string) {
		if !known[id] {
			return
		}
		fromStorageVersions[id] = true
		add(r, id)
	}
	for i := range objs.StorageVersions {
		svErrs := addStorageVersion(&objs.StorageVersions[i], objs.Discovery, addFromSV) // add may append to errs itself
		errs = append(errs, svErrs...)
	}

	t, err := topology.New(servers, served, everywhere)
	if err != nil {
		return nil, append(errs, err)
	}
	var routed []error
	t.Aggregated, routed = aggregatedRoutes(aggregated, objs.Discovery, hasLease)
	errs = append(errs, routed...)
	pending, pendingErrs := pendingResources(objs.CRDs, objs.APIServices, served, t, opts.Now)
	t.SetPending(pending)
	errs = append(errs, pendingErrs...)
	t.Sources = make(map[string]topology.Source, len(t.APIServers))
	for _, s := range t.APIServers {
		switch {
		case objs.Discovery[s.ID] != nil:
			t.Sources[s.ID] = topology.Source{From: topology.SourceDiscovery, Since: objs.DiscoveredAt[s.ID], Version: objs.Versions[s.ID]}
		case remembered[s.ID]:
			r := objs.Remembered[s.ID]
			t.Sources[s.ID] = topology.Source{From: topology.SourceRemembered, Since: r.LastSeen, LeaseDeleted: r.LeaseGone, AwaitingDiscovery: awaiting[s.ID]}
		case fromStorageVersions[s.ID]:
			t.Sources[s.ID] = topology.Source{From: topology.SourceStorageVersions, AwaitingDiscovery: awaiting[s.ID]}
		default:
			t.Sources[s.ID] = topology.Source{From: topology.SourceNone, AwaitingDiscovery: awaiting[s.ID]}
		}
	}
	for _, err := range errs {
		switch e := err.(type) {
		case *RefusedError:
			t.Refused = append(t.Refused, e.Refusal)
		case *NameError:
			t.RefusedNames = append(t.RefusedNames, e.NameRefusal)
		}
	}
	_, headers, usable, err := ObserveRequestHeaderNames(objs.HeaderNames, objs.Authentication)
	if err != nil {
		errs = append(errs, &RequestHeaderConfigError{err})
	}
	if !usable {
		return nil, errs
	}
	t.RequestHeaders = headers
	var live []*apidiscoveryv2.APIGroupDiscoveryList
	for _, id := range t.Live() { // sorted by ID: the merge is deterministic
		live = append(live, objs.Discovery[id])
	}
	t.Discovery = opts.Memo.merge(live, groupPriorities(objs.APIServices))
	return t, errs
}

// oneHostPerAddress keeps one apiserver per address. Verified discovery proves only that
// whatever answers at an address over the cluster's TLS serves what it listed, not which
// apiserver it is, so a Lease can claim a real apiserver's address (its own, or a second
// address of it) under another host. Two claims on one address must never become two
// endpoints (real Envoy keeps only the first of duplicate hosts in a locality) nor make
// a host of one apiserver a member of another's serving sets. The claim kept is, in
// order: a live one over a departed one; of live ones, the oldest Lease (an apiserver
// creates its Lease when it first starts, before anyone can know its address), then the
// lowest ID; of departed ones, the last seen live. The others keep their IDs, and what they
// serve counts as known (503 rather than 404), but they have no address: never hosts.
func oneHostPerAddress(servers []topology.APIServer, objs Objects, remembered map[string]bool) ([]topology.APIServer, []topology.Refusal) {
	created := map[string]time.Time{}
	for _, l := range objs.Leases {
		created[l.Name] = l.CreationTimestamp.Time
	}
	better := func(a, b topology.APIServer) int { // < 0: a is kept over b
		if a.Routable() != b.Routable() {
			if a.Routable() {
				return -1
			}
			return 1
		}
		if a.Routable() {
			return cmp.Or(created[a.ID].Compare(created[b.ID]), cmp.Compare(a.ID, b.ID))
		}
		return cmp.Or(objs.Remembered[b.ID].LastSeen.Compare(objs.Remembered[a.ID].LastSeen), cmp.Compare(a.ID, b.ID))
	}
	isHost := func(s topology.APIServer) bool { return s.Routable() || (s.Address != "" && remembered[s.ID]) }
	kept := map[string]topology.APIServer{}
	for _, s := range servers {
		if !isHost(s) {
			continue
		}
		if k, ok := kept[s.Address]; !ok || better(s, k) < 0 {
			kept[s.Address] = s
		}
	}
	var refused []topology.Refusal
	out := slices.Clone(servers)
	for i, s := range out {
		if !isHost(s) {
			continue
		}
		if k := kept[s.Address]; k.ID != s.ID {
			refused = append(refused, topology.Refusal{Object: "apiserver " + s.ID, ID: s.ID, Hostname: s.Hostname, Address: s.Address,
				Reason: fmt.Sprintf("its address is also claimed by apiserver %s (hostname %s), kept as its only host", k.ID, k.Hostname)})
			out[i].Address = ""
		}
	}
	slices.SortFunc(refused, func(a, b topology.Refusal) int { return cmp.Compare(a.ID, b.ID) })
	return out, refused
}

// APIServerFromLease reads one identity Lease as Build does: the apiserver's ID, hostname and
// address (the peer-advertise annotation, else Options.Addresses by hostname) and whether it
// is alive at opts.Now. The Lease's own liveness only: APIServers may still count it alive
// when our Lease watch went quiet (liveness.go). An ID is returned with an error when only the
// address is unusable; no ID when the Lease is not an apiserver identity Lease or is not
// believable.
//
// Whoever may write Leases in kube-system (controllers, many operators) can write an
// identity Lease, so one is checked before it is believed: its name must be the ID
// kube-apiserver derives from the hostname in its label (APIServerIDFor), its
// holderIdentity its name followed by "_" (as every apiserver writes it), its renewTime no more than
// MaxClockSkew in the future, and its address an IP literal and port, nothing else (no DNS
// name, user info or path for xds-server to fetch discovery from).
func APIServerFromLease(l *coordinationv1.Lease, opts Options) (topology.APIServer, error) {
	now, addresses := opts.Now, opts.Addresses
	name := "Lease " + l.Namespace + "/" + l.Name
	if l.Labels[IdentityLabel] != IdentityLabelValue {
		return topology.APIServer{}, fmt.Errorf("%s skipped: not an apiserver identity Lease (label %s=%s missing)", name, IdentityLabel, IdentityLabelValue)
	}
	if h := l.Spec.HolderIdentity; h == nil || !strings.HasPrefix(*h, l.Name+"_") {
		return topology.APIServer{}, refuse(name, l, fmt.Sprintf("holderIdentity %s is not <lease name>_<uid>, as an apiserver writes it", quoted(h)))
	}
	if rt := l.Spec.RenewTime; rt != nil && !now.IsZero() && rt.Time.After(now.Add(MaxClockSkew)) {
		return topology.APIServer{}, refuse(name, l, fmt.Sprintf("renewTime %s is more than %s in the future: it would count as alive for ever", rt.UTC().Format(time.RFC3339), MaxClockSkew))
	}
	host := l.Labels[HostnameLabel]
	if host == "" {
		return topology.APIServer{}, refuse(name, l, fmt.Sprintf("no %s label, so nothing ties it to an apiserver's host", HostnameLabel))
	}
	if want := APIServerIDFor(host); l.Name != want {
		return topology.APIServer{}, refuse(name, l, fmt.Sprintf("it claims host %q, whose kube-apiserver names its "+
			"Lease %s: a second Lease for one host could take that apiserver's place in routing", host, want))
	}
	s := topology.APIServer{ID: l.Name, Hostname: host}
	var err error
	if a, ok := l.Annotations[PeerAdvertiseAnnotation]; ok {
		if addrErr := checkAddress(a); addrErr != nil {
			err = fmt.Errorf("%s: annotation %s=%q %v; address unknown", name, PeerAdvertiseAnnotation, a, addrErr)
		} else {
			s.Address = a
		}
	} else if a, ok := addresses[s.Hostname]; ok {
		if addrErr := checkAddress(a); addrErr != nil {
			err = fmt.Errorf("%s: the address given for hostname %q, %q, %v; address unknown", name, s.Hostname, a, addrErr)
		} else {
			s.Address = a
		}
	}
	s.Alive = aliveByOwnRenewal(l.Spec.RenewTime, opts)
	return s, err
}

// APIServerIDFor is the ID, and so the identity Lease name, that kube-apiserver gives itself
// on a host (k8s.io/apiserver's NewConfig): "apiserver-" and the lower-case unpadded base32 of
// the first 16 bytes of the SHA-256 of the hostname and "kube-apiserver", each prefixed with
// its length as two bytes. One host has one ID, so a Lease that names a host but not by its
// ID is not an apiserver's.
func APIServerIDFor(hostname string) string {
	var b cryptobyte.Builder
	for _, part := range []string{hostname, IdentityLabelValue} {
		b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(part)) })
	}
	data, err := b.Bytes()
	if err != nil {
		// Longer than 65,535 bytes: no label value is (63 at most), and no apiserver's ID.
		return ""
	}
	sum := sha256.Sum256(data)
	return "apiserver-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// RefusedError is an identity Lease or a remembered apiserver that xds-server does not believe
// (it is left out of routing entirely), or an apiserver left out because another one holds its
// address. Build lists them in Topology.Refused, for /debug/topology.
type RefusedError struct{ topology.Refusal }

func (e *RefusedError) Error() string { return e.Object + " rejected: " + e.Reason }

func refuse(object string, l *coordinationv1.Lease, reason string) *RefusedError {
	return &RefusedError{topology.Refusal{Object: object, ID: l.Name, Hostname: l.Labels[HostnameLabel], Address: l.Annotations[PeerAdvertiseAnnotation], Reason: reason}}
}

// checkAddress accepts an IP literal and a port, nothing else.
func checkAddress(a string) error {
	ap, err := netip.ParseAddrPort(a)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" || ap.Addr().IsUnspecified() {
		return fmt.Errorf("is not an IP address and port (e.g. 10.0.0.1:6443)")
	}
	return nil
}

func quoted(s *string) string {
	if s == nil {
		return "missing"
	}
	return fmt.Sprintf("%q", *s)
}

// addStorageVersion adds what a StorageVersion says about the apiservers that have no
// discovery. Its name is "<group>.<resource>" with "core" for the core group; servedVersions
// are "v1" (core) or "<group>/<version>".
func addStorageVersion(sv *apiserverinternalv1alpha1.StorageVersion, discovered map[string]*apidiscoveryv2.APIGroupDiscoveryList, add func(topology.Resource, string)) []error {
	name := "StorageVersion " + sv.Name
	dot := strings.LastIndexByte(sv.Name, '.')
	if dot <= 0 || dot == len(sv.Name)-1 {
		return []error{fmt.Errorf("%s skipped: name is not <group>.<resource>", name)}
	}
	group, resource := sv.Name[:dot], sv.Name[dot+1:]
	if group == "core" {
		group = ""
	}
	var errs []error
	for _, e := range sv.Status.StorageVersions {
		if e.APIServerID == "" {
			errs = append(errs, fmt.Errorf("%s: entry without apiServerID skipped", name))
			continue
		}
		if discovered[e.APIServerID] != nil {
			continue
		}
		for _, gv := range e.ServedVersions {
			g, v := "", gv
			if slash := strings.IndexByte(gv, '/'); slash >= 0 {
				g, v = gv[:slash], gv[slash+1:]
			}
			if g != group || v == "" || strings.Contains(v, "/") {
				errs = append(errs, fmt.Errorf("%s: apiserver %s: servedVersion %q does not belong to group %q; skipped", name, e.APIServerID, gv, group))
				continue
			}
			add(topology.Resource{Group: g, Version: v, Resource: resource}, e.APIServerID)
		}
	}
	return errs
}

// MaxAggregatedGroupVersions bounds the aggregated group/versions that get a route of their
// own: each is a route Envoy tries before the built-in ones.
const MaxAggregatedGroupVersions = 256

// aggregatedRoutes are the aggregated group/versions that get a route of their own, sorted:
// those some apiserver with a Lease lists in its discovery (the aggregator lists an
// APIService only once its backend answers), at most MaxAggregatedGroupVersions, with an
// error for each left out over the bound. An APIService whose service answers nothing costs
// no route: 5,000 of them gave 50,056 routes and 24.9 MB of RDS, all tried before every
// built-in route. What gets no route of its own goes to the default set as any unpublished
// path does.
func aggregatedRoutes(aggregated []topology.GroupVersion, discovery map[string]*apidiscoveryv2.APIGroupDiscoveryList, hasLease map[string]bool) ([]topology.GroupVersion, []error) {
	listed := map[topology.GroupVersion]bool{}
	for id, list := range discovery {
		if list == nil || !hasLease[id] {
			continue
		}
		for _, g := range list.Items {
			for _, v := range g.Versions {
				listed[topology.GroupVersion{Group: g.Name, Version: v.Version}] = true
			}
		}
	}
	var out []topology.GroupVersion
	for _, gv := range topology.SortedGroupVersions(aggregated) {
		if listed[gv] {
			out = append(out, gv)
		}
	}
	var errs []error
	if len(out) > MaxAggregatedGroupVersions {
		for _, gv := range out[MaxAggregatedGroupVersions:] {
			errs = append(errs, fmt.Errorf("APIService for %s: more than %d aggregated group/versions; it gets no route of its own (its requests go to the default set)", gv, MaxAggregatedGroupVersions))
		}
		out = out[:MaxAggregatedGroupVersions]
	}
	return out, errs
}

// groupPriorities are each group's highest APIService groupPriorityMinimum: the order
// kube-aggregator gives groups in discovery.
func groupPriorities(svcs []APIService) map[string]int32 {
	out := map[string]int32{}
	for _, s := range svcs {
		if p, ok := out[s.Spec.Group]; !ok || s.Spec.GroupPriorityMinimum > p {
			out[s.Spec.Group] = s.Spec.GroupPriorityMinimum
		}
	}
	return out
}
