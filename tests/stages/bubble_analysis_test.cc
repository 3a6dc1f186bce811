// The idle-time decomposition: hand-made timelines with known answers (times are small
// dyadic numbers, so the categories must add up exactly), then real runs of the executor
// where they must add up to the measured idle time; and skew injection.
#include "pipesched/stages/bubble_analysis.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/stages/slow_stage_work.h"
#include "pipesched/stages/trainer.h"
#include "pipesched/trace/stats.h"
#include "stages/toy_stage_work.h"
#include "tests/testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::SleepyWork;

struct Builder {
  trace::Timeline tl;
  std::vector<double> issue;
  Builder(int rows) { tl.num_ranks = rows; }
  void Add(int row, int lane, const std::string& op, int stage, int mb, double start, double end,
           double issued = 0) {
    tl.spans.push_back(trace::Span{.rank = row,
                                   .lane = lane,
                                   .stage = stage,
                                   .microbatch = mb,
                                   .op = op,
                                   .start = start,
                                   .end = end});
    issue.push_back(issued);
  }
};

// Two stages on two rows; stage 1's backward (40) is twice stage 0's (20), so the
// balanced reference B is 30 and a quarter of every wait on stage 1's B is imbalance.
//   row 0: F00 [0,10) F01 [10,20) ........ B00 [79,99) .. B01 [122,142)
//   row 1:  RECV_F10 [10,12), F10 [13,23), F11 [26,36) (issued at 25), B10 [36,76),
//           SEND_B10 [76,78), B11 [80,120), SEND_B11 [120,121)
Builder TwoStages() {
  Builder b(2);
  using trace::kComputeLane, trace::kRecvLane, trace::kSendLane;
  b.Add(0, kComputeLane, "F", 0, 0, 0, 10);
  b.Add(0, kComputeLane, "F", 0, 1, 10, 20);
  b.Add(1, kRecvLane, "RECV_F", 1, 0, 10, 12);
  b.Add(1, kComputeLane, "F", 1, 0, 13, 23);
  b.Add(1, kRecvLane, "RECV_F", 1, 1, 20, 22, 25);
  b.Add(1, kComputeLane, "F", 1, 1, 26, 36, 25);
  b.Add(1, kComputeLane, "B", 1, 0, 36, 76);
  b.Add(1, kSendLane, "SEND_B", 1, 0, 76, 78);
  b.Add(0, kComputeLane, "B", 0, 0, 79, 99);
  b.Add(1, kComputeLane, "B", 1, 1, 80, 120);
  b.Add(1, kSendLane, "SEND_B", 1, 1, 120, 121);
  b.Add(0, kComputeLane, "B", 0, 1, 122, 142);
  return b;
}

// A replay takes the step's own zero-grads and optimizer steps (replica 0's rows only),
// and grows the stage list where the costs had none.
TEST(BubbleAnalysisTest, WithPhaseDurationsTakesTheStepsOwnPhases) {
  scheduler::CostModel costs;
  costs.uniform.optimizer = 9;
  const std::vector<trace::Span> phases = {
      {.rank = 0, .stage = 0, .microbatch = -1, .op = "ZERO_GRAD", .start = -5, .end = -3},
      {.rank = 1, .stage = 1, .microbatch = -1, .op = "OPTIMIZER", .start = 40, .end = 44},
      {.rank = 2, .stage = 0, .microbatch = -1, .op = "OPTIMIZER", .start = 40, .end = 50}};
  const scheduler::CostModel with = WithPhaseDurations(costs, phases, 2);
  ASSERT_EQ(with.stages.size(), 2u);
  EXPECT_EQ(with.stages[0].zero_grad, 2);
  EXPECT_EQ(with.stages[0].optimizer, 9);  // row 2 is replica 1: not replayed
  EXPECT_EQ(with.stages[1].optimizer, 4);
  EXPECT_EQ(with.stages[1].zero_grad, 0);
}

