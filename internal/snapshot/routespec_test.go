package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

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
	out.WriteString(`# The route table as data (routeSpecs, internal/snapshot/routespec.go), in match order;
# routes.yaml is what Envoy gets. Each variant is a route of its own, "<name>:<variant>",
# matched before the route itself, which takes every other request (no timeout, retried
# only where it never reached an apiserver); front-proxy comes before each of them.
#   upgrade: an Upgrade header, to the cluster's HTTP/1.1 variant, no timeout
`)
	for _, v := range classVariants {
		timeout := "no timeout"
		if v.timeout == requestTimeout {
			timeout = "timeout " + c.UpstreamRequestTimeout.String()
		}
		retry := "reads retried"
		if v.retry != retryReads {
			retry = "writes retried (on a proxied route only where never reached)"
		}
		fmt.Fprintf(&out, "#   %s: %s=%s, %s, %s\n", v.suffix[1:], contract.HeaderRequestClass, v.value, timeout, retry)
	}
	fmt.Fprintf(&out, "#   %s: %s=%s, to the cluster's proxy-certificate variant\n", RouteSuffixProxyCert[1:], contract.HeaderIdentityDecision, contract.IdentityProxyCert)
	specs := b.routeSpecs()
	for i := range specs {
		s := &specs[i]
		line := func(key, value string) { fmt.Fprintf(&out, "  %s: %s\n", key, yamlScalar(value)) }
		fmt.Fprintf(&out, "- name: %s\n", yamlScalar(s.name))
		line("match", describeMatch(s.match))
		switch {
		case s.to.direct != nil:
			line("to", "direct 503")
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
			line("frontProxy", fmt.Sprintf("direct 503 (every apiserver of %s is dangerous)", s.to.cluster))
		}
		if s.proxied {
			line("proxied", "true")
		}
	}
	return []byte(out.String()), nil
}

// describeMatch is m in a few words: its path matcher, then its headers.
func describeMatch(m routeMatch) string {
	parts := []string{[...]string{pathPrefix: "prefix ", pathSeparatedPrefix: "separated prefix ", pathRegex: "regex "}[m.pathIs] + m.path}
	for _, h := range m.headers {
		switch h.is {
		case headerAbsent:
			parts = append(parts, h.name+" absent")
		case headerPresent:
			parts = append(parts, h.name+" present")
		case headerExact:
			parts = append(parts, h.name+"="+h.value)
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
