// Palette shared by the terminal grid and the SVG: a colour-blind-safe set (Tableau 10)
// so that F/B/I/W and the communication ops stay apart in print and on screen.
#include "pipesched/trace/op_style.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"

namespace pipesched::trace::internal {
namespace {

constexpr std::array<OpStyle, 11> kStyles = {{
    {"F", "F", "forward", "#4E79A7", "97;44", 0},
    {"B", "B", "backward", "#59A14F", "30;42", 1},
    {"I", "I", "backward (input)", "#76B7B2", "30;46", 2},
    {"W", "W", "backward (weights)", "#B07AA1", "97;45", 3},
    {"SEND_F", "SF", "send activation", "#F28E2B", "30;43", 4},
    {"RECV_F", "RF", "receive activation", "#EDC948", "30;103", 5},
    {"SEND_B", "SB", "send gradient", "#FF9DA7", "30;105", 6},
    {"RECV_B", "RB", "receive gradient", "#9C755F", "97;100", 7},
    {"ALLREDUCE", "AR", "all-reduce", "#E15759", "97;41", 8},
    // Once per step, around the schedule's actions (a whole step's picture).
    {"ZERO_GRAD", "Z", "zero gradients", "#79706E", "97;40", 9},
    {"OPTIMIZER", "O", "optimizer step", "#8CD17D", "30;102", 10},
}};

constexpr OpStyle kUnknown = {"", "", "other", "#BAB0AC", "30;47", 11};

}  // namespace

const OpStyle& StyleOf(std::string_view op) {
  for (const OpStyle& style : kStyles) {
    if (style.op == op) return style;
  }
  // PyTorch's name for the gradient reduction.
  if (op == "REDUCE_GRAD") return kStyles[8];
  return kUnknown;
}

double NiceStep(double x) {
  if (!(x > 0) || !std::isfinite(x)) return 1;
  const double magnitude = std::pow(10.0, std::floor(std::log10(x)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= x * (1 - 1e-9)) return m * magnitude;
  }
  return 10 * magnitude;
}

long long EmptyRanksNotDrawn(const Timeline& timeline) {
  if (timeline.num_ranks <= kMaxEmptyRanksDrawn) return 0;
  std::set<int> used;
  for (const Span& span : timeline.spans) {
    if (span.rank >= kMaxEmptyRanksDrawn && span.rank < timeline.num_ranks) used.insert(span.rank);
  }
  return static_cast<long long>(timeline.num_ranks) - kMaxEmptyRanksDrawn -
         static_cast<long long>(used.size());
}

std::vector<int> LaneRows(const Timeline& timeline) {
  const std::size_t n = timeline.spans.size();
  std::vector<int> row(n, 0);
  std::vector<std::size_t> order;
  order.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (HasFiniteTimes(timeline.spans[i])) order.push_back(i);
  }
  // By (rank, lane), then start, then end: each span goes to the lowest row whose last
  // span has ended by its start.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Span& x = timeline.spans[a];
    const Span& y = timeline.spans[b];
    return std::tie(x.rank, x.lane, x.start, x.end, a) <
           std::tie(y.rank, y.lane, y.start, y.end, b);
  });
  std::vector<double> row_end;  // of the current (rank, lane)
  for (std::size_t k = 0; k < order.size(); ++k) {
    const Span& span = timeline.spans[order[k]];
    if (k == 0 || span.rank != timeline.spans[order[k - 1]].rank ||
        span.lane != timeline.spans[order[k - 1]].lane) {
      row_end.clear();
    }
    const auto free_at = [&](double end) {
      return span.start >= end || end - span.start <= 1e-9 * std::max(std::abs(end), 1.0);
    };
    std::size_t r = 0;
    while (r < row_end.size() && !free_at(row_end[r])) ++r;
    if (r == row_end.size()) row_end.push_back(span.end);
    row_end[r] = std::max(span.end, span.start);
    row[order[k]] = static_cast<int>(r);
  }
  return row;
}

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no overlong forms,
// no surrogates, at most U+10FFFF), or 0.
std::size_t Utf8Length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    const std::size_t n = Utf8Length(text, i);
    // XML 1.0 allows no control character but tab, newline and carriage return, and only
    // well-formed UTF-8: anything else (a name taken from a file) becomes U+FFFD.
    // U+FFFE and U+FFFF (EF BF BE, EF BF BF) are no XML characters either.
    const bool nonchar = n == 3 && text.substr(i, 2) == "\xEF\xBF" &&
                         static_cast<unsigned char>(text[i + 2]) >= 0xBE;
    if (n == 0 || nonchar ||
        (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')) {
      out += "\xEF\xBF\xBD";
      i += n == 0 ? 1 : n;
      continue;
    }
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.append(text.substr(i, n));
    }
    i += n;
  }
  return out;
}

std::string SvgNum(double x) {
  std::string s = absl::StrFormat("%.2f", x);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

}  // namespace pipesched::trace::internal
