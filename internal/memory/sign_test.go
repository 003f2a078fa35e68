package memory_test

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/memory"
	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// signingCA is a control plane's CA and the certificates the tests sign with.
type signingCA struct {
	ca    *testutil.CA
	roots *x509.CertPool
}

func newSigningCA(t *testing.T) *signingCA {
	t.Helper()
	ca, err := testutil.NewCA("kube-mvp control-plane CA")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return &signingCA{ca: ca, roots: roots}
}

// key issues a certificate naming role (serverAuth for xds-server, as certgen makes them)
// and returns it with its key.
func (c *signingCA) key(t *testing.T, role cptls.Role) memory.Key {
	t.Helper()
	usage := x509.ExtKeyUsageClientAuth
	if role == cptls.RoleXDSServer {
		usage = x509.ExtKeyUsageServerAuth
	}
	return c.keyWith(t, role, usage)
}

func (c *signingCA) keyWith(t *testing.T, role cptls.Role, usage x509.ExtKeyUsage) memory.Key {
	t.Helper()
	leaf, err := c.ca.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "kube-mvp " + string(role)},
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, URIs: []*url.URL{role.URI()}})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return memory.Key{Cert: pair.Leaf, Key: pair.PrivateKey.(crypto.Signer)}
}

var (
	cpAID = objects.APIServerIDFor("cp-a")
	cpBID = objects.APIServerIDFor("cp-b")

	jobs       = topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}
	jobsStatus = topology.Resource{Group: "batch", Version: "v1", Resource: "jobs", Subresource: "status"}
	pods       = topology.Resource{Version: "v1", Resource: "pods"}
)

// sampleMemory: cp-a departed (its Lease deleted a minute ago), cp-b live.
func sampleMemory(now time.Time) memory.Memory {
	return memory.Memory{
		cpAID: {Hostname: "cp-a", Address: "10.0.0.1:6443", Served: []topology.Resource{pods, jobs, jobsStatus},
			LastSeen: now.Add(-2 * time.Minute).Truncate(time.Second), LeaseGone: now.Add(-time.Minute).Truncate(time.Second)},
		cpBID: {Hostname: "cp-b", Address: "10.0.0.2:6443", Served: []topology.Resource{pods}, LastSeen: now.Truncate(time.Second)},
	}
}

