// SVG timeline: well-formed (balanced tags, escaped text), one box per span, idle
// hatching, axis, legend, titles.
#include "pipesched/trace/svg.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/trace/op_style.h"
#include "test_timeline.h"

namespace pipesched::trace {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

// Checks that every element is closed in order, attributes are quoted and no raw '<' or
// '&' appears in text. Returns "" when well formed, else what went wrong.
std::string CheckWellFormed(const std::string& xml) {
  std::vector<std::string> stack;
  std::size_t i = 0;
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const std::size_t semi = xml.find(';', i);
      if (semi == std::string::npos || semi - i > 6) return "bare '&' at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    const std::size_t close = xml.find('>', i);
    if (close == std::string::npos) return "unclosed tag at " + std::to_string(i);
    const std::string tag = xml.substr(i + 1, close - i - 1);
    i = close + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?') continue;  // <?xml ... ?>
    if (Count(tag, "\"") % 2 != 0) return "unbalanced quotes in <" + tag + ">";
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) {
        return "</" + name + "> closes <" + (stack.empty() ? "nothing" : stack.back()) + ">";
      }
      stack.pop_back();
      continue;
    }
    if (tag.back() == '/') continue;  // self-closing
    stack.push_back(tag.substr(0, tag.find_first_of(" \n")));
  }
  return stack.empty() ? "" : "<" + stack.back() + "> never closed";
}

TEST(SvgTest, WellFormedWithOneBoxPerSpan) {
  const Timeline t = testing::TwoRankTimeline();
  SvgOptions options;
  options.title = "1F1B <P=2> & friends";
  options.subtitle = "makespan 10.5 units, bubble fraction 38%";
  const std::string svg = ToSvg({&t}, options);
  EXPECT_EQ(CheckWellFormed(svg), "");
  EXPECT_THAT(svg, StartsWith("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg "));
  EXPECT_THAT(svg, HasSubstr("xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, EndsWith("</svg>\n"));
  EXPECT_EQ(Count(svg, "<rect class=\"span\""), static_cast<int>(t.spans.size()));
  EXPECT_THAT(svg, HasSubstr(">1F1B &lt;P=2&gt; &amp; friends</text>"));
  EXPECT_THAT(svg, HasSubstr(">makespan 10.5 units, bubble fraction 38%</text>"));
  EXPECT_THAT(svg, HasSubstr("sans-serif"));
}

// A name read from a file may hold control characters or bytes that are not UTF-8; XML
// 1.0 allows neither, and one of them makes the whole picture unreadable.
// Two sends of rank 0 in flight at once are drawn on two rows, the second labelled
// "send (2)", not one box over the other.
TEST(SvgTest, OverlappingTransfersAreDrawnOnRowsOfTheirOwn) {
  Timeline t;
  t.num_ranks = 1;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 1},
             {0, kSendLane, 0, 0, "SEND_F", 1, 4},
             {0, kSendLane, 0, 1, "SEND_F", 2, 5}};
  const std::string svg = ToSvg({&t});
  EXPECT_EQ(CheckWellFormed(svg), "");
  EXPECT_THAT(svg, HasSubstr(">send (2)</text>"));
  // The y of each span's box, in order: the two sends differ.
  std::vector<std::string> ys;
  for (std::size_t pos = svg.find("<rect class=\"span\""); pos != std::string::npos;
       pos = svg.find("<rect class=\"span\"", pos + 1)) {
    const std::size_t y = svg.find(" y=\"", pos) + 4;
    ys.push_back(svg.substr(y, svg.find('"', y) - y));
  }
  ASSERT_EQ(ys.size(), 3u);
  EXPECT_NE(ys[1], ys[2]);
  EXPECT_NE(ys[0], ys[1]);
}

