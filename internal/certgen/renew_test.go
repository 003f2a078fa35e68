package certgen

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

var (
	t0       = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dnsNames = []string{"kmvp-xds-server", "kmvp-xds-server.kube-mvp", "kmvp-xds-server.kube-mvp.svc", "kmvp-xds-server.kube-mvp.svc.cluster.local"}
	allRoles = []Spec{
		{Role: cptls.RoleXDSServer, DNSNames: dnsNames},
		{Role: cptls.RoleEnvoyFront},
		{Role: cptls.RoleEnvoySidecar},
		{Role: cptls.RoleExtproc},
	}
)

// leafCert is a parsed current leaf.
type leafCert struct {
	role cptls.Role
	cert *x509.Certificate
}

func leaves(t *testing.T, s State) []leafCert {
	t.Helper()
	var out []leafCert
	for _, r := range slices.Sorted(maps.Keys(s.Leaves)) {
		c, err := parseCert(s.Leaves[r].CertPEM)
		if err != nil {
			t.Fatalf("%s certificate: %v", r, err)
		}
		out = append(out, leafCert{r, c})
	}
	return out
}

// bundles are the distinct trust bundles of s: the CA Secret's and every role's.
func bundles(s State) [][]byte {
	out := [][]byte{s.BundlePEM}
	for _, r := range slices.Sorted(maps.Keys(s.Leaves)) {
		if b := s.Leaves[r].BundlePEM; !slices.ContainsFunc(out, func(o []byte) bool { return bytes.Equal(o, b) }) {
			out = append(out, b)
		}
	}
	return out
}

// verify checks that every leaf verifies, for its role's key usage (and, for xds-server, its
// DNS names), against every bundle, at now: any server and any client, whichever version of
// its Secret each has loaded, accept each other. It returns every failure.
func verify(now time.Time, ls []leafCert, bs [][]byte) []error {
	var errs []error
	for i, b := range bs {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			errs = append(errs, fmt.Errorf("bundle %d holds no certificate", i))
			continue
		}
		for _, l := range ls {
			opts := x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage(l.role)}}
			if l.role == cptls.RoleXDSServer {
				opts.DNSName = dnsNames[len(dnsNames)-1]
			}
			chains, err := l.cert.Verify(opts)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s certificate (serial %x) against bundle %d: %v", l.role, l.cert.SerialNumber, i, err))
				continue
			}
			if r, err := cptls.RoleOf(chains[0][0]); err != nil || r != l.role {
				errs = append(errs, fmt.Errorf("%s certificate names role %s (%v)", l.role, r, err))
			}
		}
	}
	return errs
}

// checkState checks a state on its own: every leaf holds its key and verifies against every
// bundle, every role has the CA Secret's bundle, no bundle holds an expired CA.
func checkState(t *testing.T, now time.Time, s State) {
	t.Helper()
	for r, l := range s.Leaves {
		if _, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
			t.Errorf("%s: certificate and key do not pair: %v", r, err)
		}
		if !bytes.Equal(l.BundlePEM, s.BundlePEM) {
			t.Errorf("%s trust bundle differs from the CA Secret's", r)
		}
	}
	if _, err := tls.X509KeyPair(s.CA.CertPEM, s.CA.KeyPEM); err != nil {
		t.Errorf("CA: certificate and key do not pair: %v", err)
	}
	certs, bad := parseBundle(s.BundlePEM)
	if bad > 0 || len(certs) == 0 {
		t.Errorf("bundle: %d certificates, %d bad blocks", len(certs), bad)
	}
	for _, c := range certs {
		if !now.Before(c.NotAfter) {
			t.Errorf("bundle holds %s, expired", caName(c))
		}
	}
	for _, err := range verify(now, leaves(t, s), bundles(s)) {
		t.Error(err)
	}
}

// checkTransition checks the no-outage property across a run: leaves of either state verify
// against bundles of either state (kubelet refreshes each pod's Secret at its own moment).
func checkTransition(t *testing.T, now time.Time, prev, next State) []error {
	t.Helper()
	return verify(now, append(leaves(t, prev), leaves(t, next)...), append(bundles(prev), bundles(next)...))
}

