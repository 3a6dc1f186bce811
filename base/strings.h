// Debian's Abseil (20220623) is built with its own absl::string_view
// (ABSL_OPTION_USE_STD_STRING_VIEW 0): std::string_view does not convert to it, so
// absl::StrCat / StrFormat / StrSplit reject it. Convert explicitly with Absl().
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace pipesched {

inline absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace pipesched
