package opstatus

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kube-mvp/kube-mvp/internal/adminhttp"
)

// Write prints r as tables, one per section; now dates the "since" column.
func Write(w io.Writer, r *Report, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// Not a section: it comes first, without a blank line, and keeps its header when empty.
	fmt.Fprintf(tw, "APISERVERS (xds-server %s)\n", r.XDSAdmin)
	fmt.Fprintln(tw, "HOSTNAME\tID\tVERSION\tSTATE\tCAPABILITIES\tSINCE\tPROXY CERTIFICATE")
	for _, a := range r.APIServers {
		since := "-"
		if !a.Since.IsZero() {
			since = now.Sub(a.Since).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(a.Hostname), a.ID, dash(a.Version), a.State, dash(a.CapabilitiesFrom), since, a.ProxyCertificate)
		if a.NotRoutable != "" {
			fmt.Fprintf(tw, "\t\tnot routable: %s\n", a.NotRoutable)
		}
	}
	if len(r.APIServers) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	section(tw, "NOT SERVED BY EVERY LIVE APISERVER", "(none: every live apiserver serves every published resource)",
		"RESOURCE\tOUTCOME\tSERVED BY\tCLUSTER\tSERVING SET", r.PartiallyServed, func(p Partial) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Resource, p.Outcome, dash(strings.Join(p.ServedBy, ",")), dash(p.Cluster), dash(p.ServingSet))
		})
	section(tw, "ENVOYS", "(none connected)", "NODE\tROLE\tENVOY\tLOCAL APISERVER\tSTREAMS\tCONFIG VERSION\tSTATE\tXDS-SERVER", r.Envoys, func(e Envoy) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Node, dash(e.Role), dash(e.EnvoyVersion), dash(e.LocalAPIServer), e.Streams, dash(e.Version), e.State, dash(e.XDSServer))
		if e.EnvoySupport != "" {
			fmt.Fprintf(tw, "\t\t\t\t\t\tunsupported: %s\n", e.EnvoySupport)
		}
		for _, n := range e.NACKs {
			fmt.Fprintf(tw, "\t\t\t\t\t\tNACK %s %s: %s\n", n.Type, n.Version, n.Reason)
		}
		if e.SnapshotError != "" {
			fmt.Fprintf(tw, "\t\t\t\t\t\txds-server: %s\n", e.SnapshotError)
		}
	})
	section(tw, "EXTPROCS", "", "NAME\tREADY\tTABLE VERSION\tTABLE AGE\tUPDATE FAILING\tFAILURES", r.ExtProcs, func(x ExtProc) {
		age := "-"
		if x.TableAgeSeconds != nil {
			age = (time.Duration(*x.TableAgeSeconds * float64(time.Second))).Round(time.Second).String()
		}
		var fails []string
		for _, k := range slices.Sorted(maps.Keys(x.Failures)) {
			fails = append(fails, fmt.Sprintf("%s=%d", k, x.Failures[k]))
		}
		fmt.Fprintf(tw, "%s\t%t\t%s\t%s\t%t\t%s\n", x.Name, x.Ready, dash(x.TableVersion), age, x.UpdateFailing, dash(strings.Join(fails, ",")))
		if !x.Ready && x.Readyz != "" {
			fmt.Fprintf(tw, "\tnot ready: %s\n", adminhttp.FirstLine([]byte(x.Readyz)))
		}
	})
	section(tw, "PROBLEMS", "", "", r.Problems, func(p string) {
		fmt.Fprintln(tw, "- "+p)
	})
	tw.Flush()
}

// section prints one table after a blank line: its title, then its header (none when header
// is "") and each row's lines. Without rows it prints none instead, or, when none is "",
// nothing at all: not even the title.
func section[T any](w io.Writer, title, none, header string, rows []T, row func(T)) {
	if len(rows) == 0 && none == "" {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, title)
	if len(rows) == 0 {
		fmt.Fprintln(w, none)
		return
	}
	if header != "" {
		fmt.Fprintln(w, header)
	}
	for _, x := range rows {
		row(x)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
