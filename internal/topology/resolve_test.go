package topology_test

import (
	"strings"
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestResolveLocal: a sidecar names its apiserver by ID, or by a hostname exactly one live
// apiserver carries (or exactly one apiserver, when none is live: its own restarting). A
// second live Lease with the node's hostname, as anyone who may write Leases can make, is
// refused rather than believed.
func TestResolveLocal(t *testing.T) {
	tp, err := topology.New([]topology.APIServer{
		{ID: "apiserver-tqsyvnc7rs47fayzipsuqpfg4m", Hostname: "cp-a", Address: "10.0.0.1:6443", Alive: true, Verified: true},
		{ID: "apiserver-imkgstwjs6opnbwk2ixluu6fiq", Hostname: "cp-b", Address: "10.0.0.2:6443"}, // restarting
		{ID: "apiserver-npbtitaxiimvptb5rwlxt4xbci", Hostname: "cp-c", Address: "10.0.0.3:6443", Alive: true, Verified: true},
		{ID: "apiserver-forged", Hostname: "cp-c", Address: "10.9.9.9:6443", Alive: true, Verified: true},
		{ID: "apiserver-old", Hostname: "cp-a", Address: "10.0.0.1:6443"}, // its Lease before a restart
		{ID: "apiserver-d1", Hostname: "cp-d"},
		{ID: "apiserver-d2", Hostname: "cp-d"},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, want, err string }{
		{"apiserver-npbtitaxiimvptb5rwlxt4xbci", "apiserver-npbtitaxiimvptb5rwlxt4xbci", ""},
		{"apiserver-forged", "apiserver-forged", ""},         // by ID: the operator said so
		{"cp-a", "apiserver-tqsyvnc7rs47fayzipsuqpfg4m", ""}, // the live one of two
		{"cp-b", "apiserver-imkgstwjs6opnbwk2ixluu6fiq", ""}, // the only one, restarting
		{"cp-c", "", `2 live apiservers carry hostname "cp-c" (apiserver-forged, apiserver-npbtitaxiimvptb5rwlxt4xbci): name the local one by ID`},
		{"cp-d", "", `2 apiservers, none live, carry hostname "cp-d"`},
		{"cp-x", "", `no apiserver has ID or hostname "cp-x"`},
	} {
		got, err := tp.ResolveLocal(c.name)
		if got != c.want || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ResolveLocal(%q) = %q, %v; want %q, %q", c.name, got, err, c.want, c.err)
		}
	}
}
