// Terminal grid renderer. Columns are a fixed slice of time: when the timeline fits,
// one column is a whole fraction of the shortest span so that every label fits with a
// space after it; otherwise the scale shrinks to the requested width, and a span too
// narrow for its label shows its op alone (never a cut number: "F1" for F12 would name
// another micro-batch).
#include "pipesched/trace/grid.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipesched/base/strings.h"
#include "pipesched/trace/op_style.h"

namespace pipesched::trace {
namespace {

using internal::EmptyRanksNotDrawn;
using internal::kMaxEmptyRanksDrawn;
using internal::NiceStep;
using internal::OpStyle;
using internal::StyleOf;

constexpr int kMinPlotColumns = 10;
constexpr int kMinTickSpacing = 8;               // columns between axis labels
constexpr int kMinWidth = 1, kMaxWidth = 10000;  // GridOptions::max_width, as grid.h says

// "F3", or "2F3" (stage 2's, the schedule's action text) where a rank runs several
// stages (`with_stage`): interleaved and V schedules, whose chunks would read alike.
std::string SpanLabel(const Span& span, bool with_stage) {
  const OpStyle& style = StyleOf(span.op);
  std::string label = with_stage && span.stage >= 0 ? absl::StrCat(span.stage) : std::string();
  absl::StrAppend(&label, style.code.empty() ? span.op : std::string(style.code));
  if (span.microbatch >= 0) absl::StrAppend(&label, span.microbatch);
  return label;
}

// Whether some rank's compute lane holds spans of two stages or more.
bool RanksRunSeveralStages(const Timeline& timeline) {
  std::map<int, int> stage_of_rank;
  for (const Span& span : timeline.spans) {
    if (span.lane != kComputeLane || span.stage < 0) continue;
    const auto [it, inserted] = stage_of_rank.emplace(span.rank, span.stage);
    if (!inserted && it->second != span.stage) return true;
  }
  return false;
}

// A lane's first row is named for the lane, its further rows (spans that overlap the
// first row's, LaneRows) "send (2)", "send (3)", ...
std::string RowLabel(const Timeline& timeline, int rank, int lane, int row) {
  std::string label;
  switch (lane) {
    case kComputeLane:
      label = RowName(timeline, rank);
      break;
    case kSendLane:
      label = "  send";
      break;
    case kRecvLane:
      label = "  recv";
      break;
    case kCommLane:
      label = "  comm";
      break;
    default:
      label = absl::StrCat("  lane ", lane);
  }
  if (row > 0) absl::StrAppend(&label, " (", row + 1, ")");
  return label;
}

using RowKey = std::tuple<int, int, int>;  // rank, lane, row within the lane

std::string FormatNumber(double x) { return absl::StrFormat("%g", x); }

struct Cell {
  char ch = '.';
  const OpStyle* style = nullptr;  // null: idle
};

// Emits `cells` with one SGR sequence per run of equally styled cells.
void AppendCells(const std::vector<Cell>& cells, bool color, std::string* out) {
  if (!color) {
    for (const Cell& c : cells) out->push_back(c.ch);
    return;
  }
  std::size_t i = 0;
  while (i < cells.size()) {
    std::size_t j = i;
    while (j < cells.size() && cells[j].style == cells[i].style) ++j;
    absl::StrAppend(out, "\x1b[", cells[i].style ? Absl(cells[i].style->ansi) : "90", "m");
    for (std::size_t k = i; k < j; ++k) out->push_back(cells[k].ch);
    absl::StrAppend(out, "\x1b[0m");
    i = j;
  }
}

}  // namespace

std::string RenderTimelineGrid(const Timeline& timeline, const GridOptions& options) {
  const int max_width = std::clamp(options.max_width, kMinWidth, kMaxWidth);
  // Rows: every rank's compute lane, plus each other lane that has spans, with a row
  // more for each span that overlaps the lane's others.
  const std::vector<int> lane_row = internal::LaneRows(timeline);
  std::set<RowKey> rows;
  for (int r = 0; r < std::min(timeline.num_ranks, kMaxEmptyRanksDrawn); ++r) {
    rows.insert({r, kComputeLane, 0});
  }
  for (std::size_t i = 0; i < timeline.spans.size(); ++i) {
    rows.insert({timeline.spans[i].rank, timeline.spans[i].lane, lane_row[i]});
  }

  std::size_t label_width = 0;
  for (const auto& [rank, lane, row] : rows) {
    label_width = std::max(label_width, RowLabel(timeline, rank, lane, row).size());
  }
  const int prefix = static_cast<int>(label_width) + 3;  // "rank 0 | "
  const int plot_width = std::max(kMinPlotColumns, max_width - prefix);

  // Columns per time unit: enough for every compute label and a space (transfers are
  // short and would stretch the grid; theirs may be cut).
  const double makespan = timeline.Makespan();
  const bool with_stage = RanksRunSeveralStages(timeline);
  std::size_t max_label = 1;
  double min_duration = 0;
  const bool any_compute = std::any_of(timeline.spans.begin(), timeline.spans.end(),
                                       [](const Span& span) { return span.lane == kComputeLane; });
  for (const Span& span : timeline.spans) {
    if (any_compute && span.lane != kComputeLane) continue;
    max_label = std::max(max_label, SpanLabel(span, with_stage).size());
    const double d = span.end - span.start;
    if (d > 0 && (min_duration == 0 || d < min_duration)) min_duration = d;
  }
  // Columns per time unit, and time per column for the header. A denormal makespan
  // (costs of 1e-320) makes columns per unit overflow to inf: then columns are counted
  // by dividing by the time per column instead. A makespan that is not finite gets no
  // columns (the simulator refuses one; a hand-made timeline may have it).
  const bool drawable = makespan > 0 && std::isfinite(makespan);
  double per_unit = 1;
  double col_time = 1;
  if (drawable) {
    per_unit = min_duration > 0 ? static_cast<double>(max_label + 1) / min_duration : 1;
    if (!std::isfinite(per_unit) || makespan * per_unit > plot_width) {
      per_unit = plot_width / makespan;
      // Whole columns per unit keep unit-time boundaries on column boundaries.
      if (per_unit >= 1 && std::isfinite(per_unit)) per_unit = std::floor(per_unit);
    }
    col_time = 1 / per_unit;
    if (!std::isfinite(per_unit)) {  // denormal times: the same two rules, per column
      col_time = min_duration > 0 ? min_duration / static_cast<double>(max_label + 1) : 0;
      if (!(col_time > 0) || makespan / col_time > plot_width) col_time = makespan / plot_width;
      // The smallest denormals (5e-324) divide to 0: a column is then the smallest time.
      col_time = std::max(col_time, std::numeric_limits<double>::denorm_min());
    }
  }
  auto to_columns = [&](double t) { return std::isfinite(per_unit) ? t * per_unit : t / col_time; };
  // At most plot_width columns by construction; the clamp keeps a rounding slip from
  // ever making a huge grid.
  const int num_columns = drawable
                              ? static_cast<int>(std::clamp(std::ceil(to_columns(makespan) - 1e-9),
                                                            1.0, static_cast<double>(plot_width)))
                              : 0;
  auto column = [&](double t) {
    const double c = std::clamp(to_columns(t), 0.0, static_cast<double>(num_columns));
    return std::isnan(c) ? 0 : static_cast<int>(std::lround(c));
  };

  std::map<RowKey, std::vector<Cell>> grid;
  for (const auto& row : rows) grid[row].assign(num_columns, Cell{});
  std::vector<const OpStyle*> legend;
  for (std::size_t i = 0; i < timeline.spans.size(); ++i) {
    const Span& span = timeline.spans[i];
    std::vector<Cell>& cells = grid[{span.rank, span.lane, lane_row[i]}];
    const OpStyle& style = StyleOf(span.op);
    if (std::find(legend.begin(), legend.end(), &style) == legend.end()) legend.push_back(&style);
    int c0 = column(span.start);
    int c1 = column(span.end);
    if (c1 <= c0) {
      // Too short for a column of its own: take one only if nothing else is there.
      if (c0 >= num_columns || cells[c0].style != nullptr) continue;
      c1 = c0 + 1;
    }
    // The whole label where it fits; else without the micro-batch ("2F": its stage still
    // tells the chunk); else the op alone, cut to the span (never a cut number).
    const std::string op = style.code.empty() ? span.op : std::string(style.code);
    std::string label = SpanLabel(span, with_stage);
    if (label.size() > static_cast<std::size_t>(c1 - c0)) {
      label = with_stage && span.stage >= 0 ? absl::StrCat(span.stage, op) : op;
      if (label.size() > static_cast<std::size_t>(c1 - c0)) label = op;
    }
    for (int c = c0; c < c1; ++c) {
      const std::size_t k = static_cast<std::size_t>(c - c0);
      cells[c] = Cell{k < label.size() ? label[k] : ' ', &style};
    }
  }

  std::string out;
  const std::string unit = timeline.time_unit;
  if (options.header) {
    absl::StrAppend(&out, timeline.name.empty() ? "timeline" : timeline.name, ": ",
                    LengthLabel(timeline), " ", FormatNumber(makespan), " ", unit);
    if (num_columns > 0) {
      absl::StrAppend(&out, ", 1 column = ", FormatNumber(col_time), " ", unit);
    }
    out.push_back('\n');
  }
  for (const auto& row : rows) {
    const auto& [rank, lane, lane_row_index] = row;
    absl::StrAppend(&out, absl::StrFormat("%-*s | ", static_cast<int>(label_width),
                                          RowLabel(timeline, rank, lane, lane_row_index)));
    AppendCells(grid[row], options.color, &out);
    out.push_back('\n');
  }
  if (const long long empty = EmptyRanksNotDrawn(timeline); empty > 0) {
    absl::StrAppend(&out, "(", empty, " more ranks without spans not drawn)\n");
  }

  if (options.axis && num_columns > 0) {
    const double step = NiceStep(kMinTickSpacing * col_time);
    // The axis may run one column past the grid (a tick at the makespan) and its numbers
    // a few more, within max_width.
    const int axis_width = std::max(num_columns, plot_width);
    std::string ticks(std::min(num_columns + 1, axis_width), '-');
    std::string numbers(ticks.size(), ' ');
    int free_from = 0;  // first column a new number may use
    // A tick is at least kMinTickSpacing columns from the last: the bound on k only
    // guards against a step that rounding made too small.
    for (int k = 0; k <= num_columns; ++k) {
      const double t = k * step;
      if (t > makespan * (1 + 1e-9)) break;
      const int c = column(t);
      if (c >= static_cast<int>(ticks.size())) break;
      ticks[c] = '+';
      const std::string text = FormatNumber(t);
      if (c >= free_from && c + static_cast<int>(text.size()) <= axis_width) {
        if (numbers.size() < c + text.size()) numbers.resize(c + text.size(), ' ');
        numbers.replace(c, text.size(), text);
        free_from = c + static_cast<int>(text.size()) + 1;
      }
    }
    numbers.erase(numbers.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, std::string(label_width + 3, ' '), ticks, "\n");
    absl::StrAppend(&out, absl::StrFormat("%*s", static_cast<int>(label_width), unit), "   ",
                    numbers, "\n");
  }

  if (options.legend && !legend.empty()) {
    std::sort(legend.begin(), legend.end(),
              [](const OpStyle* a, const OpStyle* b) { return a->legend_order < b->legend_order; });
    // Entries wrap at max_width; `visible` counts the printed columns (no SGR bytes).
    std::string line = "legend:";
    std::size_t visible = line.size();
    auto add = [&](std::string_view code, std::string_view ansi, std::string_view text) {
      const std::size_t width = 2 + code.size() + 1 + text.size();
      if (visible + width > static_cast<std::size_t>(std::max(max_width, 40))) {
        absl::StrAppend(&out, line, "\n");
        line = "       ";
        visible = line.size();
      }
      absl::StrAppend(&line, "  ");
      if (options.color) {
        absl::StrAppend(&line, "\x1b[", Absl(ansi), "m", Absl(code), "\x1b[0m");
      } else {
        absl::StrAppend(&line, Absl(code));
      }
      absl::StrAppend(&line, " ", Absl(text));
      visible += width;
    };
    for (const OpStyle* style : legend) {
      add(style->code.empty() ? "?" : style->code, style->ansi, style->description);
    }
    add(".", "90", "idle");
    if (with_stage) add("2F3", "0", "stage 2's F of micro-batch 3");
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace pipesched::trace
