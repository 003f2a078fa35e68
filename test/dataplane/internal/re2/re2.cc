// The RE2 side of package re2: compile a pattern the way Envoy does and report its size.

#include "re2.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include <re2/re2.h>

extern "C" int kubemvp_re2_program_size(const char* pattern, size_t len, char** err) {
  *err = nullptr;
  // Envoy's CompiledGoogleReMatcher (source/common/common/regex.cc) constructs
  // re2::RE2(regex, re2::RE2::Quiet): RE2's default options with error logging off.
  re2::RE2 re(re2::StringPiece(pattern, len), re2::RE2::Quiet);
  if (!re.ok()) {
    const std::string& e = re.error();
    *err = static_cast<char*>(std::malloc(e.size() + 1));
    if (*err != nullptr) {
      std::memcpy(*err, e.data(), e.size());
      (*err)[e.size()] = '\0';
    }
    return -1;
  }
  // regex.cc checks the forward program only (ProgramSize, not ReverseProgramSize).
  return re.ProgramSize();
}
