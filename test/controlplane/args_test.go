package controlplane

import (
	"slices"
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