// renew runs Renew and checks that running it again on its result at the same time changes
// nothing.
func renew(t *testing.T, now time.Time, cur State, want []Spec, p Policy) (State, []Change) {
	t.Helper()
	next, changes, err := Renew(now, cur, want, p)
	if err != nil {
		t.Fatalf("%s: %v", stamp(now), err)
	}
	checkIdempotent(t, now, next, want, p)
	return next, changes
}

// checkIdempotent checks that Renew on next at the same time changes nothing.
func checkIdempotent(t *testing.T, now time.Time, next State, want []Spec, p Policy) {
	t.Helper()
	again, more, err := Renew(now, next, want, p)
	if err != nil {
		t.Fatalf("%s, again: %v", stamp(now), err)
	}
	if len(more) > 0 {
		t.Errorf("%s: a second run changed %v", stamp(now), more)
	}
	if !equalState(next, again) {
		t.Errorf("%s: a second run changed the state without saying so", stamp(now))
	}
}

func equalState(a, b State) bool {
	return maps.EqualFunc(a.CAData(), b.CAData(), bytes.Equal) &&
		maps.EqualFunc(a.Leaves, b.Leaves, func(x, y Leaf) bool { return maps.EqualFunc(x.Data(), y.Data(), bytes.Equal) })
}

func has(changes []Change, what, action string) *Change {
	for i, c := range changes {
		if c.What == what && c.Action == action {
			return &changes[i]
		}
	}
	return nil
}

