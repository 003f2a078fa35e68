// Package opstatus is `kubectl mvp status`: what a running xds-server and extproc say about
// themselves, read from their admin ports (xds-server's /debug/topology and /debug/syncz,
// extproc's /readyz and /metrics) and summarised for a person. Summarize and Write are pure;
// Fetch only reads the pages.
package opstatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kube-mvp/kube-mvp/internal/adminhttp"
	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/topology"
	"github.com/kube-mvp/kube-mvp/internal/xdsstatus"
)

// Report is the answer; its JSON is `kubectl mvp status -o json` (docs/operating.md).
type Report struct {
	XDSAdmin   string      `json:"xdsAdmin"`
	APIServers []APIServer `json:"apiservers"`
	// PartiallyServed are the resources (and group/version documents) that not every live
	// apiserver serves, with who does.
	PartiallyServed []Partial `json:"partiallyServed"`
	Envoys          []Envoy   `json:"envoys"`
	// ExtProcs are the extprocs asked (none without --extproc-admin), those that answered.
	ExtProcs []ExtProc `json:"extprocs"`
	// Problems are what the pages could not tell, one sentence each.
	Problems []string `json:"problems,omitempty"`
}

// APIServer is one apiserver as xds-server sees it.
type APIServer struct {
	ID       string `json:"id"`
	Hostname string `json:"hostname,omitempty"`
	Address  string `json:"address,omitempty"`
	// Version is the apiserver's own /version, read by xds-server with its discovery; empty
	// until then (and for apiservers known only from StorageVersions or memory).
	Version string `json:"version,omitempty"`
	// State is live, unverified (Lease fresh, its own discovery not fetched over verified
	// TLS yet), departed (remembered after its Lease went stale or was deleted) or stale
	// (Lease not renewed, nothing remembered).
	State string `json:"state"`
	// CapabilitiesFrom is where what it serves was learnt (discovery, remembered,
	// storageVersions, none), and Since when.
	CapabilitiesFrom string    `json:"capabilitiesFrom,omitempty"`
	Since            time.Time `json:"since,omitzero"`
	// ProxyCertificate is "refused: REASON" when extproc found it taking the proxy
	// certificate for an ordinary client's, "accepted" otherwise (as far as xds-server knows).
	ProxyCertificate string `json:"proxyCertificate"`
	// NotRoutable, when set, says why it takes part in no routing.
	NotRoutable string `json:"notRoutable,omitempty"`
}

// Partial is one resource not every live apiserver serves.
type Partial struct {
	// Resource is group/version/resource[/subresource], or a group/version's document path.
	Resource string   `json:"resource"`
	Outcome  string   `json:"outcome"`
	ServedBy []string `json:"servedBy"`
	// Cluster is the Envoy cluster; ServingSet, for a subset, the serving set inside it.
	Cluster    string `json:"cluster,omitempty"`
	ServingSet string `json:"servingSet,omitempty"`
}

// partial is a resource view as a Partial: a subset's plan cluster is a serving set inside
// the serving-sets cluster, which is what Envoy's /clusters lists.
func partial(resource string, v plan.ResourceView) Partial {
	p := Partial{Resource: resource, Outcome: v.Outcome, ServedBy: v.ServedBy, Cluster: v.Cluster}
	if v.Outcome == topology.Subset.String() {
		p.Cluster, p.ServingSet = contract.ClusterServingSets, v.Cluster
	}
	return p
}

// Envoy is one Envoy node connected to xds-server.
type Envoy struct {
	Node string `json:"node"`
	Role string `json:"role,omitempty"`
	// EnvoyVersion is the release the Envoy says it runs; EnvoySupport, when set, why kube-mvp
	// does not support it (past its end of life, or newer than the window).
	EnvoyVersion   string `json:"envoyVersion,omitempty"`
	EnvoySupport   string `json:"envoySupport,omitempty"`
	LocalAPIServer string `json:"localAPIServer,omitempty"`
	Streams        int    `json:"openStreams"`
	Version        string `json:"configVersion,omitempty"`
	// State is ACK (every type it was sent is acknowledged), NACK (some type refused: see
	// NACKs), pending (sent, not answered yet) or disconnected (no open stream).
	State string `json:"state"`
	// NACKs are the refused types with Envoy's reason.
	NACKs []NACK `json:"nacks,omitempty"`
	// SnapshotError is xds-server's own problem with this node's configuration.
	SnapshotError string `json:"snapshotError,omitempty"`
	// XDSServer is the xds-server replica the Envoy is connected to, where more than one
	// was read (each knows only the Envoys connected to it).
	XDSServer string `json:"xdsServer,omitempty"`
}

