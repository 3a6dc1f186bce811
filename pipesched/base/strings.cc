// QuoteForMessage: file text in an error message, short and on one line.
#include "pipesched/base/strings.h"

#include <charconv>

#include "absl/strings/str_format.h"

namespace pipesched {

namespace {

// Code points that print as a blank or as nothing, so that a message quoting them would
// look as if it quoted an ordinary space, or nothing: no-break and other Unicode spaces,
// zero-width and direction marks, line and paragraph separators, the byte-order mark.
bool LooksBlank(char32_t c) {
  return c == 0xA0 || c == 0xAD || c == 0x034F || c == 0x061C || c == 0x115F || c == 0x1160 ||
         c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200F) ||
         (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F) || c == 0x2800 ||
         c == 0x3000 || c == 0x3164 || (c >= 0xFE00 && c <= 0xFE0F) || c == 0xFEFF || c == 0xFFA0 ||
         (c >= 0xE0000 && c <= 0xE007F);
}

// The length of the well-formed UTF-8 sequence at text[i] (lead byte >= 0x80), or 0 when
// it is not one or encodes a C1 control (U+0080..U+009F: 0x9B is a terminal's CSI); its
// code point in `code`.
std::size_t Utf8Length(std::string_view text, std::size_t i, char32_t& code) {
  const auto lead = static_cast<unsigned char>(text[i]);
  const std::size_t n = lead >= 0xC2 && lead <= 0xDF   ? 2
                        : lead >= 0xE0 && lead <= 0xEF ? 3
                        : lead >= 0xF0 && lead <= 0xF4 ? 4
                                                       : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(text[i + k]);
    if (c < 0x80 || c > 0xBF) return 0;
  }
  const auto second = static_cast<unsigned char>(text[i + 1]);
  if (lead == 0xC2 && second <= 0x9F) return 0;                                      // C1 controls
  if ((lead == 0xE0 && second < 0xA0) || (lead == 0xF0 && second < 0x90)) return 0;  // overlong
  if ((lead == 0xED && second > 0x9F) || (lead == 0xF4 && second > 0x8F))
    return 0;  // surrogates, > U+10FFFF
  code = lead & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (std::size_t k = 1; k < n; ++k) code = (code << 6) | (text[i + k] & 0x3F);
  return n;
}

std::string Escape(std::string_view text, std::size_t max_chars, bool quotes) {
  const bool cut = text.size() > max_chars;
  if (cut) text = text.substr(0, max_chars);
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80) {
      // UTF-8 text stays readable; any other high byte is escaped, C1 controls and what
      // prints as a blank included.
      char32_t code = 0;
      if (const std::size_t n = Utf8Length(text, i, code); n > 0 && !LooksBlank(code)) {
        out.append(text.substr(i, n));
        i += n - 1;
      } else {
        out += absl::StrFormat("\\x%02x", c);
      }
      continue;
    }
    switch (c) {
      case '\r':
        out += "\\r";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c == '"' && quotes) {
          out += "\\\"";
        } else if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out.push_back(ch);
        }
    }
  }
  if (cut) out += "...";
  return out;
}

}  // namespace

std::size_t FindControlByte(std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) return i;
    if (c < 0x80) continue;
    char32_t code = 0;
    if (const std::size_t n = Utf8Length(text, i, code); n > 0) {
      i += n - 1;
      continue;
    }
    // Not UTF-8: a raw C1 byte, or U+0080..U+009F encoded, is a control; other bytes
    // (Latin-1 text in a file name) are not.
    const bool c1_encoded = c == 0xC2 && i + 1 < text.size() &&
                            static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                            static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (c <= 0x9F || c1_encoded) return i;
  }
  return std::string_view::npos;
}

std::string EscapeForMessage(std::string_view text, std::size_t max_chars) {
  return Escape(text, max_chars, /*quotes=*/false);
}

std::string QuoteForMessage(std::string_view text, std::size_t max_chars) {
  return "\"" + Escape(text, max_chars, /*quotes=*/true) + "\"";
}

std::string ShortestNumber(double value) {
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

bool IsDecimalNumber(std::string_view text) {
  std::size_t i = 0;
  auto digits = [&] {
    const std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  std::size_t mantissa = digits();
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

}  // namespace pipesched
