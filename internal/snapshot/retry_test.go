package snapshot_test

import (
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// TestRetryPolicies: nothing that may have reached a backend is sent twice. Every route
// retries what never reached an apiserver (connect-failure, refused-stream,
// reset-before-request), and only the class variants retry more: the read and watch variants a
// reset and any answer with Retry-After (reads run any number of times); the write variants the
// apiserver's own refusals, 429 and 503, never another status (a 500 ServerTimeout or 504
// with Retry-After may follow a write that reached etcd), and not at all on an aggregated
// group/version, whose apiservers pass the backend's answers through. The route itself
// (long-running: every proxy, exec, attach, port-forward and log; unclassified; no class)
// and its upgrade variant retry nothing more.
func TestRetryPolicies(t *testing.T) {
	const neverReached = "connect-failure,refused-stream,reset-before-request"
	for _, name := range fixtures.Names(t) {
		t.Run(name, func(t *testing.T) {
			p := mustPlan(t, loadCase(t, name))
			res, err := snapshot.Build(p, testConfig())
			if err != nil {
				t.Fatal(err)
			}
			aggregated := map[string]bool{}
			for _, gv := range p.Aggregated {
				aggregated[gv.String()] = true
			}
			writes, proxiedWrites := 0, 0
			for _, r := range res.Routes[0].(*routev3.RouteConfiguration).GetVirtualHosts()[0].GetRoutes() {
				a := r.GetRoute()
				if a == nil {
					continue // a direct response
				}
				rp := a.GetRetryPolicy()
				if rp.GetNumRetries().GetValue() != 2 || len(rp.GetRetryHostPredicate()) != 1 || rp.GetHostSelectionRetryMaxAttempts() != 20 {
					t.Errorf("%s: %d retries, host predicates %v, %d host selections; want 2 on other hosts", r.GetName(),
						rp.GetNumRetries().GetValue(), rp.GetRetryHostPredicate(), rp.GetHostSelectionRetryMaxAttempts())
				}
				n := strings.TrimSuffix(r.GetName(), snapshot.RouteSuffixProxyCert)
				base, class := n, ""
				for _, s := range []string{snapshot.RouteSuffixUpgrade, snapshot.RouteSuffixRead, snapshot.RouteSuffixWatch, snapshot.RouteSuffixWrite} {
					if b, ok := strings.CutSuffix(n, s); ok {
						base, class = b, s
					}
				}
				on, codes, retryAfter := neverReached, []uint32(nil), false
				switch {
				case class == snapshot.RouteSuffixRead || class == snapshot.RouteSuffixWatch:
					on, retryAfter = neverReached+",retriable-headers,reset", true
				case class == snapshot.RouteSuffixWrite && aggregated[base]:
					proxiedWrites++
				case class == snapshot.RouteSuffixWrite:
					on, codes = neverReached+",retriable-status-codes", []uint32{429, 503}
					writes++
				}
				if rp.GetRetryOn() != on || !slices.Equal(rp.GetRetriableStatusCodes(), codes) {
					t.Errorf("%s: retry_on %q, statuses %v; want %q, %v", r.GetName(), rp.GetRetryOn(), rp.GetRetriableStatusCodes(), on, codes)
				}
				hs := rp.GetRetriableHeaders()
				if gotRetryAfter := len(hs) == 1 && hs[0].GetName() == "retry-after" && hs[0].GetPresentMatch() && !hs[0].GetInvertMatch(); gotRetryAfter != retryAfter || (!retryAfter && len(hs) > 0) {
					t.Errorf("%s: retriable headers %v; want Retry-After %v", r.GetName(), hs, retryAfter)
				}
			}
			if writes == 0 {
				t.Error("no write variant retries the apiservers' refusals")
			}
			if (proxiedWrites == 0) != (len(aggregated) == 0) {
				t.Errorf("%d write variants of aggregated group/versions, %d aggregated group/versions", proxiedWrites, len(aggregated))
			}
		})
	}
}