// NACK is one refused type.
type NACK struct {
	Type    string    `json:"type"`
	Version string    `json:"version,omitempty"`
	At      time.Time `json:"at,omitzero"`
	Reason  string    `json:"reason"`
}

// ExtProc is one extproc's routing table.
type ExtProc struct {
	// Name is its pod (in a cluster) or admin URL.
	Name string `json:"name"`
	// Ready is its /readyz; Readyz its text.
	Ready        bool   `json:"ready"`
	Readyz       string `json:"readyz,omitempty"`
	TableVersion string `json:"tableVersion,omitempty"`
	// TableAgeSeconds is how long ago the table in use was loaded; nil before the first.
	TableAgeSeconds *float64 `json:"tableAgeSeconds,omitempty"`
	// UpdateFailing: the last table update failed; Failures counts them by reason.
	UpdateFailing bool              `json:"updateFailing"`
	Failures      map[string]uint64 `json:"failures,omitempty"`
}

// Pages are the raw answers Summarize reads.
type Pages struct {
	XDSAdmin string
	Topology *plan.View
	// Syncz are the Envoys of every replica read; ConnectedTo names, when more than one
	// was read, the replica each Envoy is connected to.
	Syncz       []xdsstatus.NodeStatus
	ConnectedTo map[string]string
	ExtProcs    []*ExtProcPages
	Problems    []string
}

// ExtProcPages are an extproc's admin answers.
type ExtProcPages struct {
	Name      string
	Ready     bool
	Readyz    string
	Metrics   map[string]*dto.MetricFamily
	Reachable bool
}

// Target is an admin port to ask: its base URL, and the name to show for it.
type Target struct{ Name, URL string }

// Fetch reads the pages: the topology of the first xds-server replica, the Envoys of every
// replica (an Envoy is connected to one of them, and only that one knows it), each extproc's;
// a page that does not answer becomes a Problem (with what to check), and a first replica
// that answers nothing at all is the error.
func Fetch(ctx context.Context, c *http.Client, replicas []Target, extprocs []Target) (*Pages, error) {
	if len(replicas) == 0 {
		return nil, errors.New("no xds-server admin to read")
	}
	xdsAdmin := strings.TrimSuffix(replicas[0].URL, "/")
	p := &Pages{XDSAdmin: xdsAdmin}
	var view plan.View
	code, body, err := get(ctx, c, xdsAdmin+"/debug/topology")
	switch {
	case err != nil:
		return nil, fmt.Errorf("xds-server's admin at %s does not answer: %w (is xds-server running, and is this its --admin-address?)", xdsAdmin, err)
	case code == http.StatusServiceUnavailable:
		p.Problems = append(p.Problems, "xds-server has no topology yet: "+strings.TrimSpace(string(body)))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return nil, fmt.Errorf("xds-server's admin at %s: /debug/topology answered %d: %s (through "+
			"the Kubernetes API: you need get on pods/proxy in its namespace)", xdsAdmin, code, adminhttp.FirstLine(body))
	case code != http.StatusOK:
		return nil, fmt.Errorf("xds-server's admin at %s: /debug/topology answered %d: %s (is this xds-server's --admin-address?)", xdsAdmin, code, adminhttp.FirstLine(body))
	default:
		if err := json.Unmarshal(body, &view); err != nil {
			return nil, fmt.Errorf("xds-server's /debug/topology at %s: %w (another version of xds-server?)", xdsAdmin, err)
		}
		p.Topology = &view
	}
	for _, rp := range replicas {
		syncz, problem := fetchSyncz(ctx, c, strings.TrimSuffix(rp.URL, "/"))
		if problem != "" {
			if len(replicas) > 1 {
				problem = rp.Name + ": " + problem
			}
			p.Problems = append(p.Problems, problem)
			continue
		}
		p.addSyncz(syncz, rp.Name, len(replicas) > 1)
	}
	for _, tg := range extprocs {
		extprocAdmin := strings.TrimSuffix(tg.URL, "/")
		e := &ExtProcPages{Name: tg.Name}
		p.ExtProcs = append(p.ExtProcs, e)
		code, body, err = get(ctx, c, extprocAdmin+"/readyz")
		if err != nil {
			p.Problems = append(p.Problems, fmt.Sprintf("extproc's admin at %s does not answer: %v (is extproc running, and is this its --admin-address?)", tg.Name, err))
			continue
		}
		e.Reachable, e.Ready, e.Readyz = true, code == http.StatusOK, strings.TrimSpace(string(body))
		code, body, err = get(ctx, c, extprocAdmin+"/metrics")
		if err == nil && code == http.StatusOK {
			parser := expfmt.NewTextParser(model.UTF8Validation)
			e.Metrics, err = parser.TextToMetricFamilies(strings.NewReader(string(body)))
		}
		if err != nil || code != http.StatusOK {
			p.Problems = append(p.Problems, fmt.Sprintf("extproc's /metrics at %s (%d): %v", tg.Name, code, err))
		}
	}
	return p, nil
}

