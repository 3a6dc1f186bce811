// SVG plots (trace/plot.h). Per panel, top to bottom: title, plot area (grid, band,
// diagonal, series, axes and ticks), x label, legend; the y label runs up the left side.
// Coordinates are in px.
#include "pipesched/trace/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipesched/trace/op_style.h"

namespace pipesched::trace {
namespace {

using internal::SvgNum;
using internal::XmlEscape;

constexpr char kFont[] = "Helvetica Neue, Helvetica, Arial, DejaVu Sans, sans-serif";
constexpr char kInk[] = "#222222";
constexpr char kMuted[] = "#666666";
constexpr char kGrid[] = "#e6e6e6";
constexpr double kLeft = 62, kRight = 18, kTop = 34, kBottom = 46;  // plot area margins
constexpr double kLegendFont = 11, kLegendRow = 18;
constexpr double kCharWidth = 0.58;  // of the font size
// FigureOptions ranges, as plot.h says.
constexpr int kMinPanelWidth = 200, kMinPanelHeight = 160, kMaxPanelSize = 20000;
constexpr int kMaxColumns = 1000;

// Okabe-Ito, reordered so that the first colours are the most distinct.
constexpr std::string_view kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                         "#E69F00", "#56B4E9", "#000000", "#F0E442"};

std::string Text(double x, double y, double size, const std::string& color, const std::string& text,
                 const std::string& extra = "") {
  return absl::StrCat("<text x=\"", SvgNum(x), "\" y=\"", SvgNum(y), "\" font-size=\"",
                      SvgNum(size), "\" fill=\"", color, "\"", extra.empty() ? "" : " ", extra, ">",
                      XmlEscape(text), "</text>\n");
}

struct Axis {
  double lo = 0, hi = 1;  // in axis units (log2 of the value when log)
  bool log2 = false;
  bool percent = false;
  std::vector<double> ticks;  // values (not log)
  double step = 1;            // linear tick step

