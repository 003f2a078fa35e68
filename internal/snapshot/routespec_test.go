package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/contract"
	"github.com/kube-mvp/kube-mvp/internal/plan"
)

// RouteSpecYAML is the route table of p as data (routeSpecs), a few lines per route, for the
// golden testdata/<case>/routespec.yaml: the shape of the table at a glance, where
// routes.yaml has what Envoy gets.
func RouteSpecYAML(p *plan.Plan, cfg Config) ([]byte, error) {
	c, errs := cfg.check()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	b := &builder{p: p, t: p.Topology, cfg: c}
	var out strings.Builder
	out.WriteString(`# The route table as data (routeSpecs, internal/snapshot/routes.go), in match order;
# routes.yaml is what Envoy gets. Each variant is a route of its own, "<name>:<variant>",
# matched before the route itself, which takes every other request (no timeout, retried
# only where it never reached an apiserver); front-proxy comes before each of them.
#   upgrade: an Upgrade header, to the cluster's HTTP/1.1 variant, no timeout
`)
	for _, v := range classVariants {
		timeout := "no timeout"
		if v.timeout {
			timeout = "timeout " + c.UpstreamRequestTimeout.String()
		}
		retry := "reads retried"
		if !v.read {
			retry = "writes retried (on a proxied route only where never reached)"
		}
		fmt.Fprintf(&out, "#   %s: %s=%s, %s, %s\n", v.suffix[1:], contract.HeaderRequestClass, v.value, timeout, retry)
	}
	fmt.Fprintf(&out, "#   %s: %s=%s, to the cluster's proxy-certificate variant\n", RouteSuffixProxyCert[1:], contract.HeaderIdentityDecision, contract.IdentityProxyCert)
	for _, s := range b.routeSpecs() {
		line := func(key, value string) { fmt.Fprintf(&out, "  %s: %s\n", key, yamlScalar(value)) }
		fmt.Fprintf(&out, "- name: %s\n", yamlScalar(s.name))
		line("match", describeMatch(s.match))
		switch {
		case s.to.direct != nil:
			line("to", fmt.Sprintf("direct %d", s.to.direct.DirectResponse.GetStatus()))
		case s.to.clusterHeader:
			line("to", "the cluster in "+contract.HeaderRoutingCluster)
		default:
			line("to", s.to.cluster)
		}
		line("extProc", [...]string{extProcOff: "disabled", extProcDecides: "decides", extProcMayDecide: "may decide (fails open)"}[s.extProc])
		if s.variants != 0 {
			var vs []string
			if s.variants&variantUpgrade != 0 {
				vs = append(vs, RouteSuffixUpgrade[1:])
			}
			for _, v := range classVariants {
				if s.variants&v.variant != 0 {
					vs = append(vs, v.suffix[1:])
				}
			}
			if s.variants&variantProxyCert != 0 {
				vs = append(vs, RouteSuffixProxyCert[1:])
			}
			fmt.Fprintf(&out, "  variants: [%s]\n", strings.Join(vs, ", "))
		}
		if s.variants&variantProxyCert != 0 && s.to.proxyCertRefused != nil {
			line("frontProxy", fmt.Sprintf("direct %d (every apiserver of %s is dangerous)", s.to.proxyCertRefused.DirectResponse.GetStatus(), s.to.cluster))
		}
		if s.proxied {
			line("proxied", "true")
		}
	}
	return []byte(out.String()), nil
}

// describeMatch is m in a few words: its path matcher, then its headers.
func describeMatch(m *routev3.RouteMatch) string {
	var parts []string
	switch p := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		parts = append(parts, "prefix "+p.Prefix)
	case *routev3.RouteMatch_PathSeparatedPrefix:
		parts = append(parts, "separated prefix "+p.PathSeparatedPrefix)
	case *routev3.RouteMatch_SafeRegex:
		parts = append(parts, "regex "+p.SafeRegex.GetRegex())
	default:
		parts = append(parts, fmt.Sprintf("%T", p))
	}
	for _, h := range m.GetHeaders() {
		switch {
		case h.GetPresentMatch() && h.GetInvertMatch():
			parts = append(parts, h.GetName()+" absent")
		case h.GetPresentMatch():
			parts = append(parts, h.GetName()+" present")
		case h.GetStringMatch().GetExact() != "":
			parts = append(parts, h.GetName()+"="+h.GetStringMatch().GetExact())
		default:
			parts = append(parts, fmt.Sprintf("%s %v", h.GetName(), h.GetHeaderMatchSpecifier()))
		}
	}
	return strings.Join(parts, ", ")
}

// yamlScalar is v as a YAML scalar: plain where YAML reads it back as the same string,
// quoted otherwise.
func yamlScalar(v string) string {
	var m map[string]any
	if err := yaml.Unmarshal([]byte("v: "+v), &m); err == nil && m["v"] == v {
		return v
	}
	q, _ := json.Marshal(v) // a JSON string is a YAML double-quoted scalar
	return string(q)
}
