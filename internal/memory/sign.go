package memory

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// The memory in its ConfigMap is believed only if xds-server wrote it: every entry is signed
// with xds-server's own TLS key (its control-plane certificate, role xds-server), and a
// reader checks the signature, that the signer's certificate chains to the control plane's
// CA bundle and names the xds-server role as of the signing time, and the bounds below. A
// ConfigMap that fails any check is ignored as a whole (Read). An entry is the JSON of Encode
// plus signedAt, signer and signature (over signedMessage).
// The format and algorithms: docs/security.md#the-signed-entrys-format.

// The bounds of a memory, for the ConfigMap and the process alike. They are far above what
// a cluster needs (an entry of a kube-apiserver 1.37 lists about 25 group/versions and 125
// resources and subresources, under 4 KiB with its signature; a cluster runs a handful of
// apiservers, each with one ID across restarts) and low enough that a memory cannot grow
// Envoy's routes or xds-server's work without limit: at most MaxEntries ×
// MaxGroupVersions group/versions, and MaxBytes stays well within a
// ConfigMap's 1 MiB.
const (
	// MaxEntries is the most apiservers a memory holds.
	MaxEntries = 64
	// MaxGroupVersions is the most group/versions one entry lists.
	MaxGroupVersions = 256
	// MaxResources is the most resources and subresources one entry lists.
	MaxResources = 4096
	// MaxBytes bounds the ConfigMap's data: the keys and values together.
	MaxBytes = 512 << 10
	// ClockSkew is how far in the future (after the reader's now, or an entry's
	// signing time) a time in the memory may be: replicas' clocks differ a little. A time
	// later than that would keep an apiserver remembered for ever.
	ClockSkew = time.Minute
)

// memoryPurpose is the first field of every signed message: a signature made for anything
// else with the same key is not an entry's.
const memoryPurpose = "kube-mvp.io/xds-server-memory-entry/v1"

// Key signs a memory's entries: xds-server's certificate and its private key.
type Key struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// signedMessage is what an entry's signature covers.
func signedMessage(id string, r Remembered, signedAt time.Time) []byte {
	b, _ := json.Marshal(struct {
		Purpose  string          `json:"purpose"`
		ID       string          `json:"id"`
		Entry    json.RawMessage `json:"entry"`
		SignedAt time.Time       `json:"signedAt"`
	}{memoryPurpose, id, json.RawMessage(encodeRemembered(r)), signedAt.UTC()})
	return b
}

func (k Key) sign(msg []byte) ([]byte, error) {
	if k.Cert == nil || k.Key == nil {
		return nil, errors.New("no signing key")
	}
	if _, ok := k.Key.Public().(ed25519.PublicKey); ok {
		return k.Key.Sign(rand.Reader, msg, crypto.Hash(0))
	}
	sum := sha256.Sum256(msg)
	return k.Key.Sign(rand.Reader, sum[:], crypto.SHA256)
}

// signatureAlgorithm is how an entry signed by cert's key is checked (see sign).
func signatureAlgorithm(cert *x509.Certificate) (x509.SignatureAlgorithm, error) {
	switch cert.PublicKeyAlgorithm {
	case x509.ECDSA:
		return x509.ECDSAWithSHA256, nil
	case x509.RSA:
		return x509.SHA256WithRSA, nil
	case x509.Ed25519:
		return x509.PureEd25519, nil
	}
	return 0, fmt.Errorf("a %s key cannot sign the memory", cert.PublicKeyAlgorithm)
}

// maxSignatureLen bounds the length of a signature by k.
func (k Key) maxSignatureLen() int {
	switch pub := k.Key.Public().(type) {
	case *ecdsa.PublicKey:
		n := (pub.Curve.Params().BitSize + 7) / 8
		return 2*(n+3) + 4 // SEQUENCE of two INTEGERs, each at most n+1 bytes
	case *rsa.PublicKey:
		return pub.Size()
	case ed25519.PublicKey:
		return ed25519.SignatureSize
	}
	return 1024
}

