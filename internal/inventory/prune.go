package inventory

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kube-mvp/kube-mvp/internal/objects"
)

// Pruning an aggregated discovery document while it is read, so that one bloated CRD (fifty
// versions, eight thousand categories) costs its own entries and never the fetch:
// the document is copied, compact, into at most the body limit, each array at most its bound,
// and a group that does not fit, or holds a string no real name has, is left out whole.
// Skipped bytes cost reading time only (the fetch's timeout bounds it), never memory.

// pruneReadFactor: an aggregated body may be this many times the body limit before the fetch
// fails; what is over the bounds within it is skipped without being kept.
const pruneReadFactor = 32

// maxDiscoveryString bounds one string of the document: a Kubernetes name is at most 253
// bytes, a verb or category far less.
const maxDiscoveryString = 1024

// maxDiscoveryDepth bounds nesting: a real document is eight levels deep. Deeper fails the
// fetch like malformed JSON (the recursion's stack is what it bounds).
const maxDiscoveryDepth = 32

// arrayBounds are the most elements kept of each array, by its key; any other array keeps
// defaultArrayBound.
var arrayBounds = map[string]int{
	"items":         objects.MaxDiscoveryGroups,
	"versions":      objects.MaxDiscoveryVersions,
	"resources":     objects.MaxDiscoveryResources,
	"verbs":         objects.MaxDiscoveryResourceStrings,
	"shortNames":    objects.MaxDiscoveryResourceStrings,
	"categories":    objects.MaxDiscoveryResourceStrings,
	"subresources":  objects.MaxDiscoveryResourceStrings,
	"acceptedTypes": objects.MaxDiscoveryResourceStrings,
}

const defaultArrayBound = 64

var errTooDeep = fmt.Errorf("nested deeper than %d", maxDiscoveryDepth)

// topOverError: the document without its groups does not fit the limit, or holds a string no
// real one has; nothing of it is used.
type topOverError struct{ why string }

func (e *topOverError) Error() string { return e.why + " outside its groups" }

type syntaxError struct{ msg string }

func (e *syntaxError) Error() string { return "malformed JSON: " + e.msg }

// sink is where a copy goes: a nil sink skips. A sink over its max stops keeping bytes, and a
// string too long poisons it; either way reading goes on to the value's end, so that the rest
// of the document is read in step.
type sink struct {
	buf    bytes.Buffer
	max    int
	poison string // why this copy is not used, or ""
}

func (s *sink) writeByte(c byte) {
	if s == nil || s.poison != "" {
		return
	}
	if s.buf.Len() >= s.max {
		s.spoil(fmt.Sprintf("over what is left of the body limit (%d bytes)", s.max))
		return
	}
	s.buf.WriteByte(c)
}

// write is writeByte of each byte of b.
func (s *sink) write(b []byte) {
	if s == nil || s.poison != "" {
		return
	}
	if s.buf.Len()+len(b) > s.max {
		s.spoil(fmt.Sprintf("over what is left of the body limit (%d bytes)", s.max))
		return
	}
	s.buf.Write(b)
}

func (s *sink) spoil(why string) {
	if s != nil && s.poison == "" {
		s.poison = why
		s.buf = bytes.Buffer{} // nothing of it is kept
	}
}

// prunedDoc is a pruned document: its bytes, what was left out of it (one note per kind of
// thing left out, naming the first), and where its groups are in it.
type prunedDoc struct {
	body  []byte
	notes []string
	// items is where the items array is in body: its '[' and its ']'; groups, each group
	// kept in it, from its '{' to just after its '}'. Empty unless the document has exactly
	// one key that encoding/json decodes as items, and it is "items".
	items  [2]int
	groups [][2]int
}

