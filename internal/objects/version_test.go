package objects

import (
	"strings"
	"testing"
)

func TestPlausibleVersion(t *testing.T) {
	for v, want := range map[string]bool{
		"v1.35.0":                             true,
		"v1.36.0-alpha.1.23+abcdef":           true,
		"v1.34.2-gke.100":                     true,
		"":                                    false,
		"1.35.0":                              false,
		"v1.35":                               false,
		"v1.35.0 \x1b[31mred":                 false,
		"v1.35.0\nlive":                       false,
		"v1.35.0-" + strings.Repeat("a", 100): false,
	} {
		if got := PlausibleVersion(v); got != want {
			t.Errorf("PlausibleVersion(%q) = %v, want %v", v, got, want)
		}
	}
}
