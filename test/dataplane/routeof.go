package dataplane

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
)

// Router matches requests against the route configuration of a `xds-server translate -o
// json` dump as the data plane does, for tests that check an explanation against the data
// plane's choice without running one. The configuration is parsed and compiled once.
type Router struct {
	cfg *config
	rds string
}

// NewRouter reads the one route configuration of a `xds-server translate -o json` dump.
func NewRouter(configJSON []byte) (*Router, error) {
	var dump struct {
		Routes []json.RawMessage `json:"routes"`
	}
	if err := json.Unmarshal(configJSON, &dump); err != nil {
		return nil, err
	}
	if len(dump.Routes) != 1 {
		return nil, fmt.Errorf("dataplane: %d route configurations, want 1", len(dump.Routes))
	}
	a := &anypb.Any{}
	if err := protojson.Unmarshal(dump.Routes[0], a); err != nil {
		return nil, err
	}
	rc := &routev3.RouteConfiguration{}
	if err := a.UnmarshalTo(rc); err != nil {
		return nil, err
	}
	compiled, err := compileRouteConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Router{cfg: &config{routes: map[string]*routeConfig{rc.GetName(): compiled}}, rds: rc.GetName()}, nil
}

// Route is the route the data plane matches for a request: its name and the cluster it names
// ("" for a direct response or a cluster header). headers are the request's after the data
// plane's filters (lower-case names).
func (rt *Router) Route(method, target string, headers map[string]string) (name, cluster string, err error) {
	var hdr headerList
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		hdr = append(hdr, kv{strings.ToLower(k), headers[k]})
	}
	st := &stream{cfg: rt.cfg, hcm: &hcmCfg{rdsName: rt.rds},
		method: method, host: "kube-mvp", path: target, scheme: "https", hdr: hdr}
	r := st.matchRoute()
	if r == nil {
		return "", "", fmt.Errorf("dataplane: no route for %s %s", method, target)
	}
	return r.name, r.cluster, nil
}