TEST(BubbleAnalysisTest, WithActionDurationsSkipsSpansThatAreNotMeasurements) {
  // A span that ends before it starts, or at infinity, kept its "duration": the simulator
  // then ran with a negative or infinite cost.
  trace::Timeline t;
  t.num_ranks = 1;
  t.spans = {{.rank = 0, .stage = 0, .microbatch = 0, .op = "F", .start = 0, .end = 2},
             {.rank = 0, .stage = 0, .microbatch = 1, .op = "F", .start = 5, .end = 3},
             {.rank = 0,
              .stage = 0,
              .microbatch = 2,
              .op = "F",
              .start = 6,
              .end = std::numeric_limits<double>::infinity()}};
  const scheduler::CostModel with = WithActionDurations(scheduler::CostModel{}, t, 1);
  ASSERT_EQ(with.actions.size(), 1u);
  EXPECT_EQ(with.actions.begin()->second, 2);
}

TEST(BubbleAnalysisTest, HandMadeTimelineHasTheKnownDecomposition) {
  Builder b = TwoStages();
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(b.tl, b.issue));
  ASSERT_EQ(a.rows.size(), 2u);
  EXPECT_EQ(a.makespan, 142);
  // Row 0 waits for B10 during [20,76): B10 overlaps 40 of it (a quarter is imbalance,
  // 10), then its transfer and hand-off [76,79); for B11 during [99,120) (overlap 21,
  // 5.25 imbalance), then [120,122).
  EXPECT_EQ(a.rows[0].dependency, 46 + 15.75);
  EXPECT_EQ(a.rows[0].imbalance, 10 + 5.25);
  EXPECT_EQ(a.rows[0].transfer, 3 + 2);
  EXPECT_EQ(a.rows[0].host, 0);
  EXPECT_EQ(a.rows[0].allreduce, 0);
  // Row 1: F00 running [0,10) (dependency), RECV_F [10,12) + hand-off [12,13) (transfer);
  // F11 issued late: [23,26) host; B11 waits for nothing the executor orders it after
  // (the last stage's B has no producer, and the compute stream does not wait for
  // SEND_B10), so [76,80) is the stream's own overhead (host); after its last compute,
  // row 0's B01 [120,142) (dependency; stage 0 is faster than the reference, so no
  // imbalance).
  EXPECT_EQ(a.rows[1].dependency, 10 + 22);
  EXPECT_EQ(a.rows[1].transfer, 3);
  EXPECT_EQ(a.rows[1].host, 3 + 4);
  EXPECT_EQ(a.rows[1].imbalance, 0);
  trace::BubbleStats stats = trace::ComputeBubbleStats(b.tl);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(a.idle[r], stats.rows[r].idle);
    EXPECT_EQ(a.rows[r].total(), a.idle[r]) << "row " << r;
  }
  EXPECT_EQ(a.total.total(), 82 + 42);
  // Hand-offs of boundary 0 where the consumer waited on the producer, row by row: B00
  // 79-76, B01 122-120, F10 13-10 (F11 did not wait: its producer ended before F10 did).
  ASSERT_EQ(a.handoff_samples.size(), 1u);
  EXPECT_EQ(a.handoff_samples[0], (std::vector<double>{3, 2, 3}));
  EXPECT_EQ(MedianHandoff({&a}), (std::vector<double>{3}));
  // The same, keyed by the consumer (F11 waited on its issue, not on its data).
  using scheduler::Op;
  EXPECT_EQ(a.handoff_into, (std::map<std::tuple<int, Op, int>, double>{
                                {{0, Op::kB, 0}, 3}, {{0, Op::kB, 1}, 2}, {{1, Op::kF, 0}, 3}}));
  // Stream gaps: the actions that had everything when their row's previous action ended,
  // row by row: F01 10-10, B10 36-36, B11 80-76. Not F10 (its row's first), not F11
  // (issued late), not B00 or B01 (their data came after the previous action).
  EXPECT_EQ(a.gap_samples, (std::vector<double>{0, 0, 4}));
  EXPECT_EQ(a.gap_before, (std::map<std::tuple<int, Op, int>, double>{
                              {{0, Op::kF, 1}, 0}, {{1, Op::kB, 0}, 0}, {{1, Op::kB, 1}, 4}}));
  EXPECT_EQ(MedianGap({&a}), 0);
  EXPECT_EQ(MedianGap({}), -1);
}