// fetchSyncz reads one replica's /debug/syncz; the problem says why it could not.
func fetchSyncz(ctx context.Context, c *http.Client, xdsAdmin string) ([]xdsstatus.NodeStatus, string) {
	code, body, err := get(ctx, c, xdsAdmin+"/debug/syncz")
	if err != nil || code != http.StatusOK {
		return nil, fmt.Sprintf("xds-server's /debug/syncz did not answer (%d %v): its Envoys are unknown", code, err)
	}
	var syncz []xdsstatus.NodeStatus
	if err := json.Unmarshal(body, &syncz); err != nil {
		return nil, fmt.Sprintf("xds-server's /debug/syncz: %v", err)
	}
	return syncz, ""
}

// addSyncz merges a replica's Envoys into p: a node two replicas list (it moved: one keeps
// it disconnected for a while) is taken from the one it has the more open streams with.
func (p *Pages) addSyncz(syncz []xdsstatus.NodeStatus, replica string, several bool) {
	for _, n := range syncz {
		i := slices.IndexFunc(p.Syncz, func(o xdsstatus.NodeStatus) bool { return o.NodeID == n.NodeID })
		switch {
		case i < 0:
			p.Syncz = append(p.Syncz, n)
		case n.Streams > p.Syncz[i].Streams:
			p.Syncz[i] = n
		default:
			continue
		}
		if several {
			if p.ConnectedTo == nil {
				p.ConnectedTo = map[string]string{}
			}
			p.ConnectedTo[n.NodeID] = replica
		}
	}
}

func get(ctx context.Context, c *http.Client, url string) (int, []byte, error) {
	return adminhttp.Do(ctx, c, http.MethodGet, url, adminhttp.MaxPage)
}

