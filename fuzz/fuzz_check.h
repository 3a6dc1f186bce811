// PS_FUZZ_CHECK: an invariant the fuzz targets hold the library to. A failure prints the
// condition and a detail, then aborts, which libFuzzer records as a crash with its input.
// Not for library code: library code returns absl::Status.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

namespace pipesched::fuzz {

// Simulating more actions than this is skipped: time spent there is a slow input, not a
// bug, and libFuzzer would report it as a timeout.
inline constexpr std::size_t kMaxSimulatedActions = 100'000;

[[noreturn]] inline void FuzzFail(const char* file, int line, const char* condition,
                                  const std::string& detail) {
  std::fprintf(stderr, "%s:%d: PS_FUZZ_CHECK(%s) failed: %s\n", file, line, condition,
               detail.c_str());
  std::abort();
}

inline std::string Detail(const absl::Status& status) { return status.ToString(); }
inline std::string Detail(const std::string& text) { return text; }
inline std::string Detail(const char* text) { return text; }

}  // namespace pipesched::fuzz

#define PS_FUZZ_CHECK(condition, detail)                              \
  do {                                                                \
    if (!(condition)) {                                               \
      ::pipesched::fuzz::FuzzFail(__FILE__, __LINE__, #condition,     \
                                  ::pipesched::fuzz::Detail(detail)); \
    }                                                                 \
  } while (false)
