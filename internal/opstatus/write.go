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
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "NOT SERVED BY EVERY LIVE APISERVER")
	if len(r.PartiallyServed) == 0 {
		fmt.Fprintln(tw, "(none: every live apiserver serves every published resource)")
	} else {
		fmt.Fprintln(tw, "RESOURCE\tOUTCOME\tSERVED BY\tCLUSTER\tSERVING SET")
		for _, p := range r.PartiallyServed {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Resource, p.Outcome, dash(strings.Join(p.ServedBy, ",")), dash(p.Cluster), dash(p.ServingSet))
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ENVOYS")
	if len(r.Envoys) == 0 {
		fmt.Fprintln(tw, "(none connected)")
	} else {
		fmt.Fprintln(tw, "NODE\tROLE\tLOCAL APISERVER\tSTREAMS\tCONFIG VERSION\tSTATE")
		for _, e := range r.Envoys {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", e.Node, dash(e.Role), dash(e.LocalAPIServer), e.Streams, dash(e.Version), e.State)
			for _, n := range e.NACKs {
				fmt.Fprintf(tw, "\t\t\t\t\tNACK %s %s: %s\n", n.Type, n.Version, n.Reason)
			}
			if e.SnapshotError != "" {
				fmt.Fprintf(tw, "\t\t\t\t\txds-server: %s\n", e.SnapshotError)
			}
		}
	}
	if len(r.ExtProcs) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "EXTPROCS")
		fmt.Fprintln(tw, "NAME\tREADY\tTABLE VERSION\tTABLE AGE\tUPDATE FAILING\tFAILURES")
	}
	for _, x := range r.ExtProcs {
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
	}
	if len(r.Problems) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "PROBLEMS")
		for _, p := range r.Problems {
			fmt.Fprintln(tw, "- "+p)
		}
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
