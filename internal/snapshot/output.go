package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// typeOrder is the order of the resource types in versions and in the JSON form.
var typeOrder = []struct {
	url   resource.Type
	key   string
	get   func(*Resources) []types.Resource
	index types.ResponseType
}{
	{resource.ListenerType, "listeners", func(r *Resources) []types.Resource { return r.Listeners }, types.Listener},
	{resource.RouteType, "routes", func(r *Resources) []types.Resource { return r.Routes }, types.Route},
	{resource.ClusterType, "clusters", func(r *Resources) []types.Resource { return r.Clusters }, types.Cluster},
	{resource.EndpointType, "endpoints", func(r *Resources) []types.Resource { return r.Endpoints }, types.Endpoint},
	{resource.SecretType, "secrets", func(r *Resources) []types.Resource { return r.Secrets }, types.Secret},
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// computeVersions sets TypeVersions and Version: SHA-256 over each resource's name and
// deterministic wire bytes, in list order (the lists are sorted by name), truncated to 16 hex
// digits. Maps inside resources (metadata, typed_per_filter_config) are ordered by the
// deterministic marshalling, so the hash depends on content only. wire has the bytes of the
// resources already marshalled (a resource missing there is marshalled here).
func (r *Resources) computeVersions(wire map[types.Resource][]byte) error {
	r.TypeVersions = make(map[resource.Type]string, len(typeOrder))
	all := sha256.New()
	for _, t := range typeOrder {
		h := sha256.New()
		for _, res := range t.get(r) {
			b, ok := wire[res]
			if !ok {
				var err error
				if b, err = deterministic.Marshal(res); err != nil {
					return fmt.Errorf("hashing %s %q: %w", kindOf(res), cachev3.GetResourceName(res), err)
				}
			}
			fmt.Fprintf(h, "%s\x00%d\x00", cachev3.GetResourceName(res), len(b))
			h.Write(b)
		}
		v := hex.EncodeToString(h.Sum(nil))[:16]
		r.TypeVersions[t.url] = v
		fmt.Fprintf(all, "%s=%s\n", t.url, v)
	}
	r.Version = hex.EncodeToString(all.Sum(nil))[:16]
	return nil
}

// Snapshot is r as a go-control-plane snapshot, each type at its own content version, checked
// with Consistent (every EDS cluster has its endpoints, every RDS name its route
// configuration, and nothing extra).
func (r *Resources) Snapshot() (*cachev3.Snapshot, error) {
	s := &cachev3.Snapshot{}
	for _, t := range typeOrder {
		s.Resources[t.index] = cachev3.NewResources(r.TypeVersions[t.url], t.get(r))
	}
	if err := s.Consistent(); err != nil {
		return nil, fmt.Errorf("snapshot %s is inconsistent: %w", r.Version, err)
	}
	return s, nil
}

// MarshalJSON renders r as {"version": …, "listeners": […], "routes": […], "clusters": […],
// "endpoints": […], "secrets": […]}, every element the protojson form of the resource inside
// an Any (so with its "@type"), field names as in Envoy's documentation and /config_dump.
// The output is deterministic: protojson orders map keys, and its whitespace is normalised.
func (r *Resources) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"version":`)
	v, _ := json.Marshal(r.Version)
	buf.Write(v)
	for _, t := range typeOrder {
		fmt.Fprintf(&buf, `,%q:`, t.key)
		if err := writeListJSON(&buf, t.get(r)); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// writeListJSON writes resources as a JSON array of their Any forms.
func writeListJSON(buf *bytes.Buffer, resources []types.Resource) error {
	buf.WriteByte('[')
	for i, res := range resources {
		if i > 0 {
			buf.WriteByte(',')
		}
		b, err := resourceJSON(res)
		if err != nil {
			return fmt.Errorf("%s %q: %w", kindOf(res), cachev3.GetResourceName(res), err)
		}
		buf.Write(b)
	}
	buf.WriteByte(']')
	return nil
}

var jsonOptions = protojson.MarshalOptions{UseProtoNames: true, Resolver: protoregistry.GlobalTypes}

func resourceJSON(res types.Resource) ([]byte, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, res, deterministic); err != nil {
		return nil, err
	}
	b, err := jsonOptions.Marshal(a)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// ToJSON is MarshalJSON indented by two spaces, with a final newline.
func (r *Resources) ToJSON() ([]byte, error) {
	b, err := r.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// ToYAML is the JSON form as YAML (keys sorted).
func (r *Resources) ToYAML() ([]byte, error) {
	b, err := r.MarshalJSON()
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(b)
}
