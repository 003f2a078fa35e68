// Package oldestenvoy checks Envoy configuration against the protos of the oldest Envoy
// kube-mvp supports (internal/xds.MinEnvoyVersion): snapshot.Build on every resource it
// makes, the bootstrap and chart tests on theirs. The configuration is built with newer
// protos (go.mod), whose additions the oldest Envoy would drop unseen (or reject with
// --reject-unknown-dynamic-fields). It imports no Envoy package itself: a typed config is
// unpacked by the types its caller links.
package oldestenvoy

import (
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// oldestProtosFile lists every message (with its fields) and enum (with its values) of the
// protos of the oldest Envoy kube-mvp supports (internal/xds.MinEnvoyVersion), and of the
// protos they import. tools/envoyprotos writes it (`make envoy-protos`).
//
//go:embed oldest-envoy-protos.txt
var oldestProtosFile string

// protoList is a parsed oldest-envoy-protos.txt.
type protoList struct {
	envoy    string // the Envoy release, "1.37.0"
	messages map[protoreflect.FullName]map[protoreflect.FieldNumber]bool
	enums    map[protoreflect.FullName]map[protoreflect.EnumNumber]bool
}

var oldestProtos = sync.OnceValues(func() (*protoList, error) { return parseProtoList(oldestProtosFile) })

// parseProtoList reads the format tools/envoyprotos writes: comment lines (#), one
// "envoy VERSION" line, then "message NAME field=number …" and "enum NAME VALUE=number …".
func parseProtoList(text string) (*protoList, error) {
	l := &protoList{
		messages: map[protoreflect.FullName]map[protoreflect.FieldNumber]bool{},
		enums:    map[protoreflect.FullName]map[protoreflect.EnumNumber]bool{},
	}
	for n, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		words := strings.Fields(line)
		bad := func(why string) error {
			return fmt.Errorf("oldest-envoy-protos.txt line %d: %s: %q", n+1, why, line)
		}
		if len(words) < 2 {
			return nil, bad("too few words")
		}
		var numbers []int32
		for _, w := range words[2:] {
			_, num, ok := strings.Cut(w, "=")
			i, err := strconv.ParseInt(num, 10, 32)
			if !ok || err != nil {
				return nil, bad("not name=number: " + w)
			}
			numbers = append(numbers, int32(i))
		}
		name := protoreflect.FullName(words[1])
		switch words[0] {
		case "envoy":
			if l.envoy != "" || len(words) != 2 {
				return nil, bad("a second or malformed envoy line")
			}
			l.envoy = words[1]
		case "message":
			fields := make(map[protoreflect.FieldNumber]bool, len(numbers))
			for _, i := range numbers {
				fields[protoreflect.FieldNumber(i)] = true
			}
			l.messages[name] = fields
		case "enum":
			values := make(map[protoreflect.EnumNumber]bool, len(numbers))
			for _, i := range numbers {
				values[protoreflect.EnumNumber(i)] = true
			}
			l.enums[name] = values
		default:
			return nil, bad("unknown kind " + words[0])
		}
	}
	if l.envoy == "" || len(l.messages) == 0 {
		return nil, errors.New("oldest-envoy-protos.txt: no envoy line or no messages")
	}
	return l, nil
}

// Version is the Envoy release whose protos Check checks against ("1.37.0").
func Version() string {
	l, err := oldestProtos()
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return l.envoy
}

// Check returns an error for every use in m of what the oldest supported Envoy's
// protos (Version) lack, each naming the field path in m and ending "not in Envoy
// <version>": a populated field whose number its message did not have, a set enum value its
// enum did not have, a message type it did not have, and a typed config (google.protobuf.Any,
// unpacked and checked recursively) of a type it did not have. Fields unknown even to the
// protos kube-mvp is built with are errors too. The errors are sorted; nil means m is fine.
func Check(m proto.Message) []error {
	c, err := NewChecker()
	if err != nil {
		return []error{err}
	}
	return c.check(m)
}

// A Checker walks messages for Check and CheckWire. One checker may walk many resources: it
// remembers the typed configs it found fine (resources share many equal ones). Not safe for
// concurrent use.
type Checker struct {
	list     *protoList
	path     []pathStep
	problems []string
	anyOK    map[string]map[string]bool // typed configs found fine: type URL → value bytes
	anyRules map[string]*messageRule    // the rules of typed configs' types, by type URL
}

// NewChecker is a Checker of the oldest Envoy's protos; an error if the embedded list is
// unreadable.
func NewChecker() (*Checker, error) {
	l, err := oldestProtos()
	if err != nil {
		return nil, err
	}
	return &Checker{list: l, anyOK: map[string]map[string]bool{}, anyRules: map[string]*messageRule{}}, nil
}

