// Terminal grid: the picture of a small timeline, colour on request only, width limit.
#include "pipesched/trace/grid.h"

#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_timeline.h"

namespace pipesched::trace {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(GridTest, DrawsTheTimeline) {
  // One column is 1/3 unit: the shortest compute span (1 unit) holds "F0" and a space.
  EXPECT_EQ(RenderTimelineGrid(testing::TwoRankTimeline()),
            "simulated: makespan 10.5 unit, 1 column = 0.333333 unit\n"
            "rank 0 | F0 F1 ........B0    ...B1    ...\n"
            "  send | ...SF.SF........................\n"
            "  comm | .............................AR \n"
            "rank 1 | .....F0 B0    F1 B1    .........\n"
            "         +--------------+--------------+--\n"
            "  unit   0              5              10\n"
            "legend:  F forward  B backward  SF send activation  AR all-reduce  . idle\n");
}

// A rank that runs two stages (a V schedule's chunks): each label names its stage first,
// as the schedule's action text does ("3F0"), since "F0" would read alike for both; a
// span too narrow for that keeps its stage and op ("3B"); the legend says how to read it.
TEST(GridTest, RanksWithSeveralStagesNameTheStage) {
  Timeline t;
  t.name = "v";
  t.num_ranks = 2;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 1},   {1, kComputeLane, 1, 0, "F", 1, 2},
             {1, kComputeLane, 2, 0, "F", 2, 3},   {0, kComputeLane, 3, 0, "F", 3, 4},
             {0, kComputeLane, 3, 0, "B", 4, 4.5}, {1, kComputeLane, 2, 0, "B", 5, 7},
             {1, kComputeLane, 1, 0, "B", 7, 9},   {0, kComputeLane, 0, 0, "B", 9, 11}};
  GridOptions options;
  options.axis = false;
  options.max_width = 45;  // 3 columns a unit: 3B's half unit gets 2
  EXPECT_EQ(RenderTimelineGrid(t, options),
            "v: makespan 11 unit, 1 column = 0.333333 unit\n"
            "rank 0 | 0F0......3F03B.............0B0   \n"
            "rank 1 | ...1F02F0......2B0   1B0   ......\n"
            "legend:  F forward  B backward  . idle\n"
            "         2F3 stage 2's F of micro-batch 3\n");
}

// Rows of two replicas of a 2-rank pipeline (the executor's timeline with D = 2) are
// named by replica and rank, not "rank 2" for replica 1's rank 0.
TEST(GridTest, ReplicasRowsAreNamedByReplicaAndRank) {
  Timeline t;
  t.name = "measured";
  t.num_ranks = 4;
  t.ranks_per_replica = 2;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 1},
             {1, kComputeLane, 1, 0, "F", 1, 2},
             {2, kComputeLane, 0, 0, "F", 0, 1},
             {3, kComputeLane, 1, 0, "F", 1, 2}};
  GridOptions options;
  options.axis = false;
  options.legend = false;
  EXPECT_EQ(RenderTimelineGrid(t, options),
            "measured: makespan 2 unit, 1 column = 0.333333 unit\n"
            "replica 0 rank 0 | F0 ...\n"
            "replica 0 rank 1 | ...F0 \n"
            "replica 1 rank 0 | F0 ...\n"
            "replica 1 rank 1 | ...F0 \n");
  EXPECT_EQ(RowName(t, 3), "replica 1 rank 1");
  t.ranks_per_replica = 0;
  EXPECT_EQ(RowName(t, 3), "rank 3");
}

// Two sends of rank 0 in flight at once (a transfer longer than the forward between
// them, as `simulate --cost-comm=3` makes): the second goes on a row of its own, and
// neither label is cut. The third, which starts after the first has ended, shares its
// row.
TEST(GridTest, OverlappingTransfersGetRowsOfTheirOwn) {
  Timeline t;
  t.name = "overlap";
  t.num_ranks = 2;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 1},   {0, kComputeLane, 0, 1, "F", 1, 2},
             {0, kSendLane, 0, 0, "SEND_F", 1, 4}, {0, kSendLane, 0, 1, "SEND_F", 2, 5},
             {0, kSendLane, 0, 2, "SEND_F", 5, 8}, {1, kComputeLane, 1, 0, "F", 4, 5}};
  GridOptions options;
  options.axis = false;
  options.legend = false;
  EXPECT_EQ(RenderTimelineGrid(t, options),
            "overlap: makespan 8 unit, 1 column = 0.333333 unit\n"
            "rank 0     | F0 F1 ..................\n"
            "  send     | ...SF0      ...SF2      \n"
            "  send (2) | ......SF1      .........\n"
            "rank 1     | ............F0 .........\n");
}

