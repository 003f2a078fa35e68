package dataplane

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// checkUnknownFields handles fields of a dynamic resource that this data plane's protos do
// not know (configuration meant for a newer Envoy) as Envoy does: with
// --reject-unknown-dynamic-fields (Options.RejectUnknownDynamicFields) the resource is
// rejected, "Protobuf message (type … with unknown field set {…}) has unknown fields"
// (source/common/protobuf/utility.cc checkForUnexpectedFields, and
// source/common/protobuf/message_validator_impl.cc StrictValidationVisitorImpl); without it
// Envoy logs a warning and counts server.dynamic_unknown_fields
// (WarningValidationVisitorImpl). Typed configs (Any) are checked inside, as Envoy checks
// each when its factory translates it.
func (d *DataPlane) checkUnknownFields(m proto.Message) error {
	found := unknownFields(m.ProtoReflect())
	if len(found) == 0 {
		return nil
	}
	var errs []string
	for _, f := range found {
		errs = append(errs, fmt.Sprintf("Protobuf message (type %s with unknown field set {%s}) has unknown fields", f.typ, f.numbers))
	}
	if d.opts.RejectUnknownDynamicFields {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	for _, e := range errs {
		d.stats.inc("server.dynamic_unknown_fields")
		d.log.Warn("Unknown field: " + e)
	}
	return nil
}

type unknownField struct {
	typ     string
	numbers string // comma-separated field numbers
}

// unknownFields lists every message under m (m included, Any contents unpacked) that holds
// unknown fields.
func unknownFields(m protoreflect.Message) []unknownField {
	var out []unknownField
	if raw := m.GetUnknown(); len(raw) > 0 {
		var nums []string
		for len(raw) > 0 {
			num, typ, n := protowire.ConsumeTag(raw)
			if n < 0 {
				break
			}
			raw = raw[n:]
			vn := protowire.ConsumeFieldValue(num, typ, raw)
			if vn < 0 {
				break
			}
			raw = raw[vn:]
			if s := fmt.Sprint(num); !slices.Contains(nums, s) {
				nums = append(nums, s)
			}
		}
		out = append(out, unknownField{typ: string(m.Descriptor().FullName()), numbers: strings.Join(nums, ", ")})
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		if inner, err := a.UnmarshalNew(); err == nil {
			out = append(out, unknownFields(inner.ProtoReflect())...)
		}
		return out
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				out = append(out, unknownFields(l.Get(i).Message())...)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				out = append(out, unknownFields(mv.Message())...)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			out = append(out, unknownFields(v.Message())...)
		}
		return true
	})
	return out
}