// A consumer whose row was still busy when its producer finished, but whose data came
// later: no boundary sample (the producer was not the last blocker), but its own
// hand-off (8: F00 ends at 10, F10 starts at 18, the copy ended at 17).
TEST(BubbleAnalysisTest, AHandOffBehindABusyRowIsTheConsumersOwn) {
  Builder b(2);
  using trace::kComputeLane, trace::kRecvLane;
  b.Add(0, kComputeLane, "F", 0, 0, 0, 10);
  b.Add(1, kComputeLane, "W", 1, 5, 0, 15);
  b.Add(1, kRecvLane, "RECV_F", 1, 0, 10, 17);
  b.Add(1, kComputeLane, "F", 1, 0, 18, 28);
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(b.tl, b.issue));
  EXPECT_EQ(a.rows[1].transfer, 3);  // [15,17) the copy, [17,18) the hand-off
  EXPECT_TRUE(a.handoff_samples[0].empty());
  using scheduler::Op;
  EXPECT_EQ(a.handoff_into, (std::map<std::tuple<int, Op, int>, double>{{{1, Op::kF, 0}, 8}}));
}

TEST(BubbleAnalysisTest, BalancedReferenceResplitsTheDependencyWait) {
  Builder b = TwoStages();
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(b.tl, b.issue));
  // A balanced pipeline would idle 10 per row: the rest of each row's wait is imbalance.
  SplitByBalancedReference(a, {10, 40});
  EXPECT_EQ(a.rows[0].dependency, 10);
  EXPECT_EQ(a.rows[0].imbalance, 61.75 + 15.25 - 10);
  EXPECT_EQ(a.rows[1].dependency, 32);  // waited less than the reference: all bubble
  EXPECT_EQ(a.rows[1].imbalance, 0);
  EXPECT_EQ(a.rows[0].transfer, 5);  // untouched
  for (int r = 0; r < 2; ++r) EXPECT_EQ(a.rows[r].total(), a.idle[r]);
  EXPECT_EQ(a.total.total(), 82 + 42);
}

TEST(BubbleAnalysisTest, BalancedIdleIsThePipelineBubbleOfTheMeanCosts) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  scheduler::CostModel measured;
  measured.stages = {{.f = 1, .b = 2}, {.f = 3, .b = 6}};  // mean: F = 2, B = 4
  measured.comm_uniform = 5;                               // ignored
  PS_ASSERT_OK_AND_ASSIGN(std::vector<double> idle, BalancedIdle(schedule, measured));
  // (M + P - 1)(F + B) = 5 x 6 = 30 per rank, of which M (F + B) = 24 busy.
  EXPECT_EQ(idle, (std::vector<double>{6, 6}));
}

TEST(BubbleAnalysisTest, WithoutIssueTimesTheHostShareBecomesHandOff) {
  Builder b = TwoStages();
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(b.tl, {}));
  // F11's gap [23,26) and B11's [76,80) had no blocker left: stream overhead, still (d).
  EXPECT_EQ(a.rows[1].host, 3 + 4);
  EXPECT_EQ(a.rows[1].total(), a.idle[1]);
}

