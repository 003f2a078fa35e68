package memory_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// sampleNames: a good configuration with a custom group header, after the defaults.
func sampleNames(t *testing.T, now time.Time) memory.RequestHeaderNames {
	t.Helper()
	var n memory.RequestHeaderNames
	next, _, _, err := objects.ObserveRequestHeaderNames(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	n = next.GoodSince(n, now.Add(-time.Hour))
	next, _, _, err = objects.ObserveRequestHeaderNames(n, authCM(map[string]string{"requestheader-group-headers": `["X-Custom-Group"]`}))
	if err != nil {
		t.Fatal(err)
	}
	return next.GoodSince(n, now)
}

func wantNamesRejected(t *testing.T, what, value string, trust memory.Trust, reason string) {
	t.Helper()
	n, err := memory.ReadRequestHeaderNames(value, trust)
	var why *memory.Rejected
	if !errors.As(err, &why) {
		t.Errorf("%s: accepted (%+v), want rejected for %s", what, n, reason)
		return
	}
	if why.Reason != reason {
		t.Errorf("%s: rejected for %s (%v), want %s", what, why.Reason, why.Err, reason)
	}
	if !n.IsZero() {
		t.Errorf("%s: rejected but returned %+v", what, n)
	}
}

// TestSignedRequestHeaderNames: what xds-server signs is read back whole; a tampered value,
// one signed by another role, unsigned, in the future, or a memory entry's signature moved
// to the names (or theirs to an entry) is rejected with its reason.
func TestSignedRequestHeaderNames(t *testing.T) {
	now := time.Now()
	pki := newSigningCA(t)
	key := pki.key(t, cptls.RoleXDSServer)
	trust := memory.Trust{Roots: pki.roots, Now: now}
	names := sampleNames(t, now)
	if !slices.Contains(names.Seen, "x-custom-group") || !slices.Contains(names.Seen, "x-remote-group") {
		t.Fatalf("sample names %+v", names)
	}

	value, err := memory.EncodeSignedRequestHeaderNames(names, key, now)
	if err != nil {
		t.Fatal(err)
	}
	got, err := memory.ReadRequestHeaderNames(value, trust)
	if err != nil {
		t.Fatal(err)
	}
	if got.NeedsWrite(names) || names.NeedsWrite(got) || !got.GoodAt.Equal(names.GoodAt) || !slices.Equal(got.Seen, names.Seen) || !slices.Equal(got.SeenPrefixes, names.SeenPrefixes) {
		t.Errorf("read back %+v, want %+v", got, names)
	}

	wantNamesRejected(t, "tampered: a seen name removed", editEntry(t, value, func(e map[string]any) {
		e["seen"] = slices.DeleteFunc(e["seen"].([]any), func(s any) bool { return s == "x-custom-group" })
	}), trust, memory.RejectSignature)
	wantNamesRejected(t, "tampered: good changed", editEntry(t, value, func(e map[string]any) {
		e["good"].(map[string]any)["group"] = []any{"x-remote-group"}
	}), trust, memory.RejectSignature)
	wantNamesRejected(t, "unsigned", editEntry(t, value, func(e map[string]any) {
		delete(e, "signedAt")
		delete(e, "signer")
		delete(e, "signature")
	}), trust, memory.RejectUnsigned)
	wantNamesRejected(t, "signature without signer", editEntry(t, value, func(e map[string]any) { delete(e, "signer") }), trust, memory.RejectSignature)
	other, err := memory.EncodeSignedRequestHeaderNames(names, pki.key(t, cptls.RoleExtproc), now)
	if err != nil {
		t.Fatal(err)
	}
	wantNamesRejected(t, "signed by ext-proc", other, trust, memory.RejectSigner)
	wantNamesRejected(t, "another CA", value, memory.Trust{Roots: newSigningCA(t).roots, Now: now}, memory.RejectSigner)
	future, err := memory.EncodeSignedRequestHeaderNames(names, key, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	wantNamesRejected(t, "signed in the future", future, trust, memory.RejectFuture)
	wantNamesRejected(t, "not JSON", `{"seen": [`, trust, memory.RejectMalformed)

	// A memory entry's signature on the names, and the names' signature on an entry.
	entry := sign(t, sampleMemory(now), key, now)[cpBID]
	moved := editEntry(t, value, func(e map[string]any) {
		m := map[string]any{}
		_ = json.Unmarshal([]byte(entry), &m)
		e["signedAt"], e["signer"], e["signature"] = m["signedAt"], m["signer"], m["signature"]
	})
	wantNamesRejected(t, "an entry's signature", moved, trust, memory.RejectSignature)
	data := sign(t, sampleMemory(now), key, now)
	data[cpBID] = editEntry(t, data[cpBID], func(e map[string]any) {
		m := map[string]any{}
		_ = json.Unmarshal([]byte(value), &m)
		e["signedAt"], e["signer"], e["signature"] = m["signedAt"], m["signer"], m["signature"]
	})
	wantRejected(t, "the names' signature on an entry", data, trust, memory.RejectSignature)
	// The names moved to an apiserver's key are no entry.
	data = sign(t, sampleMemory(now), key, now)
	data[cpBID] = value
	wantRejected(t, "the names under an apiserver ID", data, trust, memory.RejectMalformed)
}

// TestRequestHeaderNamesInMemory: the names' key is no entry: memories with it are read as
// without it, it counts in the bytes but not in the entries, and Bound leaves it room.
func TestRequestHeaderNamesInMemory(t *testing.T) {
	now := time.Now()
	pki := newSigningCA(t)
	key := pki.key(t, cptls.RoleXDSServer)
	trust := memory.Trust{Roots: pki.roots, Now: now}
	value, err := memory.EncodeSignedRequestHeaderNames(sampleNames(t, now), key, now)
	if err != nil {
		t.Fatal(err)
	}
	data := sign(t, sampleMemory(now), key, now)
	data[memory.RequestHeaderNamesKey] = value
	wantAccepted(t, "a memory with the names", data, trust, sampleMemory(now))
	if m, err := memory.Decode(data); err != nil || len(m) != 2 {
		t.Errorf("Decode: %d entries, %v", len(m), err)
	}

	full := memory.Memory{}
	for i := range memory.MaxEntries {
		full[objects.APIServerIDFor(fmt.Sprintf("cp-%d", i))] = memory.Remembered{Hostname: fmt.Sprintf("cp-%d", i), Served: []topology.Resource{pods}, LastSeen: now.Truncate(time.Second)}
	}
	data = sign(t, full, key, now)
	data[memory.RequestHeaderNamesKey] = value
	wantAccepted(t, "as many entries as allowed, and the names", data, trust, full)

	// Bytes: a memory that fits alone but not with the largest names is rejected as a
	// whole; Bound leaves the names room.
	largest := largestNames(t, now)
	lv, err := memory.EncodeSignedRequestHeaderNames(largest, key, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := memory.ReadRequestHeaderNames(lv, trust); err != nil {
		t.Errorf("the largest names: %v", err)
	}
	size := func(d map[string]string) int {
		n := 0
		for k, v := range d {
			n += len(k) + len(v)
		}
		return n
	}
	var big memory.Memory
	for per := 2000; ; per += 10 {
		big = memory.Memory{}
		for i := range 3 {
			big[objects.APIServerIDFor(fmt.Sprintf("big-%d", i))] = memory.Remembered{Hostname: fmt.Sprintf("big-%d",
				i), LastSeen: now.Add(-time.Duration(i) * time.Second).Truncate(time.Second), Served: groupVersions(1, per)}
		}
		if s := size(sign(t, big, key, now)); s > memory.MaxBytes-len(lv)-len(memory.RequestHeaderNamesKey) {
			if s > memory.MaxBytes {
				t.Fatalf("no memory fits alone but not with the names (%d bytes at %d)", s, per)
			}
			break
		}
	}
	wantAccepted(t, "the memory alone", sign(t, big, key, now), trust, big)
	data = sign(t, big, key, now)
	data[memory.RequestHeaderNamesKey] = lv
	wantRejected(t, "the memory and the names", data, trust, memory.RejectBounds)
	bounded, dropped := memory.Bound(big, key)
	if len(dropped) == 0 {
		t.Fatal("Bound left the names no room")
	}
	data = sign(t, bounded, key, now)
	data[memory.RequestHeaderNamesKey] = lv
	wantAccepted(t, "a bounded memory with the largest names", data, trust, bounded)
}

func largestNames(t *testing.T, now time.Time) memory.RequestHeaderNames {
	t.Helper()
	long := func(i int) string {
		s := fmt.Sprintf("x-%d-", i)
		return s + strings.Repeat("a", topology.MaxRequestHeaderNameLength-len(s))
	}
	list := func(from int) []string {
		var l []string
		for i := range topology.MaxRequestHeaderNames {
			l = append(l, long(from+i))
		}
		return l
	}
	n := memory.RequestHeaderNames{Good: &topology.RequestHeaders{User: list(0), UID: list(16), Group: list(32), ExtraPrefix: list(48)}, GoodAt: now.Truncate(time.Second)}
	for i := range memory.MaxSeenRequestHeaderNames {
		n.Seen = append(n.Seen, long(i))
		n.SeenPrefixes = append(n.SeenPrefixes, long(i))
	}
	return n
}

// TestRequestHeaderNamesBounds: more names, or longer ones, than Observe keeps are rejected
// as a whole, signed or not; nothing out of bounds is signed.
func TestRequestHeaderNamesBounds(t *testing.T) {
	now := time.Now()
	pki := newSigningCA(t)
	key := pki.key(t, cptls.RoleXDSServer)
	trust := memory.Trust{Roots: pki.roots, Now: now}
	value, err := memory.EncodeSignedRequestHeaderNames(sampleNames(t, now), key, now)
	if err != nil {
		t.Fatal(err)
	}
	many := make([]any, memory.MaxSeenRequestHeaderNames+1)
	for i := range many {
		many[i] = fmt.Sprintf("x-%d", i)
	}
	for _, c := range []struct {
		what   string
		edit   func(map[string]any)
		reason string
	}{
		{"too many seen", func(e map[string]any) { e["seen"] = many }, memory.RejectBounds},
		{"a long seen name", func(e map[string]any) {
			e["seen"] = []any{"x-" + strings.Repeat("a", topology.MaxRequestHeaderNameLength)}
		}, memory.RejectBounds},
		{"too many good names", func(e map[string]any) { e["good"].(map[string]any)["group"] = many[:topology.MaxRequestHeaderNames+1] }, memory.RejectBounds},
		{"not a header name", func(e map[string]any) { e["seen"] = []any{"x remote"} }, memory.RejectMalformed},
		{"upper case", func(e map[string]any) { e["seen"] = []any{"X-Remote-User"} }, memory.RejectMalformed},
		{"twice", func(e map[string]any) { e["seen"] = []any{"x-a", "x-a"} }, memory.RejectMalformed},
		{"a prefix not seen", func(e map[string]any) { e["seenPrefixes"] = []any{"x-elsewhere-"} }, memory.RejectMalformed},
		{"former names in good", func(e map[string]any) { e["good"].(map[string]any)["former"] = []any{"x-a"} }, memory.RejectMalformed},
		{"too long", func(e map[string]any) { e["pad"] = strings.Repeat("a", memory.MaxRequestHeaderNamesBytes) }, memory.RejectBounds},
	} {
		wantNamesRejected(t, c.what, editEntry(t, value, c.edit), trust, c.reason)
	}
	bad := sampleNames(t, now)
	bad.Seen = append(bad.Seen, "X Bad")
	if _, err := memory.EncodeSignedRequestHeaderNames(bad, key, now); err == nil {
		t.Error("names out of bounds were signed")
	}
}

// TestMergeRequestHeaderNames: the union of the names seen, bounded; the process's good
// configuration if any, else the persisted one; and which side needs writing.
func TestMergeRequestHeaderNames(t *testing.T) {
	now := time.Now()
	persisted := sampleNames(t, now) // defaults, then x-custom-group as the group header
	var fresh memory.RequestHeaderNames

	// A restart: nothing in the process; everything persisted is known again.
	merged := memory.MergeRequestHeaderNames(fresh, persisted)
	if !slices.Equal(merged.Seen, persisted.Seen) || merged.Good == nil || !slices.Equal(merged.Good.Group, []string{"x-custom-group"}) || !merged.GoodAt.Equal(persisted.GoodAt) {
		t.Fatalf("merged into nothing: %+v", merged)
	}
	if merged.NeedsWrite(persisted) {
		t.Error("the merge of the persisted value into nothing needs writing")
	}
	// ... then the ConfigMap lost its group key (an attacker deleted it): x-custom-group
	// stays in use, and stripped.
	_, use, usable, _ := objects.ObserveRequestHeaderNames(merged, authCM(map[string]string{"requestheader-username-headers": `["X-Remote-User"]`}))
	if !usable || !slices.Equal(use.Group, []string{"x-custom-group"}) || !slices.Contains(use.StripNames(), "x-custom-group") {
		t.Errorf("after a restart and a deleted key: usable %v, %+v", usable, use)
	}
	// ... or malformed: the persisted last good is used, not unready.
	_, use, usable, err := objects.ObserveRequestHeaderNames(merged, authCM(map[string]string{"requestheader-group-headers": `nope`}))
	if !usable || err == nil || !slices.Equal(use.Group, []string{"x-custom-group"}) {
		t.Errorf("after a restart and a malformed ConfigMap: usable %v, %v, %+v", usable, err, use)
	}
	// ... or renamed: the old name stays stripped.
	next, use, _, _ := objects.ObserveRequestHeaderNames(merged, authCM(map[string]string{"requestheader-group-headers": `["X-Evil-Group"]`}))
	if !slices.Contains(use.StripNames(), "x-custom-group") || !slices.Contains(use.StripNames(), "x-evil-group") {
		t.Errorf("after a restart and a renamed group header, stripped %v", use.StripNames())
	}
	next = next.GoodSince(merged, now.Add(time.Minute))
	if !next.NeedsWrite(persisted) || persisted.NeedsWrite(next) {
		t.Error("a new name and a later good configuration: want only the process's written")
	}
	// Nothing persisted, never good: unready.
	if _, _, usable, _ := objects.ObserveRequestHeaderNames(fresh, authCM(map[string]string{"requestheader-group-headers": `nope`})); usable {
		t.Error("never good and nothing persisted: usable")
	}

	// Two replicas writing one ConfigMap: each merges what the other wrote and writes if it
	// has something new; they converge on the union of the names and the later good
	// configuration (b's), and then neither writes.
	a := sampleNames(t, now)
	var b memory.RequestHeaderNames
	b, _, _, _ = objects.ObserveRequestHeaderNames(b, authCM(map[string]string{"requestheader-uid-headers": `["X-Other-Uid"]`}))
	b = b.GoodSince(memory.RequestHeaderNames{}, now.Add(time.Second))
	stored := b // b wrote first
	for i, replica := range []*memory.RequestHeaderNames{&a, &b, &a, &b} {
		*replica = memory.MergeRequestHeaderNames(*replica, stored)
		if replica.NeedsWrite(stored) {
			if i >= 2 {
				t.Errorf("round %d: still writing %+v over %+v", i, *replica, stored)
			}
			stored = *replica
		}
	}
	for _, s := range []string{"x-custom-group", "x-other-uid", "x-remote-group", "x-remote-uid"} {
		if !slices.Contains(stored.Seen, s) || !slices.Contains(a.Seen, s) || !slices.Contains(b.Seen, s) {
			t.Errorf("the union lacks %s: stored %v, a %v, b %v", s, stored.Seen, a.Seen, b.Seen)
		}
	}
	if !slices.Equal(stored.Good.UID, []string{"x-other-uid"}) {
		t.Errorf("stored good %+v, want b's (the later)", stored.Good)
	}

	// Bounded: the union keeps at most MaxSeenRequestHeaderNames, the names in use kept.
	huge := largestNames(t, now)
	huge.Good = nil
	m := memory.MergeRequestHeaderNames(persisted, huge)
	if len(m.Seen) > memory.MaxSeenRequestHeaderNames || !slices.Contains(m.Seen, "x-custom-group") {
		t.Errorf("merged %d names, in use kept: %v", len(m.Seen), slices.Contains(m.Seen, "x-custom-group"))
	}
}

// authCM is the apiservers' authentication ConfigMap with data.
func authCM(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: objects.AuthenticationNamespace, Name: objects.AuthenticationConfigMap}, Data: data}
}
