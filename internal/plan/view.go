package plan

import (
	"slices"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// View is a plan for people, with the names an operator matches against Envoy's /clusters
// and route metadata: xds-server's /debug/topology (JSON) and the golden files (YAML).
type View struct {
	APIServers []APIServerView `json:"apiservers"`
	// LocalAPIServer is the sidecar's apiserver (?local=); empty for the front plan.
	LocalAPIServer string `json:"localAPIServer,omitempty"`
	DefaultCluster string `json:"defaultCluster"`
	// Clusters are the apiserver clusters and the serving sets (roles subset and
	// lingering), which are subsets of the serving-sets cluster.
	Clusters []Cluster `json:"clusters"`
	// ServingSetsHosts are the apiservers of the serving-sets cluster: the live ones and
	// the departed ones remembered at an address.
	ServingSetsHosts topology.ServerSet `json:"servingSetsHosts"`
	GroupVersions    []GroupVersionView `json:"groupVersions"`
	ServedEverywhere []string           `json:"servedEverywhere,omitempty"`
	// Aggregated are the group/versions an APIService sends to a service: routed like the
	// rest of their group, but a request an apiserver may have forwarded is never retried.
	Aggregated []string `json:"aggregated,omitempty"`
	// RequestHeaders are the identity headers the apiservers read: stripped from clients,
	// set for the callers kube-mvp authenticates.
	RequestHeaders topology.RequestHeaders `json:"requestHeaders"`
	// MergedDiscoveryETag is the ETag of the merged /apis discovery extproc serves; empty
	// while it cannot be built (a live apiserver's discovery not fetched yet).
	MergedDiscoveryETag string `json:"mergedDiscoveryETag,omitempty"`
	// Refused are the apiserver identities not believed (a Lease that is not an apiserver's,
	// a second claim on an address) and why.
	Refused []topology.Refusal `json:"refused,omitempty"`
	// RefusedNames are the group, version and resource names left out, where from and why.
	RefusedNames []topology.NameRefusal `json:"refusedNames,omitempty"`
	// ProxyCertExcluded are the dangerous apiservers (their reason is under apiservers),
	// by hostname: the front-proxy variants of every cluster leave them out, so requests whose
	// identity kube-mvp sets never reach them.
	ProxyCertExcluded []string `json:"frontProxyExcluded,omitempty"`
}

// APIServerView is an apiserver and where what it serves was learnt from.
type APIServerView struct {
	topology.APIServer
	topology.Source
	// NotRoutable, when set, says why it takes part in no routing (topology.NotRoutable).
	NotRoutable string `json:"notRoutable,omitempty"`
}

// GroupVersionView lists a group/version's resources and where each is routed.
type GroupVersionView struct {
	GroupVersion string `json:"groupVersion"`
	PathPrefix   string `json:"pathPrefix"`
	// ExtProc: its requests take the ext_proc route (some resource does not go to the
	// default cluster); false: line rate.
	ExtProc bool `json:"extProc"`
	// Document is its discovery document (Resource is its path): whoever serves any of it.
	Document  ResourceView   `json:"document"`
	Resources []ResourceView `json:"resources"`
}

// ResourceView is one resource (or subresource) and its decision.
type ResourceView struct {
	Resource   string   `json:"resource"`
	ServedBy   []string `json:"servedBy"`
	Outcome    string   `json:"outcome"`
	Cluster    string   `json:"cluster,omitempty"`
	Candidates []string `json:"deadCandidates,omitempty"`
	// ProxyCertRefused: every apiserver of its cluster is dangerous, by hostname; requests
	// whose identity kube-mvp sets get a 503 naming them.
	ProxyCertRefused []string `json:"frontProxyRefused,omitempty"`
	// Pending: a new CRD's resource no apiserver lists yet (a 503 with Retry-After).
	Pending bool `json:"pendingNewCRD,omitempty"`
}

// View is p as xds-server's /debug/topology shows it and the golden files keep it.
func (p *Plan) View() View {
	t := p.Topology
	v := View{LocalAPIServer: p.LocalID, DefaultCluster: p.DefaultClusterName(), Clusters: p.Clusters, ServingSetsHosts: p.Hosts,
		RequestHeaders: p.RequestHeaders, Refused: t.Refused, RefusedNames: t.RefusedNames}
	why := map[string]string{}
	for _, n := range t.NotRoutable() {
		why[n.ID] = n.Reason
	}
	for _, a := range t.APIServers {
		v.APIServers = append(v.APIServers, APIServerView{APIServer: a, Source: t.Sources[a.ID], NotRoutable: why[a.ID]})
	}
	if t.Discovery != nil {
		v.MergedDiscoveryETag = t.Discovery.ETag
	}
	v.ProxyCertExcluded = hostnamesOr(t, p.ProxyCertExcluded)
	for gv := range t.ServedEverywhere {
		v.ServedEverywhere = append(v.ServedEverywhere, gv.String())
	}
	slices.Sort(v.ServedEverywhere)
	for _, gv := range p.Aggregated {
		v.Aggregated = append(v.Aggregated, gv.String())
	}
	for _, gv := range p.GroupVersions {
		gvv := GroupVersionView{GroupVersion: gv.GroupVersion.String(), PathPrefix: gv.GroupVersion.PathPrefix(), ExtProc: gv.ExtProc}
		d := gv.Document
		gvv.Document = ResourceView{Resource: gv.GroupVersion.Path(), Outcome: d.Outcome.String(), Cluster: d.Cluster, ProxyCertRefused: hostnamesOr(t, d.ProxyCertRefused), Pending: d.Pending}
		var servedBy []string
		for _, r := range gv.Routes {
			servedBy = append(servedBy, t.Served[r.Resource]...)
		}
		for _, id := range slices.Compact(slices.Sorted(slices.Values(servedBy))) {
			gvv.Document.ServedBy = append(gvv.Document.ServedBy, hostnameOr(t, id))
		}
		if d.Outcome == topology.Unavailable {
			for _, id := range d.Servers {
				gvv.Document.Candidates = append(gvv.Document.Candidates, hostnameOr(t, id))
			}
		}
		for _, r := range gv.Routes {
			name := r.Resource.Resource
			if r.Resource.Subresource != "" {
				name += "/" + r.Resource.Subresource
			}
			rv := ResourceView{Resource: name, Outcome: r.Outcome.String(), Cluster: r.Cluster, ProxyCertRefused: hostnamesOr(t, r.ProxyCertRefused), Pending: r.Pending}
			for _, id := range t.Served[r.Resource] {
				rv.ServedBy = append(rv.ServedBy, hostnameOr(t, id))
			}
			if r.Outcome == topology.Unavailable {
				for _, id := range r.Servers {
					rv.Candidates = append(rv.Candidates, hostnameOr(t, id))
				}
			}
			gvv.Resources = append(gvv.Resources, rv)
		}
		v.GroupVersions = append(v.GroupVersions, gvv)
	}
	return v
}

// hostnamesOr is hostnameOr of each of ids; nil for none.
func hostnamesOr(t *topology.Topology, ids topology.ServerSet) []string {
	var out []string
	for _, id := range ids {
		out = append(out, hostnameOr(t, id))
	}
	return out
}

func hostnameOr(t *topology.Topology, id string) string {
	if s, ok := t.Server(id); ok && s.Hostname != "" {
		return s.Hostname
	}
	return id
}