TEST(SvgTest, ControlCharactersAndBrokenUtf8BecomeReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(internal::XmlEscape("a\x01"
                                "b\x1b[31mc"),
            "a" + fffd + "b" + fffd + "[31mc");
  EXPECT_EQ(internal::XmlEscape("tab\tnl\ncr\r"), "tab\tnl\ncr\r");
  // U+FFFE and U+FFFF are well-formed UTF-8 but no XML characters; U+FFFD itself stays.
  EXPECT_EQ(internal::XmlEscape("\xEF\xBF\xBE|\xEF\xBF\xBF|\xEF\xBF\xBD"),
            fffd + "|" + fffd + "|" + fffd);
  // Well-formed UTF-8 (2, 3 and 4 bytes) is kept; a lone continuation byte, a truncated
  // sequence, an overlong form and a surrogate are not.
  EXPECT_EQ(internal::XmlEscape("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  EXPECT_EQ(internal::XmlEscape("\x80|\xE2\x82|\xC0\xAF|\xED\xA0\x80"),
            fffd + "|" + fffd + fffd + "|" + fffd + fffd + "|" + fffd + fffd + fffd);
  Timeline t = testing::TwoRankTimeline();
  SvgOptions options;
  options.title = std::string("x\x01y\xff", 4);
  const std::string svg = ToSvg({&t}, options);
  EXPECT_EQ(svg.find('\x01'), std::string::npos);
  EXPECT_THAT(svg, HasSubstr(">x" + fffd + "y" + fffd + "</text>"));
}

TEST(SvgTest, RowsIdleAxisAndLegend) {
  const Timeline t = testing::TwoRankTimeline();
  const std::string svg = ToSvg({&t});
  // Rank rows and lane sub-rows are labelled; only rows of lanes in use exist.
  EXPECT_THAT(svg, HasSubstr(">rank 0</text>"));
  EXPECT_THAT(svg, HasSubstr(">rank 1</text>"));
  EXPECT_THAT(svg, HasSubstr(">send</text>"));
  EXPECT_THAT(svg, HasSubstr(">comm</text>"));
  EXPECT_THAT(svg, Not(HasSubstr(">recv</text>")));
  // Idle: a hatched background under each compute row (2), plain under lanes (2).
  EXPECT_THAT(svg, HasSubstr("<pattern id=\"ps-idle\""));
  EXPECT_EQ(Count(svg, "<rect class=\"idle\""), 4);
  EXPECT_EQ(Count(svg, "fill=\"url(#ps-idle)\""), 2 + 1);  // + the legend swatch
  // Axis: ticks 0, 2, ... 10 (about ten ticks, on a 1-2-5 step) and the unit.
  EXPECT_EQ(Count(svg, "class=\"tick\""), 6);
  EXPECT_THAT(svg, HasSubstr(">10</text>"));
  EXPECT_THAT(svg, HasSubstr(">time (units)</text>"));
  EXPECT_THAT(svg, HasSubstr(">makespan 10.5 units</text>"));
  // Legend: the ops in use, in legend order, then idle.
  for (const char* entry :
       {"F forward", "B backward", "SF send activation", "AR all-reduce", "idle"}) {
    EXPECT_THAT(svg, HasSubstr(std::string(">") + entry + "</text>")) << entry;
  }
  EXPECT_LT(svg.find(">F forward<"), svg.find(">B backward<"));
  EXPECT_THAT(svg, Not(HasSubstr("backward (weights)")));
  // Forward and backward boxes in their colours; micro-batch numbers in wide boxes.
  EXPECT_THAT(svg, HasSubstr("fill=\"#4E79A7\""));
  EXPECT_THAT(svg, HasSubstr("fill=\"#59A14F\""));
  EXPECT_THAT(svg, HasSubstr(">1</text>"));
  EXPECT_THAT(svg, HasSubstr("<title>stage 1 B micro-batch 0: 2.5\xE2\x80\x93"
                             "4.5 units</title>"));
}

TEST(SvgTest, LaterChunksAreDarkerAndSaySo) {
  Timeline t;
  t.num_ranks = 1;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 1}, {0, kComputeLane, 1, 0, "F", 1, 2}};
  const std::string svg = ToSvg({&t});
  EXPECT_THAT(svg, HasSubstr("fill=\"#4E79A7\""));  // chunk 0
  EXPECT_THAT(svg, HasSubstr("fill=\"#3D5E82\""));  // chunk 1: 78% brightness
  EXPECT_THAT(svg, HasSubstr("darker: later model chunk"));
}

// A rank's chunks are its own stages in order, whatever the placement: block placement
// (rank 0 holds stages 0 and 1, rank 1 stages 2 and 3) shades stage 1 and 3, not rank 1;
// so do a measured timeline's P x D rows (here row 2 is replica 1's rank 0).
TEST(SvgTest, ChunksAreEachRowsOwnStagesInOrder) {
  Timeline t;
  t.num_ranks = 2;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 1},
             {0, kComputeLane, 1, 0, "F", 1, 2},
             {1, kComputeLane, 2, 0, "F", 2, 3},
             {1, kComputeLane, 3, 0, "F", 3, 4}};
  std::string svg = ToSvg({&t});
  EXPECT_EQ(Count(svg, "fill=\"#4E79A7\""), 3);  // stages 0 and 2, and the legend's F
  EXPECT_EQ(Count(svg, "fill=\"#3D5E82\""), 2);  // stages 1 and 3
  EXPECT_THAT(svg, HasSubstr("darker: later model chunk"));

  Timeline measured;
  measured.num_ranks = 4;  // P = 2, D = 2: rows 0..3, loop placement with V = 2
  measured.spans = {{0, kComputeLane, 0, 0, "F", 0, 1},
                    {2, kComputeLane, 0, 0, "F", 0, 1},
                    {0, kComputeLane, 2, 0, "F", 1, 2},
                    {2, kComputeLane, 2, 0, "F", 1, 2}};
  svg = ToSvg({&measured});
  EXPECT_EQ(Count(svg, "fill=\"#4E79A7\""), 3);  // stage 0 on both replicas, the legend
  EXPECT_EQ(Count(svg, "fill=\"#3D5E82\""), 2);  // stage 2 on both (stage / 4 said chunk 0)
}

