package xds

import (
	"maps"
	"slices"
)

// Joining returns the IDs of the live apiservers still held out of the default cluster.
func (s *Server) Joining() []string { return slices.Sorted(maps.Keys(s.Hold().Joining)) }

// Lingering returns the names of the clusters kept only for an older routing table.
func (s *Server) Lingering() []string { return slices.Sorted(maps.Keys(s.Hold().Lingering)) }