// pathStep is one step of the path to a problem, formatted only when there is one.
type pathStep struct {
	field   protoreflect.FieldDescriptor // nil: a typed config's content
	index   int                          // of a list element, or -1
	key     protoreflect.MapKey          // of a map value, if hasKey
	hasKey  bool
	anyType protoreflect.FullName // the type unpacked from a typed config
}

// CheckWire checks m, whose deterministic wire form is wire: the fast walk of the bytes, then,
// only if that finds a problem, check's walk of m to say where.
func (c *Checker) CheckWire(m proto.Message, wire []byte) []error {
	if c.wireOK(c.rule(m.ProtoReflect().Descriptor()), wire) {
		return nil
	}
	if errs := c.check(m); len(errs) > 0 {
		return errs
	}
	return []error{fmt.Errorf("its wire form uses what Envoy %s lacks, its fields do not (a bug in the check)", c.list.envoy)}
}

// check walks m and returns its problems, sorted (map order is random).
func (c *Checker) check(m proto.Message) []error {
	c.path, c.problems = c.path[:0], nil
	c.message(m.ProtoReflect())
	slices.Sort(c.problems)
	var errs []error
	for _, p := range c.problems {
		errs = append(errs, errors.New(p))
	}
	return errs
}

// report records a problem at the current path: what is not in the oldest Envoy.
func (c *Checker) report(format string, args ...any) {
	c.fail(fmt.Sprintf(format, args...) + " is not in Envoy " + c.list.envoy)
}

// fail records a problem at the current path.
func (c *Checker) fail(msg string) {
	var b strings.Builder
	for _, s := range c.path {
		switch {
		case s.field == nil:
			fmt.Fprintf(&b, ".(%s)", s.anyType)
		case s.hasKey:
			fmt.Fprintf(&b, ".%s[%s]", s.field.Name(), formatKey(s.key))
		case s.index >= 0:
			fmt.Fprintf(&b, ".%s[%d]", s.field.Name(), s.index)
		default:
			fmt.Fprintf(&b, ".%s", s.field.Name())
		}
	}
	if b.Len() > 0 {
		msg = strings.TrimPrefix(b.String(), ".") + ": " + msg
	}
	c.problems = append(c.problems, msg)
}

func formatKey(k protoreflect.MapKey) string {
	if s, ok := k.Interface().(string); ok {
		return strconv.Quote(s)
	}
	return k.String()
}

// messageRule is what the oldest Envoy knows of one message type of the newer protos.
type messageRule struct {
	known  bool
	any    bool        // google.protobuf.Any: checked by its content
	fields []fieldRule // by the field's index in the descriptor
	// byNumber finds a field's rule by its number, for the wire form: a slice up to the
	// largest number when that is small (it nearly always is), else a map.
	byNumber    []*fieldRule
	byNumberMap map[protowire.Number]*fieldRule
	// closed: the oldest Envoy knows the type, every field of it and of every type reachable
	// from it, and every value of their enums, and none of them is an Any: nothing inside a
	// message of this type can be refused, so it is not walked (google.protobuf.Struct in
	// metadata, most matchers). Fields unknown to every proto and enum numbers no proto names
	// go unseen there; Go-built messages have neither.
	closed bool
}

type fieldRule struct {
	known bool
	fd    protoreflect.FieldDescriptor
	msg   *messageRule // of the field's (or map value's) message type
	// enumValues are the oldest Envoy's values of the field's (or map value's) enum type; nil
	// if it did not have the enum.
	enumValues map[protoreflect.EnumNumber]bool
	enumFull   bool // enumValues has every value of the newer enum
}

// rules holds a *messageRule per message descriptor (generated descriptors are one value per
// type). A rule is made with those of every type reachable from it, under rulesMu, and never
// changes after.
var (
	rulesMu sync.Mutex
	rules   = map[protoreflect.MessageDescriptor]*messageRule{}
)

func (c *Checker) rule(d protoreflect.MessageDescriptor) *messageRule {
	rulesMu.Lock()
	defer rulesMu.Unlock()
	if r, ok := rules[d]; ok {
		return r
	}
	var made []*messageRule
	r := c.makeRule(d, &made)
	// closed is the greatest fixed point (types may be recursive): start from what each new
	// type allows by itself, then take it back from every type reaching one that is not closed.
	for changed := true; changed; {
		changed = false
		for _, m := range made {
			if !m.closed {
				continue
			}
			for _, f := range m.fields {
				if f.msg != nil && !f.msg.closed {
					m.closed, changed = false, true
					break
				}
			}
		}
	}
	return r
}

