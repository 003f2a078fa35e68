package dataplane

import (
	"bufio"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/kube-mvp/kube-mvp/internal/extproc"
)

// holdingProcessor is internal/extproc as it was before it ended its streams itself: it
// answers, then waits for Envoy to end the stream.
type holdingProcessor struct{ *extproc.Server }

func (h holdingProcessor) Process(s grpc.BidiStreamingServer[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]) error {
	if err := h.Server.Process(s); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// TestExtProcStreamLifetime: a watch extproc decided (batch/v1, cp-a only) and the processor
// going away while it runs. Modelling 1.36, the data plane holds the ext_proc stream for the
// request's life: a processor that does not end it takes the watch down with it (reset), one
// that ends it after its answer (internal/extproc) leaves the watch alone. 1.37 and newer end
// the stream themselves after the last response.
func TestExtProcStreamLifetime(t *testing.T) {
	for _, c := range []struct {
		name, version string
		holds         bool // the processor waits for Envoy to end the stream
		reset         bool
	}{
		{"1.36 held by a processor that waits", "1.36.7", true, true},
		{"1.36 ended by extproc", "1.36.7", false, false},
		{"1.37 closes it itself", "1.37.0", true, false},
		{"1.40 closes it itself", "1.40.0", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			step := make(chan struct{})
			srv := extproc.New(extproc.Options{Logger: testLogger(t)})
			var proc extprocv3.ExternalProcessorServer = srv
			if c.holds {
				proc = holdingProcessor{srv}
			}
			e := newEnv(t, envOptions{tick: time.Second, ticks: 3, fake: fakeOptions{watchStep: step}, extProc: proc, envoyVersion: c.version})
			e.setExtProcTable(srv)
			cl := e.client(nil)
			cl.Timeout = 0
			resp, err := cl.Get(e.base + "/apis/batch/v1/namespaces/default/jobs?watch=true")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || e.stat(extProcStreamsStat) != 1 {
				t.Fatalf("watch: %d after %d ext_proc streams, want 200 after one (extproc decides batch/v1)", resp.StatusCode, e.stat(extProcStreamsStat))
			}
			br := bufio.NewReader(resp.Body)
			event := func(i int) error {
				select {
				case step <- struct{}{}:
				case <-time.After(20 * time.Second):
					t.Fatalf("the fake did not take event %d", i)
				}
				_, err := br.ReadString('\n')
				return err
			}
			if err := event(0); err != nil {
				t.Fatalf("first event: %v", err)
			}
			if c.version == "1.36.7" && !c.holds {
				// extproc ended the held stream after its answer, before the processor goes.
				e.waitStat(t, "http.kube_apiserver.ext_proc.kube_mvp.streams_closed", 1)
			}
			e.extGRPC.Stop() // the processor goes: its streams fail (Unavailable)
			if c.reset {
				// The held stream's failure resets the watch: its body ends in an error,
				// with no event stepped.
				e.waitStat(t, "http.kube_apiserver.ext_proc.kube_mvp.streams_failed", 1)
				read := make(chan error, 1)
				go func() { _, err := br.ReadString('\n'); read <- err }()
				select {
				case err := <-read:
					if err == nil {
						t.Errorf("the watch went on after its held ext_proc stream failed")
					}
				case <-time.After(20 * time.Second):
					t.Errorf("the watch was not reset within 20s of its held ext_proc stream failing")
				}
				return
			}
			for i := 1; i < 3; i++ {
				if err := event(i); err != nil {
					t.Errorf("event %d after the processor went: %v", i, err)
				}
			}
			if n := e.stat("http.kube_apiserver.ext_proc.kube_mvp.streams_failed"); n != 0 {
				t.Errorf("streams_failed = %d: a stream was still open when the processor went", n)
			}
		})
	}
}
