package re2

import "testing"

func TestProgramSize(t *testing.T) {
	// Sizes RE2 reports for these patterns (Debian bookworm's libre2 20220601).
	for _, tc := range []struct {
		pattern string
		want    int
	}{
		{`/apis/?`, 11},
		{`GET|HEAD`, 11},
		{`//.*|.*%.*`, 34},
	} {
		got, err := ProgramSize(tc.pattern)
		if err != nil {
			t.Errorf("ProgramSize(%q): %v", tc.pattern, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ProgramSize(%q) = %d, want %d", tc.pattern, got, tc.want)
		}
	}
}

func TestProgramSizeNUL(t *testing.T) {
	// The pattern is passed with its length: a NUL byte in it is part of the pattern.
	a, err := ProgramSize("a\x00b")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ProgramSize("a")
	if err != nil {
		t.Fatal(err)
	}
	if a <= b {
		t.Errorf("ProgramSize(\"a\\x00b\") = %d, not more than ProgramSize(\"a\") = %d", a, b)
	}
}

func TestProgramSizeInvalid(t *testing.T) {
	for _, p := range []string{`(`, `a**`, `\1`} {
		if n, err := ProgramSize(p); err == nil {
			t.Errorf("ProgramSize(%q) = %d, want an error", p, n)
		}
	}
}
