package contract_test

import (
	"testing"

	"github.com/kube-mvp/kube-mvp/internal/contract"
)

// TestClusterName: the names Envoy sees, and ParseClusterName reverses String.
func TestClusterName(t *testing.T) {
	for _, tc := range []struct {
		c    contract.ClusterName
		want string
	}{
		{contract.ClusterName{Base: contract.ClusterDefault}, "kube-apiservers"},
		{contract.ClusterName{Base: contract.ClusterDefault, ProxyCert: true}, "kube-apiservers/front-proxy"},
		{contract.ClusterName{Base: contract.ClusterServingSets, HTTP1: true}, "kube-apiservers-serving/http1"},
		{contract.ClusterName{Base: contract.ClusterLocal, ProxyCert: true, HTTP1: true}, "kube-apiserver-local/front-proxy/http1"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.c, got, tc.want)
		}
		if got := contract.ParseClusterName(tc.want); got != tc.c {
			t.Errorf("ParseClusterName(%q) = %+v, want %+v", tc.want, got, tc.c)
		}
	}
}
