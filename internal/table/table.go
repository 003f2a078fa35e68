// Package table carries a topology.Topology from xds-server to extproc over gRPC
// (proto/kubemvp/table/v1): the server side broadcasts every new table, the client side keeps
// the last one it could use and reconnects with backoff when the stream drops.
//
// On the wire a table is its Table message (format 1: the distinct apiserver sets listed once,
// resources grouped by group/version and naming their set by index), serialized
// deterministically, gzipped once per change and cut into chunks (chunk.go): the size of a
// table is bounded by MaxTableSize, not by gRPC's message size limit.
package table

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kube-mvp/kube-mvp/internal/topology"
	tablev1 "github.com/kube-mvp/kube-mvp/proto/kubemvp/table/v1"
)

// Format is the Table format this package writes and the only one it reads.
const Format = 1

var (
	// ErrUnsupportedFormat: the table is in a format this build cannot read (a newer or older
	// xds-server).
	ErrUnsupportedFormat = errors.New("unsupported table format")
	// ErrMalformed: the table contradicts itself or its format.
	ErrMalformed = errors.New("malformed table")
	// ErrTooLarge: the table is larger than the limit.
	ErrTooLarge = errors.New("table too large")
)

// ToProto converts t; the version is a hash of the content, so equal topologies give equal
// versions on every replica.
func ToProto(t *topology.Topology, now time.Time) *tablev1.Table {
	tb, _ := build(t, now)
	return tb
}

// build converts t and also returns the table's deterministic serialization, the bytes that
// go on the wire.
func build(t *topology.Topology, now time.Time) (*tablev1.Table, []byte) {
	tb := &tablev1.Table{Format: Format}
	for _, s := range t.APIServers {
		tb.Apiservers = append(tb.Apiservers, &tablev1.APIServer{Id: s.ID, Hostname: s.Hostname, Address: s.Address, Alive: s.Alive})
	}
	sets := map[string]uint32{}
	var gv *tablev1.GroupVersion
	var prev []string // the set of the previous resource, index i
	var i uint32
	for _, r := range t.Resources() { // sorted by group, version, resource, subresource
		ids := t.Served[r]
		if prev == nil || !slices.Equal(ids, prev) { // neighbours mostly share their set
			key := strings.Join(ids, "\x00")
			var ok bool
			if i, ok = sets[key]; !ok {
				i = uint32(len(tb.ServerSets))
				sets[key] = i
				tb.ServerSets = append(tb.ServerSets, &tablev1.ServerSet{ApiserverIds: ids})
			}
			prev = ids
		}
		if gv == nil || gv.Group != r.Group || gv.Version != r.Version {
			gv = &tablev1.GroupVersion{Group: r.Group, Version: r.Version}
			tb.GroupVersions = append(tb.GroupVersions, gv)
		}
		gv.Resources = append(gv.Resources, &tablev1.ServedResource{Resource: r.Resource, Subresource: r.Subresource, ServerSet: i})
	}
	for g := range t.ServedEverywhere {
		tb.ServedEverywhereGroups = append(tb.ServedEverywhereGroups, g)
	}
	slices.Sort(tb.ServedEverywhereGroups)
	if t.Discovery != nil {
		tb.ApisDiscovery = t.Discovery.JSON
	}
	content, err := proto.MarshalOptions{Deterministic: true}.Marshal(tb)
	if err != nil {
		// Only invalid UTF-8 in a string field can fail, and every string here comes from
		// Kubernetes object names and Lease labels, which are ASCII.
		panic(fmt.Sprintf("table: marshal: %v", err))
	}
	sum := sha256.Sum256(content)
	tb.Version = hex.EncodeToString(sum[:8])
	tb.GeneratedAt = timestamppb.New(now)
	// Version and generated_at are appended to the content rather than marshalling the whole
	// table again: a protobuf parser takes fields in any order.
	tail, err := proto.MarshalOptions{Deterministic: true}.Marshal(&tablev1.Table{Version: tb.Version, GeneratedAt: tb.GeneratedAt})
	if err != nil {
		panic(fmt.Sprintf("table: marshal: %v", err))
	}
	return tb, append(content, tail...)
}

// FromProto converts a received table back. It is strict: a table of another format, or one
// that contradicts itself (a set index out of range, a resource listed twice, an empty
// apiserver set), is an error wrapping ErrUnsupportedFormat or ErrMalformed, never a panic.
func FromProto(tb *tablev1.Table) (*topology.Topology, error) {
	if tb == nil {
		return nil, fmt.Errorf("%w: no table", ErrMalformed)
	}
	if f := tb.GetFormat(); f != Format {
		return nil, fmt.Errorf("table %s: %w %d (this build reads format %d)", tb.GetVersion(), ErrUnsupportedFormat, f, Format)
	}
	malformed := func(format string, args ...any) error {
		return fmt.Errorf("table %s: %w: %s", tb.GetVersion(), ErrMalformed, fmt.Sprintf(format, args...))
	}
	servers := make([]topology.APIServer, 0, len(tb.GetApiservers()))
	for _, s := range tb.GetApiservers() {
		servers = append(servers, topology.APIServer{ID: s.GetId(), Hostname: s.GetHostname(), Address: s.GetAddress(), Alive: s.GetAlive()})
	}
	sets := tb.GetServerSets()
	for i, s := range sets {
		ids := s.GetApiserverIds()
		if len(ids) == 0 {
			return nil, malformed("server set %d is empty", i)
		}
		if slices.Contains(ids, "") {
			return nil, malformed("server set %d has an empty apiserver ID", i)
		}
	}
	n := 0
	for _, gv := range tb.GetGroupVersions() {
		n += len(gv.GetResources())
	}
	served := make(map[topology.Resource][]string, n)
	for _, gv := range tb.GetGroupVersions() {
		for _, r := range gv.GetResources() {
			key := topology.Resource{Group: gv.GetGroup(), Version: gv.GetVersion(), Resource: r.GetResource(), Subresource: r.GetSubresource()}
			i := r.GetServerSet()
			if uint64(i) >= uint64(len(sets)) {
				return nil, malformed("resource %s names server set %d of %d", key, i, len(sets))
			}
			if _, dup := served[key]; dup {
				return nil, malformed("resource %s is listed twice", key)
			}
			served[key] = sets[i].GetApiserverIds()
		}
	}
	t, err := topology.New(servers, served, tb.GetServedEverywhereGroups())
	if err != nil {
		return nil, fmt.Errorf("table %s: %w: %w", tb.GetVersion(), ErrMalformed, err)
	}
	t.Discovery = topology.NewDiscovery(tb.GetApisDiscovery())
	return t, nil
}
