package controlplane

import (
	"slices"
	"strings"
	"testing"
)

// TestArgsOverride: a flag in ServerSpec.Args replaces the default of that name instead of
// adding to it (kube-apiserver appends repeated list flags).
func TestArgsOverride(t *testing.T) {
	defaults := []string{"--requestheader-allowed-names=" + ProxyClientCN, "--requestheader-username-headers=X-Remote-User", "--profiling=false"}
	got := withOverrides(defaults, []string{"--requestheader-allowed-names=someone-else", "--anonymous-auth=false"})
	want := []string{"--requestheader-username-headers=X-Remote-User", "--profiling=false", "--requestheader-allowed-names=someone-else", "--anonymous-auth=false"}
	if !slices.Equal(got, want) {
		t.Errorf("args %q, want %q", got, want)
	}
	if got := withOverrides(defaults, nil); !slices.Equal(got, defaults) {
		t.Errorf("no extra args: %q", got)
	}
	if defaults[0] != "--requestheader-allowed-names="+ProxyClientCN {
		t.Error("the defaults were modified")
	}
}

// TestClusterDefaultsArgs: with ClusterDefaults a server gets no --feature-gates and no
// alpha API; without, the gates and the StorageVersion API the tests use. Which Leases carry an
// address follows the release (DefaultsOf), and a --feature-gates in Args decides over that.
func TestClusterDefaultsArgs(t *testing.T) {
	cp := &ControlPlane{PKI: &PKI{Dir: "/pki"}, dir: "/cp", etcdURL: "http://127.0.0.1:2379", servers: map[string]*Server{}}
	flag := func(args []string, name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
		return "<none>"
	}
	for _, c := range []struct {
		spec            ServerSpec
		gates, runtime  string
		leaseHasAddress bool
		wantErr         bool
	}{
		{ServerSpec{Name: "a", Version: "v1.35.8"}, "StorageVersionAPI=true,APIServerIdentity=true,UnknownVersionInteroperabilityProxy=true", "internal.apiserver.k8s.io/v1alpha1=true", true, false},
		{ServerSpec{Name: "b", Version: "v1.35.8", ClusterDefaults: true, RuntimeConfig: []string{"batch/v1=false"}}, "<none>", "batch/v1=false", false, false},
		{ServerSpec{Name: "c", Version: "v1.36.4", ClusterDefaults: true}, "<none>", "<none>", true, false},
		{ServerSpec{Name: "d", Version: "v1.37.1", ClusterDefaults: true}, "<none>", "<none>", true, false},
		{ServerSpec{Name: "e", Version: "v1.37.1", Args: []string{"--feature-gates=APIServerIdentity=true"}}, "APIServerIdentity=true", "internal.apiserver.k8s.io/v1alpha1=true", true, false},
		{ServerSpec{Name: "f", Version: "v1.37.1", ClusterDefaults: true,
			Args: []string{"--feature-gates=UnknownVersionInteroperabilityProxy=false"}},
			"UnknownVersionInteroperabilityProxy=false", "<none>", false, false},
		{ServerSpec{Name: "g", Version: "v1.35.8", ClusterDefaults: true, PeerProxy: true}, "", "", false, true},
		{ServerSpec{Name: "h", Version: "v1.34.0", ClusterDefaults: true}, "", "", false, true},
	} {
		s := &Server{Spec: c.spec, cp: cp, Port: 6443}
		args, err := s.args()
		if (err != nil) != c.wantErr {
			t.Errorf("%s: error %v, want error %v", c.spec.Name, err, c.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		cp.servers[c.spec.Name] = s
		if got := flag(args, "--feature-gates"); got != c.gates {
			t.Errorf("%s: --feature-gates %q, want %q", c.spec.Name, got, c.gates)
		}
		if got := flag(args, "--runtime-config"); got != c.runtime {
			t.Errorf("%s: --runtime-config %q, want %q", c.spec.Name, got, c.runtime)
		}
		if got := s.LeaseHasAddress(); got != c.leaseHasAddress {
			t.Errorf("%s: LeaseHasAddress %v, want %v", c.spec.Name, got, c.leaseHasAddress)
		}
	}
	if got, want := cp.AddressesFlag(), "b=127.0.0.1:6443,f=127.0.0.1:6443"; got != want {
		t.Errorf("AddressesFlag %q, want %q", got, want)
	}
}
