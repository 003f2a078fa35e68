package dataplane

import (
	"fmt"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// TestUpstreamIdleTimeout: the data plane closes an upstream connection that carried no
// request for the cluster's common_http_protocol_options.idle_timeout, as Envoy's codec
// client does, and the next request opens a new one. The product sets one below the
// apiservers' own 90s (so Envoy, not the apiserver, closes idle connections); here it is
// shortened so the close comes soon. With Envoy's default (1h) the connection would stay.
func TestUpstreamIdleTimeout(t *testing.T) {
	const idle = 200 * time.Millisecond
	e := newEnv(t, envOptions{editResources: func(res *snapshot.Resources) error {
		for _, r := range res.Clusters {
			c := r.(*clusterv3.Cluster)
			a := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
			if c.GetType() != clusterv3.Cluster_EDS || a == nil {
				continue
			}
			o := &httpv3.HttpProtocolOptions{}
			if err := a.UnmarshalTo(o); err != nil {
				return err
			}
			if d := o.GetCommonHttpProtocolOptions().GetIdleTimeout(); d == nil || d.AsDuration() <= 0 || d.AsDuration() >= 90*time.Second {
				return fmt.Errorf("cluster %s: upstream idle_timeout %v, want one below the apiservers' 90s", c.GetName(), d.AsDuration())
			}
			o.CommonHttpProtocolOptions.IdleTimeout = durationpb.New(idle)
			packed, err := anypb.New(o)
			if err != nil {
				return err
			}
			// A copy of the map: the clusters share the product's.
			m := map[string]*anypb.Any{}
			for k, v := range c.GetTypedExtensionProtocolOptions() {
				m[k] = v
			}
			m["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"] = packed
			c.TypedExtensionProtocolOptions = m
		}
		return nil
	}})
	c := e.client(nil)
	const path = "/api/v1/namespaces/default/configmaps"
	r := e.do(c, "GET", path, nil)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	f := e.apiservers[r.seen.Server]
	conns := f.servedConns()
	if len(conns) != 1 {
		t.Fatalf("%s served requests on %d connections, want 1", r.seen.Server, len(conns))
	}
	f.waitClosed(t, conns[0], "the idle upstream connection")
	before := e.stat("cluster.kube-apiservers.upstream_cx_total")
	for range 3 {
		if r := e.do(c, "GET", path, nil); r.status != 200 {
			t.Fatalf("after the idle close: status %d: %s", r.status, r.body)
		}
	}
	if e.stat("cluster.kube-apiservers.upstream_cx_total") == before {
		t.Errorf("no new upstream connection after the idle one closed")
	}
}
