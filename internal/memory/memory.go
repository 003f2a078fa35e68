package memory

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Memory is what departed apiservers served, by apiserver ID: each apiserver's last verified
// discovery, kept after its identity Lease goes stale or is deleted, so that their resources
// answer 503 (Unavailable) rather than 404 while nobody can serve them. Without the
// StorageVersion API (the cluster default) nothing else remembers what a dead apiserver
// served; with it, the memory also covers a Lease that was deleted (a graceful stop deletes
// it), which StorageVersions alone do not.
//
// Lifetime: an apiserver is remembered while its Lease exists, stale or not, and for the
// grace period after its Lease is gone (counted from when the deletion was first seen);
// then it is forgotten and its resources answer 404 again.
//
// Everything here is a pure function of its arguments (the time is passed in); the watcher
// (internal/inventory) keeps a Memory, persists it in a ConfigMap and passes it to objects.Build
// as Objects.Remembered.
type Memory map[string]Remembered

// Remembered is one apiserver as last seen live with verified discovery.
type Remembered struct {
	Hostname string
	// Address is the host:port at which its discovery was last fetched over verified TLS:
	// Envoy keeps it as a host of the serving-sets cluster while it is remembered, so that
	// it is routable again as soon as it answers (a restart keeps its address). Empty in
	// records written before addresses were kept.
	Address string
	// Served are its resources and subresources, sorted (groups served everywhere left out:
	// any apiserver serves those).
	Served []topology.Resource
	// LastSeen is when it was last seen live with verified discovery (whole seconds).
	LastSeen time.Time
	// LeaseGone is when its identity Lease was first seen deleted (after LastSeen); zero while
	// the Lease exists.
	LeaseGone time.Time
}

// Equal reports whether r and o record the same thing.
func (r Remembered) Equal(o Remembered) bool {
	return r.Hostname == o.Hostname && r.Address == o.Address && slices.Equal(r.Served, o.Served) && r.LastSeen.Equal(o.LastSeen) && r.LeaseGone.Equal(o.LeaseGone)
}

// Sighting is what one look at the cluster says about the apiservers, for Memory.Observe.
type Sighting struct {
	// Now is the time of the look.
	Now time.Time
	// Leases are the IDs that have an identity Lease, stale or fresh.
	Leases map[string]bool
	// Verified are the live apiservers whose discovery was fetched at their address over
	// verified TLS, with what they serve (ServedBy) and their hostname.
	Verified map[string]Remembered
	// Grace is how long an apiserver is remembered after its Lease is gone.
	Grace time.Duration
}

// Observe returns m updated by one look at the cluster: verified apiservers are recorded as
// they serve now, the others keep their last record while their Lease exists, start their
// grace period when it is gone, and are forgotten when that has passed. m is not changed.
func (m Memory) Observe(s Sighting) Memory {
	now := s.Now.Truncate(time.Second)
	out := make(Memory, len(m)+len(s.Verified))
	for id, r := range s.Verified {
		served := slices.SortedFunc(slices.Values(r.Served), topology.CompareResources)
		out[id] = Remembered{Hostname: r.Hostname, Address: r.Address, Served: slices.Compact(served), LastSeen: now}
	}
	for id, r := range m {
		if _, ok := out[id]; ok {
			continue
		}
		switch {
		case s.Leases[id]:
			r.LeaseGone = time.Time{} // remembered as long as its Lease exists
		case r.LeaseGone.IsZero():
			r.LeaseGone = now
		}
		if !r.LeaseGone.IsZero() && now.Sub(r.LeaseGone) >= s.Grace {
			continue // forgotten
		}
		out[id] = r
	}
	return out
}

// Merge combines two replicas' memories (two xds-servers writing one ConfigMap), the
// same whichever comes first: per apiserver, the record seen live last wins, and a Lease
// deletion counts if it was seen after that sighting (the earliest such, so that the grace
// period is counted from the first replica that saw it). Records whose grace period has
// passed by now are dropped.
func Merge(a, b Memory, now time.Time, grace time.Duration) Memory {
	out := make(Memory, len(a)+len(b))
	for _, id := range slices.Sorted(maps.Keys(idsOf(a, b))) {
		ra, inA := a[id]
		rb, inB := b[id]
		var r Remembered
		switch {
		case !inA:
			r = rb
		case !inB:
			r = ra
		default:
			r = mergeRemembered(ra, rb)
		}
		if !r.LeaseGone.IsZero() && now.Sub(r.LeaseGone) >= grace {
			continue
		}
		out[id] = r
	}
	return out
}

func idsOf(a, b Memory) map[string]bool {
	ids := map[string]bool{}
	for id := range a {
		ids[id] = true
	}
	for id := range b {
		ids[id] = true
	}
	return ids
}

func mergeRemembered(a, b Remembered) Remembered {
	// The later sighting wins; on a tie the lower encoding, so that the result does not
	// depend on the order of a and b.
	r := a
	if b.LastSeen.After(a.LastSeen) || (b.LastSeen.Equal(a.LastSeen) && encodeRemembered(b) < encodeRemembered(a)) {
		r = b
	}
	r.LeaseGone = time.Time{}
	for _, gone := range []time.Time{a.LeaseGone, b.LeaseGone} {
		if !gone.IsZero() && !gone.Before(r.LastSeen) && (r.LeaseGone.IsZero() || gone.Before(r.LeaseGone)) {
			r.LeaseGone = gone
		}
	}
	return r
}