func sign(t *testing.T, m memory.Memory, k memory.Key, at time.Time) map[string]string {
	t.Helper()
	data, err := memory.EncodeSigned(m, k, at)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// wantRejected checks that data is rejected for reason, as a whole (no memory).
func wantRejected(t *testing.T, what string, data map[string]string, trust memory.Trust, reason string) {
	t.Helper()
	reading, err := memory.Read(data, trust)
	var why *memory.Rejected
	if !errors.As(err, &why) {
		t.Errorf("%s: accepted (%d entries), want rejected for %s", what, len(reading.Memory), reason)
		return
	}
	if why.Reason != reason {
		t.Errorf("%s: rejected for %s (%v), want %s", what, why.Reason, why.Err, reason)
	}
	if len(reading.Memory) != 0 {
		t.Errorf("%s: rejected but %d entries returned", what, len(reading.Memory))
	}
}

func wantAccepted(t *testing.T, what string, data map[string]string, trust memory.Trust, want memory.Memory) memory.Reading {
	t.Helper()
	reading, err := memory.Read(data, trust)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(reading.Memory) != len(want) {
		t.Fatalf("%s: %d entries, want %d", what, len(reading.Memory), len(want))
	}
	for id, r := range want {
		if !reading.Memory[id].Equal(r) {
			t.Errorf("%s: %s read back as %+v, want %+v", what, id, reading.Memory[id], r)
		}
	}
	return reading
}

// TestSignedMemory: what xds-server signs is read back whole by any holder of the CA bundle,
// also after its certificate expired (checked as of the signing time); everything else is
// rejected as a whole, with the reason.
func TestSignedMemory(t *testing.T) {
	now := time.Now()
	pki := newSigningCA(t)
	key := pki.key(t, cptls.RoleXDSServer)
	mem := sampleMemory(now)
	data := sign(t, mem, key, now)
	trust := memory.Trust{Roots: pki.roots, Now: now}

	reading := wantAccepted(t, "signed", data, trust, mem)
	if !reading.Signed {
		t.Error("a signed memory does not read as signed")
	}
	// Another replica's certificate, renewed: both verify.
	wantAccepted(t, "signed by another certificate of the role", sign(t, mem, pki.key(t, cptls.RoleXDSServer), now), trust, mem)
	// Read three days later, when the certificate (valid two days) has expired.
	later := trust
	later.Now = now.Add(72 * time.Hour)
	wantAccepted(t, "read after the signer expired", data, later, mem)
	// Decode (no checks) still reads the signed format: an xds-server that predates
	// signatures reads it too.
	if m, err := memory.Decode(data); err != nil || !m[cpAID].Equal(mem[cpAID]) {
		t.Errorf("Decode of the signed format: %v %+v", err, m)
	}

	// The signature field is replaced by one of the same content with another key.
	other := pki.key(t, cptls.RoleXDSServer)
	wrongKey := memory.Key{Cert: key.Cert, Key: other.Key}
	wantRejected(t, "signed with a key that is not the certificate's", sign(t, mem, wrongKey, now), trust, memory.RejectSignature)

	foreign := newSigningCA(t)
	wantRejected(t, "signed by another control plane's xds-server", sign(t, mem, foreign.key(t, cptls.RoleXDSServer), now), trust, memory.RejectSigner)
	wantRejected(t, "signed by extproc's certificate", sign(t, mem, pki.key(t, cptls.RoleExtproc), now), trust, memory.RejectSigner)
	wantRejected(t, "signed by a serving certificate of another role", sign(t, mem, pki.keyWith(t, cptls.RoleEnvoyFront, x509.ExtKeyUsageServerAuth), now), trust, memory.RejectSigner)
	wantRejected(t, "signed before the certificate was valid", sign(t, sampleMemory(now.Add(-3*time.Hour)), key, now.Add(-2*time.Hour)), trust, memory.RejectSigner)
	wantRejected(t, "no CA bundle", data, memory.Trust{Now: now}, memory.RejectSigner)

	// Moved to another key: the ID is signed.
	moved := clone(data)
	moved[objects.APIServerIDFor("cp-c")] = moved[cpAID]
	wantRejected(t, "an entry copied to another ID", moved, trust, memory.RejectSignature)
	swapped := clone(data)
	swapped[cpAID], swapped[cpBID] = data[cpBID], data[cpAID]
	wantRejected(t, "two entries swapped", swapped, trust, memory.RejectSignature)

	// Tampered content.
	for what, edit := range map[string]func(map[string]any){
		"a resource added":      func(e map[string]any) { e["served"].(map[string]any)["batch/v1"] = "cronjobs jobs jobs/status" },
		"a group added":         func(e map[string]any) { e["served"].(map[string]any)["evil/v1"] = "things" },
		"the address changed":   func(e map[string]any) { e["address"] = "192.0.2.1:443" },
		"the hostname changed":  func(e map[string]any) { e["hostname"] = "cp-b" },
		"leaseDeletedAt later":  func(e map[string]any) { e["leaseDeletedAt"] = now.Add(30 * time.Second).UTC().Format(time.RFC3339) },
		"leaseDeletedAt gone":   func(e map[string]any) { delete(e, "leaseDeletedAt") },
		"signedAt changed":      func(e map[string]any) { e["signedAt"] = now.Add(time.Second).UTC().Format(time.RFC3339Nano) },
		"the signature removed": func(e map[string]any) { delete(e, "signature") },
	} {
		bad := clone(data)
		bad[cpAID] = editEntry(t, bad[cpAID], edit)
		wantRejected(t, what, bad, trust, memory.RejectSignature)
	}
	bad := clone(data)
	bad[cpAID] = editEntry(t, bad[cpAID], func(e map[string]any) { e["signer"] = e["signer"].(string)[:40] })
	wantRejected(t, "a truncated signer", bad, trust, memory.RejectSigner)
	bad = clone(data)
	bad[cpAID] = `{"lastSeen": 12`
	wantRejected(t, "not JSON", bad, trust, memory.RejectMalformed)

	// Times in the future, even signed: lastSeen, leaseDeletedAt, the signing time itself.
	future := sampleMemory(now)
	r := future[cpAID]
	r.LeaseGone = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	future[cpAID] = r
	wantRejected(t, "leaseDeletedAt 2099", sign(t, future, key, now), trust, memory.RejectFuture)
	future = sampleMemory(now)
	r = future[cpBID]
	r.LastSeen = now.Add(2 * memory.ClockSkew)
	future[cpBID] = r
	wantRejected(t, "lastSeen ahead", sign(t, future, key, now), trust, memory.RejectFuture)
	wantRejected(t, "signed in the future", sign(t, mem, key, now.Add(time.Hour)), trust, memory.RejectFuture)
	// A little skew between replicas is fine.
	wantAccepted(t, "signed a few seconds ahead", sign(t, mem, key, now.Add(10*time.Second)), trust, mem)

	// Unsigned entries beside signed ones.
	mixed := clone(data)
	for id, v := range memory.Encode(memory.Memory{objects.APIServerIDFor("cp-c"): {Hostname: "cp-a", Address: "192.0.2.1:443", Served: []topology.Resource{jobs}, LastSeen: now}}) {
		mixed[id] = v
	}
	wantRejected(t, "an unsigned entry beside signed ones", mixed, memory.Trust{Roots: pki.roots, Now: now, AllowUnsigned: true}, memory.RejectUnsigned)
}

// TestSignedMemoryBounds: a memory over any bound is rejected as a whole, signed or not,
// and Bound keeps what xds-server writes within them.
func TestSignedMemoryBounds(t *testing.T) {
	now := time.Now()
	pki := newSigningCA(t)
	key := pki.key(t, cptls.RoleXDSServer)
	trust := memory.Trust{Roots: pki.roots, Now: now}

	many := memory.Memory{}
	for i := range memory.MaxEntries + 1 {
		many[objects.APIServerIDFor(fmt.Sprintf("cp-%d", i))] = memory.Remembered{Hostname: fmt.Sprintf("cp-%d", i),
			Served: []topology.Resource{pods}, LastSeen: now.Add(-time.Duration(i) * time.Second).Truncate(time.Second)}
	}
	wantRejected(t, "too many entries", sign(t, many, key, now), trust, memory.RejectBounds)

	wide := memory.Memory{cpAID: {Hostname: "cp-a", LastSeen: now.Truncate(time.Second), Served: groupVersions(memory.MaxGroupVersions+1, 1)}}
	wantRejected(t, "too many group/versions", sign(t, wide, key, now), trust, memory.RejectBounds)
	wantRejected(t, "too many group/versions, unsigned", memory.Encode(wide), memory.Trust{Roots: pki.roots, Now: now, AllowUnsigned: true,
		Servers: []topology.APIServer{{ID: cpAID, Hostname: "cp-a"}}}, memory.RejectBounds)
	deep := memory.Memory{cpAID: {Hostname: "cp-a", LastSeen: now.Truncate(time.Second), Served: groupVersions(2, memory.MaxResources/2+1)}}
	wantRejected(t, "too many resources", sign(t, deep, key, now), trust, memory.RejectBounds)
	big := memory.Memory{}
	for i := range 3 { // 3 entries of 4,000 long resource names: some 700 KB
		big[objects.APIServerIDFor(fmt.Sprintf("big-%d", i))] = memory.Remembered{Hostname: fmt.Sprintf("big-%d", i), LastSeen: now.Truncate(time.Second), Served: groupVersions(1, 4000)}
	}
	wantRejected(t, "too many bytes", sign(t, big, key, now), trust, memory.RejectBounds)

	// Bound: the oversized entries are left out, the most recently seen kept, and
	// the result, signed, is accepted.
	all := memory.Memory{}
	for _, m := range []memory.Memory{many, wide, deep, big} {
		for id, r := range m {
			all[id] = r
		}
	}
	bounded, dropped := memory.Bound(all, key)
	if _, ok := bounded[cpAID]; ok {
		t.Error("Bound kept an entry over the group/version or resource bound")
	}
	if len(bounded)+len(dropped) != len(all) || len(bounded) == 0 {
		t.Errorf("Bound kept %d and dropped %d of %d", len(bounded), len(dropped), len(all))
	}
	if _, ok := bounded[objects.APIServerIDFor("cp-0")]; !ok {
		t.Error("Bound dropped the most recently seen apiserver")
	}
	if _, err := memory.Read(sign(t, bounded, key, now), trust); err != nil {
		t.Errorf("what Bound kept is rejected: %v", err)
	}
	if b, d := memory.Bound(sampleMemory(now), key); len(b) != 2 || len(d) != 0 {
		t.Errorf("Bound changed a small memory: kept %d, dropped %v", len(b), d)
	}
}

// TestUnsignedMemoryMigration: a memory written before entries were signed is migrated only
// if no entry is signed and its reader has never seen a signed one, and only the entries
// whose ID has an identity Lease with their hostname (and address); within the bounds and
// without future times.
func TestUnsignedMemoryMigration(t *testing.T) {
	now := time.Now()
	pki := newSigningCA(t)
	mem := sampleMemory(now)
	idC := objects.APIServerIDFor("cp-c")
	mem[idC] = memory.Remembered{Hostname: "cp-c", Address: "10.0.0.3:6443", Served: []topology.Resource{jobs}, LastSeen: now.Add(-time.Hour).Truncate(time.Second)}
	idD := objects.APIServerIDFor("cp-d")
	mem[idD] = memory.Remembered{Hostname: "cp-d", Served: []topology.Resource{jobs}, LastSeen: now.Add(-time.Hour).Truncate(time.Second)}
	data := memory.Encode(mem)
	servers := []topology.APIServer{
		{ID: cpAID, Hostname: "cp-a", Address: "10.0.0.1:6443"},
		{ID: cpBID, Hostname: "cp-b", Address: "10.0.0.9:6443"}, // another address than recorded
		{ID: idD, Hostname: "cp-d", Address: "10.0.0.4:6443"},   // recorded without an address
		{ID: objects.APIServerIDFor("evil"), Hostname: "cp-c", Address: "10.0.0.3:6443"},
	}
	trust := memory.Trust{Roots: pki.roots, Now: now, AllowUnsigned: true, Servers: servers}
	reading := wantAccepted(t, "unsigned, migrating", data, trust, memory.Memory{cpAID: mem[cpAID], idD: mem[idD]})
	if reading.Signed || !sameIDs(reading.Migrated, cpAID, idD) || !sameIDs(reading.NotMigrated, cpBID, idC) {
		t.Errorf("reading %+v: want %s and %s migrated, %s (address) and %s (no Lease of its own) left out", reading, cpAID, idD, cpBID, idC)
	}

	noLonger := trust
	noLonger.AllowUnsigned = false
	wantRejected(t, "unsigned, read by an xds-server that has seen signed entries", data, noLonger, memory.RejectUnsigned)

	forged := memory.Encode(memory.Memory{cpAID: {Hostname: "cp-a", Address: "10.0.0.1:6443", LastSeen: now.Truncate(time.Second),
		LeaseGone: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), Served: []topology.Resource{jobs}}})
	wantRejected(t, "unsigned, leaseDeletedAt 2099", forged, trust, memory.RejectFuture)

	signed := sign(t, memory.Memory{cpBID: mem[cpBID]}, pki.key(t, cptls.RoleXDSServer), now)
	for id, v := range data {
		if id != cpBID {
			signed[id] = v
		}
	}
	wantRejected(t, "unsigned beside a signed entry", signed, trust, memory.RejectUnsigned)

	if r, err := memory.Read(nil, noLonger); err != nil || len(r.Memory) != 0 {
		t.Errorf("an empty memory: %+v %v", r, err)
	}
}

// groupVersions lists n group/versions of per resources each.
func groupVersions(n, per int) []topology.Resource {
	var out []topology.Resource
	for g := range n {
		for r := range per {
			out = append(out, topology.Resource{Group: fmt.Sprintf("g%d.example.com", g), Version: "v1",
				Resource: fmt.Sprintf("resources-with-a-long-name-to-fill-the-configmap-%04d", r)})
		}
	}
	return out
}

func sameIDs(got []string, want ...string) bool {
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(got, want)
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func editEntry(t *testing.T, v string, edit func(map[string]any)) string {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal([]byte(v), &e); err != nil {
		t.Fatal(err)
	}
	edit(e)
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
