// Private to trace/: how each op label is drawn by the exporters (short code for the
// terminal grid, colours for the grid and the SVG, a legend description), and the axis
// helpers and drawing limits they share. Not installed.
#pragma once

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "pipesched/trace/timeline.h"

namespace pipesched::trace::internal {

struct OpStyle {
  std::string_view op;           // "F", "SEND_F", ...; empty for the fallback style
  std::string_view code;         // short label in the terminal grid: "F", "SF", "AR"
  std::string_view description;  // legend text: "forward"
  std::string_view fill;         // SVG fill, "#rrggbb"
  std::string_view ansi;         // SGR parameters for the grid cell: "97;44"
  int legend_order;              // position in legends
};

// The style of `op`; unknown ops get a neutral grey style whose code is the op itself.
const OpStyle& StyleOf(std::string_view op);

// The smallest of 1, 2, 5 x 10^k that is >= x: axis tick spacing. 1 when x <= 0.
double NiceStep(double x);

// `text` with &, <, > and " escaped for SVG/XML text and attribute values; control
// characters other than tab, newline and carriage return, and bytes that are not
// well-formed UTF-8, become U+FFFD (XML 1.0 allows neither).
std::string XmlEscape(std::string_view text);

// The most ticks an axis draws: a bound on every tick loop, whatever rounding does to
// the step.
inline constexpr int kMaxTicks = 1000;

// A declared rank (below Timeline::num_ranks) that no span uses is drawn only when it is
// below this: a num_ranks of 2^31 would otherwise draw for minutes. A rank with a span
// is always drawn.
inline constexpr int kMaxEmptyRanksDrawn = 1024;

// The declared ranks of `timeline` that an exporter leaves out by that rule: those in
// [kMaxEmptyRanksDrawn, num_ranks) that no span uses.
long long EmptyRanksNotDrawn(const Timeline& timeline);

// The row within its lane that each span of `timeline` is drawn on (indexed as
// timeline.spans): spans of one (rank, lane) that overlap in time go to separate rows,
// each to the lowest row that is free at its start, so that no row holds two spans at
// once. A lane without overlaps keeps all its spans on row 0, as do spans with times
// that are not finite. Overlaps happen on the transfer lanes: the simulator lets a
// rank's sends be in flight together when a transfer lasts longer than the compute
// between them. Spans that meet end to start (within 1e-9 relative) do not overlap.
std::vector<int> LaneRows(const Timeline& timeline);

// Whether `span`'s start and end are finite: spans that are not are left out of pictures
// (the simulator refuses such times; a hand-made or corrupt timeline may have them).
// Their rows are still drawn.
inline bool HasFiniteTimes(const Span& span) {
  return std::isfinite(span.start) && std::isfinite(span.end);
}

// A coordinate with two decimals, trailing zeros dropped: compact and exact enough.
std::string SvgNum(double x);

}  // namespace pipesched::trace::internal
