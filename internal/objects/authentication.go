package objects

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-mvp/kube-mvp/internal/memory"
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
// authentication ConfigMap, strictly: every key present must be a JSON list of at most
// topology.MaxRequestHeaderNames HTTP header names (tokens of at most
// topology.MaxRequestHeaderNameLength characters), or the whole ConfigMap is malformed and
// the error names the keys. missing lists the kinds the ConfigMap does not give (all of them
// when cm is nil); their lists are empty in h.
func RequestHeadersFrom(cm *corev1.ConfigMap) (h topology.RequestHeaders, missing []string, err error) {
	if cm == nil {
		return h, []string{keyUsernameHeaders, keyUIDHeaders, keyGroupHeaders, keyExtraPrefixes}, nil
	}
	var bad []string
	read := func(key string) []string {
		raw, ok := cm.Data[key]
		if !ok {
			missing = append(missing, key)
			return nil
		}
		var names []string
		if err := json.Unmarshal([]byte(raw), &names); err != nil {
			bad = append(bad, fmt.Sprintf("%s is not a JSON list of strings", key))
			return nil
		}
		if len(names) > topology.MaxRequestHeaderNames {
			bad = append(bad, fmt.Sprintf("%s lists %d names, more than %d", key, len(names), topology.MaxRequestHeaderNames))
			return nil
		}
		var out []string
		for _, n := range names {
			if n = strings.ToLower(strings.TrimSpace(n)); n == "" {
				continue
			}
			if !topology.IsHeaderName(n) || len(n) > topology.MaxRequestHeaderNameLength {
				bad = append(bad, fmt.Sprintf("%s: %q is not an HTTP header name of at most %d characters", key, n, topology.MaxRequestHeaderNameLength))
				return nil
			}
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		if len(out) == 0 {
			missing = append(missing, key)
		}
		return out
	}
	h = topology.RequestHeaders{User: read(keyUsernameHeaders), UID: read(keyUIDHeaders), Group: read(keyGroupHeaders), ExtraPrefix: read(keyExtraPrefixes)}
	if len(bad) > 0 {
		return topology.RequestHeaders{}, nil, fmt.Errorf("ConfigMap %s/%s is malformed: %s", cm.Namespace, cm.Name, strings.Join(bad, "; "))
	}
	return h, missing, nil
}

// ObserveRequestHeaderNames reads cm (nil: absent) against what n knows and returns what to
// use now and the next state; n is not changed. The names used are, per kind, the
// ConfigMap's; for a kind it does not give, Good's, else the default. A malformed ConfigMap
// changes nothing: Good is used and err says why; with no Good yet, usable is false
// (xds-server then publishes nothing, so it stays unready rather than guess). Whatever is
// used, Strip (the names every client loses) is the defaults, what is used and everything
// seen before (memory.RequestHeaderNames.InUse).
func ObserveRequestHeaderNames(n memory.RequestHeaderNames, cm *corev1.ConfigMap) (next memory.RequestHeaderNames, use topology.RequestHeaders, usable bool, err error) {
	read, _, err := RequestHeadersFrom(cm)
	next = memory.RequestHeaderNames{Good: n.Good, GoodAt: n.GoodAt, Seen: slices.Clone(n.Seen), SeenPrefixes: slices.Clone(n.SeenPrefixes)}
	switch {
	case err != nil && n.Good == nil:
		return next, topology.RequestHeaders{}, false, fmt.Errorf("%w; no good configuration was read before, so nothing is published until it is fixed", err)
	case err != nil:
		use = *n.Good
		err = fmt.Errorf("%w; the last good configuration stays in use", err)
	default:
		use = read
		if n.Good != nil {
			from := func(have, good []string) []string {
				if len(have) == 0 {
					return good
				}
				return have
			}
			use = topology.RequestHeaders{User: from(read.User, n.Good.User), UID: from(read.UID, n.Good.UID), Group: from(read.Group, n.Good.Group), ExtraPrefix: from(read.ExtraPrefix, n.Good.ExtraPrefix)}
			// Worth a word only where the names kept are not the defaults anyway.
			d, lost := topology.DefaultRequestHeaders(), []string(nil)
			for _, k := range []struct {
				key        string
				read, good []string
				def        []string
			}{
				{keyUsernameHeaders, read.User, n.Good.User, d.User}, {keyUIDHeaders, read.UID, n.Good.UID, d.UID},
				{keyGroupHeaders, read.Group, n.Good.Group, d.Group}, {keyExtraPrefixes, read.ExtraPrefix, n.Good.ExtraPrefix, d.ExtraPrefix},
			} {
				if len(k.read) == 0 && !slices.Equal(k.good, k.def) {
					lost = append(lost, k.key)
				}
			}
			if len(lost) > 0 {
				what := "the ConfigMap is gone"
				if cm != nil {
					what = fmt.Sprintf("ConfigMap %s/%s does not give %v", cm.Namespace, cm.Name, lost)
				}
				err = fmt.Errorf("%s: the last good names stay in use", what)
			}
		}
		use = use.OrDefault()
		good := use
		next.Good = &good
	}
	next, use = next.InUse(use.OrDefault())
	return next, use, true, err
}