func signingCA(t *testing.T, s State) *x509.Certificate {
	t.Helper()
	c, err := parseCert(s.CA.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLifetimeWalk runs certgen on a fake clock as the CronJob would, over two CA rotations,
// and checks at every run: the state is consistent and every leaf verifies against every
// bundle (no outage within a state), the same holds across the run (no outage while pods
// pick up the change at different moments), a second run changes nothing, certificates are
// renewed at 2/3 of their lifetime and not before, and each rotation goes phase 1 → phase 2
// (after the propagation delay) → old CA dropped when it expires.
func TestLifetimeWalk(t *testing.T) {
	year := 365 * 24 * time.Hour
	for _, c := range []struct {
		name  string
		p     Policy
		step  time.Duration
		until time.Duration
		// rotations is how many CA rotations (phase 2) the walk must see.
		rotations int
	}{
		{"defaults-daily", DefaultPolicy(), 24 * time.Hour, 21 * year, 3},
		{"defaults-weekly", DefaultPolicy(), 7 * 24 * time.Hour, 21 * year, 3},
		{"zero-delay-daily", Policy{CALifetime: DefaultCALifetime, CertLifetime: DefaultCertLifetime}, 24 * time.Hour, 8 * year, 1},
		{"short-hourly", Policy{CALifetime: 30 * 24 * time.Hour, CertLifetime: 3 * 24 * time.Hour, PropagationDelay: 2 * time.Hour}, time.Hour, 70 * 24 * time.Hour, 3},
		{"cert-nearly-ca-lifetime", Policy{CALifetime: 90 * 24 * time.Hour, CertLifetime: 80 * 24 * time.Hour, PropagationDelay: 24 * time.Hour}, 6 * time.Hour, 200 * 24 * time.Hour, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && c.step < 7*24*time.Hour && c.until > 2*year {
				t.Skip("long walk")
			}
			var (
				cur       State
				rotations int
				phase1    = map[string]time.Time{} // next CA serial -> when it joined the bundles
				retired   = map[string]time.Time{} // previous CA serial -> its end
				renewals  = map[cptls.Role]int{}
				last      time.Time
			)
			for now := t0; now.Before(t0.Add(c.until)); now = now.Add(c.step) {
				next, changes, err := Renew(now, cur, allRoles, c.p)
				if err != nil {
					t.Fatal(err)
				}
				if len(changes) == 0 {
					if !equalState(cur, next) {
						t.Fatalf("%s: the state changed without a reported change", stamp(now))
					}
					continue
				}
				// A state is checked when it is made and here, the last time it is in use
				// (checkTransition verifies cur against cur): certificates are valid over an
				// interval, so a chain valid at both ends is valid in between.
				checkIdempotent(t, now, next, allRoles, c.p)
				checkState(t, now, next)
				if now != t0 {
					for _, err := range checkTransition(t, now, cur, next) {
						t.Errorf("%s, across the run (%v): %v", stamp(now), changes, err)
					}
				}
				oldCA, newCA := cur.CA.CertPEM, next.CA.CertPEM
				for _, ch := range changes {
					switch {
					case ch.What == "CA" && ch.Action == "created":
						if now != t0 {
							t.Errorf("%s: %s", stamp(now), ch)
						}
					case ch.What == "next CA" && ch.Action == "created":
						ca := signingCA(t, cur)
						age, life := now.Sub(ca.NotBefore), ca.NotAfter.Sub(ca.NotBefore)
						if age < 2*life/3 || age >= 2*life/3+c.step {
							t.Errorf("%s: phase 1 at %s of the CA's %s lifetime, want at 2/3", stamp(now), age, life)
						}
						nc, err := parseCert(next.NextCA.CertPEM)
						if err != nil {
							t.Fatal(err)
						}
						phase1[serialHex(nc)] = now
					case ch.What == "CA" && ch.Action == "rotated":
						rotations++
						nc, old := signingCA(t, next), signingCA(t, cur)
						since, ok := phase1[serialHex(nc)]
						if !ok {
							t.Fatalf("%s: %s signs without a phase 1", stamp(now), caName(nc))
						}
						if now.Sub(since) < c.p.PropagationDelay || now == since {
							t.Errorf("%s: phase 2 %s after phase 1, want at least %s and a later run", stamp(now), now.Sub(since), c.p.PropagationDelay)
						}
						if now.Sub(since) > c.p.PropagationDelay+c.step {
							t.Errorf("%s: phase 2 %s after phase 1, want it on the first run after %s", stamp(now), now.Sub(since), c.p.PropagationDelay)
						}
						retired[serialHex(old)] = old.NotAfter
						for _, r := range allRoles {
							if has(changes, string(r.Role)+" certificate", "renewed") == nil {
								t.Errorf("%s: phase 2 did not re-issue %s", stamp(now), r.Role)
							}
						}
					case ch.What == "trust bundle" && ch.Action == "updated" && strings.HasPrefix(ch.Reason, "dropped"):
						for serial, end := range retired {
							if !strings.Contains(ch.Reason, "CA "+serial[:8]) {
								continue
							}
							if now.Before(end) || now.Sub(end) >= c.step {
								t.Errorf("%s: %s; it ends %s", stamp(now), ch, stamp(end))
							}
							delete(retired, serial)
						}
					case strings.HasSuffix(ch.What, " certificate") && ch.Action == "created":
						if now != t0 {
							t.Errorf("%s: %s", stamp(now), ch)
						}
					case strings.HasSuffix(ch.What, " certificate") && ch.Action == "renewed":
						role := cptls.Role(strings.TrimSuffix(ch.What, " certificate"))
						renewals[role]++
						old, err := parseCert(cur.Leaves[role].CertPEM)
						if err != nil {
							t.Fatal(err)
						}
						age, life := now.Sub(old.NotBefore), old.NotAfter.Sub(old.NotBefore)
						switch {
						case strings.HasPrefix(ch.Reason, "less than 1/3"):
							if age < 2*life/3 || age >= 2*life/3+c.step {
								t.Errorf("%s: %s at %s of %s, want at 2/3", stamp(now), ch, age, life)
							}
						case strings.HasPrefix(ch.Reason, "not issued by the signing"):
							if bytes.Equal(oldCA, newCA) {
								t.Errorf("%s: %s without a CA change", stamp(now), ch)
							}
						default:
							t.Errorf("%s: unexpected renewal: %s", stamp(now), ch)
						}
					case ch.What == "trust bundle" && ch.Action == "updated":
					case strings.HasSuffix(ch.What, " trust bundle") && ch.Action == "updated":
					default:
						t.Errorf("%s: unexpected change: %s", stamp(now), ch)
					}
				}
				cur, last = next, now
				if t.Failed() {
					t.FailNow() // one broken step is enough to read
				}
			}
			checkState(t, last, cur)
			if rotations != c.rotations {
				t.Errorf("%d CA rotations, want %d", rotations, c.rotations)
			}
			for _, r := range allRoles {
				if renewals[r.Role] < rotations+1 {
					t.Errorf("%s renewed %d times", r.Role, renewals[r.Role])
				}
			}
			t.Logf("%d rotations; renewals %v", rotations, renewals)
		})
	}
}

// installed is a fresh state at t0 for allRoles.
func installed(t *testing.T) State {
	t.Helper()
	s, changes := renew(t, t0, State{}, allRoles, DefaultPolicy())
	want := []string{"CA created", "xds-server certificate created", "envoy-front certificate created", "envoy-sidecar certificate created", "extproc certificate created"}
	var got []string
	for _, c := range changes {
		got = append(got, c.What+" "+c.Action)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("install: %v, want %v", changes, want)
	}
	checkState(t, t0, s)
	return s
}

// inPhase1 is a state in rotation phase 1 (the next CA in the bundles, not signing) and when.
func inPhase1(t *testing.T, s State) (State, time.Time) {
	t.Helper()
	now := t0.Add(DefaultCALifetime*2/3 + 24*time.Hour)
	s, changes := renew(t, now, s, allRoles, DefaultPolicy())
	if has(changes, "next CA", "created") == nil || len(s.NextCA.CertPEM) == 0 {
		t.Fatalf("no phase 1 at %s: %v", stamp(now), changes)
	}
	return s, now
}

func clone(s State) State {
	out := s
	out.Leaves = maps.Clone(s.Leaves)
	return out
}

func withLeaf(s State, r cptls.Role, f func(*Leaf)) State {
	s = clone(s)
	l := s.Leaves[r]
	f(&l)
	s.Leaves[r] = l
	return s
}

// TestRenewRepairs starts from a good state, damages or changes one thing, and checks that
// Renew repairs exactly that, says why, and leaves a state in which every leaf verifies
// against every bundle. Where the repair cannot avoid an outage (the signing CA is lost), the
// check across the run must fail: it shows the check can.
func TestRenewRepairs(t *testing.T) {
	base := installed(t)
	phase1, phase1At := inPhase1(t, base)
	other := installed(t) // a second, unrelated installation: its CA and certificates
	p := DefaultPolicy()
	later := t0.Add(30 * 24 * time.Hour)
	newNames := []string{"xds.example.com"}

	type expect struct {
		what, action, reason string
	}
	for _, c := range []struct {
		name   string
		from   State
		now    time.Time
		want   []Spec
		p      Policy
		damage func(State) State
		// changes are exactly the changes expected (reason: a substring), in order.
		changes []expect
		// reissued are the roles whose certificate must change; the others must be kept.
		reissued []cptls.Role
		newCA    bool // the signing CA changes
		outage   bool // old and new cannot all verify each other
	}{
		{name: "unchanged", damage: func(s State) State { return s }},
		{
			name:   "CA missing",
			damage: func(s State) State { s.CA = KeyPair{}; return s },
			changes: []expect{{"CA", "replaced", "certificate missing"}, {"trust bundle", "updated", "now trusts"},
				{"xds-server certificate", "renewed", "not issued by"}, {"envoy-front certificate", "renewed", ""},
				{"envoy-sidecar certificate", "renewed", ""}, {"extproc certificate", "renewed", ""}},
			reissued: []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar, cptls.RoleExtproc},
			newCA:    true, outage: true,
		},
		{
			name: "CA certificate corrupt",
			damage: func(s State) State {
				s.CA.CertPEM = []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
				return s
			},
			changes: []expect{{"CA", "replaced", "OUTAGE possible"}, {"trust bundle", "updated", ""},
				{"xds-server certificate", "renewed", ""}, {"envoy-front certificate", "renewed", ""},
				{"envoy-sidecar certificate", "renewed", ""}, {"extproc certificate", "renewed", ""}},
			reissued: []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar, cptls.RoleExtproc},
			newCA:    true, outage: true,
		},
		{
			name:   "CA key of another CA",
			damage: func(s State) State { s.CA.KeyPEM = other.CA.KeyPEM; return s },
			changes: []expect{{"CA", "replaced", "does not match"}, {"trust bundle", "updated", ""},
				{"xds-server certificate", "renewed", ""}, {"envoy-front certificate", "renewed", ""},
				{"envoy-sidecar certificate", "renewed", ""}, {"extproc certificate", "renewed", ""}},
			reissued: []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar, cptls.RoleExtproc},
			newCA:    true, outage: true,
		},
		{
			name:   "CA key lost in phase 1: the next CA is promoted",
			from:   phase1,
			now:    phase1At.Add(time.Hour),
			damage: func(s State) State { s.CA.KeyPEM = nil; return s },
			changes: []expect{{"CA", "replaced", "the next CA"}, {"trust bundle", "updated", ""},
				{"xds-server certificate", "renewed", ""}, {"envoy-front certificate", "renewed", ""},
				{"envoy-sidecar certificate", "renewed", ""}, {"extproc certificate", "renewed", ""}},
			reissued: []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar, cptls.RoleExtproc},
			newCA:    true, // no outage: the promoted CA was in every bundle already
		},
		{
			name:   "next CA corrupt in phase 1: dropped and made again",
			from:   phase1,
			now:    phase1At.Add(time.Hour),
			damage: func(s State) State { s.NextCA.KeyPEM = []byte("garbage"); return s },
			changes: []expect{{"next CA", "dropped", "key no PEM"}, {"next CA", "created", "rotation phase 1"},
				{"trust bundle", "updated", ""}, {"xds-server trust bundle", "updated", ""}, {"envoy-front trust bundle",
					"updated", ""}, {"envoy-sidecar trust bundle", "updated", ""}, {"extproc trust bundle", "updated", ""}},
		},
		{
			name:   "a bundle lacks the next CA in phase 1: propagation starts again",
			from:   phase1,
			now:    phase1At.Add(48 * time.Hour),
			damage: func(s State) State { return withLeaf(s, cptls.RoleExtproc, func(l *Leaf) { l.BundlePEM = nil }) },
			changes: []expect{{"next CA", "replaced", "extproc"}, {"trust bundle", "updated", ""},
				{"xds-server trust bundle", "updated", ""}, {"envoy-front trust bundle", "updated", ""},
				{"envoy-sidecar trust bundle", "updated", ""}, {"extproc trust bundle", "updated", ""}},
		},
		{
			name:     "leaf missing",
			damage:   func(s State) State { s = clone(s); delete(s.Leaves, cptls.RoleExtproc); return s },
			changes:  []expect{{"extproc certificate", "created", "none yet"}},
			reissued: []cptls.Role{cptls.RoleExtproc},
		},
		{
			name: "leaf certificate corrupt",
			damage: func(s State) State {
				return withLeaf(s, cptls.RoleEnvoyFront, func(l *Leaf) { l.CertPEM = []byte("not PEM at all") })
			},
			changes:  []expect{{"envoy-front certificate", "renewed", "no PEM CERTIFICATE"}},
			reissued: []cptls.Role{cptls.RoleEnvoyFront},
		},
		{
			name: "leaf key missing",
			damage: func(s State) State {
				return withLeaf(s, cptls.RoleXDSServer, func(l *Leaf) { l.KeyPEM = nil })
			},
			changes:  []expect{{"xds-server certificate", "renewed", "key is missing"}},
			reissued: []cptls.Role{cptls.RoleXDSServer},
		},
		{
			name: "leaf key of another role",
			damage: func(s State) State {
				return withLeaf(s, cptls.RoleEnvoySidecar, func(l *Leaf) { l.KeyPEM = base.Leaves[cptls.RoleExtproc].KeyPEM })
			},
			changes:  []expect{{"envoy-sidecar certificate", "renewed", "does not match"}},
			reissued: []cptls.Role{cptls.RoleEnvoySidecar},
		},
		{
			name: "leaf from another CA with the same name",
			damage: func(s State) State {
				return withLeaf(s, cptls.RoleExtproc, func(l *Leaf) {
					l.CertPEM, l.KeyPEM = other.Leaves[cptls.RoleExtproc].CertPEM, other.Leaves[cptls.RoleExtproc].KeyPEM
				})
			},
			changes:  []expect{{"extproc certificate", "renewed", "not issued by the signing CA"}},
			reissued: []cptls.Role{cptls.RoleExtproc},
		},
		{
			name: "certificates swapped between roles",
			damage: func(s State) State {
				f, e := s.Leaves[cptls.RoleEnvoyFront], s.Leaves[cptls.RoleExtproc]
				s = withLeaf(s, cptls.RoleEnvoyFront, func(l *Leaf) { *l = e })
				return withLeaf(s, cptls.RoleExtproc, func(l *Leaf) { *l = f })
			},
			changes:  []expect{{"envoy-front certificate", "renewed", "names role extproc"}, {"extproc certificate", "renewed", "names role envoy-front"}},
			reissued: []cptls.Role{cptls.RoleEnvoyFront, cptls.RoleExtproc},
		},
		{
			name: "DNS names changed",
			want: []Spec{{Role: cptls.RoleXDSServer, DNSNames: append(slices.Clone(dnsNames), newNames...)}, {Role: cptls.RoleEnvoyFront}, {Role: cptls.RoleEnvoySidecar}, {Role: cptls.RoleExtproc}},
			damage: func(s State) State {
				return s
			},
			changes:  []expect{{"xds-server certificate", "renewed", "DNS names"}},
			reissued: []cptls.Role{cptls.RoleXDSServer},
		},
		{
			name:     "DNS names in another order: kept",
			want:     []Spec{{Role: cptls.RoleXDSServer, DNSNames: reversed(dnsNames)}, {Role: cptls.RoleEnvoyFront}, {Role: cptls.RoleEnvoySidecar}, {Role: cptls.RoleExtproc}},
			damage:   func(s State) State { return s },
			changes:  nil,
			reissued: nil,
		},
		{
			name:    "role trust bundle missing",
			damage:  func(s State) State { return withLeaf(s, cptls.RoleEnvoyFront, func(l *Leaf) { l.BundlePEM = nil }) },
			changes: []expect{{"envoy-front trust bundle", "updated", ""}},
		},
		{
			name: "role trust bundle of another installation",
			damage: func(s State) State {
				return withLeaf(s, cptls.RoleXDSServer, func(l *Leaf) { l.BundlePEM = other.BundlePEM })
			},
			changes: []expect{{"xds-server trust bundle", "updated", ""}},
		},
		{
			name: "CA bundle corrupt",
			damage: func(s State) State {
				s.BundlePEM = append([]byte("-----BEGIN CERTIFICATE-----\nZm9v\n-----END CERTIFICATE-----\n"), s.BundlePEM...)
				return s
			},
			changes: []expect{{"trust bundle", "updated", "1 unparseable"}, {"trust bundle", "updated", "now trusts"}},
		},
		{
			name: "CA bundle holds a leaf",
			damage: func(s State) State {
				s.BundlePEM = append(slices.Clone(s.BundlePEM), s.Leaves[cptls.RoleExtproc].CertPEM...)
				return s
			},
			changes: []expect{{"trust bundle", "updated", "not a CA certificate"}, {"trust bundle", "updated", "now trusts"}},
		},
		{
			name:   "certificate lifetime shortened",
			now:    later,
			p:      Policy{CALifetime: DefaultCALifetime, CertLifetime: 30 * 24 * time.Hour, PropagationDelay: DefaultPropagationDelay},
			damage: func(s State) State { return s },
			changes: []expect{{"xds-server certificate", "renewed", "longer than the certificate lifetime"},
				{"envoy-front certificate", "renewed", ""}, {"envoy-sidecar certificate", "renewed", ""},
				{"extproc certificate", "renewed", ""}},
			reissued: []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar, cptls.RoleExtproc},
		},
		{
			name:   "leaf expired (the CronJob did not run for a year)",
			now:    t0.Add(DefaultCertLifetime + time.Hour),
			damage: func(s State) State { return s },
			changes: []expect{{"xds-server certificate", "renewed", "expired at"}, {"envoy-front certificate",
				"renewed", "expired"}, {"envoy-sidecar certificate", "renewed", "expired"}, {"extproc certificate",
				"renewed", "expired"}},
			reissued: []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar, cptls.RoleExtproc},
			outage:   true, // the old leaves are expired: nothing verifies them
		},
		{
			name:    "one role less: its certificate is no longer kept",
			want:    allRoles[:3],
			damage:  func(s State) State { return s },
			changes: nil,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			from, now, want, pol := c.from, c.now, c.want, c.p
			if from.Leaves == nil {
				from = base
			}
			if now.IsZero() {
				now = t0.Add(time.Hour)
			}
			if want == nil {
				want = allRoles
			}
			if pol == (Policy{}) {
				pol = p
			}
			cur := c.damage(clone(from))
			next, changes := renew(t, now, cur, want, pol)
			if len(changes) != len(c.changes) {
				t.Errorf("changes:\n%s\nwant %d: %v", changeLines(changes), len(c.changes), c.changes)
			} else {
				for i, w := range c.changes {
					g := changes[i]
					if g.What != w.what || g.Action != w.action || !strings.Contains(g.Reason, w.reason) {
						t.Errorf("change %d: %s, want %s %s: ...%s...", i, g, w.what, w.action, w.reason)
					}
				}
			}
			checkState(t, now, next)
			for _, s := range want {
				changed := !bytes.Equal(cur.Leaves[s.Role].CertPEM, next.Leaves[s.Role].CertPEM)
				if changed != slices.Contains(c.reissued, s.Role) {
					t.Errorf("%s re-issued: %v, want %v", s.Role, changed, !changed)
				}
			}
			if len(next.Leaves) != len(want) {
				t.Errorf("%d leaves for %d roles", len(next.Leaves), len(want))
			}
			if changedCA := !bytes.Equal(from.CA.CertPEM, next.CA.CertPEM); changedCA != c.newCA {
				t.Errorf("signing CA changed: %v, want %v", changedCA, c.newCA)
			}
			// Across the run: the previous pieces that were intact (not the damaged ones).
			errs := checkTransition(t, now, from, next)
			switch {
			case c.outage && len(errs) == 0:
				t.Error("the check across the run passed, want it to fail (outage)")
			case !c.outage:
				for _, err := range errs {
					t.Errorf("across the run: %v", err)
				}
			}
		})
	}
}

