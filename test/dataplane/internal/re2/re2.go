// Package re2 measures regular expressions with RE2 itself (Debian's libre2, through cgo),
// for the test data plane's check of Envoy's RE2 program size limit.
//
// Envoy compiles every google_re2 safe_regex with RE2 and rejects one whose program is too
// large (source/common/common/regex.cc, CompiledGoogleReMatcher). The program size is an
// artefact of RE2's compiler (its instruction count), which Go's regexp does not reproduce,
// so the size comes from libre2 while matching stays with Go's regexp (the same RE2 syntax).
// Envoy bundles a newer RE2 than Debian's: sizes can differ slightly between the two.
package re2

/*
#cgo CXXFLAGS: -std=c++17
#cgo LDFLAGS: -lre2
#include <stdlib.h>
#include "re2.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// ProgramSize compiles pattern as Envoy's CompiledGoogleReMatcher does (re2::RE2 with
// re2::RE2::Quiet, the pattern as given: Envoy full-matches it, it does not anchor it) and
// returns RE2::ProgramSize(), the size regex.cc compares with re2.max_program_size. An
// error is RE2's message for a pattern it rejects.
func ProgramSize(pattern string) (int, error) {
	p := C.CString(pattern)
	defer C.free(unsafe.Pointer(p))
	var cerr *C.char
	n := C.kubemvp_re2_program_size(p, C.size_t(len(pattern)), &cerr)
	if n < 0 {
		msg := "RE2 rejected the pattern"
		if cerr != nil {
			msg = C.GoString(cerr)
			C.free(unsafe.Pointer(cerr))
		}
		return 0, errors.New(msg)
	}
	return int(n), nil
}
