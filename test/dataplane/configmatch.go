package dataplane

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/kube-mvp/kube-mvp/test/dataplane/internal/re2"
)

// String matchers (envoy.type.matcher.v3.StringMatcher) and the RE2 regexes they and
// routes use.

// re2MaxProgramSizeErrorLevel is the default of Envoy's runtime key
// re2.max_program_size.error_level. The stand-in models no runtime: our bootstraps
// (envoy/*.yaml) configure no layered_runtime, so Envoy runs with this default. (The warn
// level, re2.max_program_size.warn_level, only logs and is not modelled.)
const re2MaxProgramSizeErrorLevel = 100

// compileRE2 compiles an Envoy safe_regex (RE2, matched against the whole string).
//
// Envoy compiles every google_re2 RegexMatcher with RE2 and rejects the configuration when
// RE2 rejects the pattern, or when the compiled program's size (RE2::ProgramSize, the
// forward program only) exceeds the error level (source/common/common/regex.cc,
// CompiledGoogleReMatcher's constructor, through Regex::Utility::parseRegex): the
// resource is NACKed with that message. The size is RE2's own (internal/re2, Debian's
// libre2 through cgo); matching stays with Go's regexp, which implements RE2's syntax.
func compileRE2(re string) (*regexp.Regexp, error) {
	size, err := re2.ProgramSize(re)
	if err != nil {
		return nil, err // RE2's message, as Envoy's NACK carries it
	}
	if size > re2MaxProgramSizeErrorLevel {
		return nil, fmt.Errorf("regex '%s' RE2 program size of %d > max program size of %d set for the "+
			"error level threshold. Increase configured max program size if necessary.", re, size, re2MaxProgramSizeErrorLevel)
	}
	return regexp.Compile(`^(?:` + re + `)$`)
}

type stringMatcher struct {
	exact, prefix, suffix, contains *string
	re                              *regexp.Regexp
	ignoreCase                      bool
}

func compileStringMatcher(m *matcherv3.StringMatcher) (*stringMatcher, error) {
	if m == nil {
		return nil, errors.New("missing string matcher")
	}
	sm := &stringMatcher{ignoreCase: m.GetIgnoreCase()}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		sm.exact = &p.Exact
	case *matcherv3.StringMatcher_Prefix:
		sm.prefix = &p.Prefix
	case *matcherv3.StringMatcher_Suffix:
		sm.suffix = &p.Suffix
	case *matcherv3.StringMatcher_Contains:
		sm.contains = &p.Contains
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := compileRE2(p.SafeRegex.GetRegex())
		if err != nil {
			return nil, err
		}
		sm.re = re
	default:
		return nil, errors.New("string matcher: unimplemented match pattern")
	}
	return sm, nil
}

// match follows StringMatcher: ignore_case applies to exact, prefix, suffix and contains,
// not to safe_regex.
func (m *stringMatcher) match(s string) bool {
	fold := func(x string) string {
		if m.ignoreCase {
			return strings.ToLower(x)
		}
		return x
	}
	switch {
	case m.exact != nil:
		return fold(s) == fold(*m.exact)
	case m.prefix != nil:
		return strings.HasPrefix(fold(s), fold(*m.prefix))
	case m.suffix != nil:
		return strings.HasSuffix(fold(s), fold(*m.suffix))
	case m.contains != nil:
		return strings.Contains(fold(s), fold(*m.contains))
	case m.re != nil:
		return m.re.MatchString(s)
	}
	return false
}