TEST(BubbleAnalysisTest, AllReduceAtTheEndOfTheStep) {
  // One row per stage: row 0 finishes at 44 and its all-reduce runs until 50; row 1
  // computes until 40, then its all-reduce runs until 60.
  Builder b(2);
  b.Add(0, trace::kComputeLane, "F", 0, 0, 0, 10);
  b.Add(1, trace::kComputeLane, "F", 1, 0, 12, 22);
  b.Add(1, trace::kComputeLane, "B", 1, 0, 22, 40);
  b.Add(0, trace::kComputeLane, "B", 0, 0, 40, 44);
  b.Add(0, trace::kCommLane, "ALLREDUCE", 0, -1, 44, 50);
  b.Add(1, trace::kCommLane, "ALLREDUCE", 1, -1, 40, 60);
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(b.tl, b.issue));
  // Row 0: [10,40) waits for B10 (no transfer spans: hand-off 0); trailing [44,50) its
  // own all-reduce, [50,60) row 1's all-reduce.
  EXPECT_DOUBLE_EQ(a.rows[0].dependency + a.rows[0].imbalance, 30);
  EXPECT_EQ(a.rows[0].allreduce, 16);
  // Row 1: leading [0,10) waits for F00, [10,12) hand-off; trailing [40,60) own
  // all-reduce.
  EXPECT_EQ(a.rows[1].dependency, 10);
  EXPECT_EQ(a.rows[1].transfer, 2);
  EXPECT_EQ(a.rows[1].allreduce, 20);
  for (int r = 0; r < 2; ++r) EXPECT_DOUBLE_EQ(a.rows[r].total(), a.idle[r]);
}

TEST(BubbleAnalysisTest, RejectsOverlapsAndMismatchedIssueTimes) {
  Builder b(1);
  b.Add(0, trace::kComputeLane, "F", 0, 0, 0, 10);
  b.Add(0, trace::kComputeLane, "B", 0, 0, 5, 15);
  EXPECT_EQ(AnalyzeIdle(b.tl, b.issue).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(AnalyzeIdle(b.tl, {1.0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BubbleAnalysisTest, WithHandoffLatencyReplacesMeasuredBoundaries) {
  scheduler::CostModel costs;
  costs.comm_uniform = 1;
  costs.comm = {1, 1, 1};
  scheduler::CostModel out = WithHandoffLatency(costs, {5, -1, 7});
  EXPECT_EQ(out.comm, (std::vector<double>{5, 1, 7}));
}

// `measured` (two rows) replayed from `costs` with its own action durations, hand-offs
// and stream gaps (WithActionDurations, WithHandoffs) is reproduced exactly.
void ExpectReplayReproduces(const scheduler::Schedule& schedule, const scheduler::CostModel& costs,
                            const scheduler::SimResult& measured, const IdleAnalysis& a) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::SimResult replayed,
      scheduler::Simulate(schedule,
                          WithHandoffs(WithActionDurations(costs, measured.timeline, 2), a)));
  EXPECT_DOUBLE_EQ(replayed.makespan, measured.makespan);
  EXPECT_DOUBLE_EQ(replayed.bubble_fraction, measured.bubble_fraction);
}

// A "measured" step made by the simulator (1F1B, P=2, `truth`) and its analysis.
struct SimulatedStep {
  scheduler::Schedule schedule;
  scheduler::SimResult measured;
  IdleAnalysis analysis;
};
absl::StatusOr<SimulatedStep> Simulate1F1B(int microbatches, const scheduler::CostModel& truth) {
  SimulatedStep step;
  PS_ASSIGN_OR_RETURN(
      step.schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = microbatches}));
  PS_ASSIGN_OR_RETURN(step.measured, scheduler::Simulate(step.schedule, truth));
  PS_ASSIGN_OR_RETURN(step.analysis, AnalyzeIdle(step.measured.timeline, {}, 2));
  return step;
}

// Two stages of F = 10, B = 20, transfers of 1.
scheduler::CostModel EvenStages() {
  scheduler::CostModel costs;
  costs.stages = {{.f = 10, .b = 20}, {.f = 10, .b = 20}};
  costs.comm_uniform = 1;
  return costs;
}

