package plan_test

import (
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// TestDestination lists every variant: each outcome (and each refusal of the proxy
// certificate) for each request kind, certificate × upgrade. A kind dropped from
// plan.RequestKinds, or one added without a row here, fails it.
func TestDestination(t *testing.T) {
	const set = "kube-apiservers-only-cp-a+cp-c"
	var (
		own         = plan.RequestKind{}
		upgrade     = plan.RequestKind{Upgrade: true}
		cert        = plan.RequestKind{ProxyCert: true}
		certUpgrade = plan.RequestKind{ProxyCert: true, Upgrade: true}
	)
	routes := map[string]plan.Route{
		"default":          {Outcome: topology.Default, Cluster: "kube-apiservers"},
		"local":            {Outcome: topology.Default, Cluster: "kube-apiserver-local"},
		"not served":       {Outcome: topology.NotServed, Cluster: "kube-apiservers"},
		"subset":           {Outcome: topology.Subset, Cluster: set, Servers: topology.ServerSet{"a", "c"}},
		"unavailable":      {Outcome: topology.Unavailable, Servers: topology.ServerSet{"d"}},
		"default, refused": {Outcome: topology.Default, Cluster: "kube-apiservers", ProxyCertRefused: topology.ServerSet{"a"}},
		"subset, refused":  {Outcome: topology.Subset, Cluster: set, Servers: topology.ServerSet{"a"}, ProxyCertRefused: topology.ServerSet{"a"}},
	}
	type want struct {
		cluster, set string
		refused      plan.Refusal
	}
	unavailable := want{refused: plan.RefusedUnavailable}
	certRefused := want{refused: plan.RefusedProxyCert}
	for _, tc := range []struct {
		route string
		kind  plan.RequestKind
		want  want
	}{
		{"default", own, want{cluster: "kube-apiservers"}},
		{"default", upgrade, want{cluster: "kube-apiservers/http1"}},
		{"default", cert, want{cluster: "kube-apiservers/front-proxy"}},
		{"default", certUpgrade, want{cluster: "kube-apiservers/front-proxy/http1"}},

		{"local", own, want{cluster: "kube-apiserver-local"}},
		{"local", upgrade, want{cluster: "kube-apiserver-local/http1"}},
		{"local", cert, want{cluster: "kube-apiserver-local/front-proxy"}},
		{"local", certUpgrade, want{cluster: "kube-apiserver-local/front-proxy/http1"}},

		{"not served", own, want{cluster: "kube-apiservers"}},
		{"not served", upgrade, want{cluster: "kube-apiservers/http1"}},
		{"not served", cert, want{cluster: "kube-apiservers/front-proxy"}},
		{"not served", certUpgrade, want{cluster: "kube-apiservers/front-proxy/http1"}},

		{"subset", own, want{cluster: "kube-apiservers-serving", set: set}},
		{"subset", upgrade, want{cluster: "kube-apiservers-serving/http1", set: set}},
		{"subset", cert, want{cluster: "kube-apiservers-serving/front-proxy", set: set}},
		{"subset", certUpgrade, want{cluster: "kube-apiservers-serving/front-proxy/http1", set: set}},

		{"unavailable", own, unavailable},
		{"unavailable", upgrade, unavailable},
		{"unavailable", cert, unavailable},
		{"unavailable", certUpgrade, unavailable},

		{"default, refused", own, want{cluster: "kube-apiservers"}},
		{"default, refused", upgrade, want{cluster: "kube-apiservers/http1"}},
		{"default, refused", cert, certRefused},
		{"default, refused", certUpgrade, certRefused},

		{"subset, refused", own, want{cluster: "kube-apiservers-serving", set: set}},
		{"subset, refused", upgrade, want{cluster: "kube-apiservers-serving/http1", set: set}},
		{"subset, refused", cert, certRefused},
		{"subset, refused", certUpgrade, certRefused},
	} {
		d := routes[tc.route].Destination(tc.kind)
		got := want{set: d.ServingSet, refused: d.Refused}
		if d.Cluster.Base != "" {
			got.cluster = d.Cluster.String()
		}
		if got != tc.want {
			t.Errorf("%s, %+v: %+v, want %+v", tc.route, tc.kind, got, tc.want)
		}
	}

	// The rows above name every kind there is, and nothing else.
	tableKinds := []plan.RequestKind{own, upgrade, cert, certUpgrade}
	if len(plan.RequestKinds) != len(tableKinds) {
		t.Errorf("plan.RequestKinds has %d kinds, want %d: %v", len(plan.RequestKinds), len(tableKinds), plan.RequestKinds)
	}
	for _, k := range tableKinds {
		if i := k.Index(); i < 0 || i >= len(plan.RequestKinds) || plan.RequestKinds[i] != k {
			t.Errorf("%+v.Index() = %d, not its place in plan.RequestKinds %v", k, i, plan.RequestKinds)
		}
	}
}
