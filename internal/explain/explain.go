// Package explain says where one request goes and why, in the words of the plan: the Envoy
// route it matches, whether ext_proc runs, the outcome, the cluster or serving set and the
// apiservers it may reach, and the route's timeout and retries. It decides nothing itself:
// the outcome is the plan's per-request Routes (what extproc looks up), the request class is
// the Lua filter's own script (snapshot.LuaScript) and the route, timeout and retries are read
// from the Envoy configuration snapshot.Build makes for the plan.
package explain

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	lua "github.com/yuin/gopher-lua"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// Request is the request to explain.
type Request struct {
	Method string
	// Target is the :path as sent: percent-encoded, with an optional query.
	Target string
	// Certificate: the client authenticates with a certificate that Envoy verifies, so the
	// Lua filter sets its identity headers (the front-proxy variants); otherwise a bearer token.
	Certificate bool
	// Class overrides the request class; "" runs the Lua filter's script.
	Class string
}

// Explanation is the answer; its JSON is `kubectl mvp explain -o json` (docs/operating.md).
type Explanation struct {
	Method   string `json:"method"`
	Path     string `json:"path"`
	Identity string `json:"identity"` // "certificate" or "token"
	// Class is the request class the Lua filter writes (read, watch, write, long-running,
	// upgrade, unclassified); its variant of a route has the timeout and retries.
	Class string `json:"class"`
	// Envoy is "front" or "sidecar:<apiserver ID>".
	Envoy string `json:"envoy"`
	// Route is the Envoy route the request matches first; FinalRoute, when ext_proc named a
	// cluster, the route it is matched to again.
	Route      string `json:"route"`
	FinalRoute string `json:"finalRoute,omitempty"`
	// ExtProc is "off", "decides" (extproc names the cluster or answers) or "merges" (the
	// discovery route: extproc merges the answer, and Envoy goes on without it).
	ExtProc string `json:"extProc"`
	// Outcome is the plan's outcome: default, subset, not_served (the default set answers
	// 404) or unavailable.
	Outcome string `json:"outcome"`
	// Status is the status kube-mvp answers with itself (503: unavailable, or every
	// apiserver that could serve a certificate's request takes the proxy certificate for an
	// ordinary client's); 0 when the request is forwarded.
	Status int `json:"status,omitempty"`
	// Resource is the serving-table key decided on ("" for non-resource requests).
	Resource string `json:"resource,omitempty"`
	// Cluster is the Envoy cluster the request goes to; ServingSet, for a subset, the serving
	// set inside it (the load balancer's subset).
	Cluster    string `json:"cluster,omitempty"`
	ServingSet string `json:"servingSet,omitempty"`
	// APIServers are the apiservers it may reach (for unavailable: the dead ones that would
	// serve it), by ID.
	APIServers []APIServer `json:"apiservers"`
	// Timeout is the route timeout ("none" for none); Retry its retry policy.
	Timeout string `json:"timeout,omitempty"`
	Retry   *Retry `json:"retry,omitempty"`
	// Why are the reasons, one sentence each.
	Why []string `json:"why"`
}

// APIServer is one apiserver a request may reach.
type APIServer struct {
	ID       string `json:"id"`
	Hostname string `json:"hostname,omitempty"`
	Live     bool   `json:"live"`
}

// Retry is a route's retry policy.
type Retry struct {
	On          string   `json:"on"`
	NumRetries  uint32   `json:"numRetries"`
	StatusCodes []uint32 `json:"statusCodes,omitempty"`
}

// SecretsAssumed are the certificate files explain builds the configuration with: the
// chart's deployment has them all, so the routes have their front-proxy variants. The paths
// are only names: nothing opens them.
var SecretsAssumed = snapshot.SecretFiles{
	ServingCert: "/explain/serving.crt", ServingKey: "/explain/serving.key",
	ClientCA:        "/explain/client-ca.crt",
	ProxyClientCert: "/explain/proxy.crt", ProxyClientKey: "/explain/proxy.key",
	PeerCA: "/explain/peer-ca.crt",
}

