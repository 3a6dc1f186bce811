// Simulate(): tiny hand-built schedules whose every start time is worked out by hand in
// the comments, so a reader can check the simulator's rules one by one.
#include "pipesched/scheduler/simulator.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hand_schedule.h"
#include "pipesched/scheduler/registry.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::scheduler::testing::HandSchedule;
using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

// The span of (rank, lane, op, stage, mb); fails the test when absent or repeated.
const trace::Span* FindSpan(const trace::Timeline& timeline, int rank, int lane,
                            const std::string& op, int stage, int mb) {
  const trace::Span* found = nullptr;
  for (const trace::Span& span : timeline.spans) {
    if (span.rank == rank && span.lane == lane && span.op == op && span.stage == stage &&
        span.microbatch == mb) {
      EXPECT_EQ(found, nullptr) << "two spans for " << stage << op << mb;
      found = &span;
    }
  }
  EXPECT_NE(found, nullptr) << "no span for " << stage << op << mb << " on rank " << rank
                            << " lane " << lane;
  return found;
}

void ExpectSpan(const trace::Timeline& timeline, int rank, int lane, const std::string& op,
                int stage, int mb, double start, double end) {
  const trace::Span* span = FindSpan(timeline, rank, lane, op, stage, mb);
  if (span == nullptr) return;
  EXPECT_DOUBLE_EQ(span->start, start) << stage << op << mb;
  EXPECT_DOUBLE_EQ(span->end, end) << stage << op << mb;
}

void ExpectCompute(const trace::Timeline& timeline, int rank, const std::string& op, int stage,
                   int mb, double start, double end) {
  ExpectSpan(timeline, rank, trace::kComputeLane, op, stage, mb, start, end);
}

int CountLane(const trace::Timeline& timeline, int lane) {
  int n = 0;
  for (const trace::Span& span : timeline.spans) n += span.lane == lane;
  return n;
}

bool HasFlow(const trace::Timeline& timeline, const trace::Span* from, const trace::Span* to) {
  for (const trace::Flow& flow : timeline.flows) {
    if (&timeline.spans[flow.from] == from && &timeline.spans[flow.to] == to) return true;
  }
  return false;
}

// 1F1B, P=2, M=2, F=1, B=2:
//   rank 0 | 0F0 0F1 .   .   0B0 0B0 .   0B1 0B1
//   rank 1 | .   1F0 1B0 1B0 1F1 1B1 1B1
//   t        0   1   2   3   4   5   6   7   8   9
TEST(SimulatorTest, HandWritten1F1B) {
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"});
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, CostModel{}));
  const trace::Timeline& t = r.timeline;
  ExpectCompute(t, 0, "F", 0, 0, 0, 1);
  ExpectCompute(t, 0, "F", 0, 1, 1, 2);
  ExpectCompute(t, 1, "F", 1, 0, 1, 2);
  ExpectCompute(t, 1, "B", 1, 0, 2, 4);
  ExpectCompute(t, 1, "F", 1, 1, 4, 5);  // rank 1 is busy with 1B0 until 4
  ExpectCompute(t, 1, "B", 1, 1, 5, 7);
  ExpectCompute(t, 0, "B", 0, 0, 4, 6);  // waits for 1B0
  ExpectCompute(t, 0, "B", 0, 1, 7, 9);  // waits for 1B1
  EXPECT_DOUBLE_EQ(r.makespan, 9);       // (M+P-1)(F+B)
  EXPECT_DOUBLE_EQ(t.Makespan(), 9);
  ASSERT_EQ(r.ranks.size(), 2u);
  for (const RankStats& rank : r.ranks) {
    EXPECT_DOUBLE_EQ(rank.busy, 6);
    EXPECT_DOUBLE_EQ(rank.idle, 3);
  }
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 1.0 / 3);  // (P-1)/(M+P-1)
  EXPECT_DOUBLE_EQ(r.bubble_ratio, 0.5);
  EXPECT_EQ(r.ranks[0].peak_live_microbatches, 2);
  EXPECT_EQ(r.ranks[1].peak_live_microbatches, 1);
  EXPECT_EQ(t.num_ranks, 2);
  EXPECT_EQ(t.name, "hand P=2 V=1 M=2 (simulated)");
  EXPECT_EQ(CountLane(t, trace::kSendLane), 0);  // no transfer time, nothing to draw
  EXPECT_EQ(t.flows.size(), 4u);                 // 0F0->1F0, 0F1->1F1, 1B0->0B0, 1B1->0B1
}