  double Unit(double v) const { return log2 ? std::log2(v) : v; }
  // Where `v` lies from lo (0) to hi (1). Halves first: hi - lo of values near the
  // largest double overflows.
  double Fraction(double v) const { return (Unit(v) / 2 - lo / 2) / (hi / 2 - lo / 2); }
  std::string Label(double v) const {
    if (percent) {
      const int decimals = step * 100 < 1 ? 1 : 0;
      return absl::StrFormat("%.*f%%", decimals, v * 100);
    }
    return absl::StrFormat("%g", v);
  }
};

// The axis over data [lo, hi] (values), with the fixed ends given.
Axis MakeAxis(double lo, double hi, std::optional<double> fixed_lo, std::optional<double> fixed_hi,
              bool log2, bool percent) {
  Axis axis;
  axis.log2 = log2;
  axis.percent = percent;
  // An end that is not finite cannot be drawn: the data's end instead.
  if (fixed_lo && !std::isfinite(*fixed_lo)) fixed_lo.reset();
  if (fixed_hi && !std::isfinite(*fixed_hi)) fixed_hi.reset();
  if (fixed_lo) lo = *fixed_lo;
  if (fixed_hi) hi = *fixed_hi;
  if (!(lo <= hi)) {
    lo = log2 ? 1 : 0;
    hi = log2 ? 2 : 1;
  }
  if (log2) {
    lo = std::max(lo, std::numeric_limits<double>::min());
    hi = std::max(hi, lo);
    double a = std::log2(lo), b = std::log2(hi);
    if (b - a < 1e-9) {
      a -= 0.5;
      b += 0.5;
    }
    const double pad = 0.08 * (b - a);
    axis.lo = fixed_lo ? a : a - pad;
    axis.hi = fixed_hi ? b : b + pad;
    // Every power of two; every second or third when there are more than kMaxTicks (the
    // doubles span about 2100 powers, padding included).
    const int first = static_cast<int>(std::ceil(axis.lo - 1e-9));
    const int last = static_cast<int>(std::floor(axis.hi + 1e-9));
    const int stride = (last - first) / internal::kMaxTicks + 1;
    for (int e = first; e <= last; e += stride) axis.ticks.push_back(std::ldexp(1.0, e));
    return axis;
  }
  // A range narrower than a billionth of its values reads as one number on the tick
  // labels, and a few ulps apart (1e9 and 1e9 + 2.4e-7) its tick step would be below
  // their resolution: drawn as flat, padded like a single value.
  const double magnitude = std::max(std::abs(lo), std::abs(hi));
  if (hi - lo < std::max(1e-12, 1e-9 * magnitude)) {
    const double d = lo == 0 ? 1 : std::abs(lo) * 0.1;
    if (!fixed_lo) lo -= d;
    if (!fixed_hi) hi += d;
    if (fixed_lo && fixed_hi) {  // both ends given, and too close to draw between
      lo -= d;
      hi += d;
    }
    constexpr double kMax = std::numeric_limits<double>::max();
    lo = std::max(lo, -kMax);  // padding 1.7e308 by a tenth overflows
    hi = std::min(hi, kMax);
  }
  axis.step = internal::NiceStep(hi / 5 - lo / 5);
  axis.lo = fixed_lo ? lo : std::floor(lo / axis.step + 1e-9) * axis.step;
  axis.hi = fixed_hi ? hi : std::ceil(hi / axis.step - 1e-9) * axis.step;
  if (!std::isfinite(axis.lo)) axis.lo = lo;  // rounded out past the largest double
  if (!std::isfinite(axis.hi)) axis.hi = hi;
  // Ticks counted in steps from 0: first + k * step would overflow near the largest double.
  const double first = std::ceil(axis.lo / axis.step - 1e-9);
  for (int k = 0; k <= internal::kMaxTicks; ++k) {
    const double t = (first + k) * axis.step;
    if (!(t <= axis.hi + 1e-9 * axis.step)) break;
    axis.ticks.push_back(std::abs(t) < 1e-12 * axis.step ? 0 : t);
  }
  return axis;
}

std::string MarkerSvg(Marker marker, double x, double y, double r, const std::string& fill) {
  const std::string style =
      absl::StrCat(" fill=\"", fill, "\" stroke=\"#ffffff\" stroke-width=\"1\"");
  switch (marker) {
    case Marker::kNone:
      return "";
    case Marker::kCircle:
      return absl::StrCat("<circle cx=\"", SvgNum(x), "\" cy=\"", SvgNum(y), "\" r=\"", SvgNum(r),
                          "\"", style, "/>");
    case Marker::kSquare: {
      const double s = r * 0.9;
      return absl::StrCat("<rect x=\"", SvgNum(x - s), "\" y=\"", SvgNum(y - s), "\" width=\"",
                          SvgNum(2 * s), "\" height=\"", SvgNum(2 * s), "\"", style, "/>");
    }
    case Marker::kTriangle:
      return absl::StrCat("<polygon points=\"", SvgNum(x), ",", SvgNum(y - 1.2 * r), " ",
                          SvgNum(x + 1.1 * r), ",", SvgNum(y + 0.8 * r), " ", SvgNum(x - 1.1 * r),
                          ",", SvgNum(y + 0.8 * r), "\"", style, "/>");
    case Marker::kDiamond:
      return absl::StrCat("<polygon points=\"", SvgNum(x), ",", SvgNum(y - 1.25 * r), " ",
                          SvgNum(x + 1.05 * r), ",", SvgNum(y), " ", SvgNum(x), ",",
                          SvgNum(y + 1.25 * r), " ", SvgNum(x - 1.05 * r), ",", SvgNum(y), "\"",
                          style, "/>");
  }
  return "";
}

std::string ColorOf(const PlotSeries& s, int index) {
  return s.color.empty() ? PaletteColor(index) : s.color;
}

struct LegendItem {
  const PlotSeries* series;
  std::string color;
};

std::vector<LegendItem> LegendItems(const Plot& plot) {
  std::vector<LegendItem> items;
  for (std::size_t i = 0; i < plot.series.size(); ++i) {
    if (!plot.series[i].name.empty()) {
      items.push_back({&plot.series[i], ColorOf(plot.series[i], static_cast<int>(i))});
    }
  }
  for (const PlotSeries& key : plot.legend_keys) {
    items.push_back({&key, key.color.empty() ? std::string(kMuted) : key.color});
  }
  return items;
}

double ItemWidth(const LegendItem& item) {
  return 30 + item.series->name.size() * kLegendFont * kCharWidth + 14;
}

// Legend rows needed for `plot` in a panel `width` px wide.
int LegendRows(const Plot& plot, double width) {
  std::vector<LegendItem> items = LegendItems(plot);
  if (items.empty()) return 0;
  int rows = 1;
  double x = 0;
  for (const LegendItem& item : items) {
    const double w = ItemWidth(item);
    if (x > 0 && x + w > width) {
      ++rows;
      x = 0;
    }
    x += w;
  }
  return rows;
}

void DrawPanel(const Plot& plot, double ox, double oy, double width, double height, int id,
               std::string& svg) {
  const double left = ox + kLeft, top = oy + kTop;
  const double w = width - kLeft - kRight, h = height - kTop - kBottom;
  // Data ranges.
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const PlotSeries& s : plot.series) {
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      if (plot.x_log2 && s.x[i] <= 0) continue;
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      y_lo = std::min(y_lo, s.y[i]);
      y_hi = std::max(y_hi, s.y[i]);
    }
  }
  if (plot.diagonal) {  // one range for both axes
    x_lo = y_lo = std::min(x_lo, y_lo);
    x_hi = y_hi = std::max(x_hi, y_hi);
  }
  const Axis ax = MakeAxis(x_lo, x_hi, plot.x_min, plot.x_max, plot.x_log2, plot.x_percent);
  const Axis ay = MakeAxis(y_lo, y_hi, plot.y_min, plot.y_max, false, plot.y_percent);
  auto X = [&](double v) { return left + ax.Fraction(v) * w; };
  auto Y = [&](double v) { return top + h - ay.Fraction(v) * h; };

  if (!plot.title.empty()) {
    svg += Text(left, oy + 20, 14, kInk, plot.title, "font-weight=\"600\"");
  }
  svg += absl::StrCat("<rect x=\"", SvgNum(left), "\" y=\"", SvgNum(top), "\" width=\"", SvgNum(w),
                      "\" height=\"", SvgNum(h), "\" fill=\"#ffffff\" stroke=\"none\"/>\n");
  // Grid and ticks.
  for (double t : ax.ticks) {
    const double x = X(t);
    svg += absl::StrCat("<line x1=\"", SvgNum(x), "\" y1=\"", SvgNum(top), "\" x2=\"", SvgNum(x),
                        "\" y2=\"", SvgNum(top + h), "\" stroke=\"", kGrid, "\"/>\n");
    svg += Text(x, top + h + 16, 11, kMuted, ax.Label(t), "text-anchor=\"middle\"");
  }
  for (double t : ay.ticks) {
    const double y = Y(t);
    svg += absl::StrCat("<line x1=\"", SvgNum(left), "\" y1=\"", SvgNum(y), "\" x2=\"",
                        SvgNum(left + w), "\" y2=\"", SvgNum(y), "\" stroke=\"", kGrid, "\"/>\n");
    svg += Text(left - 6, y + 4, 11, kMuted, ay.Label(t), "text-anchor=\"end\"");
  }
  const std::string clip = absl::StrCat("plot-area-", id);
  svg +=
      absl::StrCat("<clipPath id=\"", clip, "\"><rect x=\"", SvgNum(left), "\" y=\"", SvgNum(top),
                   "\" width=\"", SvgNum(w), "\" height=\"", SvgNum(h), "\"/></clipPath>\n");
  svg += absl::StrCat("<g clip-path=\"url(#", clip, ")\">\n");
  if (plot.diagonal) {
    const double a = std::max(ax.lo, ay.lo), b = std::min(ax.hi, ay.hi);
    if (plot.diagonal_band > 0) {
      const double d = plot.diagonal_band, lo = ax.lo, hi = ax.hi;
      svg += absl::StrCat("<polygon points=\"", SvgNum(X(lo)), ",", SvgNum(Y(lo - d)), " ",
                          SvgNum(X(hi)), ",", SvgNum(Y(hi - d)), " ", SvgNum(X(hi)), ",",
                          SvgNum(Y(hi + d)), " ", SvgNum(X(lo)), ",", SvgNum(Y(lo + d)),
                          "\" fill=\"#999999\" fill-opacity=\"0.14\" stroke=\"none\"/>\n");
    }
    svg += absl::StrCat("<line x1=\"", SvgNum(X(a)), "\" y1=\"", SvgNum(Y(a)), "\" x2=\"",
                        SvgNum(X(b)), "\" y2=\"", SvgNum(Y(b)),
                        "\" stroke=\"#888888\" stroke-width=\"1.2\" stroke-dasharray=\"5 4\"/>\n");
  }
  // Series: lines first, then markers on top.
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t k = 0; k < plot.series.size(); ++k) {
      const PlotSeries& s = plot.series[k];
      const std::string color = ColorOf(s, static_cast<int>(k));
      std::vector<std::size_t> order;
      for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && (!plot.x_log2 || s.x[i] > 0)) {
          order.push_back(i);
        }
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return s.x[a] < s.x[b]; });
      if (pass == 0 && s.line && order.size() >= 2) {
        std::string points;
        for (std::size_t i : order) {
          absl::StrAppend(&points, points.empty() ? "" : " ", SvgNum(X(s.x[i])), ",",
                          SvgNum(Y(s.y[i])));
        }
        svg += absl::StrCat("<polyline points=\"", points, "\" fill=\"none\" stroke=\"", color,
                            "\" stroke-width=\"", s.dashed ? "1.5" : "2",
                            "\" stroke-linejoin=\"round\"",
                            s.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n");
      }
      if (pass == 1 && s.marker != Marker::kNone) {
        for (std::size_t i : order) {
          std::string m = MarkerSvg(s.marker, X(s.x[i]), Y(s.y[i]), s.marker_size, color);
          if (i < s.tooltips.size() && !s.tooltips[i].empty()) {
            m = absl::StrCat("<g>", m, "<title>", XmlEscape(s.tooltips[i]), "</title></g>");
          }
          svg += m + "\n";
        }
      }
    }
  }
  svg += "</g>\n";
  // Axes frame and labels.
  svg += absl::StrCat("<rect x=\"", SvgNum(left), "\" y=\"", SvgNum(top), "\" width=\"", SvgNum(w),
                      "\" height=\"", SvgNum(h), "\" fill=\"none\" stroke=\"#bbbbbb\"/>\n");
  svg += Text(left + w / 2, top + h + 36, 12, kInk, plot.x_label, "text-anchor=\"middle\"");
  const double yl_x = ox + 16, yl_y = top + h / 2;
  svg += Text(yl_x, yl_y, 12, kInk, plot.y_label,
              absl::StrCat("text-anchor=\"middle\" transform=\"rotate(-90 ", SvgNum(yl_x), " ",
                           SvgNum(yl_y), ")\""));
  // Legend under the x label, flowing into rows.
  double lx = left, ly = oy + height + 4;
  for (const LegendItem& item : LegendItems(plot)) {
    const double iw = ItemWidth(item);
    if (lx > left && lx + iw > left + w + kRight) {
      lx = left;
      ly += kLegendRow;
    }
    const PlotSeries& s = *item.series;
    if (s.line) {
      svg += absl::StrCat("<line x1=\"", SvgNum(lx), "\" y1=\"", SvgNum(ly), "\" x2=\"",
                          SvgNum(lx + 24), "\" y2=\"", SvgNum(ly), "\" stroke=\"", item.color,
                          "\" stroke-width=\"", s.dashed ? "1.5" : "2", "\"",
                          s.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n");
    }
    svg += MarkerSvg(s.marker, lx + 12, ly, std::min(s.marker_size, 5.0), item.color);
    svg += Text(lx + 30, ly + 4, kLegendFont, kInk, s.name);
    lx += iw;
  }
}

}  // namespace

