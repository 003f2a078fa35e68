package dataplane

import (
	"fmt"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
)

// config is one applied configuration: the raw resources (for /config_dump) and their
// compiled forms. It is immutable; an update makes a new one.
type config struct {
	raw       map[string]map[string]proto.Message // type URL -> name -> resource
	version   map[string]string
	listeners map[string]*listenerCfg
	routes    map[string]*routeConfig
	clusters  map[string]*clusterCfg
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	secrets   map[string]*tlsv3.Secret
}

func emptyConfig() *config {
	c := &config{raw: map[string]map[string]proto.Message{}, version: map[string]string{},
		listeners: map[string]*listenerCfg{}, routes: map[string]*routeConfig{}, clusters: map[string]*clusterCfg{},
		endpoints: map[string]*endpointv3.ClusterLoadAssignment{}, secrets: map[string]*tlsv3.Secret{}}
	for _, t := range typeOrder {
		c.raw[t] = map[string]proto.Message{}
	}
	return c
}

func (c *config) clone() *config {
	n := *c
	n.raw = map[string]map[string]proto.Message{}
	for k, v := range c.raw {
		n.raw[k] = v
	}
	n.version = map[string]string{}
	for k, v := range c.version {
		n.version[k] = v
	}
	return &n
}

// newResource returns an empty message of a type URL's type.
func newResource(typeURL string) (proto.Message, error) {
	switch typeURL {
	case resource.ListenerType:
		return &listenerv3.Listener{}, nil
	case resource.RouteType:
		return &routev3.RouteConfiguration{}, nil
	case resource.ClusterType:
		return &clusterv3.Cluster{}, nil
	case resource.EndpointType:
		return &endpointv3.ClusterLoadAssignment{}, nil
	case resource.SecretType:
		return &tlsv3.Secret{}, nil
	}
	return nil, fmt.Errorf("resource type %s is not implemented", typeURL)
}

// withType returns a copy of c in which the resources of typeURL are replaced by res, all
// compiled; any error rejects the whole update (state of the world: the response is one unit).
func (c *config) withType(typeURL, version string, res []proto.Message) (*config, []error) {
	var errs []error
	n := c.clone()
	raw := map[string]proto.Message{}
	for _, r := range res {
		nm := cachev3.GetResourceName(r) // a ClusterLoadAssignment's is its cluster_name
		if _, dup := raw[nm]; dup {
			errs = append(errs, fmt.Errorf("duplicate resource %q", nm))
		}
		raw[nm] = r
		fieldErrs := checkFields(r)
		if len(fieldErrs) == 0 {
			fieldErrs = envoyLoadChecks(r) // envoychecks.go
		}
		for _, e := range fieldErrs {
			errs = append(errs, fmt.Errorf("%s %q: %w", shortType(typeURL), nm, e))
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	n.raw[typeURL] = raw
	n.version[typeURL] = version
	fail := func(nm string, err error) {
		errs = append(errs, fmt.Errorf("%s %q: %w", shortType(typeURL), nm, err))
	}
	switch typeURL {
	case resource.ListenerType:
		n.listeners = compileAll(raw, compileListener, fail)
	case resource.RouteType:
		n.routes = compileAll(raw, compileRouteConfig, fail)
	case resource.ClusterType:
		n.clusters = compileAll(raw, compileCluster, fail)
	case resource.EndpointType:
		n.endpoints = compileAll(raw, func(cla *endpointv3.ClusterLoadAssignment) (*endpointv3.ClusterLoadAssignment, error) {
			_, err := compileHosts(cla)
			return cla, err
		}, fail)
	case resource.SecretType:
		n.secrets = compileAll(raw, func(s *tlsv3.Secret) (*tlsv3.Secret, error) {
			s, err := resolveSecret(s)
			if err == nil {
				err = checkSecret(s)
			}
			return s, err
		}, fail)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return n, nil
}

// compileAll compiles every resource of raw (all of type M); one that fails is reported to
// fail by name and left out.
func compileAll[M proto.Message, C any](raw map[string]proto.Message, compile func(M) (C, error), fail func(name string, err error)) map[string]C {
	out := make(map[string]C, len(raw))
	for nm, r := range raw {
		c, err := compile(r.(M))
		if err != nil {
			fail(nm, err)
			continue
		}
		out[nm] = c
	}
	return out
}

func shortType(typeURL string) string {
	return typeURL[strings.LastIndex(typeURL, ".")+1:]
}
