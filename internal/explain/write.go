package explain

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Write prints x as a table of fields: kubectl mvp explain's text.
func Write(w io.Writer, x *Explanation) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("REQUEST", fmt.Sprintf("%s %s (%s, class %s)", x.Method, x.Path, x.Identity, x.Class))
	row("ENVOY", x.Envoy)
	route := x.Route
	if x.FinalRoute != "" {
		route += " → " + x.FinalRoute
	}
	row("ROUTE", route)
	row("EXT_PROC", x.ExtProc)
	outcome := x.Outcome
	if x.Status != 0 {
		outcome += fmt.Sprintf(" (kube-mvp answers %d)", x.Status)
	}
	row("OUTCOME", outcome)
	row("RESOURCE", x.Resource)
	row("CLUSTER", x.Cluster)
	row("SERVING SET", x.ServingSet)
	for i, s := range x.APIServers {
		k := ""
		if i == 0 {
			k = "APISERVERS"
		}
		state := "live"
		if !s.Live {
			state = "not live"
		}
		fmt.Fprintf(tw, "%s\t%s  %s  %s\n", k, s.ID, orDash(s.Hostname), state)
	}
	if len(x.APIServers) == 0 {
		row("APISERVERS", "none")
	}
	row("TIMEOUT", x.Timeout)
	if x.Retry != nil {
		r := fmt.Sprintf("up to %d on %s", x.Retry.NumRetries, x.Retry.On)
		if len(x.Retry.StatusCodes) > 0 {
			r += fmt.Sprintf(" (status %v)", x.Retry.StatusCodes)
		}
		row("RETRY", r)
	}
	for i, why := range x.Why {
		k := ""
		if i == 0 {
			k = "WHY"
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, why)
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