// Explainer explains requests against one plan and its Envoy configuration.
type Explainer struct {
	p      *plan.Plan
	routes []*routev3.Route
	class  func(method, target string) (string, error)
}

// New builds p's Envoy configuration with cfg and prepares the Lua filter's script. An
// error is a configuration that cannot be built.
func New(p *plan.Plan, cfg snapshot.Config) (*Explainer, error) {
	res, err := snapshot.Build(p, cfg)
	if res == nil {
		return nil, err
	}
	return WithRoutes(p, res.Routes)
}

// WithRoutes explains by p and the route configuration an Envoy was given for it (the one
// resource of routes): xds-server's /debug/explain reads the snapshot it serves.
func WithRoutes(p *plan.Plan, routes []types.Resource) (*Explainer, error) {
	if len(routes) != 1 {
		return nil, fmt.Errorf("explain: %d route configurations, want 1", len(routes))
	}
	rc, ok := routes[0].(*routev3.RouteConfiguration)
	if !ok || len(rc.GetVirtualHosts()) != 1 {
		return nil, fmt.Errorf("explain: the route configuration has no single virtual host")
	}
	class, err := luaClass()
	if err != nil {
		return nil, err
	}
	return &Explainer{p: p, routes: rc.VirtualHosts[0].Routes, class: class}, nil
}

// luaClass runs request_class from the Lua filter's script, as Envoy does.
func luaClass() (func(method, target string) (string, error), error) {
	L := lua.NewState()
	if err := L.DoString(snapshot.LuaScript + "\nreturn request_class"); err != nil {
		return nil, fmt.Errorf("explain: the Lua filter's script: %w", err)
	}
	fn := L.Get(-1)
	L.Pop(1)
	return func(method, target string) (string, error) {
		if err := L.CallByParam(lua.P{Fn: fn, NRet: 1, Protect: true}, lua.LString(method), lua.LString(target), lua.LFalse); err != nil {
			return "", err
		}
		defer L.Pop(1)
		return L.Get(-1).String(), nil
	}, nil
}

