package envoyrelease

import (
	"strings"
	"testing"
	"time"
)

func TestSupport(t *testing.T) {
	now := day("2026-11-29")
	for _, c := range []struct {
		minor, patch uint32
		at           time.Time
		want         string // "" or a part of the sentence
	}{
		{37, 0, now, ""},
		{40, 0, now, ""},
		{37, 6, day("2027-01-12"), ""},
		{37, 6, day("2027-01-13"), "Envoy 1.37.6 is past its end of life (2027-01-13): Envoy no longer fixes 1.37; upgrade to 1.40"},
		{36, 7, now, "older than every release kube-mvp supports (1.37 to 1.40)"},
		{41, 0, now, "newer than the releases kube-mvp was checked against"},
	} {
		got := Support(1, c.minor, c.patch, c.at)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("Support(1.%d.%d, %s) = %q, want %q", c.minor, c.patch, c.at.Format(time.DateOnly), got, c.want)
		}
	}
}

// TestLines: a year of support each, one line a quarter, oldest first.
func TestLines(t *testing.T) {
	for i, l := range Lines {
		if !l.EndOfLife.Equal(l.Released.AddDate(1, 0, 0)) {
			t.Errorf("1.%d: end of life %s is not a year after %s", l.Minor, l.EndOfLife, l.Released)
		}
		if i > 0 && (l.Minor != Lines[i-1].Minor+1 || !l.Released.After(Lines[i-1].Released)) {
			t.Errorf("1.%d follows 1.%d", l.Minor, Lines[i-1].Minor)
		}
	}
}