// P=2, M=1, comm 0.5 on boundary 0:
//   0F0 [0,1]; transfer [1,1.5]; 1F0 [1.5,2.5]; 1B0 [2.5,4.5]; transfer [4.5,5]; 0B0 [5,7]
TEST(SimulatorTest, TransferTimeDelaysCrossRankDependencies) {
  const Schedule s = HandSchedule(2, 1, 1, {"0F0 0B0", "1F0 1B0"});
  CostModel costs;
  costs.comm_uniform = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  const trace::Timeline& t = r.timeline;
  ExpectCompute(t, 0, "F", 0, 0, 0, 1);
  ExpectCompute(t, 1, "F", 1, 0, 1.5, 2.5);
  ExpectCompute(t, 1, "B", 1, 0, 2.5, 4.5);  // same-stage F -> B pays no transfer
  ExpectCompute(t, 0, "B", 0, 0, 5, 7);
  EXPECT_DOUBLE_EQ(r.makespan, 7);
  ExpectSpan(t, 0, trace::kSendLane, "SEND_F", 0, 0, 1, 1.5);
  ExpectSpan(t, 1, trace::kSendLane, "SEND_B", 1, 0, 4.5, 5);
  EXPECT_EQ(CountLane(t, trace::kSendLane), 2);
  ASSERT_EQ(t.flows.size(), 2u);
  EXPECT_TRUE(HasFlow(t, FindSpan(t, 0, 0, "F", 0, 0), FindSpan(t, 1, 0, "F", 1, 0)));
  EXPECT_TRUE(HasFlow(t, FindSpan(t, 1, 0, "B", 1, 0), FindSpan(t, 0, 0, "B", 0, 0)));
  EXPECT_DOUBLE_EQ(r.ranks[0].busy, 3);
  EXPECT_DOUBLE_EQ(r.ranks[0].idle, 4);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 8.0 / 14);
}

// The same with a stream gap of 0.5 between a rank's actions: it follows every action
// but a rank's first, and overlaps a transfer instead of adding to it:
//   0F0 [0,1]; 1F0 [1.5,2.5] (its rank's first); 1B0 [3,5]; 0B0 [5.5,7.5] (its rank was
//   free at 1 + 0.5, its input at 5 + 0.5)
TEST(SimulatorTest, ActionGapFollowsEveryActionButARanksFirst) {
  const Schedule s = HandSchedule(2, 1, 1, {"0F0 0B0", "1F0 1B0"});
  CostModel costs;
  costs.comm_uniform = 0.5;
  costs.action_gap = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  ExpectCompute(r.timeline, 0, "F", 0, 0, 0, 1);
  ExpectCompute(r.timeline, 1, "F", 1, 0, 1.5, 2.5);
  ExpectCompute(r.timeline, 1, "B", 1, 0, 3, 5);
  ExpectCompute(r.timeline, 0, "B", 0, 0, 5.5, 7.5);
  EXPECT_DOUBLE_EQ(r.makespan, 7.5);
  EXPECT_DOUBLE_EQ(r.ranks[1].idle, 7.5 - 3);  // the gap is idle time
  // A per-action gap overrides it: none before 1B0.
  costs.gaps[{1, Op::kB, 0}] = 0;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult o, Simulate(s, costs));
  ExpectCompute(o.timeline, 1, "B", 1, 0, 2.5, 4.5);
  EXPECT_DOUBLE_EQ(o.makespan, 7);
  // One rank with two chunks: the gap also follows a switch of chunk (0F0 [0,1] 1F0
  // [1.5,2.5] 1B0 [3,5] 0B0 [5.5,7.5]).
  CostModel one_rank;
  one_rank.action_gap = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult v,
                          Simulate(HandSchedule(1, 2, 1, {"0F0 1F0 1B0 0B0"}), one_rank));
  ExpectCompute(v.timeline, 0, "F", 1, 0, 1.5, 2.5);
  ExpectCompute(v.timeline, 0, "B", 0, 0, 5.5, 7.5);
  // A gap that is not a time is an error naming it, not a NaN timeline or overlapping
  // actions.
  costs.gaps[{1, Op::kB, 0}] = -1;
  EXPECT_THAT(Simulate(s, costs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the gap before 1B0 is -1, not a valid time; give a number in "
                                 "[0, 1e+15]")));
  costs.gaps.clear();
  costs.action_gap = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(Simulate(s, costs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the action gap is nan, not a valid time; give a number in "
                                 "[0, 1e+15]")));
}

