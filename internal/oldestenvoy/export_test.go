package oldestenvoy

import "google.golang.org/protobuf/proto"

// WireOnly and ReflectOnly are the two walks CheckWire combines, each alone, for
// TestWireAndReflectionAgree.
func (c *Checker) WireOnly(m proto.Message, wire []byte) bool {
	return c.wireOK(c.rule(m.ProtoReflect().Descriptor()), wire)
}

func (c *Checker) ReflectOnly(m proto.Message) []error { return c.check(m) }