// Explain says where req goes. Not safe for concurrent use (one Lua state).
func (e *Explainer) Explain(req Request) (*Explanation, error) {
	method := strings.ToUpper(req.Method)
	if method == "" {
		method = "GET"
	}
	x := &Explanation{Method: method, Path: req.Target, Identity: "token", Envoy: "front", APIServers: []APIServer{}, Class: req.Class}
	if e.p.LocalID != "" {
		x.Envoy = "sidecar:" + e.p.LocalID
	}
	if x.Class == "" {
		c, err := e.class(method, req.Target)
		if err != nil {
			return nil, fmt.Errorf("explain: the Lua filter's request_class: %w", err)
		}
		x.Class = c
	}
	headers := map[string]string{contract.HeaderRequestClass: x.Class}
	if x.Class == contract.ClassUpgrade {
		headers["upgrade"] = "websocket"
	}
	if req.Certificate {
		x.Identity = "certificate"
		headers[contract.HeaderXFCC] = "By=spiffe://explain;Subject=\"CN=explain\""
		headers[contract.HeaderIdentityDecision] = contract.IdentityProxyCert
	}
	first, err := e.match(req.Target, headers)
	if err != nil {
		return nil, err
	}
	x.Route = first.GetName()
	x.ExtProc = extProcOf(first)
	d := e.p.Routes.Decide(topology.ParsePathHeader(method, req.Target))
	x.Resource = resourceString(d.Resource)
	x.Outcome = d.Outcome.String()

	if dr := first.GetDirectResponse(); dr != nil {
		x.Status = int(dr.GetStatus())
		x.Why = append(x.Why, fmt.Sprintf("Envoy answers %d itself: %s", dr.GetStatus(), strings.TrimSpace(dr.GetBody().GetInlineString())))
		return x, nil
	}
	final := first
	switch x.ExtProc {
	case "decides":
		if x.Route == snapshot.RouteEscapedPath {
			x.Why = append(x.Why, "the path has a %-escape or starts with //: Envoy cannot tell its group/version, so extproc decides on the path as the apiserver decodes it")
		} else {
			x.Why = append(x.Why, fmt.Sprintf("some resource of route %s does not go to the default cluster, so extproc decides each request", x.Route))
		}
		dest := d.Destination(plan.RequestKind{ProxyCert: req.Certificate, Upgrade: x.Class == contract.ClassUpgrade})
		switch dest.Refused {
		case plan.RefusedUnavailable:
			if d.Pending {
				x.Why = append(x.Why, "extproc answers 503 with Retry-After: 1: "+d.Resource.String()+" is a new CustomResourceDefinition's "+
					"that no apiserver lists yet (created a moment ago); client-go retries, and once an apiserver lists it, it goes there")
				break
			}
			x.Why = append(x.Why, "extproc answers 503: no apiserver that serves "+d.Resource.String()+" is "+
				"available (those that would are not live: a stale Lease, no address, or no verified discovery of their own)")
		case plan.RefusedProxyCert:
			x.Why = append(x.Why, "extproc answers 503: "+plan.ProxyCertRefusal(e.p.Topology.APIServers, d.ProxyCertRefused))
		}
		if dest.Refused != plan.NotRefused {
			x.Status = 503
			x.APIServers = e.servers(d.Servers)
			return x, nil
		}
		cluster := dest.Cluster.String()
		headers[contract.HeaderRoutingCluster] = cluster
		if final, err = e.match(req.Target, headers); err != nil {
			return nil, err
		}
		x.FinalRoute = final.GetName()
		x.Cluster, x.ServingSet = cluster, dest.ServingSet
	case "merges":
		x.Why = append(x.Why, "the live apiservers differ in what they serve: extproc answers an apiserver's discovery with the merged discovery of every live one")
	}
	if x.Cluster == "" {
		x.Cluster = final.GetRoute().GetCluster()
	}
	x.Timeout = "none"
	if t := final.GetRoute().GetTimeout(); t != nil && t.AsDuration() > 0 {
		x.Timeout = t.AsDuration().String()
	}
	if rp := final.GetRoute().GetRetryPolicy(); rp != nil {
		x.Retry = &Retry{On: rp.GetRetryOn(), NumRetries: rp.GetNumRetries().GetValue(), StatusCodes: rp.GetRetriableStatusCodes()}
	}
	x.APIServers = e.servers(e.members(x.Cluster, x.ServingSet))
	x.Why = append(x.Why, e.why(d, x)...)
	return x, nil
}

// members are the apiservers of an Envoy cluster (a variant's: the plan cluster's, less the
// dangerous ones for a front-proxy variant), or of serving set set inside the serving-sets one.
func (e *Explainer) members(cluster, set string) topology.ServerSet {
	parsed := contract.ParseClusterName(cluster)
	name := parsed.Base
	if set != "" {
		name = set
	}
	var out topology.ServerSet
	for _, c := range e.p.Clusters {
		if c.Name == name {
			out = c.Members
		}
	}
	if parsed.ProxyCert {
		out = slices.DeleteFunc(slices.Clone(out), e.p.ProxyCertExcluded.Contains)
	}
	return out
}

func (e *Explainer) servers(ids topology.ServerSet) []APIServer {
	out := []APIServer{}
	for _, id := range ids {
		a := APIServer{ID: id}
		if s, ok := e.p.Topology.Server(id); ok {
			a.Hostname, a.Live = s.Hostname, s.Routable()
		}
		out = append(out, a)
	}
	return out
}

