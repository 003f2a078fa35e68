package xds

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/kube-mvp/kube-mvp/internal/explain"
)

// maxExplaining is how many /debug/explain requests are answered at once.
const maxExplaining = 2

// explainHandler is /debug/explain?method=M&path=P[&certificate=true][&class=C][&local=ID|HOSTNAME]:
// `kubectl mvp explain` against this xds-server, by its current plan (holds applied) and the
// route configuration it serves for that kind of Envoy; JSON, explain.Explanation.
func (s *Server) explainHandler(w http.ResponseWriter, r *http.Request) {
	select {
	case s.explaining <- struct{}{}:
		defer func() { <-s.explaining }()
	default: // each answer costs a translation (milliseconds): a flood gets 429s, not a busy xds-server
		http.Error(w, "busy: too many explain requests at once; try again", http.StatusTooManyRequests)
		return
	}
	q := r.URL.Query()
	e, hold := s.Plans(), s.Hold()
	if e == nil {
		http.Error(w, "no topology yet", http.StatusServiceUnavailable)
		return
	}
	path := q.Get("path")
	if path == "" || path[0] != '/' {
		http.Error(w, "path=PATH is required (the request target as sent, starting with /)", http.StatusBadRequest)
		return
	}
	cert := false
	if c := q.Get("certificate"); c != "" {
		var err error
		if cert, err = strconv.ParseBool(c); err != nil {
			http.Error(w, "certificate= is true or false", http.StatusBadRequest)
			return
		}
	}
	p := e.Front
	if local := q.Get("local"); local != "" {
		id, err := e.Front.Topology.ResolveLocal(local)
		if p = e.For(id); err != nil || p == nil {
			http.Error(w, fmt.Sprintf("no sidecar plan for %q: %v", local, err), http.StatusNotFound)
			return
		}
	}
	p = hold.Apply(p)
	snap, err := s.translate(p)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var routes []types.Resource
	for _, res := range snap.GetResources(resourcev3.RouteType) {
		routes = append(routes, res)
	}
	x, err := explain.WithRoutes(p, routes)
	if err == nil {
		var ex *explain.Explanation
		if ex, err = x.Explain(explain.Request{Method: q.Get("method"), Target: path, Certificate: cert, Class: q.Get("class")}); err == nil {
			writeJSON(w, ex)
			return
		}
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}
