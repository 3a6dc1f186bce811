#include "pipesched/trace/stats.h"

#include <limits>

#include "gtest/gtest.h"

namespace pipesched::trace {
namespace {

Span MakeSpan(int rank, int lane, double start, double end) {
  Span s;
  s.rank = rank;
  s.lane = lane;
  s.op = "F";
  s.start = start;
  s.end = end;
  return s;
}

TEST(BubbleStatsTest, IdleIsMakespanMinusComputeTime) {
  Timeline t;
  t.num_ranks = 2;
  // Measured timelines do not start at 0: the makespan starts at the first span.
  t.spans = {MakeSpan(0, kComputeLane, 100, 110), MakeSpan(0, kComputeLane, 115, 120),
             MakeSpan(1, kComputeLane, 110, 120), MakeSpan(1, kSendLane, 120, 130)};
  BubbleStats s = ComputeBubbleStats(t);
  EXPECT_DOUBLE_EQ(s.start, 100);
  EXPECT_DOUBLE_EQ(s.makespan, 30);  // the send lane extends it, but is not busy time
  ASSERT_EQ(s.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(s.rows[0].busy, 15);
  EXPECT_DOUBLE_EQ(s.rows[0].idle, 15);
  EXPECT_DOUBLE_EQ(s.rows[1].busy, 10);
  EXPECT_DOUBLE_EQ(s.rows[1].idle, 20);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 35.0 / 60.0);
  EXPECT_DOUBLE_EQ(s.bubble_ratio, 35.0 / 25.0);
}

// A whole step's picture: the phases join the actions, and everything moves so that the
// first zero-grad starts at 0; the flows still point at the same actions.
TEST(WithStepPhasesTest, AppendsThePhasesAndStartsAtTheFirst) {
  Timeline t;
  t.num_ranks = 1;
  t.spans = {MakeSpan(0, kComputeLane, 0, 4), MakeSpan(0, kComputeLane, 4, 6)};
  t.flows = {{.from = 0, .to = 1}};
  EXPECT_EQ(WithStepPhases(t, {}).spans[0].start, 0);  // nothing to add: as it was
  Span zero = MakeSpan(0, kComputeLane, -2, 0), opt = MakeSpan(0, kComputeLane, 6, 9);
  zero.op = "ZERO_GRAD";
  opt.op = "OPTIMIZER";
  const Timeline whole = WithStepPhases(t, {zero, opt});
  ASSERT_EQ(whole.spans.size(), 4u);
  EXPECT_EQ(whole.spans[0].start, 2);  // the first F, after the 2 of the zero-grad
  EXPECT_EQ(whole.spans[2].op, "ZERO_GRAD");
  EXPECT_EQ(whole.spans[2].start, 0);
  EXPECT_EQ(whole.spans[3].end, 11);
  EXPECT_DOUBLE_EQ(whole.Makespan(), 11);
  ASSERT_EQ(whole.flows.size(), 1u);
  EXPECT_EQ(whole.flows[0].to, 1);
}

TEST(BubbleStatsTest, RowsBeyondTheLimitAreIgnored) {
  Timeline t;
  t.num_ranks = 2;
  t.spans = {MakeSpan(0, kComputeLane, 0, 4), MakeSpan(1, kComputeLane, 0, 100)};
  BubbleStats s = ComputeBubbleStats(t, 1);
  ASSERT_EQ(s.rows.size(), 1u);
  EXPECT_DOUBLE_EQ(s.makespan, 4);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 0);
}

TEST(BubbleStatsTest, EmptyTimelineIsAllZero) {
  Timeline t;
  t.num_ranks = 3;
  BubbleStats s = ComputeBubbleStats(t);
  EXPECT_EQ(s.makespan, 0);
  EXPECT_EQ(s.bubble_fraction, 0);
}

// A span ending at infinity made the bubble fraction -nan: spans whose times are not
// finite are not counted.
TEST(BubbleStatsTest, SpansWithTimesThatAreNotFiniteAreIgnored) {
  Timeline t;
  t.num_ranks = 2;
  t.spans = {MakeSpan(0, kComputeLane, 0, 4), MakeSpan(1, kComputeLane, 0, 2),
             MakeSpan(1, kComputeLane, 2, std::numeric_limits<double>::infinity()),
             MakeSpan(1, kSendLane, std::numeric_limits<double>::quiet_NaN(), 9)};
  BubbleStats s = ComputeBubbleStats(t);
  EXPECT_DOUBLE_EQ(s.makespan, 4);
  ASSERT_EQ(s.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(s.rows[1].busy, 2);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 2.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.bubble_ratio, 2.0 / 6.0);
}

// num_ranks = 2^31 - 1 allocated a row each (32 GB). The rows listed stop at 65536; the
// fractions still count every row, idle or not.
TEST(BubbleStatsTest, ManyRowsAreCountedWithoutListingThemAll) {
  constexpr int kRows = std::numeric_limits<int>::max();
  Timeline t;
  t.num_ranks = kRows;
  t.spans = {MakeSpan(0, kComputeLane, 0, 4), MakeSpan(100000, kComputeLane, 0, 1),
             MakeSpan(100000, kComputeLane, 1, 2), MakeSpan(200000, kSendLane, 0, 1)};
  BubbleStats s = ComputeBubbleStats(t);
  EXPECT_EQ(s.rows.size(), 65536u);
  EXPECT_DOUBLE_EQ(s.makespan, 4);
  EXPECT_DOUBLE_EQ(s.rows[0].busy, 4);
  EXPECT_DOUBLE_EQ(s.rows[1].idle, 4);
  // Idle: 2 on row 100000, 4 on every other row but row 0.
  const double idle = 2 + 4.0 * (kRows - 2);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, idle / (4.0 * kRows));
  EXPECT_DOUBLE_EQ(s.bubble_ratio, idle / 6);
  EXPECT_EQ(ComputeBubbleStats(t, 3).rows.size(), 3u);
}

}  // namespace
}  // namespace pipesched::trace