// P=3, M=1, boundary 0 costs 0.5 and boundary 1 costs 2:
//   0F0 [0,1] 1F0 [1.5,2.5] 2F0 [4.5,5.5] 2B0 [5.5,7.5] 1B0 [9.5,11.5] 0B0 [12,14]
TEST(SimulatorTest, PerBoundaryTransferTime) {
  const Schedule s = HandSchedule(3, 1, 1, {"0F0 0B0", "1F0 1B0", "2F0 2B0"});
  CostModel costs;
  costs.comm = {0.5, 2};
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  ExpectCompute(r.timeline, 1, "F", 1, 0, 1.5, 2.5);
  ExpectCompute(r.timeline, 2, "F", 2, 0, 4.5, 5.5);
  ExpectCompute(r.timeline, 1, "B", 1, 0, 9.5, 11.5);
  ExpectCompute(r.timeline, 0, "B", 0, 0, 12, 14);
  ExpectSpan(r.timeline, 1, trace::kSendLane, "SEND_F", 1, 0, 2.5, 4.5);
  EXPECT_DOUBLE_EQ(r.makespan, 14);
}

// One dependency's own transfer time (CostModel::transfers) overrides its boundary's for
// that consumer only: the same P=3 pipeline with 2F0's input taking 4 instead of 2.
//   0F0 [0,1] 1F0 [1.5,2.5] 2F0 [6.5,7.5] 2B0 [7.5,9.5] 1B0 [11.5,13.5] 0B0 [14,16]
TEST(SimulatorTest, PerActionTransferTimeOverridesItsBoundary) {
  const Schedule s = HandSchedule(3, 1, 1, {"0F0 0B0", "1F0 1B0", "2F0 2B0"});
  CostModel costs;
  costs.comm = {0.5, 2};
  costs.transfers[{2, Op::kF, 0}] = 4;
  EXPECT_EQ(costs.TransferInto(Action{.stage = 2, .microbatch = 0, .op = Op::kF}, 1), 4);
  EXPECT_EQ(costs.TransferInto(Action{.stage = 1, .microbatch = 0, .op = Op::kB}, 1), 2);
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  ExpectCompute(r.timeline, 2, "F", 2, 0, 6.5, 7.5);
  ExpectCompute(r.timeline, 1, "B", 1, 0, 11.5, 13.5);  // B's input keeps boundary 1's 2
  ExpectCompute(r.timeline, 0, "B", 0, 0, 14, 16);
  ExpectSpan(r.timeline, 1, trace::kSendLane, "SEND_F", 1, 0, 2.5, 6.5);
  EXPECT_DOUBLE_EQ(r.makespan, 16);
}

// Per-stage costs: stage 1's F takes 3 and its B 1.
//   0F0 [0,1] 0F1 [1,2] 1F0 [1,4] 1B0 [4,5] 1F1 [5,8] 1B1 [8,9] 0B0 [5,7] 0B1 [9,11]
TEST(SimulatorTest, PerStageCosts) {
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"});
  CostModel costs;
  costs.stages = {StageCosts{}, StageCosts{.f = 3, .b = 1}};
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  ExpectCompute(r.timeline, 1, "F", 1, 1, 5, 8);
  ExpectCompute(r.timeline, 0, "B", 0, 0, 5, 7);
  ExpectCompute(r.timeline, 0, "B", 0, 1, 9, 11);
  EXPECT_DOUBLE_EQ(r.makespan, 11);
  EXPECT_DOUBLE_EQ(r.ranks[1].busy, 8);
}

// P=1, V=2, all-reduce 5 per stage, on the comm lane:
//   compute | 0F0 [0,1] 1F0 [1,2] 1B0 [2,4] 0B0 [4,6]
//   comm    | 1ALLREDUCE [4,9] 0ALLREDUCE [9,14] (queued behind 1ALLREDUCE)
TEST(SimulatorTest, AllReduceRunsOnTheCommLaneWithoutBlockingCompute) {
  const Schedule s = HandSchedule(1, 2, 1, {"0F0 1F0 1B0 1ALLREDUCE 0B0 0ALLREDUCE"});
  CostModel costs;
  costs.uniform.allreduce = 5;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  ExpectCompute(r.timeline, 0, "B", 0, 0, 4, 6);
  ExpectSpan(r.timeline, 0, trace::kCommLane, "ALLREDUCE", 1, -1, 4, 9);
  ExpectSpan(r.timeline, 0, trace::kCommLane, "ALLREDUCE", 0, -1, 9, 14);
  EXPECT_DOUBLE_EQ(r.makespan, 14);
  EXPECT_DOUBLE_EQ(r.ranks[0].busy, 6);  // compute only: the all-reduce overlaps
  EXPECT_DOUBLE_EQ(r.ranks[0].idle, 8);
}

