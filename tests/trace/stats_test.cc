#include "trace/stats.h"

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

}  // namespace
}  // namespace pipesched::trace
