package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/inventory"
	"github.com/kube-mvp/kube-mvp/internal/testutil"
	"github.com/kube-mvp/kube-mvp/test/controlplane"
)

// The chart's memory limits (deploy/kube-mvp/values.yaml).
const (
	xdsServerMemoryLimit = 256 << 20
	extprocMemoryLimit   = 128 << 20
)

// TestBloatedCRDs: anyone allowed to create CRDs makes two with 50 served versions and 8,000
// categories of 63 characters each: every apiserver's aggregated /apis grows past 50 MB, over
// xds-server's --max-discovery-body. kube-mvp keeps working: the bloated groups reach the
// merged /apis pruned to the bounds, a CRD created after them still reaches it (the refresh
// of every apiserver's discovery is not blocked), jobs are still listed, and xds-server and
// extproc peak well under the chart's memory limits. Before pruning, each fetch was refused
// whole and the merged /apis stopped following any change.
func TestBloatedCRDs(t *testing.T) {
	ctx := testutil.Context(t, 10*time.Minute)
	e := newEnv(t, ctx, controlplane.MixedServers()...)
	k := e.startKubeMVP(ctx, "front", "")
	hc := e.rawClient(&e.cp.PKI.Admin)
	do := func(method, url, accept, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	cpA := e.cp.Server("cp-a").URL()
	crd := func(group string, versions, categories int) string {
		var vs, cs []string
		for v := range versions {
			vs = append(vs, fmt.Sprintf(`{"name":"v%d","served":true,"storage":%v,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}`, v+1, v == 0))
		}
		for c := range categories {
			cs = append(cs, strconv.Quote(fmt.Sprintf("c%05d-%s", c, strings.Repeat("x", 56))))
		}
		return `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"things.` + group + `"},
			"spec":{"group":"` + group + `","scope":"Namespaced","names":{"plural":"things","singular":"thing","kind":"Thing","listKind":"ThingList",
			"categories":[` + strings.Join(cs, ",") + `]},"versions":[` + strings.Join(vs, ",") + `]}}`
	}
	bloated := []string{"bloat1.e2e.kube-mvp.io", "bloat2.e2e.kube-mvp.io"}
	for _, g := range bloated {
		if code, body := do("POST", cpA+"/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "", crd(g, 50, 8000)); code != http.StatusCreated {
			t.Fatalf("creating the CRD of %s: %d %.300s", g, code, body)
		}
	}
	// The premise: each apiserver's own /apis is far over the limit a fetch keeps.
	for _, s := range []string{"cp-a", "cp-b"} {
		waitFor(t, ctx, s+"'s /apis with both bloated CRDs", func() error {
			code, body := do("GET", e.cp.Server(s).URL()+"/apis", contract.MediaTypeAggregatedDiscovery, "")
			if code != http.StatusOK || len(body) <= 4*inventory.DefaultMaxDiscoveryBody {
				return fmt.Errorf("%d, %d bytes", code, len(body))
			}
			for _, g := range bloated {
				if !bytes.Contains(body, []byte(`"name":"`+g+`"`)) {
					return fmt.Errorf("%d bytes without %s", len(body), g)
				}
			}
			t.Logf("%s: /apis is %d MB", s, len(body)>>20)
			return nil
		})
	}
	if code, body := do("POST", cpA+"/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "", crd("after.e2e.kube-mvp.io", 1, 1)); code != http.StatusCreated {
		t.Fatalf("creating the CRD after them: %d %.300s", code, body)
	}

	waitFor(t, ctx, "the bloated groups, pruned, and the CRD after them in the merged /apis through kube-mvp", func() error {
		code, body := do("GET", k.Endpoint()+"/apis", contract.MediaTypeAggregatedDiscovery, "")
		if code != http.StatusOK {
			return fmt.Errorf("GET /apis: %d", code)
		}
		var l apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(body, &l); err != nil {
			return err
		}
		groups := map[string]apidiscoveryv2.APIGroupDiscovery{}
		for _, g := range l.Items {
			groups[g.Name] = g
		}
		for _, name := range append(bloated, "after.e2e.kube-mvp.io", "batch") {
			if _, ok := groups[name]; !ok {
				return fmt.Errorf("%d bytes, %d groups, no %s", len(body), len(l.Items), name)
			}
		}
		for _, name := range bloated {
			g := groups[name]
			if len(g.Versions) != 50 || len(g.Versions[0].Resources) != 1 || len(g.Versions[0].Resources[0].Categories) != 64 {
				return fmt.Errorf("%s: %d versions, first with %d resources; want 50 versions, things with 64 categories", name, len(g.Versions), len(g.Versions[0].Resources))
			}
		}
		t.Logf("merged /apis through kube-mvp: %d KB, %d groups", len(body)>>10, len(l.Items))
		return nil
	})
	if code, body := do("GET", k.Endpoint()+"/apis/batch/v1/namespaces/default/jobs", "", ""); code != http.StatusOK {
		t.Errorf("listing jobs through kube-mvp: %d %.300s", code, body)
	}
	metrics := httpGet(t, k.XDSAdmin+"/metrics")
	if m := regexp.MustCompile(`(?m)^kube_mvp_xds_discovery_pruned_total (\d+)`).FindStringSubmatch(metrics); m == nil || m[1] == "0" {
		t.Errorf("no pruned discovery counted:\n%s", grepLines(metrics, "kube_mvp_xds_discovery"))
	}
	if !strings.Contains(k.Logs(), "discovery over its bounds") {
		t.Error("xds-server did not log what it left out")
	}
	for _, p := range []struct {
		name  string
		limit int64
	}{{"xds-server", xdsServerMemoryLimit}, {"extproc", extprocMemoryLimit}} {
		peak, err := k.PeakMemory(p.name)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: peak resident memory %d MiB (the chart's limit %d MiB)", p.name, peak>>20, p.limit>>20)
		if peak > p.limit/2 {
			t.Errorf("%s peaked at %d MiB, over half the chart's limit of %d MiB", p.name, peak>>20, p.limit>>20)
		}
	}
}
