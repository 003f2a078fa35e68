package objects_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

const mixedFixture = `
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: apiserver-tqsyvnc7rs47fayzipsuqpfg4m
  namespace: kube-system
  labels: {apiserver.kubernetes.io/identity: kube-apiserver, kubernetes.io/hostname: cp-a}
  annotations: {kubernetes.io/peer-advertise-address: "10.0.0.1:6443"}
spec: {holderIdentity: apiserver-tqsyvnc7rs47fayzipsuqpfg4m_1, leaseDurationSeconds: 3600, renewTime: "2026-11-23T10:00:00.000000Z"}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: apiserver-imkgstwjs6opnbwk2ixluu6fiq
  namespace: kube-system
  labels: {apiserver.kubernetes.io/identity: kube-apiserver, kubernetes.io/hostname: cp-b}
spec: {holderIdentity: apiserver-imkgstwjs6opnbwk2ixluu6fiq_1, leaseDurationSeconds: 3600, renewTime: "2026-11-23T09:00:00.000000Z"}
---
# B's Lease has no address annotation (MVP gate off): Options.Addresses supplies it.
apiVersion: internal.apiserver.k8s.io/v1alpha1
kind: StorageVersion
metadata: {name: batch.jobs}
status:
  storageVersions:
  - {apiServerID: apiserver-tqsyvnc7rs47fayzipsuqpfg4m, encodingVersion: batch/v1, decodableVersions: [batch/v1], servedVersions: [batch/v1]}
  - {apiServerID: apiserver-gone, encodingVersion: batch/v1, decodableVersions: [batch/v1], servedVersions: [batch/v1]}
---
apiVersion: v1
kind: List
items:
- apiVersion: internal.apiserver.k8s.io/v1alpha1
  kind: StorageVersion
  metadata: {name: core.pods}
  status:
    storageVersions:
    - {apiServerID: apiserver-tqsyvnc7rs47fayzipsuqpfg4m, encodingVersion: v1, decodableVersions: [v1], servedVersions: [v1]}
    - {apiServerID: apiserver-imkgstwjs6opnbwk2ixluu6fiq, encodingVersion: v1, decodableVersions: [v1], servedVersions: [v1, apps/v1]}
- apiVersion: internal.apiserver.k8s.io/v1alpha1
  kind: StorageVersion
  metadata: {name: nodot}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1.example.com, labels: {kube-aggregator.kubernetes.io/automanaged: "true"}}
spec: {group: example.com, version: v1}
---
apiVersion: kube-mvp.io/v1alpha1
kind: APIServerDiscovery
metadata: {name: apiserver-tqsyvnc7rs47fayzipsuqpfg4m}
discovery:
  items:
  - metadata: {name: example.com}
    versions:
    - version: v1
      resources: [{resource: widgets, scope: Namespaced, singularResource: widget, verbs: [get]}]
  - metadata: {name: apps}
    versions:
    - version: v1
      resources:
      - resource: deployments
        scope: Namespaced
        singularResource: deployment
        verbs: [get, list]
        subresources: [{subresource: scale, verbs: [get]}]
`

