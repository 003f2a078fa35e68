package configdiff

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Write prints r as one table per node: TYPE NAME XDS-SERVER ENVOY STATE, with a line
// under a row that has something to explain (a NACK's reason, differing fields).
func Write(w io.Writer, r *Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, n := range r.Nodes {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		where := ""
		if n.Envoy != "" && n.Envoy != n.Node {
			where = " at " + n.Envoy
		}
		fmt.Fprintf(tw, "NODE %s%s (xds-server: %s; %s)\n", n.Node, where, n.Sync, summary(n))
		if len(n.Resources) == 0 {
			fmt.Fprintln(tw, "(no resources on either side)")
			continue
		}
		fmt.Fprintln(tw, "TYPE\tNAME\tXDS-SERVER\tENVOY\tSTATE")
		for _, res := range n.Resources {
			envoy := "-"
			if res.Envoy != "" {
				envoy = res.Envoy
				if res.EnvoyVersion != "" {
					envoy += " " + res.EnvoyVersion
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", res.Type, res.Name, dash(res.XDSServer), envoy, res.State)
			if len(res.Fields) > 0 {
				fmt.Fprintf(tw, "\t\t\t\t  fields: %s\n", strings.Join(res.Fields, ", "))
			}
			if res.Detail != "" && res.State != Equal {
				fmt.Fprintf(tw, "\t\t\t\t  %s\n", res.Detail)
			}
		}
	}
	if len(r.Nodes) == 0 {
		fmt.Fprintln(tw, "(no Envoy)")
	}
	if len(r.Problems) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "PROBLEMS")
		for _, p := range r.Problems {
			fmt.Fprintln(tw, p)
		}
	}
	tw.Flush()
}

func summary(n Node) string {
	var parts []string
	for _, s := range []string{Equal, Differs, OnlyXDSServer, OnlyEnvoy, Warming} {
		if c := n.Summary[s]; c > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c, s))
		}
	}
	if len(parts) == 0 {
		return "nothing to compare"
	}
	return strings.Join(parts, ", ")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