// makeRule makes the rules of d and of every type reachable from it that has none yet (rulesMu
// held), appending them to made.
func (c *Checker) makeRule(d protoreflect.MessageDescriptor, made *[]*messageRule) *messageRule {
	if r, ok := rules[d]; ok {
		return r
	}
	fields, known := c.list.messages[d.FullName()]
	r := &messageRule{known: known, any: d.FullName() == "google.protobuf.Any"}
	rules[d] = r // before the fields: types may be recursive
	*made = append(*made, r)
	r.closed = known && !r.any
	fds := d.Fields()
	r.fields = make([]fieldRule, fds.Len())
	for i := range fds.Len() {
		fd := fds.Get(i)
		fr := fieldRule{known: fields[fd.Number()], fd: fd}
		vd := fd
		if fd.IsMap() {
			vd = fd.MapValue()
		}
		switch vd.Kind() {
		case protoreflect.MessageKind, protoreflect.GroupKind:
			fr.msg = c.makeRule(vd.Message(), made)
		case protoreflect.EnumKind:
			ed := vd.Enum()
			fr.enumValues = c.list.enums[ed.FullName()]
			fr.enumFull = true
			for j := range ed.Values().Len() {
				if !fr.enumValues[ed.Values().Get(j).Number()] {
					fr.enumFull = false
				}
			}
		}
		r.fields[i] = fr
		if !fr.known || (vd.Kind() == protoreflect.EnumKind && !fr.enumFull) {
			r.closed = false
		}
	}
	maxNumber := protowire.Number(0)
	for i := range r.fields {
		maxNumber = max(maxNumber, r.fields[i].fd.Number())
	}
	if maxNumber <= 1024 {
		r.byNumber = make([]*fieldRule, maxNumber+1)
	} else {
		r.byNumberMap = map[protowire.Number]*fieldRule{}
	}
	for i := range r.fields {
		if n := r.fields[i].fd.Number(); r.byNumber != nil {
			r.byNumber[n] = &r.fields[i]
		} else {
			r.byNumberMap[n] = &r.fields[i]
		}
	}
	return r
}

func (r *messageRule) field(n protowire.Number) *fieldRule {
	if r.byNumber != nil {
		if int(n) < len(r.byNumber) {
			return r.byNumber[n]
		}
		return nil
	}
	return r.byNumberMap[n]
}

// wireOK reports whether b, the wire form of a message whose type's rule is r, uses nothing
// the oldest Envoy lacks. It is the fast path of the check, walking the bytes a caller
// (snapshot.Build) has anyway instead of the messages by reflection; when it finds a problem, the reflective walk
// (check) says where. It is at least as strict: a field no proto of ours knows is a problem.
func (c *Checker) wireOK(r *messageRule, b []byte) bool {
	switch {
	case r.closed:
		return true
	case !r.known:
		return false
	case r.any:
		return c.typedConfigWireOK(b)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		fr := r.field(num)
		if fr == nil || !fr.known {
			return false
		}
		switch {
		case typ == protowire.BytesType && fr.fd.IsMap():
			entry, n := protowire.ConsumeBytes(b)
			if n < 0 || !c.mapEntryWireOK(fr, entry) {
				return false
			}
			b = b[n:]
		case typ == protowire.BytesType && fr.msg != nil:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !c.wireOK(fr.msg, v) {
				return false
			}
			b = b[n:]
		case fr.fd.Kind() == protoreflect.EnumKind:
			n := c.enumWire(fr, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
		default:
			if fr.msg != nil && typ != protowire.BytesType {
				return false // a group, or not what the field holds
			}
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
		}
	}
	return true
}

// enumWire checks the value (VarintType) or packed values (BytesType) of an enum field at the
// start of b: the number of bytes they take, or -1 for a problem.
func (c *Checker) enumWire(fr *fieldRule, typ protowire.Type, b []byte) int {
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 || !fr.enumValues[protoreflect.EnumNumber(int32(v))] {
			return -1
		}
		return n
	case protowire.BytesType:
		packed, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return -1
		}
		for len(packed) > 0 {
			v, m := protowire.ConsumeVarint(packed)
			if m < 0 || !fr.enumValues[protoreflect.EnumNumber(int32(v))] {
				return -1
			}
			packed = packed[m:]
		}
		return n
	}
	return -1
}