// Replaying a step action by action: a timeline the simulator made with uneven
// per-action costs, fed back through WithActionDurations onto costs that know nothing
// of them, is reproduced span for span; the stage medians alone do not reproduce it.
TEST(BubbleAnalysisTest, WithActionDurationsReplaysAStepSpanForSpan) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 6}));
  scheduler::CostModel truth;
  truth.stages = {{.f = 10, .b = 20}, {.f = 10, .b = 20}};
  truth.comm_uniform = 1;
  truth.actions[{1, scheduler::Op::kF, 0}] = 25;  // one slow forward
  truth.actions[{0, scheduler::Op::kB, 4}] = 31;  // one slow backward
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult measured, scheduler::Simulate(schedule, truth));
  scheduler::CostModel medians = truth;
  medians.actions.clear();
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult plain, scheduler::Simulate(schedule, medians));
  EXPECT_LT(plain.makespan, measured.makespan);
  scheduler::CostModel replay = WithActionDurations(medians, measured.timeline, 2);
  EXPECT_EQ(replay.actions.size(), 24u);  // 6 F + 6 B on each of 2 stages
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult replayed, scheduler::Simulate(schedule, replay));
  EXPECT_DOUBLE_EQ(replayed.makespan, measured.makespan);
  EXPECT_DOUBLE_EQ(replayed.bubble_fraction, measured.bubble_fraction);
  // Rows beyond num_rows (other replicas) are not taken.
  EXPECT_TRUE(WithActionDurations(medians, measured.timeline, 0).actions.empty());
}

// Replaying hand-offs: a step in which two dependencies took longer than their
// boundary's time (the first forward's input 7 instead of 1, the last backward's 4) is
// reproduced once each consumer gets its measured hand-off (WithHandoffs).
TEST(BubbleAnalysisTest, WithHandoffsReplaysSlowHandOffs) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 6}));
  using scheduler::Op;
  scheduler::CostModel truth;
  truth.stages = {{.f = 10, .b = 20}, {.f = 10, .b = 20}};
  truth.comm_uniform = 1;
  truth.transfers[{1, Op::kF, 0}] = 7;
  truth.transfers[{0, Op::kB, 5}] = 4;
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult measured, scheduler::Simulate(schedule, truth));
  scheduler::CostModel medians = truth;
  medians.transfers.clear();
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult plain, scheduler::Simulate(schedule, medians));
  EXPECT_DOUBLE_EQ(plain.makespan, measured.makespan - 6 - 3);
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(measured.timeline, {}, 2));
  EXPECT_EQ(a.handoff_into.at({1, Op::kF, 0}), 7);
  EXPECT_EQ(a.handoff_into.at({0, Op::kB, 5}), 4);
  ExpectReplayReproduces(schedule, medians, measured, a);
}

// Replaying stream gaps: a step whose ranks paid 2 between actions, and 9 once before
// the last stage's third backward (on the critical path), gives those gaps back (the
// median 2 for the stream, 9 for that one action); the simulator then reproduces it
// with the gaps, not without, nor with the median alone.
TEST(BubbleAnalysisTest, StreamGapsAreMeasuredAndReplayed) {
  using scheduler::Op;
  scheduler::CostModel truth = EvenStages();
  truth.action_gap = 2;
  truth.gaps[{1, Op::kB, 2}] = 9;
  PS_ASSERT_OK_AND_ASSIGN(const SimulatedStep step, Simulate1F1B(6, truth));
  const auto& [schedule, measured, a] = step;
  EXPECT_EQ(a.gap_before.at({1, Op::kB, 2}), 9);
  EXPECT_EQ(MedianGap({&a}), 2);
  for (double gap : a.gap_samples) EXPECT_TRUE(gap == 2 || gap == 9) << gap;
  // B00 waited for its data (1B0's end + 1): no gap sample.
  EXPECT_EQ(a.gap_before.count({0, Op::kB, 0}), 0u);
  scheduler::CostModel medians = truth;
  medians.action_gap = 0;
  medians.gaps.clear();
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult plain, scheduler::Simulate(schedule, medians));
  EXPECT_LT(plain.makespan, measured.makespan);
  medians.action_gap = MedianGap({&a});
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult median_gap, scheduler::Simulate(schedule, medians));
  EXPECT_LT(median_gap.makespan, measured.makespan);  // the one gap of 9 is not in it
  ExpectReplayReproduces(schedule, medians, measured, a);
}