// Summarize turns the pages into the report.
func Summarize(p *Pages) *Report {
	r := &Report{XDSAdmin: p.XDSAdmin, APIServers: []APIServer{}, PartiallyServed: []Partial{}, Envoys: []Envoy{}, ExtProcs: []ExtProc{}, Problems: slices.Clone(p.Problems)}
	if v := p.Topology; v != nil {
		for _, a := range v.APIServers {
			s := APIServer{ID: a.ID, Hostname: a.Hostname, Address: a.Address, Version: a.Version, CapabilitiesFrom: a.From, Since: a.Since, ProxyCertificate: "accepted", NotRoutable: a.NotRoutable}
			switch {
			case a.AwaitingDiscovery:
				s.State = "unverified"
			case a.Alive && a.NotRoutable == "": // xds-server's verdict: the view has no Verified
				s.State = "live"
			case a.From == "remembered":
				s.State = "departed"
			default:
				s.State = "stale"
			}
			if a.Dangerous != "" {
				s.ProxyCertificate = "refused: " + a.Dangerous
			}
			r.APIServers = append(r.APIServers, s)
		}
		if len(v.APIServers) > 0 && !slices.ContainsFunc(v.APIServers, func(a plan.APIServerView) bool { return a.NotRoutable == "" }) {
			r.Problems = append(r.Problems, "no apiserver is routable: every request would be answered 503 (each apiserver's reason is under APISERVERS)")
		}
		for _, gv := range v.GroupVersions {
			if d := gv.Document; d.Outcome != "default" {
				r.PartiallyServed = append(r.PartiallyServed, partial(d.Resource, d))
			}
			for _, res := range gv.Resources {
				if res.Outcome != "default" {
					r.PartiallyServed = append(r.PartiallyServed, partial(gv.GroupVersion+"/"+res.Resource, res))
				}
			}
		}
	}
	for _, n := range p.Syncz {
		e := Envoy{Node: n.NodeID, Role: string(n.Role), EnvoyVersion: n.EnvoyVersion, EnvoySupport: n.EnvoySupport,
			LocalAPIServer: n.LocalAPIServer, Streams: n.Streams, Version: n.Snapshot, SnapshotError: n.SnapshotError,
			State: "ACK", XDSServer: p.ConnectedTo[n.NodeID]}
		if e.EnvoySupport != "" {
			r.Problems = append(r.Problems, fmt.Sprintf("Envoy %s: %s (docs/compatibility.md#envoy-releases)", n.NodeID, e.EnvoySupport))
		}
		for _, typ := range slices.Sorted(maps.Keys(n.Types)) {
			ts := n.Types[typ]
			if ts.NackError != "" {
				e.NACKs = append(e.NACKs, NACK{Type: shortType(typ), Version: ts.NackedNext, At: ts.NackedAt, Reason: ts.NackError})
			} else if ts.Sent != ts.Acked && e.State == "ACK" {
				e.State = "pending"
			}
		}
		if len(e.NACKs) > 0 {
			e.State = "NACK"
		}
		if n.Streams == 0 {
			e.State = "disconnected"
		}
		r.Envoys = append(r.Envoys, e)
	}
	for _, ep := range p.ExtProcs {
		x := ExtProc{Name: ep.Name, Ready: ep.Ready, Readyz: ep.Readyz}
		if fam := ep.Metrics["kube_mvp_extproc_table_version_info"]; fam != nil {
			for _, m := range fam.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "version" && m.GetGauge().GetValue() == 1 {
						x.TableVersion = l.GetValue()
					}
				}
			}
		}
		if v, ok := gauge(ep.Metrics, "kube_mvp_extproc_table_age_seconds"); ok && v == v { // NaN: no table yet
			x.TableAgeSeconds = &v
		}
		if v, ok := gauge(ep.Metrics, "kube_mvp_extproc_table_update_failing"); ok {
			x.UpdateFailing = v == 1
		}
		if fam := ep.Metrics["kube_mvp_extproc_table_update_failures_total"]; fam != nil {
			for _, m := range fam.GetMetric() {
				if n := uint64(m.GetCounter().GetValue()); n > 0 {
					if x.Failures == nil {
						x.Failures = map[string]uint64{}
					}
					x.Failures[labelValue(m, "reason")] = n
				}
			}
		}
		if ep.Reachable {
			r.ExtProcs = append(r.ExtProcs, x)
		}
	}
	return r
}

func gauge(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	fam := fams[name]
	if fam == nil || len(fam.GetMetric()) == 0 {
		return 0, false
	}
	return fam.GetMetric()[0].GetGauge().GetValue(), true
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// shortType is a type URL's last part: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration" → "RouteConfiguration".
func shortType(typeURL string) string {
	return typeURL[strings.LastIndexByte(typeURL, '.')+1:]
}
