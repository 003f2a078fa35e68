package topology_test

import (
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := topology.New([]topology.APIServer{{ID: "a"}, {ID: "a"}}, nil, nil); err == nil {
		t.Error("duplicate IDs accepted")
	}
	if _, err := topology.New([]topology.APIServer{{Hostname: "h"}}, nil, nil); err == nil {
		t.Error("apiserver without ID accepted")
	}
	if _, err := topology.New(nil, map[topology.Resource][]string{{Group: "g", Resource: "r"}: {"a"}}, nil); err == nil {
		t.Error("resource without version accepted")
	}
}