// An input that arrived while its consumer's row was busy took at most until the consumer
// started: with a boundary median of 50 (as if measured in slower steps), the replay
// still starts no action later than it started, and reproduces the step.
TEST(BubbleAnalysisTest, AnInputsReplayedHandOffIsAtMostItsWait) {
  const scheduler::CostModel truth = EvenStages();
  PS_ASSERT_OK_AND_ASSIGN(const SimulatedStep step, Simulate1F1B(6, truth));
  const auto& [schedule, measured, a] = step;
  EXPECT_FALSE(a.handoff_at_most.empty());
  for (const auto& [key, bound] : a.handoff_at_most) {
    EXPECT_EQ(a.handoff_into.count(key), 0u);
    EXPECT_GE(bound, 1);  // at least the transfer, which came before the row was free
  }
  scheduler::CostModel slow = truth;
  slow.comm_uniform = 50;
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult plain, scheduler::Simulate(schedule, slow));
  EXPECT_GT(plain.makespan, measured.makespan);
  ExpectReplayReproduces(schedule, slow, measured, a);
}

// zb-v's bottom on one row: B10's gradient copy to stage 0 on the same row runs on the
// compute stream behind it, in the gap before W10 (3 = the copy's 2 + 1). That gap is
// W10's to replay, but not a sample of the stream's own overhead; B10's and B00's (1
// each) are. F10 waited for its local receive: at most 1.
TEST(BubbleAnalysisTest, ACopyWithinTheRowIsNotAStreamGapSample) {
  Builder b(1);
  using trace::kComputeLane, trace::kRecvLane, trace::kSendLane;
  b.Add(0, kComputeLane, "F", 0, 0, 0, 10);
  b.Add(0, kRecvLane, "RECV_F", 1, 0, 10, 11);
  b.Add(0, kComputeLane, "F", 1, 0, 11, 21);
  b.Add(0, kComputeLane, "B", 1, 0, 22, 32);
  b.Add(0, kSendLane, "SEND_B", 1, 0, 32, 34);
  b.Add(0, kComputeLane, "W", 1, 0, 35, 45);
  b.Add(0, kComputeLane, "B", 0, 0, 46, 56);
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(b.tl, b.issue));
  using scheduler::Op;
  EXPECT_EQ(a.gap_samples, (std::vector<double>{1, 1}));
  EXPECT_EQ(a.gap_before, (std::map<std::tuple<int, Op, int>, double>{
                              {{1, Op::kB, 0}, 1}, {{1, Op::kW, 0}, 3}, {{0, Op::kB, 0}, 1}}));
  EXPECT_EQ(a.gap_at_most, (std::map<std::tuple<int, Op, int>, double>{{{1, Op::kF, 0}, 1}}));
}

// An action whose data came after its row's previous action ended had a stream gap of at
// most its wait: stage 0's slow forwards (30) leave B00 waiting 1 for its gradient
// (1B0 ends at 62.5, + 0.5 transfer, after 0F1 ended at 62), and B00 paid no gap of its
// own, so the replay must not give it the median gap of 2 (it would start at 64, not
// 63, and every later action of rank 0, the slower, with it).
TEST(BubbleAnalysisTest, AWaitingActionsGapIsAtMostItsWait) {
  using scheduler::Op;
  scheduler::CostModel truth = EvenStages();
  truth.stages[0].f = 30;
  truth.comm_uniform = 0.5;
  truth.action_gap = 2;
  truth.gaps[{0, Op::kB, 0}] = 0;
  PS_ASSERT_OK_AND_ASSIGN(const SimulatedStep step, Simulate1F1B(4, truth));
  const auto& [schedule, measured, a] = step;
  EXPECT_EQ(a.gap_before.count({0, Op::kB, 0}), 0u);
  EXPECT_EQ(a.gap_at_most.at({0, Op::kB, 0}), 1);
  EXPECT_EQ(MedianGap({&a}), 2);
  scheduler::CostModel medians = truth;
  medians.gaps.clear();
  ExpectReplayReproduces(schedule, medians, measured, a);
}