TEST(GridTest, ColourOnlyWhenAsked) {
  const Timeline t = testing::TwoRankTimeline();
  EXPECT_THAT(RenderTimelineGrid(t), Not(HasSubstr("\x1b[")));
  GridOptions options;
  options.color = true;
  const std::string colored = RenderTimelineGrid(t, options);
  EXPECT_THAT(colored, HasSubstr("\x1b[97;44mF0 \x1b[0m"));  // forward: white on blue
  EXPECT_THAT(colored, HasSubstr("\x1b[0m"));
}

TEST(GridTest, FitsTheRequestedWidth) {
  Timeline t;
  t.num_ranks = 3;
  for (int r = 0; r < 3; ++r) {
    for (int m = 0; m < 200; ++m) {
      t.spans.push_back({r, kComputeLane, r, m, "F", r + 3.0 * m, r + 3.0 * m + 1});
      t.spans.push_back({r, kComputeLane, r, m, "B", r + 3.0 * m + 1, r + 3.0 * m + 3});
    }
  }
  for (int width : {60, 120, 200}) {
    GridOptions options;
    options.max_width = width;
    const std::vector<std::string> lines = Lines(RenderTimelineGrid(t, options));
    ASSERT_GE(lines.size(), 6u);
    for (const std::string& line : lines) {
      EXPECT_LE(line.size(), static_cast<std::size_t>(width)) << line;
    }
    EXPECT_EQ(lines[1].substr(0, 9), "rank 0 | ");
  }
}

TEST(GridTest, ASpanTooNarrowForItsNumberShowsItsOpAlone) {
  // `simulate --microbatches=16` drew F10..F15 as "F1" (the number cut to two columns):
  // another micro-batch's name. Two columns per unit here: "F9" fits, "F10" does not and
  // shows "F" and a space; the backwards (two units) keep their numbers.
  Timeline t;
  t.num_ranks = 1;
  for (int m = 0; m < 12; ++m) {
    t.spans.push_back({0, kComputeLane, 0, m, "F", 3.0 * m, 3.0 * m + 1});
    t.spans.push_back({0, kComputeLane, 0, m, "B", 3.0 * m + 1, 3.0 * m + 3});
  }
  GridOptions options;
  options.max_width = 9 + 72;  // "rank 0 | " and 2 columns per unit of the 36
  const std::vector<std::string> lines = Lines(RenderTimelineGrid(t, options));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1],
            "rank 0 | F0B0  F1B1  F2B2  F3B3  F4B4  F5B5  F6B6  F7B7  F8B8  F9B9  F B10 F B11 ");
}

TEST(GridTest, OptionalPartsAndEmptyTimeline) {
  GridOptions bare;
  bare.header = bare.axis = bare.legend = false;
  const std::vector<std::string> lines =
      Lines(RenderTimelineGrid(testing::TwoRankTimeline(), bare));
  ASSERT_EQ(lines.size(), 4u);  // rank 0, send, comm, rank 1
  EXPECT_EQ(lines[3].substr(0, 6), "rank 1");

  Timeline empty;
  empty.num_ranks = 2;
  EXPECT_EQ(RenderTimelineGrid(empty), "timeline: makespan 0 unit\nrank 0 | \nrank 1 | \n");

  // With a step's phases the length drawn is the whole step's, and is called so.
  Timeline step =
      WithStepPhases(testing::TwoRankTimeline(),
                     {Span{.rank = 0, .stage = 0, .op = "ZERO_GRAD", .start = -1, .end = 0},
                      Span{.rank = 0, .stage = 0, .op = "OPTIMIZER", .start = 10.5, .end = 12.5}});
  EXPECT_EQ(LengthLabel(step), std::string("step time"));
  EXPECT_THAT(Lines(RenderTimelineGrid(step))[0],
              ::testing::StartsWith("simulated, whole step: step time 13.5 unit"));
}

TEST(GridTest, UnknownOpsAndSpansShorterThanAColumn) {
  Timeline t;
  t.num_ranks = 1;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 10}, {0, kComputeLane, 0, 0, "UNSHARD", 10, 10.01}};
  GridOptions options;
  options.max_width = 40;
  const std::string grid = RenderTimelineGrid(t, options);
  EXPECT_THAT(grid, HasSubstr("rank 0 | F0"));
  EXPECT_THAT(grid, HasSubstr("? other"));
}

