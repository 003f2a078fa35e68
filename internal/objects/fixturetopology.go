package objects

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// FixtureView says how to read a fixture as one Envoy would see its control plane.
type FixtureView struct {
	Build Options
	// LocalID, in sidecar mode, is the apiserver the Envoy runs beside; "" for a front proxy.
	LocalID string
	// Dangerous are the apiservers to treat as extproc's proxy certificate check found them,
	// with the reason (xds-server learns that from extproc, never from objects).
	Dangerous map[string]string
}

// LoadFixtureTopology reads the fixture at path into the topology v describes, with every
// warning a person feeding it should see: objects skipped, a LocalID or dangerous apiserver
// no Lease names, and each apiserver that takes part in no routing (with why). The offline
// commands (xds-server translate, kubectl mvp explain -f) share it so they agree.
func LoadFixtureTopology(path string, v FixtureView) (*topology.Topology, []string, error) {
	objs, err := LoadFixture(path)
	if err != nil {
		return nil, nil, err
	}
	topo, errs := Build(objs, v.Build)
	var warnings []string
	for _, e := range errs {
		warnings = append(warnings, fmt.Sprintf("%s: %v", path, e))
	}
	if topo == nil {
		return nil, warnings, fmt.Errorf("%s describes no usable topology", path)
	}
	for _, w := range UnroutableWarnings(topo) {
		warnings = append(warnings, path+": "+w)
	}
	if v.LocalID != "" {
		if _, ok := topo.Server(v.LocalID); !ok {
			warnings = append(warnings, fmt.Sprintf("--node-id %s: no identity Lease in %s names this apiserver; its local cluster is empty", v.LocalID, path))
		}
		topo = topo.WithLocal(v.LocalID)
	}
	if len(v.Dangerous) > 0 {
		for _, id := range slices.Sorted(maps.Keys(v.Dangerous)) {
			if _, ok := topo.Server(id); !ok {
				warnings = append(warnings, fmt.Sprintf("--dangerous-apiserver %s: no identity Lease in %s names this apiserver", id, path))
			}
		}
		topo = topo.WithDangerous(v.Dangerous)
	}
	return topo, warnings, nil
}

// UnroutableWarnings says, per apiserver that takes part in no routing, why, and when none
// does, that every request would be refused: a configuration without a single endpoint is
// valid Envoy configuration, so nothing else would say so.
func UnroutableWarnings(t *topology.Topology) []string {
	var out []string
	for _, n := range t.NotRoutable() {
		out = append(out, fmt.Sprintf("apiserver %s (hostname %q) is not routable: %s", n.ID, n.Hostname, n.Reason))
	}
	if len(t.Live()) == 0 {
		out = append(out, "no apiserver is routable: every request would be answered 503")
	}
	return out
}