// The spread simulation is the mean of the simulator over the measured durations: with
// one duration per (stage, op) it is the plain simulation; with stage 1's two forwards
// measured at 10 and 30 (stage 0's take 20), it approaches the exact mean over the four
// equally likely ways of drawing them, enumerated here through the simulator itself:
// 37.0%, above the 34.4% of both at their median 20 (a slow first forward delays the
// second, a fast one cannot make it start before stage 0 delivers).
TEST(BubbleAnalysisTest, SpreadBubbleIsTheMeanOverTheMeasuredDurations) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("gpipe", {.num_ranks = 2, .num_microbatches = 2}));
  using scheduler::Op;
  scheduler::CostModel costs;
  costs.stages = {{.f = 20, .b = 20}, {.f = 20, .b = 20}};
  costs.comm_uniform = 1;
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult even, scheduler::Simulate(schedule, costs));
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis even_idle, AnalyzeIdle(even.timeline, {}, 2));
  PS_ASSERT_OK_AND_ASSIGN(double same,
                          SpreadBubble(schedule, costs, even.timeline, 2, even_idle, 50, 1));
  EXPECT_DOUBLE_EQ(same, even.bubble_fraction);

  scheduler::CostModel truth = costs;
  truth.actions[{1, Op::kF, 0}] = 10;
  truth.actions[{1, Op::kF, 1}] = 30;
  PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult step, scheduler::Simulate(schedule, truth));
  PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis idle, AnalyzeIdle(step.timeline, {}, 2));
  double exact = 0;
  for (double f0 : {10.0, 30.0}) {
    for (double f1 : {10.0, 30.0}) {
      scheduler::CostModel c = costs;
      c.actions[{1, Op::kF, 0}] = f0;
      c.actions[{1, Op::kF, 1}] = f1;
      PS_ASSERT_OK_AND_ASSIGN(scheduler::SimResult r, scheduler::Simulate(schedule, c));
      exact += r.bubble_fraction / 4;
    }
  }
  PS_ASSERT_OK_AND_ASSIGN(double spread,
                          SpreadBubble(schedule, costs, step.timeline, 2, idle, 4000, 7));
  EXPECT_NEAR(spread, exact, 0.003);
  // Not the median-fed answer (both forwards at the median 20).
  EXPECT_NEAR(exact, 0.3699, 1e-4);
  EXPECT_NEAR(even.bubble_fraction, 0.3443, 1e-4);
  // Deterministic for a seed.
  PS_ASSERT_OK_AND_ASSIGN(double again,
                          SpreadBubble(schedule, costs, step.timeline, 2, idle, 4000, 7));
  EXPECT_EQ(again, spread);
  EXPECT_THAT(SpreadBubble(schedule, costs, step.timeline, 2, idle, 0, 7),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("draws >= 1")));
}

TrainerConfig Tiny(const std::string& schedule, int p, int m) {
  TrainerConfig config;
  config.schedule = schedule;
  config.stages = p;
  config.microbatches = m;
  config.microbatch_size = 2;
  config.model = {.d_in = 6, .d_hidden = 8, .num_classes = 4, .num_layers = 7};
  config.backend = "host";
  config.strict = true;
  return config;
}

