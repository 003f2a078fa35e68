package controlplane

import (
	"context"
	"testing"
)

// MixedServers are the usual mixed two-version control plane of the tests: cp-a v1.37.1 with
// every API, cp-b v1.36.4 with batch/v1 turned off. Each call returns new specs, which the
// caller may change.
func MixedServers() []ServerSpec {
	return []ServerSpec{
		{Name: "cp-a", Version: "v1.37.1"},
		{Name: "cp-b", Version: "v1.36.4", RuntimeConfig: []string{"batch/v1=false"}},
	}
}

// ForTest skips the test under -short, else starts a control plane as StartForTest does.
func ForTest(t testing.TB, ctx context.Context, opts Options) *ControlPlane {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real control plane")
	}
	return StartForTest(t, ctx, opts)
}

// StartForTest starts a control plane (see Start), fails the test if that fails, and closes
// it when the test and its subtests have ended (t.Cleanup). Unlike ForTest it runs under
// -short too.
func StartForTest(t testing.TB, ctx context.Context, opts Options) *ControlPlane {
	t.Helper()
	cp, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	return cp
}
