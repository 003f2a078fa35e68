// Command testsummary reads `go test -json` on its standard input, prints the tests' output as
// `go test -v` would, and ends with one summary line: how many tests ran, passed, were
// skipped (each skip reason counted) and failed. It exits 1 when a test or a package failed
// (a build failure included), 0 otherwise. make test-envoy pipes the end-to-end suite
// through it:
//
//	go test -json ./test/e2e/ | testsummary -title "kube-mvp on envoy 1.40.0"
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
)

func main() {
	title := flag.String("title", "tests", "what the summary line begins with")
	flag.Parse()
	s, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	fmt.Println(s.line(*title))
	if s.failed() {
		os.Exit(1)
	}
}

// event is test2json's (go doc test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

type summary struct {
	passed, nFailed int
	skipped         map[string]int // reason -> tests
	failedTests     []string
	failedPackages  []string
}

// reasonLine is how testing prints t.Skip's message: "    file_test.go:12: reason".
var reasonLine = regexp.MustCompile(`^\s+\S+\.go:\d+: (.+)$`)

// summarize copies the tests' output to out and counts top-level tests (subtests are part of
// their test). A line that is not JSON (go test's own build errors) is copied as it is.
func summarize(in io.Reader, out io.Writer) (*summary, error) {
	s := &summary{skipped: map[string]int{}}
	lastReason := map[string]string{} // package/test -> its last message line
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text())
			continue
		}
		key := e.Package + "/" + e.Test
		switch e.Action {
		case "output":
			io.WriteString(out, e.Output)
			if m := reasonLine.FindStringSubmatch(strings.TrimRight(e.Output, "\n")); m != nil {
				lastReason[key] = m[1]
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				if e.Action == "fail" {
					s.failedPackages = append(s.failedPackages, e.Package)
				}
				continue
			}
			if strings.Contains(e.Test, "/") {
				continue
			}
			switch e.Action {
			case "pass":
				s.passed++
			case "fail":
				s.nFailed++
				s.failedTests = append(s.failedTests, e.Test)
			case "skip":
				r := lastReason[key]
				if r == "" {
					r = "no reason given"
				}
				s.skipped[r]++
			}
		}
	}
	return s, sc.Err()
}

func (s *summary) failed() bool { return s.nFailed > 0 || len(s.failedPackages) > 0 }

// line is the summary: "TITLE: 40 tests run: 37 passed, 2 skipped (2 needs …), 1 failed (TestX)".
func (s *summary) line(title string) string {
	skipped := 0
	var reasons []string
	for _, r := range slices.Sorted(maps.Keys(s.skipped)) {
		skipped += s.skipped[r]
		reasons = append(reasons, fmt.Sprintf("%d: %s", s.skipped[r], r))
	}
	l := fmt.Sprintf("%s: %d tests run: %d passed, %d skipped", title, s.passed+s.nFailed+skipped, s.passed, skipped)
	if len(reasons) > 0 {
		l += " (" + strings.Join(reasons, "; ") + ")"
	}
	l += fmt.Sprintf(", %d failed", s.nFailed)
	if len(s.failedTests) > 0 {
		l += " (" + strings.Join(s.failedTests, ", ") + ")"
	}
	if s.nFailed == 0 && len(s.failedPackages) > 0 {
		l += "; FAILED packages (no test failed: a build or TestMain failure): " + strings.Join(s.failedPackages, ", ")
	}
	return l
}