func changeLines(cs []Change) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "  %s\n", c)
	}
	return b.String()
}

func reversed(s []string) []string {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

// TestRenewRequested: a requested renewal re-issues exactly the requested certificate (all
// of them when asked on the CA's state) from the same CA, with the same trust bundle and no
// outage, says who asked, and leaves nothing due (renew checks that a second run changes
// nothing). During rotation phase 1 the CA and the next CA are kept: a request never rotates.
func TestRenewRequested(t *testing.T) {
	base := installed(t)
	phase1, phase1At := inPhase1(t, base)
	later := t0.Add(30 * 24 * time.Hour)
	const asked = "annotation kube-mvp.io/renew"
	all := []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoyFront, cptls.RoleEnvoySidecar, cptls.RoleExtproc}
	for _, c := range []struct {
		name     string
		from     State
		now      time.Time
		request  func(State) State
		reissued []cptls.Role
		reason   string // of every change
	}{
		{
			name:     "one role",
			from:     base,
			now:      later,
			request:  func(s State) State { return withLeaf(s, cptls.RoleExtproc, func(l *Leaf) { l.RenewRequest = asked }) },
			reissued: []cptls.Role{cptls.RoleExtproc},
			reason:   "renewal requested (annotation kube-mvp.io/renew)",
		},
		{
			name: "two roles",
			from: base,
			now:  later,
			request: func(s State) State {
				s = withLeaf(s, cptls.RoleXDSServer, func(l *Leaf) { l.RenewRequest = asked })
				return withLeaf(s, cptls.RoleEnvoySidecar, func(l *Leaf) { l.RenewRequest = asked })
			},
			reissued: []cptls.Role{cptls.RoleXDSServer, cptls.RoleEnvoySidecar},
			reason:   "renewal requested (annotation kube-mvp.io/renew)",
		},
		{
			name:     "every role, asked on the CA",
			from:     base,
			now:      later,
			request:  func(s State) State { s = clone(s); s.RenewAllRequest = asked + " on the CA Secret"; return s },
			reissued: all,
			reason:   "renewal requested (annotation kube-mvp.io/renew on the CA Secret)",
		},
		{
			name: "at once after install",
			from: base,
			now:  t0,
			request: func(s State) State {
				return withLeaf(s, cptls.RoleEnvoyFront, func(l *Leaf) { l.RenewRequest = asked })
			},
			reissued: []cptls.Role{cptls.RoleEnvoyFront},
			reason:   "renewal requested",
		},
		{
			name:     "every role during rotation phase 1",
			from:     phase1,
			now:      phase1At.Add(time.Hour), // within the propagation delay: no phase 2
			request:  func(s State) State { s = clone(s); s.RenewAllRequest = asked; return s },
			reissued: all,
			reason:   "renewal requested",
		},
		{
			name: "requested and damaged: the damage is the reason",
			from: base,
			now:  later,
			request: func(s State) State {
				return withLeaf(s, cptls.RoleExtproc, func(l *Leaf) { l.RenewRequest = asked; l.KeyPEM = nil })
			},
			reissued: []cptls.Role{cptls.RoleExtproc},
			reason:   "the key is",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			from := c.request(c.from)
			next, changes := renew(t, c.now, from, allRoles, DefaultPolicy())
			var want []string
			for _, r := range all {
				if slices.Contains(c.reissued, r) {
					want = append(want, string(r)+" certificate renewed")
				}
			}
			var got []string
			for _, ch := range changes {
				got = append(got, ch.What+" "+ch.Action)
				if !strings.HasPrefix(ch.Reason, c.reason) {
					t.Errorf("%s: reason %q, want it to start with %q", ch.What, ch.Reason, c.reason)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("changes:\n%swant %v", changeLines(changes), want)
			}
			// The CA Secret is untouched: same signing CA, next CA and trust bundle.
			if !maps.EqualFunc(c.from.CAData(), next.CAData(), bytes.Equal) {
				t.Error("the CA state changed")
			}
			if next.RenewAllRequest != "" {
				t.Errorf("the result still requests a renewal of every role: %q", next.RenewAllRequest)
			}
			for _, r := range all {
				old, now := c.from.Leaves[r], next.Leaves[r]
				if now.RenewRequest != "" {
					t.Errorf("%s: the result still requests a renewal: %q", r, now.RenewRequest)
				}
				if !bytes.Equal(now.BundlePEM, old.BundlePEM) {
					t.Errorf("%s: trust bundle changed", r)
				}
				if !slices.Contains(c.reissued, r) {
					if !bytes.Equal(now.CertPEM, old.CertPEM) || !bytes.Equal(now.KeyPEM, old.KeyPEM) {
						t.Errorf("%s: re-issued, want it kept", r)
					}
					continue
				}
				oc, err := parseCert(old.CertPEM)
				if err != nil {
					t.Fatal(err)
				}
				nc, err := parseCert(now.CertPEM)
				if err != nil {
					t.Fatal(err)
				}
				if oc.SerialNumber.Cmp(nc.SerialNumber) == 0 || bytes.Equal(old.KeyPEM, now.KeyPEM) {
					t.Errorf("%s: same serial or key after the renewal", r)
				}
				if !bytes.Equal(nc.RawIssuer, signingCA(t, c.from).RawSubject) {
					t.Errorf("%s: issued by %s, want the signing CA it had", r, nc.Issuer)
				}
				if want := c.now.Add(-Backdate); !nc.NotBefore.Equal(want) {
					t.Errorf("%s: not before %s, want %s", r, stamp(nc.NotBefore), stamp(want))
				}
			}
			checkState(t, c.now, next)
			for _, err := range checkTransition(t, c.now, c.from, next) {
				t.Errorf("across the run: %v", err)
			}
		})
	}
}