// mapEntryWireOK checks the value of one map entry (key 1, value 2) of map field fr.
func (c *Checker) mapEntryWireOK(fr *fieldRule, b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 2 && fr.msg != nil && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !c.wireOK(fr.msg, v) {
				return false
			}
			b = b[n:]
		case num == 2 && fr.fd.MapValue().Kind() == protoreflect.EnumKind:
			if typ != protowire.VarintType {
				return false
			}
			n := c.enumWire(fr, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
		case num == 1 || num == 2 && fr.msg == nil:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
		default:
			return false
		}
	}
	return true
}

// typedConfigWireOK checks the wire form of an Any: its type, then its value.
func (c *Checker) typedConfigWireOK(b []byte) bool {
	var url string
	var value []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) {
			return false
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == 1 {
			url = string(v)
		} else {
			value = v
		}
	}
	if c.anyOK[url][string(value)] {
		return true
	}
	r := c.anyRules[url]
	if r == nil {
		name := protoreflect.FullName(url[strings.LastIndexByte(url, '/')+1:])
		if _, ok := c.list.messages[name]; !ok {
			return false
		}
		mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
		if err != nil {
			return false
		}
		r = c.rule(mt.Descriptor())
		c.anyRules[url] = r
	}
	if !c.wireOK(r, value) {
		return false
	}
	ok := c.anyOK[url]
	if ok == nil {
		ok = map[string]bool{}
		c.anyOK[url] = ok
	}
	ok[string(value)] = true
	return true
}

func (c *Checker) message(m protoreflect.Message) {
	c.messageOf(c.rule(m.Descriptor()), m)
}

// messageOf checks m, whose type's rule is r.
func (c *Checker) messageOf(r *messageRule, m protoreflect.Message) {
	switch {
	case r.closed:
		return
	case !r.known:
		c.report("message type %s", m.Descriptor().FullName())
		return
	case r.any:
		c.typedConfig(m)
		return
	}
	if len(m.GetUnknown()) > 0 {
		c.fail(fmt.Sprintf("a field of %s is unknown even to kube-mvp's protos", m.Descriptor().FullName()))
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		c.path = append(c.path, pathStep{field: fd, index: -1})
		top := len(c.path) - 1
		if fd.IsExtension() {
			c.report("extension %s", fd.FullName())
			c.path = c.path[:top]
			return true
		}
		fr := &r.fields[fd.Index()]
		switch {
		case !fr.known:
			c.report("field %s (number %d)", fd.FullName(), fd.Number())
		case fr.msg != nil && fr.msg.closed:
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				c.path[top].index = i
				c.value(fd, fr, l.Get(i))
			}
		case fd.IsMap():
			vd := fd.MapValue()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				c.path[top].key, c.path[top].hasKey = k, true
				c.value(vd, fr, mv)
				return true
			})
		default:
			c.value(fd, fr, v)
		}
		c.path = c.path[:top]
		return true
	})
}

// value checks one value of field fd (a list element or map value: fd is then the map's value
// descriptor).
func (c *Checker) value(fd protoreflect.FieldDescriptor, fr *fieldRule, v protoreflect.Value) {
	switch {
	case fr.msg != nil:
		c.messageOf(fr.msg, v.Message())
	case fd.Kind() == protoreflect.EnumKind:
		if n := v.Enum(); !fr.enumValues[n] {
			name := strconv.Itoa(int(n))
			if ev := fd.Enum().Values().ByNumber(n); ev != nil {
				name = string(ev.Name()) + " (" + name + ")"
			}
			c.report("value %s of enum %s", name, fd.Enum().FullName())
		}
	}
}

// typedConfig checks an Any: its type, then its content, unpacked with the types kube-mvp is
// built with.
func (c *Checker) typedConfig(m protoreflect.Message) {
	fds := m.Descriptor().Fields()
	url := m.Get(fds.ByNumber(1)).String()
	value := m.Get(fds.ByNumber(2)).Bytes()
	if c.anyOK[url][string(value)] {
		return
	}
	name := protoreflect.FullName(url[strings.LastIndexByte(url, '/')+1:])
	if _, ok := c.list.messages[name]; !ok {
		c.report("typed config type %s", name)
		return
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	if err != nil {
		c.fail(fmt.Sprintf("typed config type %s: %v", name, err))
		return
	}
	inner := mt.New()
	if err := proto.Unmarshal(value, inner.Interface()); err != nil {
		c.fail(fmt.Sprintf("typed config of type %s: %v", name, err))
		return
	}
	before := len(c.problems)
	c.path = append(c.path, pathStep{anyType: name, index: -1})
	c.message(inner)
	c.path = c.path[:len(c.path)-1]
	if len(c.problems) == before {
		ok := c.anyOK[url]
		if ok == nil {
			ok = map[string]bool{}
			c.anyOK[url] = ok
		}
		ok[string(value)] = true
	}
}
