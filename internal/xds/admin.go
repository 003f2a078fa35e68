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

	"github.com/kube-mvp/kube-mvp/internal/plan"
)

// AdminHandler serves xds-server's admin endpoints next to the given metrics handler:
//
//	/healthz              the process is up
//	/readyz               a topology has been built (Envoy can be served), and not stopping
//	/metrics              Prometheus
//	/debug/topology       the plan: apiservers, liveness, clusters, and who serves which
//	                      group/version/resource and where it goes (?local=ID|HOSTNAME: a
//	                      sidecar's plan)
//	/debug/syncz          per Envoy node: snapshot version, sent and acknowledged versions, NACKs
//	/debug/config_dump    the Envoy resources of a node (?node=ID), or of a front proxy
//	/debug/explain        where a request goes and why (?method=M&path=P, kubectl mvp explain)
func (s *Server) AdminHandler(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.stopping.Load() {
			http.Error(w, "stopping (SIGTERM): serving on for --shutdown-delay", http.StatusServiceUnavailable)
			return
		}
		if s.Plans() == nil {
			http.Error(w, "no topology yet: waiting for the first Lease/StorageVersion sync", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/debug/topology", func(w http.ResponseWriter, r *http.Request) {
		e, hold := s.Plans(), s.Hold()
		if e == nil {
			http.Error(w, "no topology yet", http.StatusServiceUnavailable)
			return
		}
		p := e.Front
		if local := r.URL.Query().Get("local"); local != "" {
			id, err := e.Front.Topology.ResolveLocal(local)
			if p = e.For(id); err != nil || p == nil {
				http.Error(w, fmt.Sprintf("no sidecar plan for %q: %v", local, err), http.StatusNotFound)
				return
			}
		}
		writeJSON(w, hold.Apply(p).View())
	})
	mux.HandleFunc("/debug/syncz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.Status()) })
	mux.HandleFunc("/debug/explain", s.explainHandler)
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

// TopologyView is the JSON of /debug/topology: the plan's View.
type TopologyView = plan.View

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
