// SVG timeline renderer. Layout, top to bottom: title, subtitle, then per timeline its
// name and makespan, the rank rows over a hatched idle background and light vertical
// grid lines, and a time axis; the legend closes the picture. Coordinates are in px.
#include "pipesched/trace/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

using internal::SvgNum;
using internal::XmlEscape;

using internal::EmptyRanksNotDrawn;
using internal::HasFiniteTimes;
using internal::kMaxEmptyRanksDrawn;
using internal::kMaxTicks;
using internal::NiceStep;
using internal::OpStyle;
using internal::StyleOf;

constexpr char kFont[] = "Helvetica Neue, Helvetica, Arial, DejaVu Sans, sans-serif";
constexpr char kInk[] = "#222222";
constexpr char kMuted[] = "#666666";
constexpr double kMarginLeft = 24;  // plus the row-label column
constexpr double kMarginRight = 28;
constexpr double kMarginTop = 20;
constexpr double kMarginBottom = 16;
constexpr double kRankGap = 6;
constexpr double kLaneGap = 2;
constexpr double kCharWidth = 0.6;                 // of the font size, for fitting text in boxes
constexpr int kMinWidth = 320, kMaxWidth = 20000;  // SvgOptions ranges, as svg.h says
constexpr int kMinRowHeight = 8, kMaxRowHeight = 200;

// Axis and tooltip text for a time unit: "us" as the micro sign, "unit" as a plural.
std::string UnitText(const std::string& unit) {
  if (unit == "us") return "\xC2\xB5s";
  if (unit == "unit") return "units";
  return unit;
}

// A time for people: 4 significant digits, whole numbers from 1000 on (no exponents).
std::string Time(double t) {
  return std::abs(t) >= 1000 ? absl::StrFormat("%.0f", t) : absl::StrFormat("%.4g", t);
}

// The latest end of the spans with finite times, at least 0 (Timeline::Makespan over
// the spans that are drawn).
double DrawnMakespan(const Timeline& t) {
  double m = 0;
  for (const Span& s : t.spans) {
    if (HasFiniteTimes(s)) m = std::max(m, s.end);
  }
  return m;
}

struct Rgb {
  double r, g, b;
};

Rgb ParseHex(std::string_view hex) {
  unsigned r = 0, g = 0, b = 0;
  std::sscanf(std::string(hex).c_str(), "#%02x%02x%02x", &r, &g, &b);
  return {r / 255.0, g / 255.0, b / 255.0};
}

std::string ToHex(Rgb c) {
  auto channel = [](double v) {
    return static_cast<int>(std::lround(std::clamp(v, 0.0, 1.0) * 255));
  };
  return absl::StrFormat("#%02X%02X%02X", channel(c.r), channel(c.g), channel(c.b));
}

// Later model chunks (virtual stages) are drawn darker: chunk 0 as is, each further
// chunk mixes in 22% more black, as in the interleaved-schedule figures of Megatron-LM.
Rgb Shade(Rgb c, int chunk) {
  const double k = std::pow(0.78, std::clamp(chunk, 0, 4));
  return {c.r * k, c.g * k, c.b * k};
}

// The chunk each (row, stage) is drawn as: the stage's place among the stages its row
// runs, in stage order. Loop and v placement give stage / P; a placement of any other kind
// (block, renamed ranks) and a measured timeline's P x D rows get their own rank's count,
// which stage / num_ranks would not.
std::map<std::pair<int, int>, int> ChunksOfStages(const Timeline& t) {
  std::map<int, std::set<int>> stages_of_row;
  for (const Span& s : t.spans) {
    if (s.stage >= 0) stages_of_row[s.rank].insert(s.stage);
  }
  std::map<std::pair<int, int>, int> chunk;
  for (const auto& [row, stages] : stages_of_row) {
    int k = 0;
    for (int stage : stages) chunk[{row, stage}] = k++;
  }
  return chunk;
}

double Luminance(Rgb c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b; }

std::string LaneName(int lane) {
  switch (lane) {
    case kSendLane:
      return "send";
    case kRecvLane:
      return "recv";
    case kCommLane:
      return "comm";
    default:
      return absl::StrCat("lane ", lane);
  }
}

struct Row {
  int rank;
  int lane;
  int lane_row;  // within the lane: spans that overlap the lane's others go below (LaneRows)
  double y;
  double height;
};

struct Block {
  const Timeline* timeline;
  std::vector<int> lane_rows;  // per span, LaneRows
  std::vector<Row> rows;
  double top;       // y of the block's name line
  double rows_top;  // y of the first row
  double rows_bottom;
  double axis_y;
  double makespan;
  double scale_end;  // time at the right edge of the plot
};