// The two-rank picture with every time multiplied by `scale`.
Timeline Scaled(double scale) {
  Timeline t = testing::TwoRankTimeline();
  for (Span& span : t.spans) {
    span.start *= scale;
    span.end *= scale;
  }
  return t;
}

// Costs of 1e-320 (denormal) made columns per unit overflow to inf: the header said "1
// column = 0 unit" over a one-column grid. The picture is the unit one at any scale.
TEST(GridTest, TinyAndHugeTimesDrawTheSamePicture) {
  const std::vector<std::string> unit = Lines(RenderTimelineGrid(Scaled(1)));
  for (double scale : {1e-320, 1e-300, 1e-9, 1e9, 1e15}) {
    SCOPED_TRACE(scale);
    const std::string text = RenderTimelineGrid(Scaled(scale));
    const std::vector<std::string> lines = Lines(text);
    ASSERT_EQ(lines.size(), unit.size()) << text;
    EXPECT_THAT(lines[0], Not(HasSubstr("= 0 unit")));
    EXPECT_THAT(lines[0], Not(HasSubstr("inf")));
    for (std::size_t k = 1; k <= 4; ++k) EXPECT_EQ(lines[k].size(), unit[k].size()) << k;
  }
  // Denormals carry few digits: the columns may round one off, the labels all show.
  EXPECT_THAT(Lines(RenderTimelineGrid(Scaled(1e-320)))[1],
              ::testing::MatchesRegex("rank 0 \\| F0 F1 \\.+B0    \\.\\.\\.B1    \\.+"));
  // The smallest denormal (5e-324) divided to a column of 0: now a column is that time.
  const std::string smallest =
      RenderTimelineGrid(Scaled(std::numeric_limits<double>::denorm_min()));
  EXPECT_THAT(Lines(smallest)[0], Not(HasSubstr("= 0 unit"))) << smallest;
  EXPECT_THAT(Lines(smallest)[1], HasSubstr("F")) << smallest;
  EXPECT_THAT(Lines(smallest)[1], HasSubstr("B")) << smallest;
}

// A makespan of inf (costs of 1e308) never finished drawing its time axis.
TEST(GridTest, AMakespanThatIsNotFiniteGetsNoColumns) {
  for (double end :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 1e308}) {
    Timeline t = testing::TwoRankTimeline();
    t.spans.back().end = end;
    const std::string text = RenderTimelineGrid(t);
    EXPECT_LT(text.size(), 2000u) << end;
    EXPECT_THAT(text, HasSubstr("rank 0 | ")) << end;
  }
}

// max_width = INT_MIN overflowed in `max_width - prefix`; INT_MAX sized a 32 GB grid.
TEST(GridTest, MaxWidthIsClamped) {
  GridOptions narrow;
  narrow.max_width = std::numeric_limits<int>::min();
  const std::vector<std::string> lines =
      Lines(RenderTimelineGrid(testing::TwoRankTimeline(), narrow));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1].size(), 9u + 10u);  // "rank 0 | " and the 10 columns at the least

  Timeline wide;
  wide.num_ranks = 1;
  wide.spans = {{0, kComputeLane, 0, 0, "F", 0, 1}, {0, kComputeLane, 0, 0, "B", 1, 1e9}};
  GridOptions huge;
  huge.max_width = std::numeric_limits<int>::max();
  const std::vector<std::string> wide_lines = Lines(RenderTimelineGrid(wide, huge));
  ASSERT_GE(wide_lines.size(), 2u);
  for (const std::string& line : wide_lines) EXPECT_LE(line.size(), 10000u);
  EXPECT_EQ(wide_lines[1].size(), 10000u);
}

// num_ranks = 2^31 - 1 with no spans drew a row per declared rank: minutes.
TEST(GridTest, DeclaredRanksWithoutSpansAreDrawnUpToALimit) {
  Timeline t;
  t.num_ranks = std::numeric_limits<int>::max();
  t.spans = {{5000, kComputeLane, 0, 0, "F", 0, 1}};
  GridOptions bare;
  bare.header = bare.axis = bare.legend = false;
  const std::vector<std::string> lines = Lines(RenderTimelineGrid(t, bare));
  ASSERT_EQ(lines.size(), 1024u + 1u + 1u);
  EXPECT_EQ(lines[1023].substr(0, 12), "rank 1023 | ");
  EXPECT_EQ(lines[1024].substr(0, 12), "rank 5000 | ");
  EXPECT_EQ(lines[1025], "(2147482622 more ranks without spans not drawn)");
}

}  // namespace
}  // namespace pipesched::trace