// why says the plan's reason for outcome d.
func (e *Explainer) why(d plan.Route, x *Explanation) []string {
	var out []string
	switch d.Outcome {
	case topology.Default:
		if x.Route == snapshot.RouteDiscovery || strings.HasPrefix(x.Route, snapshot.RouteDiscovery+":") {
			out = append(out, "the aggregated discovery (/apis): any apiserver of the default set answers it")
		} else if d.Resource == (topology.Resource{}) {
			out = append(out, "no published resource: the default set serves it (non-resource path, a group served everywhere, a CRD or an aggregated API)")
		} else if e.p.LocalID != "" {
			out = append(out, fmt.Sprintf("the local apiserver serves %s", x.Resource))
		} else {
			out = append(out, fmt.Sprintf("every live apiserver serves %s", x.Resource))
		}
	case topology.Subset:
		out = append(out, fmt.Sprintf("only some live apiservers serve %s: its serving set %s", x.Resource, x.ServingSet))
	case topology.NotServed:
		out = append(out, fmt.Sprintf("%s is published but no known apiserver serves it any more: the default set answers 404 itself", x.Resource))
	}
	if x.Timeout == "none" {
		out = append(out, fmt.Sprintf("class %s: no route timeout (long-running or unclassified)", x.Class))
	}
	return out
}

func extProcOf(r *routev3.Route) string {
	for _, a := range r.GetTypedPerFilterConfig() {
		var o extprocv3.ExtProcPerRoute
		if a.UnmarshalTo(&o) != nil {
			continue
		}
		if o.GetDisabled() {
			return "off"
		}
		if o.GetOverrides().GetFailureModeAllow().GetValue() {
			return "merges"
		}
		return "decides"
	}
	return "decides" // no override: the filter's own configuration, which runs
}

func resourceString(r topology.Resource) string {
	if r == (topology.Resource{}) {
		return ""
	}
	return r.String()
}

// match is Envoy's first matching route for target with headers (lower-case names), for the
// matchers internal/snapshot uses; any other is an error rather than a guess.
func (e *Explainer) match(target string, headers map[string]string) (*routev3.Route, error) {
	path := target
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	for _, r := range e.routes {
		m := r.GetMatch()
		ok, err := pathMatches(m, path)
		if err != nil {
			return nil, fmt.Errorf("explain: route %s: %w", r.GetName(), err)
		}
		if !ok || len(m.GetQueryParameters()) > 0 {
			continue
		}
		hm, err := headersMatch(m.GetHeaders(), headers)
		if err != nil {
			return nil, fmt.Errorf("explain: route %s: %w", r.GetName(), err)
		}
		if hm {
			return r, nil
		}
	}
	return nil, fmt.Errorf("explain: no route matches %s", target)
}

func pathMatches(m *routev3.RouteMatch, path string) (bool, error) {
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		return strings.HasPrefix(path, ps.Prefix), nil
	case *routev3.RouteMatch_PathSeparatedPrefix:
		p := ps.PathSeparatedPrefix
		return path == p || strings.HasPrefix(path, p+"/"), nil
	case *routev3.RouteMatch_SafeRegex:
		re, err := regexp.Compile(`^(?:` + ps.SafeRegex.GetRegex() + `)$`)
		if err != nil {
			return false, err
		}
		return re.MatchString(path), nil
	}
	return false, fmt.Errorf("path matcher %T is not one explain knows", m.GetPathSpecifier())
}

func headersMatch(ms []*routev3.HeaderMatcher, headers map[string]string) (bool, error) {
	for _, h := range ms {
		v, present := headers[h.GetName()]
		var ok bool
		switch s := h.GetHeaderMatchSpecifier().(type) {
		case *routev3.HeaderMatcher_PresentMatch:
			ok = present == s.PresentMatch
		case *routev3.HeaderMatcher_StringMatch:
			exact, isExact := s.StringMatch.GetMatchPattern().(*matcherv3.StringMatcher_Exact)
			if !isExact {
				return false, fmt.Errorf("header matcher on %s is not one explain knows", h.GetName())
			}
			ok = present && v == exact.Exact
		default:
			return false, fmt.Errorf("header matcher on %s is not one explain knows", h.GetName())
		}
		if ok == h.GetInvertMatch() {
			return false, nil
		}
	}
	return true, nil
}