TEST(SvgTest, StacksTimelinesOnASharedScale) {
  const Timeline planned = testing::TwoRankTimeline();
  Timeline measured = testing::TwoRankTimeline();
  measured.name = "measured";
  for (Span& s : measured.spans) {
    s.start *= 2;
    s.end *= 2;
  }
  const std::string svg = ToSvg({&planned, nullptr, &measured});
  EXPECT_EQ(CheckWellFormed(svg), "");
  EXPECT_EQ(Count(svg, "<rect class=\"span\""), 2 * static_cast<int>(planned.spans.size()));
  const std::size_t first = svg.find(">simulated</text>");
  const std::size_t second = svg.find(">measured</text>");
  ASSERT_NE(first, std::string::npos);
  ASSERT_NE(second, std::string::npos);
  EXPECT_LT(first, second);
  EXPECT_THAT(svg, HasSubstr(">makespan 21 units</text>"));
  // Shared scale: both axes run to 21, so 20 appears on both.
  EXPECT_EQ(Count(svg, ">20</text>"), 2);
}

TEST(SvgTest, EmptyInputIsStillAPicture) {
  const std::string svg = ToSvg({});
  EXPECT_EQ(CheckWellFormed(svg), "");
  EXPECT_THAT(svg, HasSubstr("<svg "));
}

// A span ending at infinity drew ticks up to infinity: ToSvg never returned. Spans whose
// times are not finite are not drawn, their rows are, and the makespan line says so.
TEST(SvgTest, SpansWithTimesThatAreNotFiniteAreNotDrawn) {
  const double inf = std::numeric_limits<double>::infinity();
  Timeline t;
  t.num_ranks = 2;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 4},
             {0, kComputeLane, 0, 1, "F", 4, inf},
             {1, kComputeLane, 1, 0, "F", -inf, 2},
             {1, kComputeLane, 1, 1, "B", std::numeric_limits<double>::quiet_NaN(), 6}};
  const std::string svg = ToSvg({&t});
  EXPECT_EQ(CheckWellFormed(svg), "");
  EXPECT_EQ(Count(svg, "<rect class=\"span\""), 1);
  EXPECT_THAT(svg, HasSubstr(">rank 1</text>"));
  EXPECT_THAT(svg, HasSubstr(">makespan 4 units; 3 spans with times that are not finite not "
                             "drawn</text>"));
  EXPECT_EQ(Count(svg, "class=\"tick\""), 9);  // 0, 0.5, ... 4
  for (const char* bad : {"\"inf", "\"-inf", "\"nan", "\"-nan", ">inf", ">nan"}) {
    EXPECT_THAT(svg, Not(HasSubstr(bad))) << bad;
  }
}

// num_ranks = 2^31 - 1 drew a row per declared rank: minutes. Empty declared ranks are
// drawn up to rank 1023; a rank with a span always is; the makespan line counts the rest.
TEST(SvgTest, DeclaredRanksWithoutSpansAreDrawnUpToALimit) {
  Timeline t;
  t.num_ranks = std::numeric_limits<int>::max();
  t.spans = {{5000, kComputeLane, 0, 0, "F", 0, 1}};
  const std::string svg = ToSvg({&t});
  EXPECT_EQ(CheckWellFormed(svg), "");
  EXPECT_THAT(svg, HasSubstr(">rank 1023</text>"));
  EXPECT_THAT(svg, Not(HasSubstr(">rank 1024</text>")));
  EXPECT_THAT(svg, HasSubstr(">rank 5000</text>"));
  EXPECT_EQ(Count(svg, ">rank "), 1025);
  EXPECT_THAT(svg, HasSubstr("; 2147482622 more ranks without spans not drawn</text>"));
}

TEST(SvgTest, WidthAndRowHeightAreClamped) {
  const Timeline t = testing::TwoRankTimeline();
  const int kMax = std::numeric_limits<int>::max(), kMin = std::numeric_limits<int>::min();
  SvgOptions wide;
  wide.width = wide.row_height = kMax;
  const std::string big = ToSvg({&t}, wide);
  EXPECT_EQ(CheckWellFormed(big), "");
  EXPECT_THAT(big, HasSubstr(" width=\"20000\" "));
  EXPECT_THAT(big, HasSubstr("height=\"200\" fill=\"url(#ps-idle)\""));  // a compute row
  SvgOptions narrow;
  narrow.width = narrow.row_height = kMin;
  const std::string small = ToSvg({&t}, narrow);
  EXPECT_THAT(small, HasSubstr(" width=\"320\" "));
  EXPECT_THAT(small, HasSubstr("height=\"8\" fill=\"url(#ps-idle)\""));
}

}  // namespace
}  // namespace pipesched::trace