func TestBuildFromFixture(t *testing.T) {
	objs, err := objects.DecodeFixture(strings.NewReader(mixedFixture))
	if err != nil {
		t.Fatal(err)
	}
	now, _ := time.Parse(time.RFC3339, "2026-11-23T10:00:10Z")
	topo, errs := objects.Build(objs, objects.Options{Now: now, Addresses: map[string]string{"cp-b": "10.0.0.2:6443"}})

	// Each bad piece is reported by name and nothing else is lost.
	wantErrs := []string{`StorageVersion core.pods: apiserver apiserver-imkgstwjs6opnbwk2ixluu6fiq: servedVersion "apps/v1" does not belong to group ""`, `StorageVersion nodot skipped`}
	if len(errs) != len(wantErrs) {
		t.Fatalf("errors: %v, want %d", errs, len(wantErrs))
	}
	for i, want := range wantErrs {
		if !strings.Contains(errs[i].Error(), want) {
			t.Errorf("error %d: %q, want it to contain %q", i, errs[i], want)
		}
	}

	a, _ := topo.Server("apiserver-tqsyvnc7rs47fayzipsuqpfg4m")
	b, _ := topo.Server("apiserver-imkgstwjs6opnbwk2ixluu6fiq")
	if !a.Alive || a.Address != "10.0.0.1:6443" || a.Hostname != "cp-a" {
		t.Errorf("A: %+v", a)
	}
	if b.Alive || b.Address != "10.0.0.2:6443" {
		t.Errorf("B (renewed an hour ago, address from Options): %+v", b)
	}
	for r, want := range map[topology.Resource][]string{
		// A has discovery: its StorageVersion entries are not needed (and not used).
		{Group: "apps", Version: "v1", Resource: "deployments"}:                       {"apiserver-tqsyvnc7rs47fayzipsuqpfg4m"},
		{Group: "apps", Version: "v1", Resource: "deployments", Subresource: "scale"}: {"apiserver-tqsyvnc7rs47fayzipsuqpfg4m"},
		{Version: "v1", Resource: "pods"}:                                             {"apiserver-imkgstwjs6opnbwk2ixluu6fiq"},
		// Only an ID no Lease or memory knows: it decides nothing and would cost a route.
		{Group: "batch", Version: "v1", Resource: "jobs"}: nil,
		// Served everywhere: never in the serving table.
		{Group: "example.com", Version: "v1", Resource: "widgets"}: nil,
	} {
		if got := topo.Served[r]; !slices.Equal(got, want) {
			t.Errorf("%s served by %v, want %v", r, got, want)
		}
	}
	if d := topo.DecideResource(topology.Resource{Group: "batch", Version: "v1", Resource: "jobs"}); d.Outcome != topology.Default {
		t.Errorf("jobs served only by an unknown ID: %v, want default (the apiservers answer 404 themselves)", d.Outcome)
	}
	if d := topo.DecideResource(topology.Resource{Version: "v1", Resource: "pods"}); d.Outcome != topology.Unavailable {
		t.Errorf("pods served only by dead B: %v, want unavailable", d.Outcome)
	}
	// Where each apiserver's capabilities come from, for /debug/topology.
	if got := topo.Sources; got["apiserver-tqsyvnc7rs47fayzipsuqpfg4m"].From != topology.SourceDiscovery || got["apiserver-imkgstwjs6opnbwk2ixluu6fiq"].From != topology.SourceStorageVersions {
		t.Errorf("sources %+v, want A from discovery, B from StorageVersions", got)
	}
	fetched := now.Add(-3 * time.Second)
	objs.DiscoveredAt = map[string]time.Time{"apiserver-tqsyvnc7rs47fayzipsuqpfg4m": fetched}
	topo, _ = objects.Build(objs, objects.Options{Now: now, Addresses: map[string]string{"cp-b": "10.0.0.2:6443"}})
	if got := topo.Sources["apiserver-tqsyvnc7rs47fayzipsuqpfg4m"]; !got.Since.Equal(fetched) {
		t.Errorf("A's discovery since %v, want %v", got.Since, fetched)
	}
	objs.StorageVersions = nil
	topo, _ = objects.Build(objs, objects.Options{Now: now, Addresses: map[string]string{"cp-b": "10.0.0.2:6443"}})
	if got := topo.Sources["apiserver-imkgstwjs6opnbwk2ixluu6fiq"].From; got != topology.SourceNone {
		t.Errorf("B with neither discovery nor StorageVersions: %q, want none", got)
	}
}

