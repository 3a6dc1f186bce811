// Reading JSON from files safely, for every module that does: a parse that refuses
// deep nesting before it builds anything, and a short quote of a value for an error
// message. Internal to the build (not installed): it exposes nlohmann/json.
//
// Why a depth limit: nlohmann's parser is iterative, but dump() recurses once per level,
// so quoting a 100000-deep value in an error message overflowed the stack. No file
// pipesched reads needs more than a few levels.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace pipesched {

inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as one JSON document. InvalidArgument, without a prefix (callers add
// what the file is), for
//   - nesting of arrays and objects deeper than `max_depth`: "nested deeper than 64
//     levels of arrays and objects; ...", found before any value is built;
//   - a key given twice in one object: "key \"f\" is given twice in one object; ...";
//   - invalid JSON: the parser's "parse error at line 1, column 5: ... (byte 5)", cut to
//     about 200 bytes with control bytes escaped.
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, int max_depth = kMaxJsonDepth);

// `value` as compact JSON text for an error message, at most `max_chars` bytes (cut with
// "..."). Walks only the part it prints, so a huge or deep value costs no more than a
// small one; strings are cut before they are escaped, control bytes come out escaped.
std::string JsonForMessage(const nlohmann::json& value, std::size_t max_chars = 60);

}  // namespace pipesched
