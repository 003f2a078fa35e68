package certgen

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/cptls"
)

const (
	// DefaultCALifetime is how long a new CA is valid: 10 years.
	DefaultCALifetime = 10 * 365 * 24 * time.Hour
	// DefaultCertLifetime is how long a new role certificate is valid: 1 year.
	DefaultCertLifetime = 365 * 24 * time.Hour
	// DefaultPropagationDelay is how long a next CA stays in the trust bundles before it signs.
	DefaultPropagationDelay = 24 * time.Hour
)

// Policy is how long things live.
type Policy struct {
	// CALifetime is the validity of a new CA.
	CALifetime time.Duration
	// CertLifetime is the validity of a new role certificate (cut at its CA's end).
	CertLifetime time.Duration
	// PropagationDelay is how long a next CA is trusted before it signs: longer than it takes
	// every pod to see its updated Secret.
	PropagationDelay time.Duration
}

// DefaultPolicy is the default lifetimes.
func DefaultPolicy() Policy {
	return Policy{CALifetime: DefaultCALifetime, CertLifetime: DefaultCertLifetime, PropagationDelay: DefaultPropagationDelay}
}

// PolicyError is one problem with a Policy; Field is the Policy field's name.
type PolicyError struct {
	Field string
	Msg   string
}

func (e *PolicyError) Error() string { return e.Field + ": " + e.Msg }

// Validate returns every problem with p, each a *PolicyError.
func (p Policy) Validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &PolicyError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if p.CALifetime < time.Hour {
		bad("CALifetime", "%s is too short: want at least 1h", p.CALifetime)
	}
	if p.CertLifetime < time.Hour {
		bad("CertLifetime", "%s is too short: want at least 1h", p.CertLifetime)
	}
	if p.CALifetime >= time.Hour && p.CertLifetime >= p.CALifetime {
		bad("CertLifetime", "%s must be shorter than the CA lifetime %s", p.CertLifetime, p.CALifetime)
	}
	if p.PropagationDelay < 0 {
		bad("PropagationDelay", "%s is negative", p.PropagationDelay)
	}
	if p.CALifetime >= time.Hour && p.PropagationDelay >= p.CALifetime/3 {
		bad("PropagationDelay", "%s must be shorter than a third of the CA lifetime (%s): rotation starts when a third is left, and the old CA must still be valid when the new one starts signing",
			p.PropagationDelay, p.CALifetime/3)
	}
	return errs
}

// Spec is a role certificate to keep.
type Spec struct {
	Role cptls.Role
	// DNSNames are the DNS SANs of the xds-server certificate (the names clients dial);
	// client roles have none.
	DNSNames []string
}

// Leaf is one role's stored material: tls.crt, tls.key and ca.crt of its Secret.
type Leaf struct {
	CertPEM   []byte
	KeyPEM    []byte
	BundlePEM []byte
	// RenewRequest, when not empty, asks for a new certificate now, as if it were due, and
	// says who asked, for the log (e.g. "annotation kube-mvp.io/renew"). Renew never returns
	// a request: the state it returns has been renewed.
	RenewRequest string
}

// State is everything certgen stores.
type State struct {
	// CA is the signing CA.
	CA KeyPair
	// NextCA is, during rotation phase 1, the CA that is trusted but does not sign yet.
	NextCA KeyPair
	// BundlePEM is every trusted CA: the signing CA, the next CA, and previous CAs until they
	// expire.
	BundlePEM []byte
	// Leaves are the role certificates, with the trust bundle each role's holder reads.
	Leaves map[cptls.Role]Leaf
	// RenewAllRequest, when not empty, asks for a new certificate for every role now (as
	// Leaf.RenewRequest does for one) and says who asked. It renews the role certificates
	// only: the CA stays, and rotates only by the rotation rules. Renew never returns it.
	RenewAllRequest string
}

// Change is one thing Renew changed, for the log. It never holds key material.
type Change struct {
	// What: "CA", "next CA", "trust bundle", "<role> certificate", "<role> trust bundle".
	What string
	// Action: created, replaced, promoted, renewed, updated, dropped.
	Action string
	Reason string
}

func (c Change) String() string { return c.What + " " + c.Action + ": " + c.Reason }