class Writer {
 public:
  void Line(std::string_view text) { absl::StrAppend(&out_, "  ", Absl(text), "\n"); }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

std::string Text(double x, double y, double size, std::string_view fill, std::string_view text,
                 std::string_view extra = "") {
  return absl::StrCat("<text x=\"", SvgNum(x), "\" y=\"", SvgNum(y), "\" font-size=\"",
                      SvgNum(size), "\" fill=\"", Absl(fill), "\"", extra.empty() ? "" : " ",
                      Absl(extra), ">", XmlEscape(text), "</text>");
}

}  // namespace

std::string ToSvg(const std::vector<const Timeline*>& input, const SvgOptions& options) {
  std::vector<const Timeline*> timelines;
  for (const Timeline* t : input) {
    if (t != nullptr) timelines.push_back(t);
  }
  const double width = std::clamp(options.width, kMinWidth, kMaxWidth);
  const double row_height = std::clamp(options.row_height, kMinRowHeight, kMaxRowHeight);
  const double lane_height = std::max(6.0, std::round(row_height * 0.4));
  const double label_font = std::clamp(row_height * 0.5, 9.0, 13.0);

  // Row-label column: wide enough for the longest row name ("rank NN", "replica 1 rank 0").
  std::size_t longest = 0;
  for (const Timeline* t : timelines) {
    int max_rank = std::min(t->num_ranks, kMaxEmptyRanksDrawn) - 1;
    for (const Span& s : t->spans) max_rank = std::max(max_rank, s.rank);
    longest = std::max(longest, RowName(*t, std::max(max_rank, 0)).size());
  }
  const double label_column =
      static_cast<double>(std::max<std::size_t>(longest, 6)) * label_font * kCharWidth + 10;
  const double plot_left = kMarginLeft + label_column;
  const double plot_right = width - kMarginRight;
  const double plot_width = plot_right - plot_left;

  // Shared time scale per unit.
  std::map<std::string, double> unit_end;
  for (const Timeline* t : timelines) {
    double& end = unit_end[t->time_unit];
    end = std::max(end, DrawnMakespan(*t));
  }

  // Vertical layout.
  double y = kMarginTop;
  Writer body;
  if (!options.title.empty()) {
    y += 18;
    body.Line(Text(kMarginLeft, y, 18, kInk, options.title, "font-weight=\"600\""));
    y += 6;
  }
  if (!options.subtitle.empty()) {
    y += 15;
    body.Line(Text(kMarginLeft, y, 13, kMuted, options.subtitle));
    y += 4;
  }
  if (!options.title.empty() || !options.subtitle.empty()) y += 10;

  std::vector<Block> blocks;
  for (const Timeline* t : timelines) {
    Block block;
    block.timeline = t;
    block.top = y;
    y += 16;  // name line
    block.rows_top = y + 6;
    y = block.rows_top;
    block.lane_rows = internal::LaneRows(*t);
    std::set<std::tuple<int, int, int>> keys;
    for (int r = 0; r < std::min(t->num_ranks, kMaxEmptyRanksDrawn); ++r) {
      keys.insert({r, kComputeLane, 0});
    }
    for (std::size_t i = 0; i < t->spans.size(); ++i) {
      keys.insert({t->spans[i].rank, t->spans[i].lane, block.lane_rows[i]});
    }
    int previous_rank = -1;
    for (const auto& [rank, lane, lane_row] : keys) {
      if (previous_rank >= 0 && rank != previous_rank) y += kRankGap;
      if (rank == previous_rank) y += kLaneGap;
      const bool compute = lane == kComputeLane;
      block.rows.push_back({rank, lane, lane_row, y, compute ? row_height : lane_height});
      y += compute ? row_height : lane_height;
      previous_rank = rank;
    }
    block.rows_bottom = y;
    block.axis_y = y + 6;
    y = block.axis_y + 34;  // ticks, numbers, axis title
    block.makespan = DrawnMakespan(*t);
    block.scale_end = options.shared_scale ? unit_end[t->time_unit] : block.makespan;
    if (block.scale_end <= 0) block.scale_end = 1;
    blocks.push_back(std::move(block));
  }

  // Legend entries: ops in use, whether any chunk shading is visible.
  std::vector<const OpStyle*> legend;
  bool shaded = false;
  std::map<const Timeline*, std::map<std::pair<int, int>, int>> chunks;
  for (const Timeline* t : timelines) {
    std::map<std::pair<int, int>, int>& chunk = chunks[t];
    if (chunk.empty()) chunk = ChunksOfStages(*t);
    for (const Span& s : t->spans) {
      if (!HasFiniteTimes(s)) continue;
      const OpStyle* style = &StyleOf(s.op);
      if (std::find(legend.begin(), legend.end(), style) == legend.end()) legend.push_back(style);
      if (s.stage >= 0 && chunk[{s.rank, s.stage}] > 0) shaded = true;
    }
  }
  std::sort(legend.begin(), legend.end(),
            [](const OpStyle* a, const OpStyle* b) { return a->legend_order < b->legend_order; });

  for (const Block& block : blocks) {
    const Timeline& t = *block.timeline;
    auto x_of = [&](double time) { return plot_left + time / block.scale_end * plot_width; };
    const std::string unit = UnitText(t.time_unit);

    // Name and makespan, and what was left out.
    body.Line(Text(kMarginLeft, block.top + 12, 14, kInk, t.name.empty() ? "timeline" : t.name,
                   "font-weight=\"600\""));
    std::string makespan = absl::StrCat(LengthLabel(t), " ", Time(block.makespan), " ", unit);
    const auto not_finite = std::count_if(t.spans.begin(), t.spans.end(),
                                          [](const Span& s) { return !HasFiniteTimes(s); });
    if (not_finite > 0) {
      absl::StrAppend(&makespan, "; ", not_finite,
                      " spans with times that are not finite not drawn");
    }
    if (const long long empty = EmptyRanksNotDrawn(t); empty > 0) {
      absl::StrAppend(&makespan, "; ", empty, " more ranks without spans not drawn");
    }
    body.Line(Text(plot_right, block.top + 12, 12, kMuted, makespan, "text-anchor=\"end\""));

    // Grid lines at the ticks, behind everything else.
    const double step = NiceStep(block.scale_end / 10);
    std::vector<double> ticks;
    for (int k = 0; k <= kMaxTicks && k * step <= block.scale_end * (1 + 1e-9); ++k) {
      ticks.push_back(k * step);
    }
    for (double tick : ticks) {
      body.Line(absl::StrCat("<line x1=\"", SvgNum(x_of(tick)), "\" y1=\"",
                             SvgNum(block.rows_top - 3), "\" x2=\"", SvgNum(x_of(tick)), "\" y2=\"",
                             SvgNum(block.axis_y), "\" stroke=\"#E6E6E6\" stroke-width=\"1\"/>"));
    }

    // Rows: label and the idle background up to this timeline's makespan.
    for (const Row& row : block.rows) {
      const bool compute = row.lane == kComputeLane;
      std::string label = compute ? RowName(*block.timeline, row.rank) : LaneName(row.lane);
      if (row.lane_row > 0) absl::StrAppend(&label, " (", row.lane_row + 1, ")");
      body.Line(Text(plot_left - 8, row.y + row.height / 2, compute ? label_font : label_font * 0.8,
                     compute ? kInk : kMuted, label,
                     "text-anchor=\"end\" dominant-baseline=\"central\""));
      if (block.makespan > 0) {
        body.Line(absl::StrCat(
            "<rect class=\"idle\" x=\"", SvgNum(plot_left), "\" y=\"", SvgNum(row.y), "\" width=\"",
            SvgNum(x_of(block.makespan) - plot_left), "\" height=\"", SvgNum(row.height),
            "\" fill=\"", compute ? "url(#ps-idle)" : "#F4F4F4", "\"/>"));
      }
    }

    // Spans.
    std::map<std::tuple<int, int, int>, const Row*> row_of;
    for (const Row& row : block.rows) row_of[{row.rank, row.lane, row.lane_row}] = &row;
    for (std::size_t i = 0; i < t.spans.size(); ++i) {
      const Span& s = t.spans[i];
      if (!HasFiniteTimes(s)) continue;
      const Row& row = *row_of[{s.rank, s.lane, block.lane_rows[i]}];
      const OpStyle& style = StyleOf(s.op);
      const int chunk = s.stage >= 0 ? chunks[&t][{s.rank, s.stage}] : 0;
      const Rgb fill = Shade(ParseHex(style.fill), chunk);
      const double x0 = x_of(s.start);
      const double w = std::max(0.5, x_of(s.end) - x0);
      std::string tooltip = s.stage >= 0 ? absl::StrCat("stage ", s.stage, " ") : "";
      absl::StrAppend(&tooltip, s.op);
      if (s.microbatch >= 0) absl::StrAppend(&tooltip, " micro-batch ", s.microbatch);
      absl::StrAppend(&tooltip, ": ", Time(s.start), "\xE2\x80\x93", Time(s.end), " ", unit);
      body.Line(absl::StrCat("<rect class=\"span\" x=\"", SvgNum(x0), "\" y=\"", SvgNum(row.y),
                             "\" width=\"", SvgNum(w), "\" height=\"", SvgNum(row.height),
                             "\" fill=\"", ToHex(fill), "\" stroke=\"#FFFFFF\" stroke-width=\"",
                             w > 3 ? "1" : "0", "\"><title>", XmlEscape(tooltip),
                             "</title></rect>"));
      // The micro-batch number (or the op code when there is none) if it fits.
      const std::string label =
          s.microbatch >= 0 ? std::to_string(s.microbatch) : std::string(style.code);
      const double font = std::min(row.height * 0.6, 12.0);
      if (!label.empty() && font >= 6 && label.size() * font * kCharWidth + 3 <= w) {
        body.Line(Text(x0 + w / 2, row.y + row.height / 2, font,
                       Luminance(fill) > 0.55 ? kInk : "#FFFFFF", label,
                       "text-anchor=\"middle\" dominant-baseline=\"central\""));
      }
    }

    // Time axis.
    body.Line(absl::StrCat("<line x1=\"", SvgNum(plot_left), "\" y1=\"", SvgNum(block.axis_y),
                           "\" x2=\"", SvgNum(plot_right), "\" y2=\"", SvgNum(block.axis_y),
                           "\" stroke=\"", kMuted, "\" stroke-width=\"1\"/>"));
    for (double tick : ticks) {
      body.Line(absl::StrCat("<line x1=\"", SvgNum(x_of(tick)), "\" y1=\"", SvgNum(block.axis_y),
                             "\" x2=\"", SvgNum(x_of(tick)), "\" y2=\"", SvgNum(block.axis_y + 4),
                             "\" stroke=\"", kMuted, "\" stroke-width=\"1\"/>"));
      body.Line(Text(x_of(tick), block.axis_y + 15, 10, kMuted, absl::StrFormat("%g", tick),
                     "text-anchor=\"middle\" class=\"tick\""));
    }
    body.Line(Text(plot_right, block.axis_y + 29, 10, kMuted, absl::StrCat("time (", unit, ")"),
                   "text-anchor=\"end\" class=\"axis-title\""));
  }

  // Legend: one row, wrapping when it runs out of width.
  if (options.legend && (!legend.empty() || !blocks.empty())) {
    struct Entry {
      std::string swatch;  // fill
      std::string text;
    };
    std::vector<Entry> entries;
    for (const OpStyle* style : legend) {
      std::string code(style->code.empty() ? "" : absl::StrCat(Absl(style->code), " "));
      entries.push_back({std::string(style->fill), absl::StrCat(code, Absl(style->description))});
    }
    entries.push_back({"url(#ps-idle)", "idle"});
    if (shaded)
      entries.push_back({"", "darker: later model chunk; numbers: micro-batch"});
    else
      entries.push_back({"", "numbers: micro-batch"});
    double x = plot_left;
    y += 4;
    for (const Entry& e : entries) {
      const double text_width = e.text.size() * 12 * 0.52;
      const double entry_width = (e.swatch.empty() ? 0 : 18) + text_width + 18;
      if (x + entry_width > plot_right && x > plot_left) {
        x = plot_left;
        y += 20;
      }
      if (!e.swatch.empty()) {
        body.Line(absl::StrCat("<rect class=\"legend\" x=\"", SvgNum(x), "\" y=\"", SvgNum(y),
                               "\" width=\"12\" height=\"12\" rx=\"2\" fill=\"", e.swatch,
                               "\" stroke=\"#BBBBBB\" stroke-width=\"0.5\"/>"));
        x += 18;
      }
      body.Line(Text(x, y + 6, 12, e.swatch.empty() ? kMuted : kInk, e.text,
                     "dominant-baseline=\"central\" class=\"legend\""));
      x += text_width + 18;
    }
    y += 12;
  }
  const double height = y + kMarginBottom;

  std::string out = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", SvgNum(width), "\" height=\"",
      SvgNum(height), "\" viewBox=\"0 0 ", SvgNum(width), " ", SvgNum(height), "\" font-family=\"",
      kFont, "\">\n", "  <defs>\n",
      "    <pattern id=\"ps-idle\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\">\n",
      "      <rect width=\"6\" height=\"6\" fill=\"#F5F5F5\"/>\n",
      "      <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#DADADA\" stroke-width=\"2\"/>\n",
      "    </pattern>\n", "  </defs>\n",
      "  <rect width=\"100%\" height=\"100%\" fill=\"#FFFFFF\"/>\n");
  absl::StrAppend(&out, body.out(), "</svg>\n");
  return out;
}

}  // namespace pipesched::trace
