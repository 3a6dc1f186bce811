// QuoteForMessage: file text in an error message, short and on one line.
#include "base/strings.h"

#include "absl/strings/str_format.h"

namespace pipesched {

namespace {

std::string Escape(std::string_view text, std::size_t max_chars, bool quotes) {
  const bool cut = text.size() > max_chars;
  if (cut) text = text.substr(0, max_chars);
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
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

std::string EscapeForMessage(std::string_view text, std::size_t max_chars) {
  return Escape(text, max_chars, /*quotes=*/false);
}

std::string QuoteForMessage(std::string_view text, std::size_t max_chars) {
  return "\"" + Escape(text, max_chars, /*quotes=*/true) + "\"";
}

}  // namespace pipesched