// dnsName is a DNS name (lower case, labels of letters, digits and hyphens), optionally with
// a leading wildcard label.
var dnsName = regexp.MustCompile(`^(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)

// ValidateSpecs returns every problem with specs: unknown or repeated roles, DNS names on a
// client role, malformed DNS names.
func ValidateSpecs(specs []Spec) []error {
	var errs []error
	seen := map[cptls.Role]bool{}
	for _, s := range specs {
		if _, err := cptls.ParseRole(string(s.Role)); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[s.Role] {
			errs = append(errs, fmt.Errorf("role %s is listed more than once", s.Role))
		}
		seen[s.Role] = true
		if s.Role != cptls.RoleXDSServer && len(s.DNSNames) > 0 {
			errs = append(errs, fmt.Errorf("role %s is a client: its certificate has no DNS names (got %s)", s.Role, strings.Join(s.DNSNames, ",")))
		}
		for _, n := range s.DNSNames {
			if len(n) > 253 || !dnsName.MatchString(n) {
				errs = append(errs, fmt.Errorf("%q is not a DNS name (lower-case labels of letters, digits and '-', separated by dots)", n))
			}
		}
	}
	return errs
}

// Renew decides, at now, what of cur to keep and what to (re)issue for the roles in want
// under policy p, and returns the state to store with what changed and why (see the package
// documentation for the rules). It reads no clock and does no I/O; it only draws random
// numbers for new keys and serials. Missing or corrupt pieces of cur are replaced, never an
// error: the error is for bad arguments or a failing random source.
func Renew(now time.Time, cur State, want []Spec, p Policy) (State, []Change, error) {
	if now.IsZero() {
		return State{}, nil, errors.New("certgen: Renew needs the current time")
	}
	if errs := p.Validate(); len(errs) > 0 {
		return State{}, nil, fmt.Errorf("certgen: policy: %w", errors.Join(errs...))
	}
	if errs := ValidateSpecs(want); len(errs) > 0 {
		return State{}, nil, fmt.Errorf("certgen: %w", errors.Join(errs...))
	}
	r := &renewal{now: now, p: p, renewAll: cur.RenewAllRequest}
	out, err := r.run(cur, want)
	if err != nil {
		return State{}, nil, fmt.Errorf("certgen: %w", err)
	}
	return out, r.changes, nil
}

type renewal struct {
	now     time.Time
	p       Policy
	changes []Change
	// renewAll is State.RenewAllRequest of the state renewed.
	renewAll string
}

func (r *renewal) note(what, action, format string, args ...any) {
	r.changes = append(r.changes, Change{What: what, Action: action, Reason: fmt.Sprintf(format, args...)})
}

func (r *renewal) run(cur State, want []Spec) (State, error) {
	now := r.now
	installing := cur.CA.empty() && cur.NextCA.empty() && len(cur.BundlePEM) == 0 && len(cur.Leaves) == 0

	// Previous CAs that stay trusted until they expire (besides those of the stored bundle).
	var retire []*x509.Certificate

	// The signing CA, and the next CA of a rotation in progress.
	signing, oldCert, problem := parseCA(cur.CA, now)
	var next *authority
	var discarded *x509.Certificate // an unusable next CA: no longer trusted
	if !cur.NextCA.empty() {
		var nextProblem string
		var cert *x509.Certificate
		next, cert, nextProblem = parseCA(cur.NextCA, now)
		if next == nil {
			discarded = cert
			r.note("next CA", "dropped", "%s; a new one is made if a rotation is still due", nextProblem)
		}
	}
	if signing == nil {
		if oldCert != nil && oldCert.IsCA && now.Before(oldCert.NotAfter) {
			retire = append(retire, oldCert)
		}
		switch {
		case next != nil:
			r.note("CA", "replaced", "the CA is unusable (%s): the next CA %s, trusted since %s, "+
				"signs from now on; pods that have not loaded it yet reject the "+
				"re-issued certificates until kubelet refreshes their Secret",
				problem, caName(next.cert), stamp(issuedAt(next.cert)))
			signing, next = next, nil
		default:
			ca, err := newCA(now, r.p.CALifetime)
			if err != nil {
				return State{}, err
			}
			if installing {
				r.note("CA", "created", "none yet: %s", caName(ca.cert))
			} else {
				r.note("CA", "replaced", "the CA is unusable (%s): new %s, every certificate is re-issued from it; "+
					"OUTAGE possible: pods that still hold the previous trust bundle reject "+
					"the new certificates until kubelet refreshes their Secret (about a minute)",
					problem, caName(ca.cert))
			}
			signing = ca
		}
	}

	// Rotation. Phase 1: a next CA joins the bundles. Phase 2 (a later run): it signs.
	if next == nil {
		left, life := signing.cert.NotAfter.Sub(now), signing.cert.NotAfter.Sub(signing.cert.NotBefore)
		if left < life/3 {
			ca, err := newCA(now, r.p.CALifetime)
			if err != nil {
				return State{}, err
			}
			next = ca
			r.note("next CA", "created", "rotation phase 1: the signing %s has less than 1/3 of its lifetime "+
				"left; %s is trusted from now on and starts signing once it "+
				"has been in every trust bundle for %s (at %s at the earliest)",
				caName(signing.cert), caName(ca.cert), r.p.PropagationDelay, stamp(issuedAt(ca.cert).Add(r.p.PropagationDelay)))
		}
	} else {
		since := issuedAt(next.cert)
		var lacking []string
		for _, s := range want {
			if !bundleHas(cur.Leaves[s.Role].BundlePEM, next.cert) {
				lacking = append(lacking, string(s.Role))
			}
		}
		switch {
		case len(lacking) > 0:
			// Some holders may only now get it: its propagation starts again, with a new
			// next CA (the old one signed nothing) so that its NotBefore tells when.
			ca, err := newCA(now, r.p.CALifetime)
			if err != nil {
				return State{}, err
			}
			r.note("next CA", "replaced", "the trust bundles of %s lacked %s, so its propagation starts again: %s is trusted from now on and starts signing after %s (at %s at the earliest)",
				strings.Join(lacking, ", "), caName(next.cert), caName(ca.cert), r.p.PropagationDelay, stamp(issuedAt(ca.cert).Add(r.p.PropagationDelay)))
			discarded, next = next.cert, ca
		case !now.After(since.Add(r.p.PropagationDelay)):
			// Waiting (strictly longer than the delay: never in the run that made it).
		default:
			r.note("CA", "rotated", "rotation phase 2: %s has been trusted since %s (at least %s); it signs from now "+
				"on and every certificate is re-issued from it; the previous %s stays trusted until it expires",
				caName(next.cert), stamp(since), r.p.PropagationDelay, caName(signing.cert))
			retire = append(retire, signing.cert)
			signing, next = next, nil
		}
	}

	// The trust bundle: signing CA, next CA, then every previous CA still valid.
	trusted := []*x509.Certificate{signing.cert}
	if next != nil {
		trusted = append(trusted, next.cert)
	}
	stored, bad := parseBundle(cur.BundlePEM)
	if bad > 0 {
		r.note("trust bundle", "updated", "%d unparseable PEM block(s) dropped", bad)
	}
	for _, c := range append(stored, retire...) {
		switch {
		case slices.ContainsFunc(trusted, c.Equal):
		case discarded != nil && c.Equal(discarded):
			// The unusable next CA signed nothing: dropped with it.
		case !c.IsCA:
			r.note("trust bundle", "updated", "dropped %q: not a CA certificate", c.Subject.CommonName)
		case !now.Before(c.NotAfter):
			r.note("trust bundle", "updated", "dropped the previous %s: expired", caName(c))
		default:
			trusted = append(trusted, c)
		}
	}
	var bundle []byte
	for _, c := range trusted {
		bundle = append(bundle, encodeCert(c.Raw)...)
	}
	if !bytes.Equal(bundle, cur.BundlePEM) && !installing {
		names := make([]string, len(trusted))
		for i, c := range trusted {
			names[i] = caName(c)
		}
		r.note("trust bundle", "updated", "now trusts %s", strings.Join(names, ", "))
	}

	out := State{CA: signing.pair, BundlePEM: bundle, Leaves: map[cptls.Role]Leaf{}}
	if next != nil {
		out.NextCA = next.pair
	}

	// The role certificates, in cptls.Roles order for a stable log.
	specs := slices.Clone(want)
	slices.SortFunc(specs, func(a, b Spec) int { return slices.Index(cptls.Roles, a.Role) - slices.Index(cptls.Roles, b.Role) })
	for _, s := range specs {
		old := cur.Leaves[s.Role]
		leaf := Leaf{CertPEM: old.CertPEM, KeyPEM: old.KeyPEM, BundlePEM: bundle}
		what := string(s.Role) + " certificate"
		if why := r.leafProblem(old, s, signing); why != "" {
			kp, err := signing.issue(s, now, r.p.CertLifetime)
			if err != nil {
				return State{}, err
			}
			leaf.CertPEM, leaf.KeyPEM = kp.CertPEM, kp.KeyPEM
			action := "renewed"
			if len(old.CertPEM) == 0 {
				action = "created"
			}
			c, _ := parseCert(kp.CertPEM)
			r.note(what, action, "%s; valid until %s", why, stamp(c.NotAfter))
		} else if !bytes.Equal(old.BundlePEM, bundle) {
			r.note(string(s.Role)+" trust bundle", "updated", "it differed from the current trust bundle")
		}
		out.Leaves[s.Role] = leaf
	}
	return out, nil
}

// issuedAt is when certgen made c.
func issuedAt(c *x509.Certificate) time.Time { return c.NotBefore.Add(Backdate) }

func bundleHas(bundle []byte, c *x509.Certificate) bool {
	certs, _ := parseBundle(bundle)
	return slices.ContainsFunc(certs, c.Equal)
}

// leafProblem is why old must be (re)issued for s, or "" when it is fine.
func (r *renewal) leafProblem(old Leaf, s Spec, ca *authority) string {
	now := r.now
	if len(bytes.TrimSpace(old.CertPEM)) == 0 {
		return "none yet"
	}
	cert, err := parseCert(old.CertPEM)
	if err != nil {
		return "the certificate is " + err.Error()
	}
	key, err := parseKey(old.KeyPEM)
	if err != nil {
		return "the key is " + err.Error()
	}
	if !keyMatches(cert, key) {
		return "its key does not match the certificate"
	}
	if !bytes.Equal(cert.RawIssuer, ca.cert.RawSubject) || cert.CheckSignatureFrom(ca.cert) != nil {
		return fmt.Sprintf("not issued by the signing %s", caName(ca.cert))
	}
	if role, err := cptls.RoleOf(cert); err != nil {
		return err.Error()
	} else if role != s.Role {
		return fmt.Sprintf("it names role %s", role)
	}
	if len(cert.URIs) != 1 {
		return fmt.Sprintf("it has %d URI SANs, want only %s", len(cert.URIs), s.Role.URI())
	}
	if got, want := sortedNames(cert.DNSNames), sortedNames(s.DNSNames); !slices.Equal(got, want) {
		return fmt.Sprintf("its DNS names are [%s], want [%s]", strings.Join(got, " "), strings.Join(want, " "))
	}
	if len(cert.IPAddresses) > 0 || len(cert.EmailAddresses) > 0 {
		return "it has IP or e-mail SANs"
	}
	if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{usage(s.Role)}) || cert.IsCA {
		return "its key usage is not the role's"
	}
	if cert.Subject.CommonName != CommonName(s.Role) {
		return fmt.Sprintf("its common name is %q, want %q", cert.Subject.CommonName, CommonName(s.Role))
	}
	left, life := cert.NotAfter.Sub(now), cert.NotAfter.Sub(cert.NotBefore)
	switch {
	case !now.Before(cert.NotAfter):
		return "expired at " + stamp(cert.NotAfter)
	case now.Before(cert.NotBefore):
		return "not valid before " + stamp(cert.NotBefore)
	case left < life/3:
		return fmt.Sprintf("less than 1/3 of its lifetime left (expires %s)", stamp(cert.NotAfter))
	case left > r.p.CertLifetime:
		return fmt.Sprintf("valid until %s, longer than the certificate lifetime %s allows", stamp(cert.NotAfter), r.p.CertLifetime)
	}
	// Asked for: last, so that a certificate that had to be re-issued anyway says why.
	switch {
	case old.RenewRequest != "":
		return "renewal requested (" + old.RenewRequest + ")"
	case r.renewAll != "":
		return "renewal requested (" + r.renewAll + ")"
	}
	return ""
}
