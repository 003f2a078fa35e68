// Package envoyrelease is Envoy's release calendar as kube-mvp follows it: Envoy supports each
// release line for 12 months after its .0 (RELEASES.md in envoyproxy/envoy), and kube-mvp
// supports the lines Envoy supports (docs/compatibility.md#envoy-releases).
package envoyrelease

import (
	"fmt"
	"time"
)

// Line is one Envoy release line, 1.Minor.x.
type Line struct {
	Minor     uint32
	Released  time.Time // the day of 1.Minor.0
	EndOfLife time.Time // a year later: no fixes after it
}

func day(s string) time.Time {
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		panic(err)
	}
	return t
}

// Lines are the lines kube-mvp supports, oldest first, dates from Envoy's RELEASES.md and each
// line's changelogs/1.N.0.yaml. To move the window: add the new line, drop the one past its end
// of life, then raise internal/xds.MinEnvoyVersion with `make envoy-protos`.
var Lines = []Line{
	{37, day("2026-01-13"), day("2027-01-13")},
	{38, day("2026-04-23"), day("2027-04-23")},
	{39, day("2026-07-14"), day("2027-07-14")},
	{40, day("2026-10-01"), day("2027-10-01")},
}

// Oldest and Newest are the window's ends.
func Oldest() Line { return Lines[0] }
func Newest() Line { return Lines[len(Lines)-1] }

// Support says what kube-mvp knows of Envoy 1.minor.patch at now: "" for a supported release;
// otherwise one sentence an operator can act on. Versions older than the window are refused
// before this is asked (internal/xds.MinEnvoyVersion).
func Support(major, minor, patch uint32, now time.Time) string {
	v := fmt.Sprintf("%d.%d.%d", major, minor, patch)
	if major == 1 {
		for _, l := range Lines {
			if l.Minor != minor {
				continue
			}
			if !now.Before(l.EndOfLife) {
				return fmt.Sprintf("Envoy %s is past its end of life (%s): Envoy no longer fixes 1.%d; upgrade to 1.%d", v, l.EndOfLife.Format(time.DateOnly), minor, Newest().Minor)
			}
			return ""
		}
	}
	if major < 1 || (major == 1 && minor < Oldest().Minor) {
		return fmt.Sprintf("Envoy %s is older than every release kube-mvp supports (1.%d to 1.%d)", v, Oldest().Minor, Newest().Minor)
	}
	return fmt.Sprintf("Envoy %s is newer than the releases kube-mvp was checked against (1.%d to 1.%d)", v, Oldest().Minor, Newest().Minor)
}