// pruneAggregated copies the JSON document r holds into at most max bytes, as described
// above. Malformed JSON, or a document whose top level (all but its groups) does not fit,
// fails.
func pruneAggregated(r io.Reader, max int) (prunedDoc, error) {
	p := &pruner{r: bufio.NewReaderSize(r, 32<<10), noted: map[string]bool{}}
	c, err := p.next()
	if err != nil {
		return prunedDoc{}, unexpected(err)
	}
	if c != '{' {
		return prunedDoc{}, &syntaxError{"the document is not an object"}
	}
	p.top = &sink{max: max}
	if err := p.object(p.top, 0); err != nil {
		return prunedDoc{}, err
	}
	if c, err := p.next(); err != io.EOF {
		if err == nil {
			err = &syntaxError{fmt.Sprintf("%q after the document", c)}
		}
		return prunedDoc{}, err
	}
	d := prunedDoc{body: p.top.buf.Bytes(), notes: p.notes}
	if p.itemsKeys == 1 {
		d.items, d.groups = p.items, p.spans
	}
	return d, nil
}

type pruner struct {
	r      *bufio.Reader
	top    *sink // the document's copy: spoiling it ends the read
	budget int   // bytes of output left for groups
	notes  []string
	noted  map[string]bool

	groupName string // items[i].metadata.name of the group being read, when seen
	// items and spans: where the last items array and its groups are in top (prunedDoc).
	items     [2]int
	spans     [][2]int
	itemsKeys int
	key       sink // every key is read into it
	group     sink // every group is read into it
}

func (p *pruner) note(kind, msg string) {
	if !p.noted[kind] {
		p.noted[kind] = true
		p.notes = append(p.notes, msg)
	}
}

// stop ends the read once the document's own copy is spoiled: nothing of it will be used.
func (p *pruner) stop() error {
	if p.top != nil && p.top.poison != "" {
		return &topOverError{p.top.poison}
	}
	return nil
}

