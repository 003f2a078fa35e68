package dataplane

import (
	"fmt"
	"strconv"
	"strings"
)

// envoyVersion is the Envoy release the data plane models (Options.EnvoyVersion). Where the
// releases differ in what kube-mvp's configuration uses, each difference is one method here,
// cited from Envoy's source or changelog. The window kube-mvp supports is 1.37 to 1.40
// (internal/envoyrelease); 1.36 is modelled too, for the one difference tests need it for.
type envoyVersion struct{ minor, patch uint32 }

// Modelled releases: the oldest and newest minor the data plane can stand in for.
const (
	oldestModelledMinor = 36
	newestModelledMinor = 40
)

func parseEnvoyVersion(s string) (envoyVersion, error) {
	if s == "" {
		return envoyVersion{minor: newestModelledMinor}, nil
	}
	parts := strings.Split(strings.TrimPrefix(s, "v"), ".")
	bad := fmt.Errorf("dataplane: EnvoyVersion %q: want 1.N or 1.N.P with N from %d to %d", s, oldestModelledMinor, newestModelledMinor)
	if len(parts) < 2 || len(parts) > 3 || parts[0] != "1" {
		return envoyVersion{}, bad
	}
	var v envoyVersion
	for i, p := range parts[1:] {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return envoyVersion{}, bad
		}
		if i == 0 {
			v.minor = uint32(n)
		} else {
			v.patch = uint32(n)
		}
	}
	if v.minor < oldestModelledMinor || v.minor > newestModelledMinor {
		return envoyVersion{}, bad
	}
	return v, nil
}

func (v envoyVersion) String() string { return fmt.Sprintf("1.%d.%d", v.minor, v.patch) }

// extProcStreamForRequestLife: before 1.37 the ext_proc filter keeps its gRPC stream until the
// HTTP request ends (Filter::onDestroy closes it), even after the last response it expects;
// 1.37 closes it once that response arrived (Filter::closeGrpcStreamIfLastRespReceived, runtime
// guard envoy.reloadable_features.ext_proc_stream_close_optimization, on by default). A held stream
// that fails while the request goes on resets the request (Filter::onGrpcError, the response
// already started); one the processor ends cleanly is done with (Filter::onGrpcClose).
func (v envoyVersion) extProcStreamForRequestLife() bool { return v.minor < 37 }
