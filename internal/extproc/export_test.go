package extproc

import (
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// SetTopology makes the plans of t (plan.ForEveryEnvoy, as xds-server makes them) the
// routing table; see SetTable. A nil t, or one no plan can be made of, is ignored (logged).
func (s *Server) SetTopology(t *topology.Topology, version string) {
	if t == nil {
		return
	}
	tb, err := plan.TableOf(t)
	if err != nil {
		s.log.Error("routing table not used: no plan can be made of it", "version", version, "error", err)
		return
	}
	s.SetTable(tb, version)
}