// next is the next byte that is not whitespace.
func (p *pruner) next() (byte, error) {
	if err := p.stop(); err != nil {
		return 0, err
	}
	for {
		c, err := p.r.ReadByte()
		if err != nil {
			return 0, err
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c, nil
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return &syntaxError{"unexpected end"}
	}
	return err
}

// elements reads the elements of an object or array whose opening byte was read, calling each
// with the first byte of an element (for an object, the key's quote) until the closing byte.
func (p *pruner) elements(closing byte, each func(c byte, i int) error) error {
	for i := 0; ; i++ {
		c, err := p.next()
		if err != nil {
			return unexpected(err)
		}
		if c == closing && i == 0 {
			return nil
		}
		if i > 0 {
			if c == closing {
				return nil
			}
			if c != ',' {
				return &syntaxError{fmt.Sprintf("%q between elements", c)}
			}
			if c, err = p.next(); err != nil {
				return unexpected(err)
			}
		}
		if err := each(c, i); err != nil {
			return err
		}
	}
}

// object copies an object whose '{' was read; at depth 0 (the document) its items are groups.
func (p *pruner) object(out *sink, depth int) error {
	if depth > maxDiscoveryDepth {
		return errTooDeep
	}
	out.writeByte('{')
	err := p.elements('}', func(c byte, i int) error {
		if c != '"' {
			return &syntaxError{fmt.Sprintf("%q for a key", c)}
		}
		if i > 0 {
			out.writeByte(',')
		}
		key := &p.key // read and copied before any value: one sink serves every key
		key.buf.Reset()
		key.max, key.poison = maxDiscoveryString+2, ""
		if err := p.str(key); err != nil {
			return err
		}
		if key.poison != "" {
			return &syntaxError{"a key longer than " + strconv.Itoa(maxDiscoveryString) + " bytes"}
		}
		out.write(key.buf.Bytes())
		c, err := p.next()
		if err != nil {
			return unexpected(err)
		}
		if c != ':' {
			return &syntaxError{fmt.Sprintf("%q after a key", c)}
		}
		out.writeByte(':')
		name := keyName(key.buf.Bytes())
		if depth == 0 && strings.EqualFold(name, "items") {
			p.itemsKeys++ // as encoding/json matches keys
		}
		if depth == 0 && name == "items" {
			return p.groups(out)
		}
		if c, err = p.next(); err != nil {
			return unexpected(err)
		}
		return p.value(out, c, name, depth+1)
	})
	out.writeByte('}')
	return err
}

// groups copies the document's items, each group whole or not at all.
func (p *pruner) groups(out *sink) error {
	c, err := p.next()
	if err != nil {
		return unexpected(err)
	}
	if c != '[' {
		return &syntaxError{"items is not an array"}
	}
	open := out.buf.Len()
	out.writeByte('[')
	// The groups share what the rest of the document leaves of the limit; 64 bytes are kept
	// for the document's end.
	p.budget = out.max - out.buf.Len() - 64
	kept := 0
	var spans [][2]int
	err = p.elements(']', func(c byte, i int) error {
		if c != '{' {
			return &syntaxError{"a group is not an object"}
		}
		if kept == objects.MaxDiscoveryGroups {
			p.note("groups", fmt.Sprintf("more than %d groups; the rest left out", objects.MaxDiscoveryGroups))
			return p.object(nil, 1)
		}
		p.groupName = ""
		group := &p.group // copied out before the next group: one sink serves them all
		group.buf.Reset()
		group.max, group.poison = p.budget-1, "" // and a comma
		if err := p.object(group, 1); err != nil {
			return err
		}
		if group.poison != "" {
			name := "#" + strconv.Itoa(i)
			if p.groupName != "" {
				name = strconv.Quote(p.groupName)
			}
			p.note("group "+name, fmt.Sprintf("group %s left out: %s", name, group.poison))
			return nil
		}
		if kept > 0 {
			out.writeByte(',')
			p.budget--
		}
		start := out.buf.Len()
		out.write(group.buf.Bytes())
		spans = append(spans, [2]int{start, out.buf.Len()})
		p.budget -= group.buf.Len()
		kept++
		return nil
	})
	p.items, p.spans = [2]int{open, out.buf.Len()}, spans // a later items key wins, as in encoding/json
	out.writeByte(']')
	return err
}

// value copies the value starting with c; key is the key it is under.
func (p *pruner) value(out *sink, c byte, key string, depth int) error {
	switch {
	case c == '{':
		return p.object(out, depth)
	case c == '[':
		return p.array(out, key, depth)
	case c == '"':
		if key == "name" && depth == 3 && out != nil { // a group's metadata.name
			name := &sink{max: maxDiscoveryString + 2}
			err := p.str(name)
			if name.poison != "" {
				out.spoil(name.poison)
			}
			p.groupName, _ = strconv.Unquote(name.buf.String())
			for _, b := range name.buf.Bytes() {
				out.writeByte(b)
			}
			return err
		}
		return p.str(out)
	case c == 't':
		return p.literal(out, "true")
	case c == 'f':
		return p.literal(out, "false")
	case c == 'n':
		return p.literal(out, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number(out, c)
	}
	return &syntaxError{fmt.Sprintf("%q starts no value", c)}
}

// array copies an array whose '[' was read, keeping at most its key's bound of elements.
func (p *pruner) array(out *sink, key string, depth int) error {
	if depth > maxDiscoveryDepth {
		return errTooDeep
	}
	bound, ok := arrayBounds[key]
	if !ok {
		bound = defaultArrayBound
	}
	out.writeByte('[')
	err := p.elements(']', func(c byte, i int) error {
		dst := out
		if i == bound {
			p.note("array "+key, fmt.Sprintf("more than %d %s in one list; the rest left out", bound, key))
		}
		if i >= bound {
			dst = nil
		} else if i > 0 {
			out.writeByte(',')
		}
		return p.value(dst, c, key, depth+1)
	})
	out.writeByte(']')
	return err
}

// str copies a string whose opening quote was read, quotes included, checking its escapes; a
// string over maxDiscoveryString bytes spoils out (and is read to its end).
func (p *pruner) str(out *sink) error {
	out.writeByte('"')
	for n := 0; ; n++ {
		if n == maxDiscoveryString {
			out.spoil(fmt.Sprintf("a string longer than %d bytes", maxDiscoveryString))
			if err := p.stop(); err != nil {
				return err
			}
		}
		// The bytes that need no look, as many as are read already, copied at once (up to the
		// bound, so that the byte that reaches it is checked above).
		limit := maxDiscoveryString - n
		if n >= maxDiscoveryString {
			limit = 1 << 30
		}
		if k := p.plainRun(out, limit); k > 0 {
			n += k - 1
			continue
		}
		c, err := p.r.ReadByte()
		if err != nil {
			return unexpected(err)
		}
		switch {
		case c == '"':
			out.writeByte('"')
			return nil
		case c < 0x20:
			return &syntaxError{"a control character in a string"}
		case c == '\\':
			e, err := p.r.ReadByte()
			if err != nil {
				return unexpected(err)
			}
			out.writeByte(c)
			out.writeByte(e)
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for k := 0; k < 4; k++ {
					h, err := p.r.ReadByte()
					if err != nil {
						return unexpected(err)
					}
					if !isHex(h) {
						return &syntaxError{"a bad \\u escape"}
					}
					out.writeByte(h)
				}
			default:
				return &syntaxError{fmt.Sprintf("the escape \\%c", e)}
			}
		default:
			out.writeByte(c)
		}
	}
}

// plainRun copies the bytes of a string already read that are neither a quote, a backslash
// nor a control character, at most limit of them, and says how many.
func (p *pruner) plainRun(out *sink, limit int) int {
	buf, _ := p.r.Peek(p.r.Buffered())
	i := 0
	for i < len(buf) && i < limit {
		if c := buf[i]; c == '"' || c == '\\' || c < 0x20 {
			break
		}
		i++
	}
	if i > 0 {
		out.write(buf[:i])
		p.r.Discard(i) //nolint:errcheck // i bytes are buffered
	}
	return i
}

// keyName is a key as a string (its quotes off, escapes decoded); discovery's own keys
// without allocating.
func keyName(quoted []byte) string {
	switch string(quoted) {
	case `"items"`:
		return "items"
	case `"versions"`:
		return "versions"
	case `"resources"`:
		return "resources"
	case `"verbs"`:
		return "verbs"
	case `"shortNames"`:
		return "shortNames"
	case `"categories"`:
		return "categories"
	case `"subresources"`:
		return "subresources"
	case `"acceptedTypes"`:
		return "acceptedTypes"
	case `"metadata"`:
		return "metadata"
	case `"name"`:
		return "name"
	case `"resource"`:
		return "resource"
	case `"subresource"`:
		return "subresource"
	case `"responseKind"`:
		return "responseKind"
	case `"scope"`:
		return "scope"
	case `"singularResource"`:
		return "singularResource"
	case `"version"`:
		return "version"
	case `"group"`:
		return "group"
	case `"kind"`:
		return "kind"
	case `"apiVersion"`:
		return "apiVersion"
	case `"freshness"`:
		return "freshness"
	}
	name, _ := strconv.Unquote(string(quoted))
	return name
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func (p *pruner) literal(out *sink, want string) error {
	out.writeByte(want[0])
	for i := 1; i < len(want); i++ {
		c, err := p.r.ReadByte()
		if err != nil {
			return unexpected(err)
		}
		if c != want[i] {
			return &syntaxError{fmt.Sprintf("%q in %s", c, want)}
		}
		out.writeByte(c)
	}
	return nil
}

// number copies a number, checked against JSON's grammar; one longer than a string may be
// spoils out like a long string.
func (p *pruner) number(out *sink, first byte) error {
	num := []byte{first}
	for {
		c, err := p.r.ReadByte()
		if err != nil && err != io.EOF {
			return err
		}
		if err == nil && ((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
			if len(num) < maxDiscoveryString {
				num = append(num, c)
			} else if out.spoil(fmt.Sprintf("a number longer than %d bytes", maxDiscoveryString)); p.stop() != nil {
				return p.stop()
			}
			continue
		}
		if err == nil {
			if err := p.r.UnreadByte(); err != nil {
				return err
			}
		}
		if len(num) < maxDiscoveryString && !json.Valid(num) {
			return &syntaxError{fmt.Sprintf("the number %q", num)}
		}
		for _, b := range num {
			out.writeByte(b)
		}
		return nil
	}
}
