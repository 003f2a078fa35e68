package xds

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// AdminHandler serves xds-server's admin endpoints next to the given metrics handler:
//
//	/healthz              the process is up
//	/readyz               a topology has been built (Envoy can be served)
//	/metrics              Prometheus
//	/debug/topology       apiservers, liveness, and who serves which group/version/resource
//	/debug/syncz          per Envoy node: snapshot version, sent and acknowledged versions, NACKs
//	/debug/config_dump    the Envoy resources of a node (?node=ID), or of a front proxy
func (s *Server) AdminHandler(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.Topology() == nil {
			http.Error(w, "no topology yet: waiting for the first Lease/StorageVersion sync", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/debug/topology", func(w http.ResponseWriter, _ *http.Request) {
		t := s.Topology()
		if t == nil {
			http.Error(w, "no topology yet", http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, DescribeTopology(t))
	})
	mux.HandleFunc("/debug/syncz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.Status()) })
	mux.HandleFunc("/debug/config_dump", func(w http.ResponseWriter, r *http.Request) {
		snap, err := s.Snapshot(r.URL.Query().Get("node"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		b, err := ConfigDump(snap)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
	return mux
}

// TopologyView is the JSON of /debug/topology: names an operator can match against Envoy's
// /clusters.
type TopologyView struct {
	APIServers       []topology.APIServer `json:"apiservers"`
	DefaultCluster   string               `json:"defaultCluster"`
	GroupVersions    []GroupVersionView   `json:"groupVersions"`
	ServedEverywhere []string             `json:"servedEverywhere,omitempty"`
	// MergedDiscoveryETag is the ETag of the merged /apis discovery extproc serves; empty
	// while it cannot be built (a live apiserver's discovery not fetched yet).
	MergedDiscoveryETag string `json:"mergedDiscoveryETag,omitempty"`
}

// GroupVersionView lists a group/version's resources and where each is routed.
type GroupVersionView struct {
	GroupVersion string         `json:"groupVersion"`
	PathPrefix   string         `json:"pathPrefix"`
	Resources    []ResourceView `json:"resources"`
}

// ResourceView is one resource (or subresource) and its decision.
type ResourceView struct {
	Resource   string   `json:"resource"`
	ServedBy   []string `json:"servedBy"`
	Outcome    string   `json:"outcome"`
	Cluster    string   `json:"cluster,omitempty"`
	Candidates []string `json:"deadCandidates,omitempty"`
}

// DescribeTopology builds the /debug/topology view.
func DescribeTopology(t *topology.Topology) TopologyView {
	v := TopologyView{APIServers: t.APIServers, DefaultCluster: t.DefaultClusterName()}
	if t.Discovery != nil {
		v.MergedDiscoveryETag = t.Discovery.ETag
	}
	for g := range t.ServedEverywhere {
		v.ServedEverywhere = append(v.ServedEverywhere, g)
	}
	slices.Sort(v.ServedEverywhere)
	byGV := map[topology.GroupVersion]int{}
	for _, r := range t.Resources() {
		gv := r.GroupVersion()
		i, ok := byGV[gv]
		if !ok {
			i = len(v.GroupVersions)
			byGV[gv] = i
			v.GroupVersions = append(v.GroupVersions, GroupVersionView{GroupVersion: gv.String(), PathPrefix: gv.PathPrefix()})
		}
		d := t.DecideResource(r)
		name := r.Resource
		if r.Subresource != "" {
			name += "/" + r.Subresource
		}
		rv := ResourceView{Resource: name, Outcome: d.Outcome.String(), Cluster: t.ClusterFor(d)}
		for _, id := range t.Served[r] {
			rv.ServedBy = append(rv.ServedBy, hostnameOr(t, id))
		}
		if d.Outcome == topology.Unavailable {
			for _, id := range d.Servers {
				rv.Candidates = append(rv.Candidates, hostnameOr(t, id))
			}
		}
		v.GroupVersions[i].Resources = append(v.GroupVersions[i].Resources, rv)
	}
	return v
}

func hostnameOr(t *topology.Topology, id string) string {
	if s, ok := t.Server(id); ok && s.Hostname != "" {
		return s.Hostname
	}
	return id
}

// ConfigDump renders a snapshot as {"listeners":[…],"routes":[…],"clusters":[…],
// "endpoints":[…],"secrets":[…]}, each element the protojson of the resource with its @type.
func ConfigDump(snap *cachev3.Snapshot) ([]byte, error) {
	kinds := []struct {
		key     string
		typeURL string
	}{
		{"listeners", resourcev3.ListenerType},
		{"routes", resourcev3.RouteType},
		{"clusters", resourcev3.ClusterType},
		{"endpoints", resourcev3.EndpointType},
		{"secrets", resourcev3.SecretType},
	}
	var b strings.Builder
	b.WriteString("{")
	for i, k := range kinds {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%q:[", k.key)
		items := snap.GetResources(k.typeURL)
		names := make([]string, 0, len(items))
		for name := range items {
			names = append(names, name)
		}
		slices.Sort(names)
		for j, name := range names {
			if j > 0 {
				b.WriteString(",")
			}
			js, err := resourceJSON(redact(items[name]))
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", k.key, name, err)
			}
			b.Write(js)
		}
		b.WriteString("]")
	}
	b.WriteString("}")
	// Re-indent through encoding/json so the dump is readable with curl.
	var out json.RawMessage = []byte(b.String())
	return json.MarshalIndent(out, "", "  ")
}

// redacted replaces private keys in the dump, as Envoy's own /config_dump does: the admin
// port is reachable by probes and Prometheus, and must not hand out keys.
const redacted = "[redacted]"

// redact returns r with any private key replaced by redacted (a copy; r is shared with the
// snapshot cache).
func redact(r types.Resource) types.Resource {
	sec, ok := r.(*tlsv3.Secret)
	if !ok || sec.GetTlsCertificate().GetPrivateKey() == nil {
		return r
	}
	c := proto.Clone(sec).(*tlsv3.Secret)
	c.GetTlsCertificate().PrivateKey = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: redacted}}
	return c
}

func resourceJSON(r types.Resource) ([]byte, error) {
	a, err := anypb.New(r)
	if err != nil {
		return nil, err
	}
	return protojson.Marshal(a)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
