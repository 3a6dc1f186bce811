// Small SVG line and scatter plots: a figure of one or more panels side by side, each
// with axes, nice ticks, light grid lines, series drawn as lines and/or markers, an
// optional y = x diagonal (with a shaded +-band) and a legend. Self-contained like
// trace/svg.h: no scripts, no external fonts. What `pipesched bench` draws: bubble
// fraction vs micro-batches per schedule, and predicted vs measured.
// Not a general plotting library: linear or log2 axes, a handful of marker shapes.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pipesched::trace {

enum class Marker { kNone, kCircle, kSquare, kTriangle, kDiamond };

struct PlotSeries {
  std::string name;          // legend label; empty: not in the legend
  std::vector<double> x, y;  // same length; non-finite points are skipped
  std::string color;         // "#rrggbb"; empty: the palette colour of the series' index
  bool line = true;          // a polyline through the points in x order
  bool dashed = false;
  Marker marker = Marker::kCircle;
  double marker_size = 4;  // px radius
  // Hover text per point (SVG <title>), optional; same length as x when given.
  std::vector<std::string> tooltips;
};

struct Plot {
  std::string title;
  std::string x_label, y_label;
  std::vector<PlotSeries> series;
  bool x_log2 = false;     // log2 x axis with ticks at powers of two
  bool x_percent = false;  // tick labels as percentages of 1 (0.25 -> 25%)
  bool y_percent = false;
  // Default: the data, padded; an end that is not finite counts as not given. A range
  // narrower than a billionth of its values is drawn as flat (padded like one value).
  std::optional<double> x_min, x_max, y_min, y_max;
  bool diagonal = false;     // y = x reference line (same range on both axes)
  double diagonal_band = 0;  // shade |y - x| <= band around the diagonal; 0 = none
  // Extra legend entries that explain styles (e.g. "simulated" solid, "measured" dots).
  std::vector<PlotSeries> legend_keys;
};

struct FigureOptions {
  std::string title;
  std::string subtitle;
  int panel_width = 460;   // px, clamped to [200, 20000]
  int panel_height = 340;  // px, clamped to [160, 20000]
  int columns = 3;         // panels per row, clamped to [1, 1000]
};

// The palette colour number `index` (colour-blind safe, cycles after 8).
std::string PaletteColor(int index);

// One SVG with every panel. Text is XML-escaped.
std::string ToSvgFigure(const std::vector<Plot>& panels, const FigureOptions& options = {});

}  // namespace pipesched::trace
