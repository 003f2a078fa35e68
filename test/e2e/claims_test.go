package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// TestClaimsLeaveBuiltinRouting: cp-b runs with events.k8s.io/v1 off, so kube-mvp sends
// that group/version to cp-a. A CRD widgets.events.k8s.io (which anyone allowed to create
// CRDs may create; its automanaged APIService then says every apiserver serves
// events.k8s.io/v1) and an APIService v1alpha9.events.k8s.io with a service must change
// nothing for events.k8s.io/v1 events: not one 404 while xds-server takes them in, and the
// CRD's own resource is served through kube-mvp too.
func TestClaimsLeaveBuiltinRouting(t *testing.T) {
	ctx := testutil.Context(t, 5*time.Minute)
	e := newEnv(t, ctx,
		controlplane.ServerSpec{Name: "cp-a", Version: "v1.37.1"},
		controlplane.ServerSpec{Name: "cp-b", Version: "v1.37.1", RuntimeConfig: []string{"events.k8s.io/v1=false"}},
	)
	k := e.startKubeMVP(ctx, "front", "")
	admin, err := e.cp.PKI.ClientCert("claims-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	hc := e.rawClient(&admin)
	do := func(method, url, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		return res.StatusCode, string(b)
	}
	cpA := "https://" + e.cp.Server("cp-a").Address()
	cpB := "https://" + e.cp.Server("cp-b").Address()
	if code, body := do("POST", cpA+"/apis/events.k8s.io/v1/namespaces/default/events", `{"apiVersion":"events.k8s.io/v1","kind":"Event",
		"metadata":{"name":"e1"},"eventTime":"2026-11-29T08:00:00.000000Z","reportingController":"kube-mvp.io/e2e","reportingInstance":"e2e",
		"action":"Test","reason":"Test","type":"Normal","regarding":{"kind":"Namespace","name":"default","apiVersion":"v1"}}`); code != http.StatusCreated {
		t.Fatalf("creating an events.k8s.io/v1 Event on cp-a: %d %s", code, body)
	}
	event := k.Endpoint() + "/apis/events.k8s.io/v1/namespaces/default/events/e1"
	if code, _ := do("GET", cpB+"/apis/events.k8s.io/v1/namespaces/default/events/e1", ""); code != http.StatusNotFound {
		t.Fatalf("cp-b answers events.k8s.io/v1 with %d; the test needs it off there (404)", code)
	}
	// Before the claims: every GET reaches cp-a.
	for i := range 20 {
		if code, body := do("GET", event, ""); code != http.StatusOK {
			t.Fatalf("GET %d through kube-mvp before the claims: %d %s", i, code, body)
		}
	}

	if code, body := do("POST", cpB+"/apis/apiextensions.k8s.io/v1/customresourcedefinitions", `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
		"metadata":{"name":"widgets.events.k8s.io","annotations":{"api-approved.kubernetes.io":"unapproved, a test of kube-mvp"}},
		"spec":{"group":"events.k8s.io","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget","listKind":"WidgetList"},
		"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`); code != http.StatusCreated {
		t.Fatalf("creating the CRD widgets.events.k8s.io: %d %s", code, body)
	}
	if code, body := do("POST", cpA+"/apis/apiregistration.k8s.io/v1/apiservices", `{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService",
		"metadata":{"name":"v1alpha9.events.k8s.io"},"spec":{"group":"events.k8s.io","version":"v1alpha9",
		"service":{"namespace":"default","name":"claims","port":443},"insecureSkipTLSVerify":true,"groupPriorityMinimum":1000,"versionPriority":1}}`); code != http.StatusCreated {
		t.Fatalf("creating the APIService v1alpha9.events.k8s.io: %d %s", code, body)
	}

	// xds-server takes both claims in (the APIService, created second, shows in
	// /debug/topology); all the while, and for the routing table's delay and the apiservers'
	// discovery refetches after, every GET must reach cp-a.
	var failures []string
	get := func(when string) {
		if code, body := do("GET", event, ""); code != http.StatusOK {
			failures = append(failures, fmt.Sprintf("%s: %d %.200s", when, code, body))
		}
	}
	testutil.WaitFor(t, ctx, time.Minute, "xds-server sees the APIService", func() error {
		get("while xds-server takes the claims in")
		if !strings.Contains(httpGet(t, k.XDSAdmin+"/debug/topology"), `"events.k8s.io/v1alpha9"`) {
			return fmt.Errorf("/debug/topology does not name events.k8s.io/v1alpha9 yet")
		}
		return nil
	})
	widgets := k.Endpoint() + "/apis/events.k8s.io/v1/namespaces/default/widgets"
	testutil.WaitFor(t, ctx, time.Minute, "the CRD's widgets served through kube-mvp, 10 in a row", func() error {
		get("while the CRD is established")
		for range 10 {
			if code, body := do("GET", widgets, ""); code != http.StatusOK {
				return fmt.Errorf("GET widgets: %d %.200s", code, body)
			}
		}
		return nil
	})
	deadline := time.Now().Add(15 * time.Second)
	n := 0
	for ; time.Now().Before(deadline); n++ {
		get("after the claims")
		time.Sleep(50 * time.Millisecond)
	}
	if len(failures) > 0 {
		t.Errorf("%d GETs of an events.k8s.io/v1 Event through kube-mvp failed after a CRD and an APIService claimed the group (want none):\n%s",
			len(failures), strings.Join(failures, "\n"))
	}
	t.Logf("%d GETs after the claims, all from cp-a", n)
}
