package snapshot

import (
	"bytes"
	"fmt"

	"sigs.k8s.io/yaml"
)

// ToYAMLByType is ToYAML split by resource type: for each key of the JSON form but version
// ("listeners", "routes", "clusters", "endpoints", "secrets"), that type's list as YAML, the
// same text ToYAML prints under the key. The golden files keep one per type.
func (r *Resources) ToYAMLByType() (map[string][]byte, error) {
	out := make(map[string][]byte, len(typeOrder))
	for _, t := range typeOrder {
		var buf bytes.Buffer
		if err := writeListJSON(&buf, t.get(r)); err != nil {
			return nil, err
		}
		y, err := yaml.JSONToYAML(buf.Bytes())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.key, err)
		}
		out[t.key] = y
	}
	return out, nil
}
