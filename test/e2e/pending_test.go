package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/objects"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestNewCRDPending: a CRD that no apiserver serves yet answers through kube-mvp 503 with
// Retry-After (client-go retries it) for objects.PendingWindow after its creation, where an
// apiserver answers 404; afterwards kube-mvp answers as the apiservers do. The test arranges
// a CRD no apiserver will ever serve, so nothing depends on how fast they take one in: its
// kind is another CRD's of the group, so its names are never accepted.
func TestNewCRDPending(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	e := newEnv(t, ctx,
		controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"},
		controlplane.ServerSpec{Name: "cp-b", Version: "v1.36.4"},
	)
	k := e.startKubeMVP(ctx, "front", "")
	hc := e.rawClient(&e.cp.PKI.Admin)
	type answer struct {
		code       int
		retryAfter string
		body       string
	}
	do := func(method, url, body string) answer {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return answer{body: err.Error()}
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		return answer{res.StatusCode, res.Header.Get("Retry-After"), string(b)}
	}
	crd := func(plural, kind string) string {
		return `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"` + plural + `.pending.example.com"},
		"spec":{"group":"pending.example.com","scope":"Namespaced","names":{"plural":"` + plural + `","kind":"` + kind + `"},
		"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`
	}
	cpA := "https://" + e.cp.Server("cp-a").Address()
	crds := cpA + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
	if a := do("POST", crds, crd("gizmos", "Gizmo")); a.code != http.StatusCreated {
		t.Fatalf("creating gizmos.pending.example.com: %d %s", a.code, a.body)
	}
	gizmos := k.Endpoint() + "/apis/pending.example.com/v1/namespaces/default/gizmos"
	testutil.WaitFor(t, ctx, time.Minute, "gizmos served through kube-mvp", func() error {
		if a := do("GET", gizmos, ""); a.code != http.StatusOK {
			return fmt.Errorf("GET gizmos: %d %.200s", a.code, a.body)
		}
		return nil
	})

	// gadgets claims the kind Gizmo too: its names are never accepted, no apiserver serves it.
	created := time.Now()
	if a := do("POST", crds, crd("gadgets", "Gizmo")); a.code != http.StatusCreated {
		t.Fatalf("creating gadgets.pending.example.com: %d %s", a.code, a.body)
	}
	path := "/apis/pending.example.com/v1/namespaces/default/gadgets"
	if a := do("GET", cpA+path, ""); a.code != http.StatusNotFound {
		t.Fatalf("cp-a answers GET gadgets %d; the test needs a CRD no apiserver serves (404): %.200s", a.code, a.body)
	}
	testutil.WaitFor(t, ctx, 20*time.Second, "kube-mvp answers the new CRD's gadgets 503 with Retry-After", func() error {
		a := do("GET", k.Endpoint()+path, "")
		if a.code != http.StatusServiceUnavailable || a.retryAfter != "1" || !strings.Contains(a.body, "new CustomResourceDefinition") {
			return fmt.Errorf("GET gadgets: %d Retry-After %q %.200s", a.code, a.retryAfter, a.body)
		}
		return nil
	})
	// Once the CRD is older than the window, kube-mvp answers as the apiservers do (the
	// re-judging tick takes the CRD out of the pending ones).
	testutil.WaitFor(t, ctx, objects.PendingWindow+30*time.Second, "gadgets 404 through kube-mvp once the CRD is old", func() error {
		a := do("GET", k.Endpoint()+path, "")
		if a.code == http.StatusServiceUnavailable && time.Since(created) < objects.PendingWindow-5*time.Second {
			return fmt.Errorf("still pending (%s after its creation)", time.Since(created).Round(time.Second))
		}
		if a.code != http.StatusNotFound {
			return fmt.Errorf("GET gadgets: %d %.200s", a.code, a.body)
		}
		return nil
	})
	if age := time.Since(created); age < objects.PendingWindow-5*time.Second {
		t.Errorf("gadgets answered 404 %s after its creation, within the pending window of %s", age.Round(time.Second), objects.PendingWindow)
	}
}
