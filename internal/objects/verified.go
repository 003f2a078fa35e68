package objects

import (
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Whether an apiserver is verified. Everything that decides it is in this file:
//
//   - An identity Lease is only a claim, which anyone who may write Leases in kube-system can
//     make; a forged one pointing at any address must change nothing. So an apiserver is
//     Verified only once its own discovery is in Objects.Discovery: fetched by the watcher at
//     the Lease's address over TLS verified against the cluster's CA (internal/inventory),
//     or given by a fixture (an APIServerDiscovery object).
//   - Liveness (its Lease's renewals: liveness.go) is separate; topology.APIServer.Routable
//     needs both, and an address.

// Verify sets Verified on each of servers whose discovery is in discovery, and returns the
// IDs awaiting it: alive with an address, so the watcher fetches their discovery, but not
// fetched yet (topology.Source.AwaitingDiscovery).
func Verify(servers []topology.APIServer, discovery map[string]*apidiscoveryv2.APIGroupDiscoveryList) (awaiting map[string]bool) {
	awaiting = map[string]bool{}
	for i, s := range servers {
		servers[i].Verified = discovery[s.ID] != nil
		if s.Alive && s.Address != "" && !servers[i].Verified {
			awaiting[s.ID] = true
		}
	}
	return awaiting
}