// Real runs: the categories explain the measured idle time (to rounding), issue times
// precede their spans, and every cross-rank wait yields a hand-off sample.
TEST(BubbleAnalysisTest, RealRunsAddUpToTheMeasuredIdleTime) {
  for (const auto& [schedule, p, d] : std::vector<std::tuple<std::string, int, int>>{
           {"1f1b", 2, 1}, {"gpipe", 3, 1}, {"zb-v", 2, 1}, {"interleaved-1f1b", 2, 2}}) {
    TrainerConfig config = Tiny(schedule, p, 4);
    config.replicas = d;
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
    for (int step = 0; step < 2; ++step) {
      PS_ASSERT_OK_AND_ASSIGN(StepResult r, trainer->Step());
      ASSERT_EQ(r.issue_micros.size(), r.timeline.spans.size());
      for (std::size_t i = 0; i < r.issue_micros.size(); ++i) {
        // The clocks agree to a microsecond; the margin is for preemption between the
        // calibration's two clock reads on a loaded machine.
        EXPECT_LE(r.issue_micros[i], r.timeline.spans[i].start + 100) << schedule;
      }
      PS_ASSERT_OK_AND_ASSIGN(IdleAnalysis a, AnalyzeIdle(r.timeline, r.issue_micros, p));
      trace::BubbleStats stats = trace::ComputeBubbleStats(r.timeline, p);
      ASSERT_EQ(a.rows.size(), static_cast<std::size_t>(p));
      for (int row = 0; row < p; ++row) {
        EXPECT_NEAR(a.idle[row], stats.rows[row].idle, 1e-6);
        EXPECT_NEAR(a.rows[row].total(), a.idle[row], 1e-6 * std::max(1.0, a.idle[row]))
            << schedule << " row " << row;
        for (double part : {a.rows[row].dependency, a.rows[row].transfer, a.rows[row].allreduce,
                            a.rows[row].host, a.rows[row].imbalance}) {
          EXPECT_GE(part, 0) << schedule;
        }
      }
      if (d == 1) {
        EXPECT_EQ(a.total.allreduce, 0) << schedule;
      }
    }
  }
}

TEST(SlowStageWorkTest, StretchesEachActionOnTheStream) {
  PS_ASSERT_OK_AND_ASSIGN(
      auto backend, runtime::CreateBackend({.kind = runtime::BackendKind::kHost, .strict = true}));
  runtime::Device& device = backend->device(0);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, device.CreateStream("s"));
  PS_ASSERT_OK_AND_ASSIGN(auto start, device.CreateEvent(true, "start"));
  PS_ASSERT_OK_AND_ASSIGN(auto end, device.CreateEvent(true, "end"));
  PS_ASSERT_OK_AND_ASSIGN(auto slow,
                          SlowStageWork::Create(std::make_unique<SleepyWork>(2000), 2.5));
  PS_ASSERT_OK(start->Record(*stream));
  PS_ASSERT_OK(slow->Forward({}, *stream));
  PS_ASSERT_OK(end->Record(*stream));
  PS_ASSERT_OK(stream->Synchronize());
  PS_ASSERT_OK_AND_ASSIGN(double ms, end->ElapsedMillis(*start));
  EXPECT_GE(ms, 2.5 * 2.0);  // the inner 2 ms, then 1.5 x what it took
  EXPECT_EQ(SlowStageWork::Create(std::make_unique<SleepyWork>(1), 0.5).status().code(),
            absl::StatusCode::kInvalidArgument);
  PS_ASSERT_OK(stream->Synchronize());
}

TEST(SlowStageWorkTest, TrainerSlowsOneRankAndStillTrains) {
  TrainerConfig config = Tiny("1f1b", 2, 2);
  config.slow_rank = 2;
  EXPECT_EQ(Trainer::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.slow_rank = 1;
  config.slow_factor = 3;
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
  PS_ASSERT_OK_AND_ASSIGN(StepResult r, trainer->Step());
  EXPECT_TRUE(std::isfinite(r.loss));
  PS_ASSERT_OK_AND_ASSIGN(auto params, trainer->ExportParameters());  // unwraps the MLP
  EXPECT_FALSE(params.empty());
}

TEST(SlowStageWorkTest, CudaIsRefusedWithTheReason) {
  // Refused before any GPU is looked for: the same answer with or without one.
  TrainerConfig config = Tiny("1f1b", 2, 2);
  config.slow_rank = 1;
  config.slow_factor = 2;
  config.backend = "cuda";
  EXPECT_THAT(Trainer::Create(config).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("needs the host backend"), HasSubstr("--backend=host"))));
}

}  // namespace
}  // namespace pipesched::stages