// signatureOverhead bounds the bytes k's signature fields add to an entry.
func (k Key) signatureOverhead() int {
	if k.Cert == nil {
		return 0
	}
	const fields = len(`,"signedAt":"","signer":"","signature":""`)
	const longestTime = len("2006-01-02T15:04:05.999999999Z")
	return fields + longestTime + base64.StdEncoding.EncodedLen(len(k.Cert.Raw)) + base64.StdEncoding.EncodedLen(k.maxSignatureLen())
}

// signedJSON is an entry as stored: rememberedJSON and its signature.
type signedJSON struct {
	rememberedJSON
	SignedAt  *time.Time `json:"signedAt,omitempty"`
	Signer    string     `json:"signer,omitempty"`
	Signature string     `json:"signature,omitempty"`
}

// EncodeSigned is m as ConfigMap data, every entry signed by k at now.
func EncodeSigned(m Memory, k Key, now time.Time) (map[string]string, error) {
	now = now.UTC()
	data := make(map[string]string, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		r := m[id]
		sig, err := k.sign(signedMessage(id, r, now))
		if err != nil {
			return nil, fmt.Errorf("signing the memory entry of %s: %w", id, err)
		}
		j := signedJSON{rememberedJSON: toJSON(r), SignedAt: &now,
			Signer: base64.StdEncoding.EncodeToString(k.Cert.Raw), Signature: base64.StdEncoding.EncodeToString(sig)}
		b, err := json.Marshal(j)
		if err != nil {
			return nil, err
		}
		data[id] = string(b)
	}
	return data, nil
}

// Why Read rejected a memory: the label of kube_mvp_xds_memory_rejected_total.
const (
	RejectMalformed = "malformed" // not an entry's JSON, or what it lists is not resources
	RejectBounds    = "bounds"    // more entries, group/versions, resources or bytes than allowed
	RejectFuture    = "future"    // a time after now (or after its signing time) plus ClockSkew
	RejectUnsigned  = "unsigned"  // entries without a signature where none may be
	RejectSigner    = "signer"    // a signer certificate not from the CA, not xds-server's, not valid then
	RejectSignature = "signature" // a signature that does not verify: tampered, or moved to another key
)

// Rejected is why a memory is not believed at all.
type Rejected struct {
	Reason string // one of the Reject* constants
	Err    error
}

func (e *Rejected) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *Rejected) Unwrap() error { return e.Err }

