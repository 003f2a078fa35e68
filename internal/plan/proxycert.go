package plan

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Requests whose identity kube-mvp sets go to the front-proxy variants of the clusters, which
// present the proxy certificate. An apiserver that takes it for an ordinary client's
// (topology.APIServer.Dangerous, from extproc's check) would run them as the certificate's
// user, so the front-proxy variant of every cluster leaves it out (Plan.ProxyCertExcluded),
// and where every member is dangerous (Route.ProxyCertRefused, Cluster.ProxyCertRefused) the
// request gets a 503 with Retry-After naming them and what to fix (ProxyCertRefusal).
// Requests with the caller's own credentials are not affected.
// Why: docs/security.md#a-dangerous-apiserver-gets-no-request-whose-identity-kube-mvp-sets.

// refusedIfAll is members when it is not empty and every member is in dangerous; nil
// otherwise.
func refusedIfAll(members, dangerous topology.ServerSet) topology.ServerSet {
	if len(members) == 0 || len(dangerous) == 0 {
		return nil
	}
	for _, id := range members {
		if !dangerous.Contains(id) {
			return nil
		}
	}
	return members
}

// Bounds of ProxyCertRefusal's message: it is the body of a direct response in Envoy's
// route configuration, which Envoy refuses above 4 KiB (max_direct_response_body_size_bytes).
const (
	refusalMaxNamed  = 3
	refusalMaxReason = 600
)

// ProxyCertRefusal is the message of the 503 that a request whose identity kube-mvp sets
// gets when the apiservers ids, every one that could serve it, are all dangerous: each
// (at most three, then how many more) by hostname and ID with the reason extproc's check
// gave, which says what to fix. servers are the apiservers of the topology or routing table.
func ProxyCertRefusal(servers []topology.APIServer, ids topology.ServerSet) string {
	var b strings.Builder
	b.WriteString("kube-mvp: every apiserver that could serve this request takes kube-mvp's proxy " +
		"certificate for an ordinary client's, so the request would run as the certificate's " +
		"user, not as you; kube-mvp sends it to none of them until that is fixed: ")
	for i, id := range ids {
		if i == refusalMaxNamed {
			fmt.Fprintf(&b, "; and %d more (xds-server's /debug/topology lists them)", len(ids)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		var s topology.APIServer
		for _, c := range servers {
			if c.ID == id {
				s = c
				break
			}
		}
		reason := cmp.Or(s.Dangerous, "found dangerous by extproc's proxy certificate check")
		if len(reason) > refusalMaxReason {
			reason = strings.ToValidUTF8(reason[:refusalMaxReason], "") + "…"
		}
		fmt.Fprintf(&b, "%s (%s): %s", cmp.Or(s.Hostname, id), id, reason)
	}
	return b.String()
}
