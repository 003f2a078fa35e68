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

// RouteOf is the route the data plane matches for a request to the route configuration of a
// `xds-server translate -o json` dump: its name and the cluster it names ("" for a direct
// response or a cluster header). headers are the request's after the data plane's filters
// (lower-case names). For tests that check an explanation against the data plane's choice
// without running one.
func RouteOf(configJSON []byte, method, target string, headers map[string]string) (name, cluster string, err error) {
	var dump struct {
		Routes []json.RawMessage `json:"routes"`
	}
	if err := json.Unmarshal(configJSON, &dump); err != nil {
		return "", "", err
	}
	if len(dump.Routes) != 1 {
		return "", "", fmt.Errorf("dataplane: %d route configurations, want 1", len(dump.Routes))
	}
	a := &anypb.Any{}
	if err := protojson.Unmarshal(dump.Routes[0], a); err != nil {
		return "", "", err
	}
	rc := &routev3.RouteConfiguration{}
	if err := a.UnmarshalTo(rc); err != nil {
		return "", "", err
	}
	compiled, err := compileRouteConfig(rc)
	if err != nil {
		return "", "", err
	}
	var hdr headerList
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		hdr = append(hdr, kv{strings.ToLower(k), headers[k]})
	}
	st := &stream{cfg: &config{routes: map[string]*routeConfig{rc.GetName(): compiled}}, hcm: &hcmCfg{rdsName: rc.GetName()},
		method: method, host: "kube-mvp", path: target, scheme: "https", hdr: hdr}
	r := st.matchRoute()
	if r == nil {
		return "", "", fmt.Errorf("dataplane: no route for %s %s", method, target)
	}
	return r.name, r.cluster, nil
}
