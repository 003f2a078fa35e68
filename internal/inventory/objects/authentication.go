package objects

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-mvp/kube-mvp/internal/topology"
)

// The ConfigMap in which every kube-apiserver publishes how it authenticates clients, the
// front-proxy (requestheader) header names among it. It is a union over every apiserver
// that wrote it, never pruned.
const (
	AuthenticationNamespace = "kube-system"
	AuthenticationConfigMap = "extension-apiserver-authentication"
)

// The ConfigMap's keys for the requestheader names, each a JSON list of header names.
const (
	keyUsernameHeaders = "requestheader-username-headers"
	keyUIDHeaders      = "requestheader-uid-headers"
	keyGroupHeaders    = "requestheader-group-headers"
	keyExtraPrefixes   = "requestheader-extra-headers-prefix"
)

// RequestHeadersFrom reads the identity header names the apiservers read from their
// authentication ConfigMap (nil: none published, the defaults). A list that is not a JSON
// list of strings is an error naming the key; the other lists are still used.
func RequestHeadersFrom(cm *corev1.ConfigMap) (topology.RequestHeaders, error) {
	var h topology.RequestHeaders
	if cm == nil {
		return h.OrDefault(), nil
	}
	var bad []string
	read := func(key string) []string {
		raw, ok := cm.Data[key]
		if !ok || raw == "" {
			return nil
		}
		var names []string
		if err := json.Unmarshal([]byte(raw), &names); err != nil {
			bad = append(bad, key)
			return nil
		}
		return slices.DeleteFunc(names, func(n string) bool { return n == "" })
	}
	h = topology.RequestHeaders{User: read(keyUsernameHeaders), UID: read(keyUIDHeaders), Group: read(keyGroupHeaders), ExtraPrefix: read(keyExtraPrefixes)}
	var err error
	if len(bad) > 0 {
		err = fmt.Errorf("ConfigMap %s/%s: %v are not JSON lists of header names; their defaults are used", cm.Namespace, cm.Name, bad)
	}
	return h.OrDefault(), err
}
