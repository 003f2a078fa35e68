package dataplane

import (
	"errors"
	"net"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
)

// Cluster load assignments (endpoints), compiled.

func compileHosts(cla *endpointv3.ClusterLoadAssignment) ([]hostCfg, error) {
	var out []hostCfg
	// EdsClusterImpl::BatchUpdateHelper::updateLocalityEndpoints: of endpoints with the
	// same address anywhere in the assignment only the first is kept, whatever its health.
	seen := map[string]bool{}
	for _, loc := range cla.GetEndpoints() {
		for _, ep := range loc.GetLbEndpoints() {
			if k := endpointKey(ep.GetEndpoint().GetAddress()); k != "" {
				if seen[k] {
					continue
				}
				seen[k] = true
			}
			if _, ok := ep.GetMetadata().GetFilterMetadata()[transportSocketMatchKey]; ok {
				// Envoy would pick this host's transport socket from
				// transport_socket_matches; this data plane uses the cluster's for data.
				return nil, errors.New("endpoint metadata " + transportSocketMatchKey + " is not implemented")
			}
			switch ep.GetHealthStatus() {
			case corev3.HealthStatus_UNKNOWN, corev3.HealthStatus_HEALTHY:
			default:
				// Envoy excludes such hosts from balancing; we simply leave them out.
				continue
			}
			e := ep.GetEndpoint()
			h := hostCfg{hostname: e.GetHostname(), metadata: ep.GetMetadata()}
			switch a := e.GetAddress().GetAddress().(type) {
			case *corev3.Address_SocketAddress:
				h.address = net.JoinHostPort(a.SocketAddress.GetAddress(), strconv.Itoa(int(a.SocketAddress.GetPortValue())))
			case *corev3.Address_Pipe:
				h.address = "unix:" + a.Pipe.GetPath()
			default:
				return nil, errors.New("endpoint address: only socket_address and pipe are implemented")
			}
			out = append(out, h)
		}
	}
	return out, nil
}
