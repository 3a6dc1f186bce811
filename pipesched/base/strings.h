// Debian's Abseil (20220623) is built with its own absl::string_view
// (ABSL_OPTION_USE_STD_STRING_VIEW 0): std::string_view does not convert to it, so
// absl::StrCat / StrFormat / StrSplit reject it. Convert explicitly with Absl().
// Also: quoting text that came from a file for a one-line error message.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace pipesched {

inline absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// `text` in double quotes for an error message: at most `max_chars` bytes of it, cut
// with "..." inside the quotes, and every byte that could break the line or the
// terminal (control bytes, DEL, '"' and '\\') escaped as \r, \n, \t, \", \\ or \xNN.
// "0B0\r1F0" -> "\"0B0\\r1F0\"". Well-formed UTF-8 passes through (text stays readable);
// other bytes >= 0x80, UTF-8's C1 controls (U+0080..U+009F) and the code points that print
// as a blank or as nothing (U+00A0 no-break space, zero-width marks, U+FEFF ...) are
// escaped as \xNN.
std::string QuoteForMessage(std::string_view text, std::size_t max_chars = 40);

// The same without the quotes (and '"' left as it is), for text the message quotes its
// own way: "bad value 'x' for --flag".
std::string EscapeForMessage(std::string_view text, std::size_t max_chars = 40);

// The position of the first control character in `text` (C0, DEL, or C1 whether a raw
// byte 0x80..0x9F or U+0080..U+009F in UTF-8), or npos: what a terminal could take as a
// command. Other bytes that are not UTF-8 are not controls.
std::size_t FindControlByte(std::string_view text);

// `value` with as many digits as it takes to read back as the same double, and no more:
// 1.0000001e+15, 65536.001, 0.1, 2, inf, nan. For messages that quote a number a user
// gave (absl::StrCat keeps 6 digits, so "--cost-f=1e+15 is not in [0, 1e+15]").
std::string ShortestNumber(double value);

// A decimal number: [+-]digits[.digits][e[+-]digits], or with the digits after the point
// only (".5"). abseil's SimpleAtod would also take hexadecimal ("0x10" as 16), spaces,
// "inf" and "nan": check with this first where the text is the user's.
bool IsDecimalNumber(std::string_view text);

}  // namespace pipesched