// The same schedule without its ALLREDUCE actions: an all-reduce time in the costs
// places them where the executor does for replicas (right after each stage's last
// backward), so `simulate --cost-allreduce=5` of a generated schedule models them too.
// A stage without an all-reduce time gets none.
TEST(SimulatorTest, AnAllReduceTimeReducesStagesThatHaveNoAllReduceAction) {
  const Schedule s = HandSchedule(1, 2, 1, {"0F0 1F0 1B0 0B0"});
  CostModel costs;
  costs.uniform.allreduce = 5;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  ExpectSpan(r.timeline, 0, trace::kCommLane, "ALLREDUCE", 1, -1, 4, 9);
  ExpectSpan(r.timeline, 0, trace::kCommLane, "ALLREDUCE", 0, -1, 9, 14);
  EXPECT_DOUBLE_EQ(r.makespan, 14);
  EXPECT_DOUBLE_EQ(r.ranks[0].idle, 8);

  costs.uniform.allreduce = 0;
  costs.stages = {StageCosts{.allreduce = 3}, StageCosts{}};
  PS_ASSERT_OK_AND_ASSIGN(const SimResult only0, Simulate(s, costs));
  int reductions = 0;
  for (const trace::Span& span : only0.timeline.spans) reductions += span.op == "ALLREDUCE";
  EXPECT_EQ(reductions, 1);
  ExpectSpan(only0.timeline, 0, trace::kCommLane, "ALLREDUCE", 0, -1, 6, 9);
  EXPECT_DOUBLE_EQ(only0.makespan, 9);

  // A generated schedule with an optimizer step: the step waits for each stage's
  // all-reduce (1F1B, P=2, M=2: rank 0's last B ends at 9, rank 1's at 7).
  PS_ASSERT_OK_AND_ASSIGN(const Schedule f1b, GenerateSchedule("1f1b", {2, 2, 1}));
  CostModel step;
  step.uniform.allreduce = 5;
  step.uniform.optimizer = 1;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult stepped, Simulate(f1b, step));
  EXPECT_DOUBLE_EQ(stepped.makespan, 14);
  EXPECT_DOUBLE_EQ(stepped.step_time, 15);
  // Without an all-reduce time, nothing is placed: the plain 1F1B step, 9 + 1.
  step.uniform.allreduce = 0;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult plain, Simulate(f1b, step));
  EXPECT_DOUBLE_EQ(plain.step_time, 10);
}