func rejected(reason, format string, args ...any) *Rejected {
	return &Rejected{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Trust is what Read checks a memory against.
type Trust struct {
	// Roots is the control plane's CA bundle: every signer's certificate must chain to it.
	Roots *x509.CertPool
	// Now is the reader's time: no time in the memory may be later than Now+ClockSkew.
	Now time.Time
	// AllowUnsigned: the reader has never seen or written a signed memory, so a memory
	// written before entries were signed may be migrated (see Read).
	AllowUnsigned bool
	// Servers are the apiservers that have an identity Lease now (APIServers), for
	// migration.
	Servers []topology.APIServer
}

// Reading is what Read found in a memory it accepted.
type Reading struct {
	Memory Memory
	// Signed: some entry carries a signature (accepted or not): the memory is past its
	// migration, and its reader accepts no unsigned entry from now on.
	Signed bool
	// Migrated are the unsigned entries accepted (Memory holds them); NotMigrated those
	// left out: no identity Lease with their ID, hostname and address.
	Migrated, NotMigrated []string
}

// Read checks ConfigMap data written by EncodeSigned and returns the memory it
// holds, or, if anything is wrong, a *Rejected and no memory at all: a memory is
// believed whole or not at all. Checked: the bounds (MaxMemory*), every time at most
// ClockSkew after trust.Now (and an entry's times after its signing time), and every
// entry's signature, made at its signedAt by a certificate that chains to trust.Roots and
// names the xds-server role then, over its ID and content.
//
// Unsigned entries (written before entries were signed) are migrated only while
// trust.AllowUnsigned and only if no entry is signed: then an entry is accepted (once: its
// reader writes it back signed) only if its ID has an identity Lease now with the same
// hostname and, if the entry names one, the same address; the others are left out.
// Otherwise any unsigned entry rejects the memory.
func Read(data map[string]string, trust Trust) (Reading, error) {
	reading := Reading{Memory: make(Memory, len(data))}
	size := 0
	for id, v := range data {
		size += len(id) + len(v)
	}
	// The request-header names (ReadRequestHeaderNames) count in the bytes, not as an entry.
	if _, ok := data[RequestHeaderNamesKey]; ok {
		data = maps.Clone(data)
		delete(data, RequestHeaderNamesKey)
	}
	if len(data) > MaxEntries {
		return reading, rejected(RejectBounds, "%d entries, at most %d", len(data), MaxEntries)
	}
	if size > MaxBytes {
		return reading, rejected(RejectBounds, "%d bytes, at most %d", size, MaxBytes)
	}
	latest := trust.Now.Add(ClockSkew)
	type entry struct {
		id string
		r  Remembered
		j  signedJSON
	}
	var entries []entry
	var unsigned []string
	for _, id := range slices.Sorted(maps.Keys(data)) {
		var j signedJSON
		if err := json.Unmarshal([]byte(data[id]), &j); err != nil {
			return reading, rejected(RejectMalformed, "entry %q: %v", id, err)
		}
		if len(j.Served) > MaxGroupVersions {
			return reading, rejected(RejectBounds, "entry %q lists %d group/versions, at most %d", id, len(j.Served), MaxGroupVersions)
		}
		r, err := fromJSON(j.rememberedJSON)
		if err != nil {
			return reading, rejected(RejectMalformed, "entry %q: %v", id, err)
		}
		if len(r.Served) > MaxResources {
			return reading, rejected(RejectBounds, "entry %q lists %d resources, at most %d", id, len(r.Served), MaxResources)
		}
		for _, t := range []struct {
			name string
			at   time.Time
		}{{"lastSeen", r.LastSeen}, {"leaseDeletedAt", r.LeaseGone}} {
			if t.at.After(latest) {
				return reading, rejected(RejectFuture, "entry %q: %s %s is in the future", id, t.name, t.at.UTC().Format(time.RFC3339))
			}
		}
		if j.SignedAt != nil || j.Signer != "" || j.Signature != "" {
			reading.Signed = true
		} else {
			unsigned = append(unsigned, id)
		}
		entries = append(entries, entry{id, r, j})
	}
	if len(unsigned) > 0 {
		switch {
		case reading.Signed:
			return reading, rejected(RejectUnsigned, "%d entries carry no signature beside signed ones (%s)", len(unsigned), unsigned[0])
		case !trust.AllowUnsigned:
			return reading, rejected(RejectUnsigned, "%d entries carry no signature, and this xds-server has seen signed ones", len(unsigned))
		}
		leases := map[string]topology.APIServer{}
		for _, s := range trust.Servers {
			leases[s.ID] = s
		}
		for _, e := range entries {
			s, ok := leases[e.id]
			if ok && s.Hostname == e.r.Hostname && (e.r.Address == "" || e.r.Address == s.Address) {
				reading.Memory[e.id] = e.r
				reading.Migrated = append(reading.Migrated, e.id)
			} else {
				reading.NotMigrated = append(reading.NotMigrated, e.id)
			}
		}
		return reading, nil
	}
	v := verifier{roots: trust.Roots, chains: map[string]error{}}
	for _, e := range entries {
		if err := v.verify(e.id, e.r, e.j, latest); err != nil {
			return Reading{Memory: Memory{}, Signed: true}, err
		}
		reading.Memory[e.id] = e.r
	}
	return reading, nil
}

// verifier checks entries' signatures, each signer certificate's chain once per signing
// time (one write signs every entry with one certificate at one time).
type verifier struct {
	roots  *x509.CertPool
	chains map[string]error
	certs  map[string]*x509.Certificate
}

func (v *verifier) verify(id string, r Remembered, j signedJSON, latest time.Time) error {
	if j.SignedAt == nil || j.Signer == "" || j.Signature == "" {
		return rejected(RejectSignature, "entry %q: signedAt, signer and signature go together", id)
	}
	signedAt := *j.SignedAt
	if signedAt.After(latest) {
		return rejected(RejectFuture, "entry %q: signedAt %s is in the future", id, signedAt.UTC().Format(time.RFC3339))
	}
	for _, t := range []time.Time{r.LastSeen, r.LeaseGone} {
		if t.After(signedAt.Add(ClockSkew)) {
			return rejected(RejectFuture, "entry %q: %s is after its signing time %s", id, t.UTC().Format(time.RFC3339), signedAt.UTC().Format(time.RFC3339))
		}
	}
	cert, err := v.signer(j.Signer, signedAt)
	if err != nil {
		return rejected(RejectSigner, "entry %q: %v", id, err)
	}
	sig, err := base64.StdEncoding.DecodeString(j.Signature)
	if err != nil {
		return rejected(RejectSignature, "entry %q: signature: %v", id, err)
	}
	alg, err := signatureAlgorithm(cert)
	if err != nil {
		return rejected(RejectSigner, "entry %q: %v", id, err)
	}
	if err := cert.CheckSignature(alg, signedMessage(id, r, signedAt), sig); err != nil {
		return rejected(RejectSignature, "entry %q: the signature does not match its ID and content: %v", id, err)
	}
	return nil
}

// signer parses a signer certificate and checks that it chains to the roots, is valid for
// serving (as every xds-server certificate) and names the xds-server role, at signedAt.
func (v *verifier) signer(b64 string, signedAt time.Time) (*x509.Certificate, error) {
	key := b64 + "@" + signedAt.UTC().Format(time.RFC3339Nano)
	if err, done := v.chains[key]; done {
		return v.certs[b64], err
	}
	cert, err := v.checkSigner(b64, signedAt)
	if v.certs == nil {
		v.certs = map[string]*x509.Certificate{}
	}
	v.chains[key], v.certs[b64] = err, cert
	return cert, err
}

func (v *verifier) checkSigner(b64 string, signedAt time.Time) (*x509.Certificate, error) {
	der, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("signer: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("signer: %v", err)
	}
	if v.roots == nil {
		return nil, errors.New("no CA bundle to check the signer against")
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: v.roots, CurrentTime: signedAt, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("signer %q is not from the control plane's CA at its signing time: %v", cert.Subject.CommonName, err)
	}
	role, err := cptls.RoleOf(cert)
	if err != nil {
		return nil, err
	}
	if role != cptls.RoleXDSServer {
		return nil, fmt.Errorf("signer %q names role %s, not %s", cert.Subject.CommonName, role, cptls.RoleXDSServer)
	}
	return cert, nil
}

// Bound is m within the bounds its ConfigMap must keep, so that what xds-server
// writes it also accepts: an entry with more group/versions or resources than allowed is
// left out, and of the others the most recently seen are kept, up to MaxEntries and
// MaxBytes with k's signature (k's zero value: no signature, the memory of a process
// without a ConfigMap), less room for the request-header names when signed
// (MaxRequestHeaderNamesBytes under RequestHeaderNamesKey). dropped are the IDs left out,
// sorted.
func Bound(m Memory, k Key) (bounded Memory, dropped []string) {
	overhead := k.signatureOverhead()
	type sized struct {
		id   string
		r    Remembered
		size int
	}
	var fit []sized
	for id, r := range m {
		if len(r.Served) > MaxResources || len(groupVersionsOf(r.Served)) > MaxGroupVersions {
			dropped = append(dropped, id)
			continue
		}
		fit = append(fit, sized{id, r, len(id) + len(encodeRemembered(r)) + overhead})
	}
	// The most recent sightings first (live apiservers), then by ID.
	slices.SortFunc(fit, func(a, b sized) int {
		return cmp.Or(b.r.LastSeen.Compare(a.r.LastSeen), cmp.Compare(a.id, b.id))
	})
	bounded = make(Memory, len(fit))
	total := 0
	if k.Cert != nil {
		total = len(RequestHeaderNamesKey) + MaxRequestHeaderNamesBytes
	}
	for _, e := range fit {
		if len(bounded) >= MaxEntries || total+e.size > MaxBytes {
			dropped = append(dropped, e.id)
			continue
		}
		total += e.size
		bounded[e.id] = e.r
	}
	slices.Sort(dropped)
	return bounded, dropped
}

func groupVersionsOf(served []topology.Resource) map[topology.GroupVersion]bool {
	gvs := map[topology.GroupVersion]bool{}
	for _, r := range served {
		gvs[r.GroupVersion()] = true
	}
	return gvs
}
