package extproc

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// TestDecisionLatency: every request_headers message is observed once, whatever its outcome
// (no table, a decision); other messages are not.
func TestDecisionLatency(t *testing.T) {
	srv := New(Options{})
	client := serve(t, "unix", srv)
	call(t, client, request("GET", "/healthz")) // no table yet
	srv.SetTopology(loadFixture(t, "upgrade.yaml", fixtureNow), "v1")
	call(t, client, request("GET", "/apis/batch/v1/jobs"))
	call(t, client, request("GET", "/api/v1/pods"))
	ctx := t.Context()
	if _, err := exchange(ctx, client, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{}}}); err != nil {
		t.Fatal(err)
	}

	mfs, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kube_mvp_extproc_decision_duration_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 3 || h.GetSampleSum() <= 0 || len(h.GetBucket()) != len(decisionBuckets) {
			t.Errorf("histogram: %d samples (want 3), sum %v, %d buckets", h.GetSampleCount(), h.GetSampleSum(), len(h.GetBucket()))
		}
		return
	}
	t.Error("no kube_mvp_extproc_decision_duration_seconds")
}