// P=2, M=1; rank 0 zeroes its gradients in 0.5, rank 1 in 3 (its F waits for its own
// zero-grad, not only for 0F0: the makespan grows from 6 to 7.5 and the bubble with it,
// as in the executor); optimizer steps of 1.5 after each rank's last action:
//   from the step's start: 0F0 [0.5,1.5] 1F0 [3,4] 1B0 [4,6] 0B0 [6,8]; optimizer
//   rank 1 [6,7.5], rank 0 [8,9.5] -> step 9.5
//   the timeline starts at the first action: 0F0 [0,1] 1F0 [2.5,3.5] 0B0 [5.5,7.5]
TEST(SimulatorTest, ZeroGradHoldsARanksFirstActionAndOptimizerStepsEndTheStep) {
  const Schedule s = HandSchedule(2, 1, 1, {"0F0 0B0", "1F0 1B0"});
  CostModel costs;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult plain, Simulate(s, costs));
  EXPECT_DOUBLE_EQ(plain.step_time, plain.makespan);
  EXPECT_DOUBLE_EQ(plain.makespan, 6);
  costs.stages = {StageCosts{.zero_grad = 0.5, .optimizer = 1.5},
                  StageCosts{.zero_grad = 3, .optimizer = 1.5}};
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, costs));
  ExpectCompute(r.timeline, 0, "F", 0, 0, 0, 1);
  ExpectCompute(r.timeline, 1, "F", 1, 0, 2.5, 3.5);
  ExpectCompute(r.timeline, 0, "B", 0, 0, 5.5, 7.5);
  EXPECT_DOUBLE_EQ(r.makespan, 7.5);
  EXPECT_DOUBLE_EQ(r.step_time, 9.5);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 9.0 / (2 * 7.5));  // 4.5 idle per rank
  // The phases, on the timeline's clock (from 0F0): rank 0's zero-grad [-0.5,0], rank
  // 1's [-0.5,2.5]; optimizer steps rank 1 [5.5,7], rank 0 [7.5,9].
  ASSERT_EQ(r.phases.size(), 4u);
  auto phase = [&r](int rank, const std::string& op) {
    for (const trace::Span& p : r.phases) {
      if (p.rank == rank && p.op == op) return std::make_pair(p.start, p.end);
    }
    return std::make_pair(-1e9, -1e9);
  };
  EXPECT_EQ(phase(0, "ZERO_GRAD"), std::make_pair(-0.5, 0.0));
  EXPECT_EQ(phase(1, "ZERO_GRAD"), std::make_pair(-0.5, 2.5));
  EXPECT_EQ(phase(1, "OPTIMIZER"), std::make_pair(5.5, 7.0));
  EXPECT_EQ(phase(0, "OPTIMIZER"), std::make_pair(7.5, 9.0));
  EXPECT_TRUE(plain.phases.empty());  // none without the costs
  // The stream's gap also comes before the optimizer step: 1B0 [4.25,6.25], 0B0
  // [6.25,8.25], rank 0's optimizer [8.5,10].
  costs.action_gap = 0.25;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult g, Simulate(s, costs));
  EXPECT_DOUBLE_EQ(g.step_time, 10);
  // Each optimizer step waits for its stage's all-reduce, in stage order (P=1, V=2,
  // all-reduces end at 9 (stage 1) and 14 (stage 0), compute at 6): stage 0 [14,15],
  // stage 1 [15,16].
  CostModel reduced;
  reduced.uniform.allreduce = 5;
  reduced.uniform.optimizer = 1;
  PS_ASSERT_OK_AND_ASSIGN(
      const SimResult a,
      Simulate(HandSchedule(1, 2, 1, {"0F0 1F0 1B0 1ALLREDUCE 0B0 0ALLREDUCE"}), reduced));
  EXPECT_DOUBLE_EQ(a.makespan, 14);
  EXPECT_DOUBLE_EQ(a.step_time, 16);
  // Stage 0's all-reduce holds stage 1's optimizer back even when stage 0's optimizer
  // step costs nothing: [14,15].
  reduced.stages = {StageCosts{.allreduce = 5, .optimizer = 0},
                    StageCosts{.allreduce = 5, .optimizer = 1}};
  PS_ASSERT_OK_AND_ASSIGN(
      const SimResult free0,
      Simulate(HandSchedule(1, 2, 1, {"0F0 1F0 1B0 1ALLREDUCE 0B0 0ALLREDUCE"}), reduced));
  EXPECT_DOUBLE_EQ(free0.step_time, 15);
  // A time that is not one is an error naming it, not a step that silently drops it.
  costs.stages[1].optimizer = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(Simulate(s, costs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 1's optimizer is nan, not a valid time; give a number "
                                 "in [0, 1e+15]")));
  costs.stages[1].optimizer = 1.5;
  costs.uniform.zero_grad = -1;
  EXPECT_THAT(Simulate(s, costs), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("the default zero_grad is -1")));
}

TEST(SimulatorTest, LoweredTransfersAreZeroTimeMarkers) {
  CostModel costs;
  costs.comm_uniform = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult plain,
                          Simulate(HandSchedule(2, 1, 1, {"0F0 0B0", "1F0 1B0"}), costs));
  PS_ASSERT_OK_AND_ASSIGN(
      const SimResult lowered,
      Simulate(HandSchedule(2, 1, 1, {"0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"}),
               costs));
  EXPECT_DOUBLE_EQ(lowered.makespan, plain.makespan);
  EXPECT_EQ(lowered.timeline.spans.size(), plain.timeline.spans.size());
  ExpectCompute(lowered.timeline, 0, "B", 0, 0, 5, 7);
}

