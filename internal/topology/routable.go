package topology

import "strings"

// NotRoutable is an apiserver of a topology that takes part in no routing, and why, in words
// for the person who fed kube-mvp its objects.
type NotRoutable struct {
	ID       string `json:"id"`
	Hostname string `json:"hostname,omitempty"`
	Reason   string `json:"reason"`
}

// NotRoutable lists every apiserver of t that requests cannot go to, sorted by ID. A
// topology read from Leases and StorageVersions alone has no routable apiserver at all (each
// needs its own discovery), and its configuration routes every request to a 503; saying so
// is the difference between a fixture mistake and a silent outage.
func (t *Topology) NotRoutable() []NotRoutable {
	var out []NotRoutable
	for _, s := range t.APIServers {
		if s.Routable() {
			continue
		}
		src := t.Sources[s.ID]
		var why []string
		switch {
		case src.AwaitingDiscovery || (s.Alive && !s.Verified && s.Address != ""): // the latter: an address from the memory
			why = append(why, "its own discovery was never read (an apiserver takes part in routing only "+
				"once xds-server fetched its discovery at its address over verified TLS; "+
				"a fixture gives it as a kube-mvp.io/v1alpha1 APIServerDiscovery object)")
		case src.From == SourceRemembered:
			why = append(why, "departed (its Lease is stale or deleted): only remembered, for the serving sets that still name it")
		case !s.Alive:
			why = append(why, "its Lease was not renewed within the liveness window")
		}
		if s.Address == "" {
			why = append(why, "no address is known for it (no peer-advertise annotation on its Lease and none configured for its hostname, or another apiserver holds the address)")
		}
		out = append(out, NotRoutable{ID: s.ID, Hostname: s.Hostname, Reason: strings.Join(why, "; ")})
	}
	return out
}
