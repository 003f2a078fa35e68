package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// TestSummaryOfARealRun: go test -json of testdata/sample, summarized.
func TestSummaryOfARealRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	cmd := exec.Command("go", "test", "-count=1", "-json", "./testdata/sample")
	var stream bytes.Buffer
	cmd.Stdout = &stream
	if err := cmd.Run(); err == nil {
		t.Fatal("go test of the sample passed; it has a failing test")
	}
	var out bytes.Buffer
	s, err := summarize(&stream, &out)
	if err != nil {
		t.Fatal(err)
	}
	want := "sample: 5 tests run: 1 passed, 3 skipped (2: needs a; 1: needs b), 1 failed (TestFails)"
	if got := s.line("sample"); got != want || !s.failed() {
		t.Errorf("summary\n%s\nwant\n%s (failed %v)", got, want, s.failed())
	}
	if !strings.Contains(out.String(), "broken") || !strings.Contains(out.String(), "--- SKIP: TestSkipsForB") {
		t.Errorf("the tests' output was not passed through:\n%s", out.String())
	}
}

// TestBuildFailureFails: a package that fails without a failing test (a build failure, a
// TestMain that exits 1) fails the summary.
func TestBuildFailureFails(t *testing.T) {
	in := strings.NewReader(`{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Output":"FAIL\tp [setup failed]\n"}
{"Action":"fail","Package":"p"}
`)
	s, err := summarize(in, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.failed() || !strings.Contains(s.line("x"), "FAILED packages") {
		t.Errorf("a failed package passed: %s", s.line("x"))
	}
}