TEST(SimulatorTest, PeakLiveActivationsCountUntilWWhenSplit) {
  CostModel costs;
  costs.uniform.activation_bytes = 100;
  // 0W0 comes after 0F2: three stashes live at once.
  PS_ASSERT_OK_AND_ASSIGN(
      SimResult r, Simulate(HandSchedule(1, 1, 3, {"0F0 0F1 0I0 0F2 0W0 0I1 0W1 0I2 0W2"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_microbatches, 3);
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 300);
  // 0W0 before 0F2: two.
  PS_ASSERT_OK_AND_ASSIGN(
      r, Simulate(HandSchedule(1, 1, 3, {"0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_microbatches, 2);
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 200);
}

TEST(SimulatorTest, PeakLiveBytesWeighStagesOfOneRank) {
  CostModel costs;
  costs.stages = {StageCosts{.activation_bytes = 100}, StageCosts{.activation_bytes = 10}};
  PS_ASSERT_OK_AND_ASSIGN(
      const SimResult r,
      Simulate(HandSchedule(1, 2, 2, {"0F0 1F0 1B0 0F1 1F1 1B1 0B1 0B0"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_microbatches, 3);  // 0F0, 0F1, 1F1
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 210);
}

// What a stage holds for the whole step is counted once on its rank, whatever the order:
// on zb-v's V, rank 0 holds stages 0 and 2P-1.
TEST(SimulatorTest, StaticBytesAddUpPerRank) {
  CostModel costs;
  costs.stages.resize(4);
  for (int s = 0; s < 4; ++s) costs.stages[s].static_bytes = std::int64_t{1} << (10 * s);
  PS_ASSERT_OK_AND_ASSIGN(Schedule zbv, GenerateSchedule("zb-v", {2, 4, 2}));
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(zbv, costs));
  EXPECT_EQ(r.ranks[0].static_bytes, 1 + (std::int64_t{1} << 30));  // stages 0 and 3
  EXPECT_EQ(r.ranks[1].static_bytes, (1 << 10) + (1 << 20));        // stages 1 and 2
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 0);                         // not activations
}

// A B or I holds its stage's workspace while it runs, on top of the stashes live then
// (its own included: it releases only when it ends); F and W hold none.
TEST(SimulatorTest, WorkspaceOfBAndICountsOnTopOfTheLiveStashes) {
  CostModel costs;
  costs.uniform.activation_bytes = 100;
  costs.uniform.workspace_bytes = 30;
  // Three stashes live at 0I0: 300 + 30.
  PS_ASSERT_OK_AND_ASSIGN(
      SimResult r, Simulate(HandSchedule(1, 1, 3, {"0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 330);
  EXPECT_EQ(r.ranks[0].peak_live_microbatches, 3);
  // At most two live at any B: 230; the peak of the stashes alone is 200.
  PS_ASSERT_OK_AND_ASSIGN(r, Simulate(HandSchedule(1, 1, 3, {"0F0 0F1 0B0 0F2 0B1 0B2"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 230);
  // A workspace larger than the stashes: the peak is the first B's, two stashes + 1000.
  costs.uniform.workspace_bytes = 1000;
  PS_ASSERT_OK_AND_ASSIGN(r, Simulate(HandSchedule(1, 1, 2, {"0F0 0F1 0B0 0B1"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 1200);
  // Per stage: stage 1's workspace counts during its own backward only.
  costs.uniform.workspace_bytes = 0;
  costs.stages = {StageCosts{.activation_bytes = 100},
                  StageCosts{.activation_bytes = 10, .workspace_bytes = 500}};
  PS_ASSERT_OK_AND_ASSIGN(r, Simulate(HandSchedule(1, 2, 1, {"0F0 1F0 1B0 0B0"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 610);
}

// Recomputation: an F holds the activations it drops only while it runs; a B or I
// rebuilds them at its start and holds them to its end, or, when split, to the W's end.
TEST(SimulatorTest, RecomputeBytesLiveDuringFAndFromTheBackwardToItsEnd) {
  CostModel costs;
  costs.uniform.activation_bytes = 10;  // kept from F to the backward
  costs.uniform.recompute_bytes = 100;  // dropped at the F's end, rebuilt by the backward
  costs.uniform.workspace_bytes = 5;
  // 0F2 peaks at 3 x 10 + 100; 0B0 at 3 x 10 + 100 + its workspace.
  PS_ASSERT_OK_AND_ASSIGN(SimResult r,
                          Simulate(HandSchedule(1, 1, 3, {"0F0 0F1 0F2 0B0 0B1 0B2"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 135);
  EXPECT_EQ(r.ranks[0].peak_live_microbatches, 3);
  // Split, W right after I: one rebuilt stash at a time.
  PS_ASSERT_OK_AND_ASSIGN(
      r, Simulate(HandSchedule(1, 1, 3, {"0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 135);
  // W's deferred: each I's rebuilt stash waits for its W, 3 x 10 + 3 x 100 + 5 at 0I2.
  PS_ASSERT_OK_AND_ASSIGN(
      r, Simulate(HandSchedule(1, 1, 3, {"0F0 0F1 0F2 0I0 0I1 0I2 0W0 0W1 0W2"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 335);
  // A backward holds the rebuilt stash and its workspace: 0F0 10 + 1000, 0B0 10 + 1000 + 5.
  costs.uniform.recompute_bytes = 1000;
  PS_ASSERT_OK_AND_ASSIGN(r, Simulate(HandSchedule(1, 1, 1, {"0F0 0B0"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 1015);
  // An F's own peak: two chunks on one rank, stage 1 keeping 500 per micro-batch; at 0F1
  // 0F1's 10 + 1000 while it runs, on top of 0F0's 10 and 1F0's 500: 1520, above any
  // backward's (0B0: 10 + 10 + 1000).
  costs.uniform = {};
  costs.stages = {StageCosts{.activation_bytes = 10, .recompute_bytes = 1000},
                  StageCosts{.activation_bytes = 500}};
  PS_ASSERT_OK_AND_ASSIGN(
      r, Simulate(HandSchedule(1, 2, 2, {"0F0 1F0 0F1 1B0 1F1 1B1 0B0 0B1"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 1520);
}

// The received input of an F of a stage > 0 is live from the start of the compute action
// before it on its rank (the executor's receive buffer): a 1F1B backward in the steady
// state holds the next F's input on top of the stashes; stage 0 receives nothing.
TEST(SimulatorTest, InputBytesAreLiveFromTheActionBeforeTheirF) {
  CostModel costs;
  costs.uniform.activation_bytes = 100;
  costs.uniform.input_bytes = 10;
  const Schedule one_f_one_b =
      HandSchedule(2, 1, 3, {"0F0 0F1 0B0 0F2 0B1 0B2", "1F0 1B0 1F1 1B1 1F2 1B2"});
  PS_ASSERT_OK_AND_ASSIGN(SimResult r, Simulate(one_f_one_b, costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 200);  // two stashes; stage 0 prefetches nothing
  EXPECT_EQ(r.ranks[1].peak_live_bytes, 110);  // 1B0 (and 1B1) with the next F's input
  EXPECT_EQ(r.ranks[1].peak_live_microbatches, 1);
  // With the workspace, during 1B0: 100 + 10 + 30.
  costs.uniform.workspace_bytes = 30;
  PS_ASSERT_OK_AND_ASSIGN(r, Simulate(one_f_one_b, costs));
  EXPECT_EQ(r.ranks[1].peak_live_bytes, 140);
  // GPipe: the input of 1F2 arrives during 1F1, when two stashes are live at most: the
  // peak is still all three stashes.
  costs.uniform.workspace_bytes = 0;
  PS_ASSERT_OK_AND_ASSIGN(
      r, Simulate(HandSchedule(2, 1, 3, {"0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"}),
                  costs));
  EXPECT_EQ(r.ranks[1].peak_live_bytes, 300);
  // More input than activations is a mistake, except on stage 0, which receives none (a
  // uniform --input-bytes may exceed its activations).
  costs.stages = {StageCosts{.activation_bytes = 10, .input_bytes = 50},
                  StageCosts{.activation_bytes = 100, .input_bytes = 50}};
  PS_ASSERT_OK_AND_ASSIGN(r, Simulate(one_f_one_b, costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 20);
  EXPECT_EQ(r.ranks[1].peak_live_bytes, 150);
  costs.stages = {StageCosts{.activation_bytes = 100},
                  StageCosts{.activation_bytes = 8, .input_bytes = 9}};
  EXPECT_THAT(Simulate(one_f_one_b, costs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 1: input_bytes 9 exceeds activation_bytes 8; the "
                                 "received input is part of a micro-batch's activations: give "
                                 "input_bytes <= activation_bytes")));
}

TEST(SimulatorTest, ZeroCostsGiveZeroBubbleNotNaN) {
  CostModel costs;
  costs.uniform = StageCosts{.f = 0, .b = 0, .i = 0, .w = 0};
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r,
                          Simulate(HandSchedule(2, 1, 1, {"0F0 0B0", "1F0 1B0"}), costs));
  EXPECT_DOUBLE_EQ(r.makespan, 0);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 0);
  EXPECT_DOUBLE_EQ(r.bubble_ratio, 0);
}

TEST(SimulatorTest, RejectsWhatValidateRejects) {
  EXPECT_THAT(Simulate(HandSchedule(2, 1, 1, {"0F0 0B0", "1F0"}), CostModel{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1F0 has no backward")));
  EXPECT_THAT(Simulate(HandSchedule(2, 1, 2, {"0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"}), CostModel{}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 0 blocked at 0B0 (waits for 1B0 on rank 1)")));
}

// A library caller can hand the simulator any CostModel: a time outside [0, 1e15] or a
// byte count outside [0, 2^50] is an error naming the field, not "makespan inf, bubble
// fraction -nan" (1e308), "bubble 4.27, busy -36" (b = -10) or a lower peak (negative
// workspace).
TEST(SimulatorTest, RejectsCostsOutOfRangeNamingTheField) {
  const Schedule s = HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"});
  auto expect_refused = [&s](const CostModel& costs, const std::string& message) {
    EXPECT_THAT(Simulate(s, costs),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  };
  const std::string time = ", not a valid time; give a number in [0, 1e+15]";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    CostModel c;
    c.uniform.b = 1e308;
    expect_refused(c, "the default b is 1e+308" + time);
    c.uniform.b = -10;
    expect_refused(c, "the default b is -10" + time);
    c.uniform.b = 2;
    c.uniform.f = 1e15 * 1.0000001;
    expect_refused(c, "the default f is 1e+15" + time);
    c.uniform.f = 1;
    c.uniform.allreduce = -3;
    expect_refused(c, "the default allreduce is -3" + time);
  }
  for (auto [field, name] : {std::pair{&StageCosts::f, "f"}, std::pair{&StageCosts::b, "b"},
                             std::pair{&StageCosts::i, "i"}, std::pair{&StageCosts::w, "w"},
                             std::pair{&StageCosts::allreduce, "allreduce"},
                             std::pair{&StageCosts::zero_grad, "zero_grad"},
                             std::pair{&StageCosts::optimizer, "optimizer"}}) {
    CostModel c;
    c.stages.resize(2);
    c.stages[1].*field = -1;
    expect_refused(c, absl::StrCat("stage 1's ", name, " is -1", time));
  }
  for (auto [field, name] : {std::pair{&StageCosts::activation_bytes, "activation_bytes"},
                             std::pair{&StageCosts::workspace_bytes, "workspace_bytes"},
                             std::pair{&StageCosts::input_bytes, "input_bytes"},
                             std::pair{&StageCosts::recompute_bytes, "recompute_bytes"}}) {
    CostModel c;
    c.uniform.*field = -5;
    expect_refused(c, absl::StrCat("the default ", name,
                                   " is -5, not a valid byte count; give an integer in [0, "
                                   "1125899906842624] (2^50)"));
    c.uniform.*field = kMaxCostBytes + 1;
    expect_refused(c, absl::StrCat("the default ", name, " is 1125899906842625"));
  }
  {
    CostModel c;
    c.comm_uniform = -3;
    expect_refused(c, "the transfer time comm_uniform is -3" + time);
    c.comm_uniform = 0;
    c.comm = {nan};
    expect_refused(c, "the transfer time comm[0] (boundary 0 -> 1) is nan" + time);
    c.comm.clear();
    c.actions[{0, Op::kF, 0}] = -100;
    expect_refused(c, "the duration of 0F0 is -100" + time);
    c.actions.clear();
    c.transfers[{1, Op::kF, 1}] = -100;
    expect_refused(c, "the transfer time into 1F1 is -100" + time);
    c.transfers.clear();
    c.gaps[{0, Op::kB, 1}] = std::numeric_limits<double>::infinity();
    expect_refused(c, "the gap before 0B1 is inf" + time);
  }
  // The bounds themselves, and zero everywhere, are times and byte counts.
  CostModel edge;
  edge.uniform = StageCosts{.f = kMaxCostTime, .b = 0, .i = 0, .w = 0, .zero_grad = 0};
  edge.uniform.activation_bytes = kMaxCostBytes;
  edge.uniform.workspace_bytes = kMaxCostBytes;
  edge.uniform.input_bytes = kMaxCostBytes;
  PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(s, edge));
  EXPECT_DOUBLE_EQ(r.makespan, 3 * kMaxCostTime);
}

// A P=1 program with all of `m` forwards before the backwards: m stashes live at once.
Schedule AllForwardsFirst(int m) {
  Schedule s;
  s.name = "forwards-first";
  s.num_microbatches = m;
  s.programs.resize(1);
  for (Op op : {Op::kF, Op::kB}) {
    for (int mb = 0; mb < m; ++mb) s.programs[0].push_back({0, mb, op});
  }
  return s;
}

// Byte counts within the bound can still add up past 2^63: 2^13 stashes of 2^50.
TEST(SimulatorTest, RejectsLiveBytesThatOverflow) {
  CostModel costs;
  costs.uniform.activation_bytes = kMaxCostBytes;
  EXPECT_THAT(
      Simulate(AllForwardsFirst(8192), costs),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("rank 0's live bytes overflow 64 bits at 0F8191: 9222246136947933184 "
                         "bytes live plus activation_bytes 1125899906842624")));
  costs.uniform.workspace_bytes = kMaxCostBytes;
  EXPECT_THAT(Simulate(AllForwardsFirst(8191), costs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("overflow 64 bits at 0B0: 9222246136947933184 bytes live plus "
                                 "workspace_bytes 1125899906842624")));
  // Below that nothing overflows: 2 x 2^50.
  costs.uniform = StageCosts{.activation_bytes = kMaxCostBytes};
  PS_ASSERT_OK_AND_ASSIGN(
      const SimResult r,
      Simulate(HandSchedule(2, 1, 2, {"0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"}), costs));
  EXPECT_EQ(r.ranks[0].peak_live_bytes, 2 * kMaxCostBytes);
  EXPECT_EQ(r.ranks[1].peak_live_bytes, kMaxCostBytes);
}

}  // namespace
}  // namespace pipesched::scheduler
