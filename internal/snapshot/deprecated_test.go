package snapshot_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kube-mvp/kube-mvp/internal/fixtures"
	"github.com/kube-mvp/kube-mvp/internal/snapshot"
)

// TestNothingDeprecated: nothing kube-mvp emits (every golden fixture's resources, the
// bootstraps in envoy/) is deprecated in the newest protos it is built with (go.mod's
// go-control-plane/envoy, Envoy 1.40): no populated field, enum value or typed config type
// marked deprecated, so no supported Envoy warns of it (or counts it in
// runtime.deprecated_feature_use) and no removal takes kube-mvp by surprise. A deprecated
// field whose replacement the oldest supported Envoy lacks would be listed here, with why, as
// an exception; there is none.
func TestNothingDeprecated(t *testing.T) {
	// The walk finds what is deprecated: http2_protocol_options (a field), in a typed config.
	//lint:ignore SA1019 the probe must use a deprecated field
	probe, err := anypb.New(&clusterv3.Cluster{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := deprecatedIn(t, probe.ProtoReflect(), "probe"); len(got) != 1 || !strings.HasPrefix(got[0], "probe.(envoy.config.cluster.v3.Cluster).http2_protocol_options: field") {
		t.Fatalf("the walk misses a deprecated field: %q", got)
	}
	var found []string
	walked := 0
	for _, name := range fixtures.Names(t) {
		res, err := snapshot.Build(mustPlan(t, loadCase(t, name)), testConfig())
		if err != nil {
			t.Fatalf("%s: Build: %v", name, err)
		}
		for _, list := range [][]proto.Message{msgs(res.Listeners), msgs(res.Routes), msgs(res.Clusters), msgs(res.Endpoints), msgs(res.Secrets)} {
			for _, m := range list {
				walked++
				found = append(found, deprecatedIn(t, m.ProtoReflect(), name+": "+string(m.ProtoReflect().Descriptor().Name()))...)
			}
		}
	}
	for _, f := range []string{"front.yaml", "sidecar.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "envoy", f))
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, deprecatedIn(t, decodeBootstrap(t, raw).ProtoReflect(), "envoy/"+f)...)
	}
	if walked < 10 {
		t.Fatalf("walked %d resources: the fixtures gave too few to mean anything", walked)
	}
	t.Logf("walked %d resources and 2 bootstraps", walked)
	slices.Sort(found)
	found = slices.Compact(found)
	if len(found) > 0 {
		t.Errorf("deprecated in the protos kube-mvp is built with:\n%s", strings.Join(found, "\n"))
	}
}

func msgs[T proto.Message](rs []T) []proto.Message {
	out := make([]proto.Message, len(rs))
	for i, r := range rs {
		out[i] = r
	}
	return out
}

// deprecatedIn lists what m uses that is marked deprecated, each with its path from at.
func deprecatedIn(t *testing.T, m protoreflect.Message, at string) []string {
	var out []string
	if opts, ok := m.Descriptor().Options().(*descriptorpb.MessageOptions); ok && opts.GetDeprecated() {
		out = append(out, at+": message "+string(m.Descriptor().FullName()))
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			t.Errorf("%s: typed config %s: %v", at, a.GetTypeUrl(), err)
			return out
		}
		return append(out, deprecatedIn(t, inner.ProtoReflect(), at+".("+string(inner.ProtoReflect().Descriptor().FullName())+")")...)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := at + "." + string(fd.Name())
		if opts, ok := fd.Options().(*descriptorpb.FieldOptions); ok && opts.GetDeprecated() {
			out = append(out, path+": field "+string(fd.FullName()))
		}
		value := func(p string, v protoreflect.Value) {
			switch {
			case fd.Enum() != nil:
				if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
					if opts, ok := ev.Options().(*descriptorpb.EnumValueOptions); ok && opts.GetDeprecated() {
						out = append(out, fmt.Sprintf("%s: enum value %s", p, ev.FullName()))
					}
				}
			case fd.Message() != nil:
				out = append(out, deprecatedIn(t, v.Message(), p)...)
			}
		}
		switch {
		case fd.IsList():
			for i := range v.List().Len() {
				value(fmt.Sprintf("%s[%d]", path, i), v.List().Get(i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					out = append(out, deprecatedIn(t, mv.Message(), fmt.Sprintf("%s[%v]", path, k))...)
				}
				return true
			})
		default:
			value(path, v)
		}
		return true
	})
	return out
}
