// ParseJson: a depth-counting SAX pass (which stops at the first level too deep) before
// nlohmann's DOM parse. JsonForMessage: a bounded walk of the value.
#include "pipesched/base/json_util.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/strings.h"

namespace pipesched {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxParseMessage = 200;

// Counts the open arrays and objects; stops the parse (returns false) at the first one
// that would exceed the limit, at a key given twice in one object (nlohmann would keep
// the last value without a word), or at a syntax error, remembering which.
class DepthCheck : public nlohmann::json_sax<json> {
 public:
  explicit DepthCheck(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return Open();
  }
  bool key(string_t& key) override {
    if (!keys_.empty() && !keys_.back().insert(key).second) {
      duplicate_key_ = key;
      return false;
    }
    return true;
  }
  bool end_object() override {
    if (!keys_.empty()) keys_.pop_back();
    return Close();
  }
  bool start_array(std::size_t) override { return Open(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    syntax_error_ = e.what();
    syntax_byte_ = position;
    return false;
  }

  bool too_deep() const { return too_deep_; }
  const std::optional<std::string>& duplicate_key() const { return duplicate_key_; }
  const std::string& syntax_error() const { return syntax_error_; }
  std::size_t syntax_byte() const { return syntax_byte_; }

 private:
  bool Open() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    return true;
  }
  bool Close() {
    --depth_;
    return true;
  }

  int max_depth_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::vector<std::set<std::string>> keys_;  // of each open object, innermost last
  std::optional<std::string> duplicate_key_;
  std::string syntax_error_;
  std::size_t syntax_byte_ = 0;
};

// nlohmann's "[json.exception.parse_error.101] parse error at ..." without the tag, cut
// and escaped for one line.
std::string ParserMessage(std::string_view what, std::size_t byte) {
  if (!what.empty() && what.front() == '[') {
    const std::size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  return absl::StrCat(EscapeForMessage(what, kMaxParseMessage), " (byte ", byte, ")");
}

void Append(const json& value, std::size_t limit, std::string& out) {
  if (out.size() > limit) return;
  switch (value.type()) {
    case json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
        if (!first) out.push_back(',');
        first = false;
        Append(json(it.key().substr(0, limit)), limit, out);
        out.push_back(':');
        Append(it.value(), limit, out);
      }
      out.push_back('}');
      return;
    }
    case json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
        if (!first) out.push_back(',');
        first = false;
        Append(*it, limit, out);
      }
      out.push_back(']');
      return;
    }
    case json::value_t::string: {
      const std::string& s = value.get_ref<const std::string&>();
      // Cut first (at most `limit` bytes are shown anyway), then escape; a cut inside a
      // UTF-8 sequence is replaced, not thrown about.
      out += json(s.substr(0, limit + 1)).dump(-1, ' ', false, json::error_handler_t::replace);
      return;
    }
    default:  // numbers, booleans, null, binary: short
      out += value.dump(-1, ' ', false, json::error_handler_t::replace);
      return;
  }
}

}  // namespace

absl::StatusOr<json> ParseJson(std::string_view text, int max_depth) {
  DepthCheck check(max_depth);
  json::sax_parse(text.begin(), text.end(), &check);
  if (check.too_deep()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nested deeper than ", max_depth,
                     " levels of arrays and objects (a pipesched file needs 4 at most)"));
  }
  if (check.duplicate_key().has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", QuoteForMessage(*check.duplicate_key()),
                     " is given twice in one object; give each key once"));
  }
  if (!check.syntax_error().empty()) {
    return absl::InvalidArgumentError(ParserMessage(check.syntax_error(), check.syntax_byte()));
  }
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // not expected after the SAX pass accepted it
    return absl::InvalidArgumentError(ParserMessage(e.what(), 0));
  }
}

std::string JsonForMessage(const json& value, std::size_t max_chars) {
  // Each nested level prints at least one byte before descending, so the walk never goes
  // deeper than max_chars levels.
  std::string out;
  Append(value, max_chars, out);
  if (out.size() > max_chars) {
    out.resize(max_chars >= 3 ? max_chars - 3 : 0);
    out += "...";
  }
  return out;
}

}  // namespace pipesched
