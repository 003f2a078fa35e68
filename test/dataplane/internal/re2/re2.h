// C interface to the few RE2 calls the Go side needs (re2.go).
#ifndef KUBEMVP_RE2_H
#define KUBEMVP_RE2_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// kubemvp_re2_program_size compiles pattern[0:len] as Envoy's CompiledGoogleReMatcher does
// and returns RE2::ProgramSize(), or -1 with *err set to a malloc'd message when RE2
// rejects the pattern (the caller frees it).
int kubemvp_re2_program_size(const char* pattern, size_t len, char** err);

#ifdef __cplusplus
}
#endif

#endif