std::string PaletteColor(int index) {
  const int n = static_cast<int>(std::size(kPalette));
  return std::string(kPalette[((index % n) + n) % n]);
}

std::string ToSvgFigure(const std::vector<Plot>& panels, const FigureOptions& options) {
  const int n = static_cast<int>(panels.size());
  // More columns than panels draws as many as there are panels.
  const int columns = std::clamp(options.columns, 1, std::clamp(n, 1, kMaxColumns));
  const double pw = std::clamp(options.panel_width, kMinPanelWidth, kMaxPanelSize);
  const double ph = std::clamp(options.panel_height, kMinPanelHeight, kMaxPanelSize);
  const int fig_rows = n == 0 ? 0 : (n + columns - 1) / columns;
  const int used_columns = std::min(columns, std::max(n, 1));
  double header = 12;
  if (!options.title.empty()) header += 26;
  if (!options.subtitle.empty()) header += 18;
  // Each figure row is as tall as its panel plus its tallest legend.
  std::vector<double> row_top(fig_rows + 1, header);
  for (int r = 0; r < fig_rows; ++r) {
    int legend_rows = 0;
    for (int c = 0; c < columns && r * columns + c < n; ++c) {
      legend_rows = std::max(legend_rows, LegendRows(panels[r * columns + c], pw - kLeft));
    }
    row_top[r + 1] = row_top[r] + ph + legend_rows * kLegendRow + 14;
  }
  const double width = used_columns * pw + 16, height = row_top[fig_rows] + 8;
  std::string svg = absl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                                 SvgNum(width), "\" height=\"", SvgNum(height), "\" viewBox=\"0 0 ",
                                 SvgNum(width), " ", SvgNum(height), "\" font-family=\"", kFont,
                                 "\">\n<rect width=\"100%\" height=\"100%\" fill=\"#fafafa\"/>\n");
  double ty = 8;
  if (!options.title.empty()) {
    ty += 22;
    svg += Text(16, ty, 18, kInk, options.title, "font-weight=\"600\"");
  }
  if (!options.subtitle.empty()) {
    ty += 18;
    svg += Text(16, ty, 12, kMuted, options.subtitle);
  }
  for (int i = 0; i < n; ++i) {
    const int r = i / columns, c = i % columns;
    DrawPanel(panels[i], 8 + c * pw, row_top[r], pw, ph, i, svg);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace pipesched::trace