// lastSeenRefresh: the last-seen time of a live apiserver is written again at most this
// often; a departure writes it at once.
const lastSeenRefresh = 10 * time.Minute

// NeedsWrite reports whether mine says something persisted does not: another apiserver, a
// change in what one serves or in its Lease, a departed apiserver's final sighting, or a live
// one's sighting lastSeenRefresh newer. live are the apiservers seen live now.
func NeedsWrite(persisted, mine Memory, live map[string]bool) bool {
	if len(persisted) != len(mine) {
		return true
	}
	for id, m := range mine {
		p, ok := persisted[id]
		if !ok || p.Hostname != m.Hostname || p.Address != m.Address || !slices.Equal(p.Served, m.Served) || !p.LeaseGone.Equal(m.LeaseGone) {
			return true
		}
		if m.LastSeen.After(p.LastSeen) && (!live[id] || m.LastSeen.Sub(p.LastSeen) >= lastSeenRefresh) {
			return true
		}
	}
	return false
}

// The ConfigMap: one key per apiserver ID (IDs are valid ConfigMap keys), its value JSON,
// resources listed per group/version as "jobs jobs/status cronjobs":
//
//	apiserver-abc: {"hostname":"cp-a","address":"10.0.0.1:6443","lastSeen":"2026-01-02T03:04:05Z","served":{"batch/v1":"cronjobs cronjobs/status jobs jobs/status","v1":"pods pods/log ..."}}
//
// with "leaseDeletedAt" once its Lease is gone. The core group/version is written "v1".
type rememberedJSON struct {
	Hostname  string            `json:"hostname,omitempty"`
	Address   string            `json:"address,omitempty"`
	LastSeen  time.Time         `json:"lastSeen"`
	LeaseGone *time.Time        `json:"leaseDeletedAt,omitempty"`
	Served    map[string]string `json:"served"`
}

// Encode is m as ConfigMap data, unsigned (xds-server writes EncodeSigned).
func Encode(m Memory) map[string]string {
	data := make(map[string]string, len(m))
	for id, r := range m {
		data[id] = encodeRemembered(r)
	}
	return data
}

func encodeRemembered(r Remembered) string {
	b, _ := json.Marshal(toJSON(r)) // strings, a map of strings and times: cannot fail
	return string(b)
}

func toJSON(r Remembered) rememberedJSON {
	j := rememberedJSON{Hostname: r.Hostname, Address: r.Address, LastSeen: r.LastSeen.UTC(), Served: map[string]string{}}
	if !r.LeaseGone.IsZero() {
		gone := r.LeaseGone.UTC()
		j.LeaseGone = &gone
	}
	names := map[string]*strings.Builder{}
	for _, res := range r.Served {
		gv := res.Version
		if res.Group != "" {
			gv = res.Group + "/" + res.Version
		}
		b := names[gv]
		if b == nil {
			b = &strings.Builder{}
			names[gv] = b
		} else {
			b.WriteByte(' ')
		}
		b.WriteString(res.Resource)
		if res.Subresource != "" {
			b.WriteString("/" + res.Subresource)
		}
	}
	for gv, b := range names {
		j.Served[gv] = b.String()
	}
	return j
}

// Decode reads ConfigMap data written by Encode or EncodeSigned, without
// checking signatures or bounds (xds-server reads its ConfigMap with Read). The first
// entry it cannot read makes it fail, naming the entry. RequestHeaderNamesKey is no entry.
func Decode(data map[string]string) (Memory, error) {
	m := make(Memory, len(data))
	for _, id := range slices.Sorted(maps.Keys(data)) {
		if id == RequestHeaderNamesKey {
			continue
		}
		r, err := decodeRemembered(data[id])
		if err != nil {
			return nil, fmt.Errorf("entry %q: %w", id, err)
		}
		m[id] = r
	}
	return m, nil
}

func decodeRemembered(s string) (Remembered, error) {
	var j rememberedJSON
	if err := json.Unmarshal([]byte(s), &j); err != nil {
		return Remembered{}, err
	}
	return fromJSON(j)
}

func fromJSON(j rememberedJSON) (Remembered, error) {
	if j.LastSeen.IsZero() {
		return Remembered{}, fmt.Errorf("no lastSeen")
	}
	if j.Address != "" {
		if _, _, err := net.SplitHostPort(j.Address); err != nil {
			return Remembered{}, fmt.Errorf("address %q: %w", j.Address, err)
		}
	}
	r := Remembered{Hostname: j.Hostname, Address: j.Address, LastSeen: j.LastSeen}
	if j.LeaseGone != nil {
		r.LeaseGone = *j.LeaseGone
	}
	for gv, names := range j.Served {
		group, version, found := strings.Cut(gv, "/")
		if !found {
			group, version = "", gv
		}
		if version == "" || strings.Contains(version, "/") {
			return Remembered{}, fmt.Errorf("served: %q is not a group/version", gv)
		}
		for _, name := range strings.Fields(names) {
			res, sub, _ := strings.Cut(name, "/")
			if res == "" || strings.Contains(sub, "/") {
				return Remembered{}, fmt.Errorf("served: %q is not a resource or resource/subresource", name)
			}
			r.Served = append(r.Served, topology.Resource{Group: group, Version: version, Resource: res, Subresource: sub})
		}
	}
	slices.SortFunc(r.Served, topology.CompareResources)
	r.Served = slices.Compact(r.Served)
	return r, nil
}
