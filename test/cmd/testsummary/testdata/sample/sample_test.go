// Package sample is testsummary's test input: run with go test -json, it passes, skips and
// fails as its names say (go test ./... never runs it: it is under testdata).
package sample

import "testing"

func TestPasses(t *testing.T) {
	t.Run("subtest", func(t *testing.T) {})
}

func TestSkipsForA(t *testing.T)      { t.Skip("needs a") }
func TestSkipsForAAgain(t *testing.T) { t.Log("a log line first"); t.Skip("needs a") }
func TestSkipsForB(t *testing.T)      { t.Skip("needs b") }
func TestFails(t *testing.T)          { t.Error("broken") }
