package inventory

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kube-mvp/kube-mvp/internal/objects"
)

// TestDiscoveryRefetchRule walks the watcher's decision of when to fetch an apiserver's
// discovery again, on a clock the test sets: a new apiserver at once and once more after
// settleRefetch; after a CRD or APIService change once nothing changed for apisPublish (no
// sooner than minQuietRefetch after the last fetch, no later than minRefetch after the first
// change), and once more apisSettle after the last change; otherwise not before the
// DiscoveryInterval. An apiserver that never answered is asked again every settleRefetch: it
// takes no part in routing until it does. The fetches themselves fail (nothing listens);
// answered marks them as successful. What is checked is the decision: the time of the last
// fetch started.
func TestDiscoveryRefetchRule(t *testing.T) {
	testRefetchRule(t, true)
	testRefetchRule(t, false)
}

func testRefetchRule(t *testing.T, answers bool) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	id := objects.APIServerIDFor("cp-a")
	w := &Watcher{
		cfg:       &rest.Config{},
		opts:      WatchOptions{DiscoveryInterval: time.Hour, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		kick:      make(chan struct{}, 1),
		discovery: map[string]discovered{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // fetches fail at once
	holder := id + "_1"
	lease := func(now time.Time) []coordinationv1.Lease {
		renew := metav1.NewMicroTime(now)
		return []coordinationv1.Lease{{
			ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: "kube-system",
				Labels:      map[string]string{objects.IdentityLabel: objects.IdentityLabelValue, objects.HostnameLabel: "cp-a"},
				Annotations: map[string]string{objects.PeerAdvertiseAnnotation: "127.0.0.1:1"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renew},
		}}
	}
	at := func(after time.Duration) time.Time { return t0.Add(after) }
	// step asks for discovery at t0+after and checks whether a fetch started then.
	step := func(after time.Duration, wantFetch bool, why string) {
		t.Helper()
		now := at(after)
		w.discoveryFor(ctx, lease(now), objects.Options{Now: now, LivenessWindow: 30 * time.Second})
		w.mu.Lock()
		fetched := w.discovery[id].fetched
		w.mu.Unlock()
		if got := fetched.Equal(now); got != wantFetch {
			t.Errorf("answers %v, t0+%s (%s): fetch started %v, want %v (last fetch t0+%s)", answers, after, why, got, wantFetch, fetched.Sub(t0))
		}
		if answers { // as if the fetch had succeeded
			w.mu.Lock()
			d := w.discovery[id]
			d.list = &apidiscoveryv2.APIGroupDiscoveryList{}
			w.discovery[id] = d
			w.mu.Unlock()
		}
	}
	apisChanged := func(after time.Duration) { w.noteAPIsChanged(at(after)) }

	step(0, true, "a new apiserver")
	step(2*time.Second, false, "just fetched")
	step(6*time.Second, true, "settling: once more after settleRefetch")
	if !answers {
		step(8*time.Second, false, "never answered, fetched less than settleRefetch ago")
		step(12*time.Second, true, "never answered: again after settleRefetch")
		return
	}
	step(20*time.Second, false, "settled, within DiscoveryInterval")

	apisChanged(30 * time.Second)
	step(30*time.Second+500*time.Millisecond, true, "a CRD changed after the last fetch")
	step(32*time.Second, false, "fetched after the change, apisSettle not over")
	step(33*time.Second+500*time.Millisecond, true, "apisSettle over: once more")
	step(40*time.Second, false, "fetched after the change settled")

	apisChanged(45 * time.Second)
	step(45*time.Second+50*time.Millisecond, false, "another change, not apisPublish old yet")
	step(45*time.Second+200*time.Millisecond, true, "nothing changed for apisPublish")
	apisChanged(45*time.Second + 300*time.Millisecond)
	step(45*time.Second+350*time.Millisecond, false, "changed again, fetched less than minQuietRefetch ago")
	step(45*time.Second+450*time.Millisecond, true, "minQuietRefetch over, quiet for apisPublish")

	// A change every 80 ms (a chart applying CRDs): never quiet, fetched minRefetch after the
	// first change the last fetch did not see.
	for ms := 0; ms <= 1000; ms += 80 {
		apisChanged(46*time.Second + time.Duration(ms)*time.Millisecond)
		step(46*time.Second+time.Duration(ms+40)*time.Millisecond, ms+40 >= 1000, "changes every 80 ms")
	}
	step(49*time.Second+500*time.Millisecond, false, "fetched after the last change, apisSettle not over")
	step(50*time.Second, true, "apisSettle after the last change over")
	step(52*time.Second, false, "settled")

	step(2*time.Hour, true, "DiscoveryInterval over")
}

// TestNewlyReported: a bad object is logged when it first appears, not again at every
// rebuild while it stays, and again when it comes back after it was fixed.
func TestNewlyReported(t *testing.T) {
	a, b := errors.New("Lease kube-system/x rejected"), errors.New("Lease kube-system/y rejected")
	var prev map[string]bool
	for i, step := range []struct {
		errs, want []error
	}{
		{[]error{a}, []error{a}},
		{[]error{a}, nil},
		{[]error{a, b, b}, []error{b}},
		{nil, nil},
		{[]error{a}, []error{a}},
	} {
		var got []error
		got, prev = newlyReported(prev, step.errs)
		if !slices.Equal(got, step.want) {
			t.Errorf("step %d: logged %v, want %v", i, got, step.want)
		}
	}
}