// TestBuildChecksLeases: anyone who may write Leases in kube-system can write an identity
// Lease, so Build believes one only as far as it looks like an apiserver's: a Lease that is not
// an identity Lease, whose holderIdentity is not <name>_..., or whose renewTime lies in the
// future is skipped (a future renewTime would count as alive for ever); an address that is
// not exactly an IP and port keeps the apiserver known but not routable. Each error names the
// Lease.
func TestBuildChecksLeases(t *testing.T) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	lease := func(name, holder, renew, address string) string {
		l := "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: " + name + "\n  namespace: kube-system\n" +
			"  labels: {apiserver.kubernetes.io/identity: kube-apiserver, kubernetes.io/hostname: cp-a}\n"
		if address != "" {
			l += "  annotations: {kubernetes.io/peer-advertise-address: \"" + address + "\"}\n"
		}
		l += "spec: {"
		if holder != "" {
			l += "holderIdentity: " + holder + ", "
		}
		return l + "renewTime: \"" + renew + "\"}\n"
	}
	fresh := "2026-11-23T09:59:55.000000Z"
	for _, c := range []struct {
		name, yaml string
		err        string // "": accepted
		routable   bool
	}{
		{"an apiserver's", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "10.0.0.1:6443"), "", true},
		{"IPv6", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "[fd00::1]:6443"), "", true},
		{"clock a little ahead", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", "2026-11-23T10:00:09.000000Z", "10.0.0.1:6443"), "", true},
		{"not an identity Lease", "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: some-controller, namespace: kube-system}\n",
			"Lease kube-system/some-controller skipped: not an apiserver identity Lease", false},
		{"no holder", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "", fresh, "10.0.0.1:6443"), "Lease kube-system/apiserver-tqsyvnc7rs47fayzipsuqpfg4m rejected: holderIdentity missing", false},
		{"someone else's holder", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "kube-controller-manager_1", fresh, "10.0.0.1:6443"), `rejected: holderIdentity "kube-controller-manager_1"`, false},
		{"holder without the separator", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-aaab", fresh, "10.0.0.1:6443"), `holderIdentity "apiserver-aaab"`, false},
		{"renewTime in the future", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m",
			"apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", "2099-01-01T00:00:00.000000Z", "10.0.0.1:6443"),
			"rejected: renewTime 2099-01-01T00:00:00Z is", false},
		{"a URL", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "127.0.0.1:1/evil?x=1"), `"127.0.0.1:1/evil?x=1" is not an IP address and port`, false},
		{"a DNS name", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "evil.example.com:443"), "is not an IP address and port", false},
		{"user info", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "u:p@10.0.0.1:6443"), "is not an IP address and port", false},
		{"no port", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "10.0.0.3"), "is not an IP address and port", false},
		{"port 0", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "10.0.0.3:0"), "is not an IP address and port", false},
		{"unspecified address", lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "0.0.0.0:6443"), "is not an IP address and port", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, err := objects.DecodeFixture(strings.NewReader(c.yaml))
			if err != nil {
				t.Fatal(err)
			}
			verified(&objs, "apiserver-tqsyvnc7rs47fayzipsuqpfg4m")
			topo, errs := objects.Build(objs, objects.Options{Now: now})
			if c.err == "" && len(errs) > 0 {
				t.Fatalf("errors: %v", errs)
			}
			if c.err != "" && (len(errs) == 0 || !strings.Contains(errs[0].Error(), c.err)) {
				t.Fatalf("errors %v, want one containing %q", errs, c.err)
			}
			if got := len(topo.Live()) == 1; got != c.routable {
				t.Errorf("routable %v, want %v: %+v", got, c.routable, topo.APIServers)
			}
		})
	}
	// An address given by flag (--apiserver-addresses) is checked the same way.
	objs, err := objects.DecodeFixture(strings.NewReader(lease("apiserver-tqsyvnc7rs47fayzipsuqpfg4m", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m_6f1c", fresh, "")))
	if err != nil {
		t.Fatal(err)
	}
	topo, errs := objects.Build(objs, objects.Options{Now: now, Addresses: map[string]string{"cp-a": "localhost:6443"}})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `the address given for hostname "cp-a", "localhost:6443", is not an IP address and port`) || len(topo.Live()) != 0 {
		t.Errorf("address by flag: errors %v, live %v", errs, topo.Live())
	}
}

func TestDecodeFixtureNamesBadDocuments(t *testing.T) {
	_, err := objects.DecodeFixture(strings.NewReader(`
apiVersion: v1
kind: Secret
metadata: {name: x}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: bad-lease}
spec: {holderIdentity: 7, bogus: true}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`document 1: v1 Secret "x": unknown kind`, `document 2: coordination.k8s.io/v1 Lease "bad-lease"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 2 {
		t.Errorf("want both documents reported, got %v", err)
	}
}

// TestAllLeasesStale: when no Lease renewal was seen for longer than apiservers take to
// renew, the view is taken to be stale, not the control plane dead: the Leases are judged as
// of the newest renewal seen (plus the window less the renew interval), so what was alive
// then stays alive (Envoy's health checks decide), and the error says why. While renewals
// arrive, the others are judged normally.
func TestAllLeasesStale(t *testing.T) {
	objs, err := objects.DecodeFixture(strings.NewReader(mixedFixture))
	if err != nil {
		t.Fatal(err)
	}
	verified(&objs, "apiserver-imkgstwjs6opnbwk2ixluu6fiq")
	opts := objects.Options{Addresses: map[string]string{"cp-b": "10.0.0.2:6443"}}

	opts.Now = time.Date(2026, 11, 23, 10, 0, 10, 0, time.UTC) // A fresh, B an hour old
	topo, errs := objects.Build(objs, opts)
	if live := topo.Live(); !slices.Equal(live, []string{"apiserver-tqsyvnc7rs47fayzipsuqpfg4m"}) {
		t.Errorf("with A fresh: live %v, want only A", live)
	}
	for _, e := range errs {
		if strings.Contains(e.Error(), "no identity Lease renewal seen") {
			t.Errorf("with A fresh: %v", e)
		}
	}

	opts.Now = time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC) // no renewal for an hour
	topo, errs = objects.Build(objs, opts)
	if live := topo.Live(); !slices.Equal(live, []string{"apiserver-tqsyvnc7rs47fayzipsuqpfg4m"}) {
		t.Errorf("no renewal seen for an hour: live %v, want A (alive when the watch went quiet), not B (dead long before)", live)
	}
	found := false
	for _, e := range errs {
		found = found ||
			strings.Contains(e.Error(),
				"no identity Lease renewal seen for 1h0m0s (apiservers renew every 10s): our Lease watch is more likely stuck than the apiservers dead, so the Leases are judged as of 2026-11-23T10:00:15Z")
	}
	if !found {
		t.Errorf("no renewal seen for an hour: no error says so: %v", errs)
	}
}

// TestQuietLeaseWatch: the Lease watch goes quiet (its connection to a hung apiserver),
// A having renewed last just before, B 10.5 s earlier (its next renewal, due as the watch
// stopped, never seen): judged against the clock alone B would drop out of the window first
// and A alone count as alive; judged as of the last renewal seen, both stay alive however
// long the watch stays quiet. A real death is still seen while renewals arrive: with A
// renewing, B drops out after the window.
func TestQuietLeaseWatch(t *testing.T) {
	const window = 20 * time.Second
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	bRenewed := t0.Add(-10500 * time.Millisecond)
	a, b := leaseAt(idA, t0), leaseAt(idB, bRenewed)
	live := func(now time.Time, leases ...coordinationv1.Lease) []string {
		servers, _ := objects.APIServers(leases, objects.Options{Now: now, LivenessWindow: window})
		var out []string
		for _, s := range servers {
			if s.Alive {
				out = append(out, s.ID)
			}
		}
		return out
	}
	for _, quiet := range []time.Duration{5 * time.Second, 9 * time.Second, 11 * time.Second, time.Minute, time.Hour} {
		if got := live(t0.Add(quiet), a, b); !slices.Equal(got, []string{idA, idB}) {
			t.Errorf("watch quiet for %s: live %v, want both", quiet, got)
		}
	}
	// No Lease carries a renewal at all: nothing to judge by, every apiserver counts as alive.
	noRenewal := func(l coordinationv1.Lease) coordinationv1.Lease { l.Spec.RenewTime = nil; return l }
	servers, errs := objects.APIServers([]coordinationv1.Lease{noRenewal(a), noRenewal(b)}, objects.Options{Now: t0, LivenessWindow: window})
	if len(servers) != 2 || !servers[0].Alive || !servers[1].Alive || len(errs) != 1 || !strings.Contains(errs[0].Error(), "no identity Lease carries a renewTime: all 2 apiservers count as alive") {
		t.Errorf("no renewTime anywhere: %+v, %v; want both alive and the reason", servers, errs)
	}
	// A keeps renewing, B does not: B is dead once its renewal is older than the window.
	for _, after := range []time.Duration{0, 10 * time.Second, 20 * time.Second, 30 * time.Second} {
		now := t0.Add(after)
		want := []string{idA}
		if now.Sub(bRenewed) <= window {
			want = append(want, idB)
		}
		if got := live(now, leaseAt(idA, now), b); !slices.Equal(got, want) {
			t.Errorf("A renewing, B not, at +%s: live %v, want %v", after, got, want)
		}
	}
}

// TestRequestHeadersFromAuthenticationConfigMap: the identity header names come from the
// ConfigMap the apiservers publish (JSON lists; a union over every apiserver), lower case,
// with the defaults for what it does not say; a ConfigMap with a list that does not parse
// is malformed as a whole, and with nothing good read before, Build publishes nothing.
func TestRequestHeadersFromAuthenticationConfigMap(t *testing.T) {
	const good = `
apiVersion: v1
kind: ConfigMap
metadata: {name: extension-apiserver-authentication, namespace: kube-system}
data:
  requestheader-username-headers: '["X-Remote-User","X-User"]'
  requestheader-group-headers: '["X-Groups"]'
  requestheader-extra-headers-prefix: '["X-Remote-Extra-","X-Extra-"]'
  requestheader-allowed-names: '["front-proxy-client"]'
`
	objs, err := objects.DecodeFixture(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	topo, errs := objects.Build(objs, objects.Options{})
	want := topology.RequestHeaders{
		User: []string{"x-remote-user", "x-user"}, UID: []string{"x-remote-uid"}, Group: []string{"x-groups"},
		ExtraPrefix: []string{"x-remote-extra-", "x-extra-"},
	}
	if len(errs) != 0 || !reflect.DeepEqual(topo.RequestHeaders, want) {
		t.Errorf("request headers %+v, %v; want %+v", topo.RequestHeaders, errs, want)
	}
	objs, err = objects.DecodeFixture(strings.NewReader(good + "  requestheader-uid-headers: 'not json'\n"))
	if err != nil {
		t.Fatal(err)
	}
	topo, errs = objects.Build(objs, objects.Options{})
	if topo != nil || len(errs) != 1 ||
		!strings.Contains(errs[0].Error(),
			"ConfigMap kube-system/extension-apiserver-authentication is malformed: requestheader-uid-headers is not a JSON list of strings") {
		t.Errorf("malformed, never good before: topology %v, errors %v; want none and the reason", topo != nil, errs)
	}
	if h, missing, err := objects.RequestHeadersFrom(nil); err != nil || len(missing) != 4 || !reflect.DeepEqual(h.OrDefault(), topology.DefaultRequestHeaders()) {
		t.Errorf("no ConfigMap: %+v, %v, %v; want the defaults", h, missing, err)
	}
	otherConfigMap := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: kube-system}\n"
	if _, err := objects.DecodeFixture(strings.NewReader(otherConfigMap)); err == nil ||
		!strings.Contains(err.Error(), "the only ConfigMap read is kube-system/extension-apiserver-authentication") {
		t.Errorf("another ConfigMap: %v", err)
	}
}

// verified gives each of ids an (empty) discovery, as if fetched at its address over
// verified TLS, unless it has one.
func verified(objs *objects.Objects, ids ...string) {
	if objs.Discovery == nil {
		objs.Discovery = map[string]*apidiscoveryv2.APIGroupDiscoveryList{}
	}
	for _, id := range ids {
		if objs.Discovery[id] == nil {
			objs.Discovery[id] = &apidiscoveryv2.APIGroupDiscoveryList{}
		}
	}
}

// TestUnverifiedLeaseChangesNothing: an identity Lease that passes every check (fresh,
// holder, IP address) is still only a claim, which anyone allowed to write Leases in
// kube-system can make. Until its apiserver's own discovery was fetched at that address over
// verified TLS it takes no part in routing: the plan is the one without it, and
// /debug/topology says why it is not routable. Once verified, it counts.
func TestUnverifiedLeaseChangesNothing(t *testing.T) {
	const forged = `
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay
  namespace: kube-system
  labels: {apiserver.kubernetes.io/identity: kube-apiserver, kubernetes.io/hostname: cp-z}
  annotations: {kubernetes.io/peer-advertise-address: "10.6.6.6:6443"}
spec: {holderIdentity: apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay_1, leaseDurationSeconds: 3600, renewTime: "2026-11-23T10:00:05.000000Z"}
`
	now := time.Date(2026, 11, 23, 10, 0, 10, 0, time.UTC)
	opts := objects.Options{Now: now, Addresses: map[string]string{"cp-b": "10.0.0.2:6443"}}
	build := func(fixture string) *plan.Plan {
		t.Helper()
		objs, err := objects.DecodeFixture(strings.NewReader(fixture))
		if err != nil {
			t.Fatal(err)
		}
		topo, _ := objects.Build(objs, opts)
		p, err := plan.Build(topo)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	without, with := build(mixedFixture), build(mixedFixture+forged)
	if !reflect.DeepEqual(without.Clusters, with.Clusters) || !reflect.DeepEqual(without.Routes.All(), with.Routes.All()) || !reflect.DeepEqual(without.GroupVersions, with.GroupVersions) {
		t.Errorf("a fresh Lease without verified discovery changed the plan:\nclusters %v\nwant     %v", with.Clusters, without.Clusters)
	}
	if src := with.Topology.Sources["apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay"]; !src.AwaitingDiscovery {
		t.Errorf("source %+v, want it marked as awaiting verified discovery", src)
	}
	if s, _ := with.Topology.Server("apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay"); s.Verified || s.Routable() {
		t.Errorf("unverified apiserver counts as verified or routable: %+v", s)
	}
	// The sidecar beside cp-a still finds its own apiserver: the one live Lease of that hostname.
	if id, err := with.Topology.ResolveLocal("cp-a"); err != nil || id != "apiserver-tqsyvnc7rs47fayzipsuqpfg4m" {
		t.Errorf("ResolveLocal(cp-a) = %q, %v; want apiserver-tqsyvnc7rs47fayzipsuqpfg4m", id, err)
	}

	objs, err := objects.DecodeFixture(strings.NewReader(mixedFixture + forged))
	if err != nil {
		t.Fatal(err)
	}
	verified(&objs, "apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay")
	topo, _ := objects.Build(objs, opts)
	if !slices.Contains(topo.Live(), "apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay") || topo.Sources["apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay"].AwaitingDiscovery {
		t.Errorf("verified: live %v, source %+v", topo.Live(), topo.Sources["apiserver-r2wj45hxfjj5gvi6cdsk4ea2ay"])
	}
}
