package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/testutil"
)

// TestDemo runs the demo script to its end: the newcomer's first command must keep working,
// and must show what kube-mvp is for.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real control plane")
	}
	ctx := testutil.Context(t, 15*time.Minute)
	var out bytes.Buffer
	if err := run(ctx, &out, true); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^  (round-robin|kube-mvp): (\d) of 6 succeeded$`).FindAllStringSubmatch(out.String(), -1) {
		got[m[1]], _ = strconv.Atoi(m[2])
	}
	if got["kube-mvp"] != 6 {
		t.Errorf("through kube-mvp %d of 6 succeeded", got["kube-mvp"])
	}
	// Connections alternate between cp-a and cp-b, so half fail.
	if rr, ok := got["round-robin"]; !ok || rr == 6 {
		t.Errorf("through round-robin %d of 6 succeeded (found: %v); the contrast is gone", rr, ok)
	}
	for _, want := range []string{"/apis/batch/v1/jobs", "kube-apiservers-only-cp-a", "  FAIL  ",
		// kubectl mvp's status and explain: the serving set inside the cluster Envoy has.
		"batch/v1/jobs", "kube-apiservers-serving", "ROUTE        batch/v1 → extproc-decided:read", "demo  envoy-front",
		// The control plane's channel: no certificate or the wrong role gets nothing.
		"a client without a certificate                     refused: Unavailable",
		"extproc's certificate asking for Envoy's secrets   refused: PermissionDenied",
		"a front Envoy's certificate                        answered: private_key is the file /"} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(out.String())
	}
}
