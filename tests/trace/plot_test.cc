// SVG plots: structure, ticks, escaping, the diagonal, skipped points.
#include "pipesched/trace/plot.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipesched::trace {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

Plot BubbleVsMicrobatches() {
  Plot plot;
  plot.title = "P=2";
  plot.x_label = "micro-batches M";
  plot.y_label = "bubble fraction";
  plot.x_log2 = true;
  plot.y_percent = true;
  plot.y_min = 0;
  plot.series.push_back({.name = "1f1b simulated", .x = {4, 8, 16}, .y = {0.2, 0.11, 0.06}});
  plot.series.push_back(
      {.name = "1f1b measured", .x = {4, 8, 16}, .y = {0.21, 0.12, 0.07}, .line = false});
  return plot;
}

TEST(PlotTest, LinesMarkersTicksAndLegend) {
  std::string svg = ToSvgFigure({BubbleVsMicrobatches()}, {.title = "bubble <vs> M"});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>\n"));
  EXPECT_THAT(svg, HasSubstr("bubble &lt;vs&gt; M"));
  EXPECT_EQ(Count(svg, "<polyline"), 1);    // the measured series has no line
  EXPECT_EQ(Count(svg, "<circle"), 6 + 2);  // 3 + 3 points, 2 legend markers
  for (const char* tick : {">4<", ">8<", ">16<", ">0%<", ">20%<"}) {
    EXPECT_THAT(svg, HasSubstr(tick)) << tick;
  }
  EXPECT_THAT(svg, HasSubstr(">1f1b simulated<"));
  EXPECT_THAT(svg, HasSubstr(PaletteColor(0)));
  EXPECT_THAT(svg, HasSubstr(PaletteColor(1)));
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
}

TEST(PlotTest, ScatterWithDiagonalAndBand) {
  Plot plot;
  plot.diagonal = true;
  plot.diagonal_band = 0.03;
  plot.x_percent = plot.y_percent = true;
  plot.series.push_back({.name = "gpipe",
                         .x = {0.1, 0.3, std::numeric_limits<double>::quiet_NaN()},
                         .y = {0.12, 0.28, 0.5},
                         .line = false,
                         .marker = Marker::kSquare,
                         .tooltips = {"P=2 M=8", "P=2 M=4", "skipped"}});
  std::string svg = ToSvgFigure({plot});
  EXPECT_THAT(svg, HasSubstr("stroke-dasharray=\"5 4\""));  // the diagonal
  EXPECT_THAT(svg, HasSubstr("fill-opacity=\"0.14\""));     // the band
  // Plot area, clip and frame, then two square markers (the NaN point is skipped) and
  // the legend's.
  EXPECT_EQ(Count(svg, "<rect x="), 3 + 2 + 1);
  EXPECT_THAT(svg, HasSubstr("<title>P=2 M=8</title>"));
  EXPECT_THAT(svg, Not(HasSubstr("skipped")));  // the NaN point is not drawn
}

TEST(PlotTest, PanelsFlowIntoRowsAndEmptyInputIsAValidPicture) {
  std::string two_rows = ToSvgFigure(
      {BubbleVsMicrobatches(), BubbleVsMicrobatches(), BubbleVsMicrobatches()}, {.columns = 2});
  EXPECT_EQ(Count(two_rows, "<clipPath"), 3);
  std::string empty = ToSvgFigure({});
  EXPECT_EQ(empty.rfind("<svg", 0), 0u);
  std::string no_data = ToSvgFigure({Plot{}});
  EXPECT_THAT(no_data, Not(HasSubstr("nan")));
  EXPECT_THAT(no_data, Not(HasSubstr("inf")));
  EXPECT_EQ(PaletteColor(8), PaletteColor(0));
}

// Values a few ulps apart (a tick step below their resolution: `t += step` stood still)
// never finished their axis. Such a range is drawn as flat, padded like one value.
TEST(PlotTest, ValuesAFewUlpsApartDrawAFlatAxis) {
  Plot plot;
  plot.series.push_back({.x = {1e15, 1e15 + 0.125}, .y = {1e9, 1e9 + 2.384185791015625e-7}});
  const std::string svg = ToSvgFigure({plot});
  for (const char* tick : {">9e+08<", ">1e+09<", ">1.1e+09<", ">1e+15<"}) {
    EXPECT_THAT(svg, HasSubstr(tick)) << tick;
  }
  EXPECT_LE(Count(svg, "stroke=\"#e6e6e6\""), 24);  // grid lines: a handful per axis
  EXPECT_THAT(svg, Not(HasSubstr("nan")));

  // Both ends given, that close: padded too, as there is nothing to draw between them.
  plot.y_min = 1e9;
  plot.y_max = 1e9 + 2.384185791015625e-7;
  const std::string fixed = ToSvgFigure({plot});
  EXPECT_THAT(fixed, HasSubstr(">1e+09<"));
  EXPECT_LE(Count(fixed, "stroke=\"#e6e6e6\""), 24);
}

// An axis end of inf, or data whose range overflows (-1e308 to 1e308), made a tick step
// of 1 that could not advance either.
TEST(PlotTest, HugeRangesAndEndsThatAreNotFinite) {
  Plot plot;
  plot.series.push_back({.x = {-1e308, 1e308}, .y = {1, 2}});
  plot.y_max = std::numeric_limits<double>::infinity();
  plot.y_min = -std::numeric_limits<double>::infinity();
  const std::string svg = ToSvgFigure({plot});
  EXPECT_THAT(svg, HasSubstr(">1e+308<"));
  EXPECT_THAT(svg, HasSubstr(">1.4<"));  // the data's y range
  EXPECT_LE(Count(svg, "stroke=\"#e6e6e6\""), 24);
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("inf")));
}

// columns = INT_MAX overflowed `n + columns - 1`; sizes are clamped to what plot.h says.
TEST(PlotTest, FigureOptionsAreClamped) {
  const Plot plot = BubbleVsMicrobatches();
  const std::string svg = ToSvgFigure({plot, plot}, {.columns = std::numeric_limits<int>::max()});
  EXPECT_THAT(svg, HasSubstr("width=\"936\""));  // two 460 px panels side by side, + 16
  EXPECT_EQ(Count(svg, "<clipPath"), 2);
  const std::string huge = ToSvgFigure({plot}, {.panel_width = std::numeric_limits<int>::max(),
                                                .panel_height = std::numeric_limits<int>::min(),
                                                .columns = std::numeric_limits<int>::min()});
  EXPECT_THAT(huge, HasSubstr("width=\"20016\""));
}

}  // namespace
}  // namespace pipesched::trace
