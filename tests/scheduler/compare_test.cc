// Comparing schedules at equal work: how one model's per-stage costs are cut into V
// chunks, and the simulated ranking they give every registered schedule.
#include "pipesched/scheduler/compare.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/scheduler/registry.h"
#include "test_costs.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RefineCostsTest, OneChunkKeepsTheCosts) {
  CostModel costs;
  costs.uniform = {.f = 3, .b = 5, .i = 2, .w = 3, .activation_bytes = 7};
  costs.comm_uniform = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(const CostModel same, RefineCosts(costs, 4, 1));
  EXPECT_EQ(same.uniform.f, 3);
  EXPECT_EQ(same.uniform.activation_bytes, 7);
  EXPECT_EQ(same.comm_uniform, 0.5);
}

TEST(RefineCostsTest, AChunkRunsItsShareOfTheStage) {
  CostModel costs;
  costs.uniform = {.f = 3,
                   .b = 6,
                   .i = 2,
                   .w = 4,
                   .allreduce = 9,
                   .activation_bytes = 1001,
                   .workspace_bytes = 64,
                   .input_bytes = 100,
                   .static_bytes = 7001,
                   .zero_grad = 1.5,
                   .optimizer = 3};
  costs.comm_uniform = 0.25;
  costs.action_gap = 0.01;
  PS_ASSERT_OK_AND_ASSIGN(const CostModel c, RefineCosts(costs, 4, 2));
  EXPECT_TRUE(c.stages.empty());
  EXPECT_DOUBLE_EQ(c.uniform.f, 1.5);
  EXPECT_DOUBLE_EQ(c.uniform.b, 3);
  EXPECT_DOUBLE_EQ(c.uniform.i, 1);
  EXPECT_DOUBLE_EQ(c.uniform.w, 2);
  EXPECT_DOUBLE_EQ(c.uniform.allreduce, 4.5);
  EXPECT_DOUBLE_EQ(c.uniform.zero_grad, 0.75);
  EXPECT_DOUBLE_EQ(c.uniform.optimizer, 1.5);
  EXPECT_EQ(c.uniform.activation_bytes, 501);  // rounded up
  EXPECT_EQ(c.uniform.static_bytes, 3501);     // each chunk holds its share of the state
  // One boundary tensor in, one backward's scratch: the same for a chunk.
  EXPECT_EQ(c.uniform.workspace_bytes, 64);
  EXPECT_EQ(c.uniform.input_bytes, 100);
  EXPECT_DOUBLE_EQ(c.comm_uniform, 0.25);
  EXPECT_DOUBLE_EQ(c.action_gap, 0.01);
  // An input larger than a chunk's share of the stash is capped at it.
  PS_ASSERT_OK_AND_ASSIGN(const CostModel thin, RefineCosts(costs, 4, 16));
  EXPECT_EQ(thin.uniform.activation_bytes, 63);
  EXPECT_EQ(thin.uniform.input_bytes, 63);
}

// A recomputing stage keeps boundary tensors, which each chunk has whole, up to its share
// of all the stage's activations, and rebuilds the rest of that share: never more than
// without recomputation.
TEST(RefineCostsTest, ARecomputingChunkKeepsItsBoundaryTensorsWhole) {
  CostModel costs;
  costs.uniform = {.activation_bytes = 1000, .input_bytes = 100};
  PS_ASSERT_OK_AND_ASSIGN(const CostModel recomputing, WithRecompute(costs));
  PS_ASSERT_OK_AND_ASSIGN(const CostModel two, RefineCosts(recomputing, 4, 2));
  EXPECT_EQ(two.uniform.activation_bytes, 100);  // the whole input
  EXPECT_EQ(two.uniform.input_bytes, 100);
  EXPECT_EQ(two.uniform.recompute_bytes, 400);  // its share, 1000 / 2, less what it keeps
  // Cut 16 ways a chunk's share of the 1000 is 63: it keeps that, not the 100.
  PS_ASSERT_OK_AND_ASSIGN(const CostModel thin, RefineCosts(recomputing, 4, 16));
  EXPECT_EQ(thin.uniform.activation_bytes, 63);
  EXPECT_EQ(thin.uniform.input_bytes, 63);
  EXPECT_EQ(thin.uniform.recompute_bytes, 0);  // nothing left of its share to rebuild
  PS_ASSERT_OK_AND_ASSIGN(const CostModel plain, RefineCosts(costs, 4, 16));
  EXPECT_LE(thin.uniform.activation_bytes, plain.uniform.activation_bytes);
}

TEST(RefineCostsTest, PerStageListsFollowTheModelOrder) {
  // P=3 stages cut in V=2: chunk k is half of stage k / 2. Boundaries between stages keep
  // their times; a boundary inside a stage takes the mean (0.4).
  CostModel costs;
  costs.stages = {{.f = 2}, {.f = 4}, {.f = 8}};
  costs.comm = {0.2, 0.6};
  PS_ASSERT_OK_AND_ASSIGN(const CostModel c, RefineCosts(costs, 3, 2));
  std::vector<double> f;
  for (const StageCosts& s : c.stages) f.push_back(s.f);
  EXPECT_THAT(f, ElementsAre(1, 1, 2, 2, 4, 4));
  EXPECT_THAT(c.comm, ElementsAre(0.4, 0.2, 0.4, 0.6, 0.4));
}

TEST(RefineCostsTest, ListsOfAnotherShapeAreRefusedWithWhatWouldFit) {
  CostModel costs;
  costs.stages.resize(8);
  EXPECT_THAT(RefineCosts(costs, 4, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"stages\" has 8 entries; comparing schedules takes one per "
                                 "pipeline stage of a one-chunk cut (P=4), or none")));
  costs.stages.clear();
  costs.comm = {1, 2};
  EXPECT_THAT(RefineCosts(costs, 4, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"comm\" has 2 entries; comparing schedules takes one per "
                                 "boundary between the P=4 stages (3)")));
  costs.comm.clear();
  costs.actions[{0, Op::kF, 0}] = 1;
  EXPECT_THAT(RefineCosts(costs, 4, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("per-action replay costs")));
  CostModel unsplit;
  unsplit.uniform = {.f = 1, .b = 4, .i = 1, .w = 1};
  EXPECT_THAT(RefineCosts(unsplit, 4, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cost model: B=4 is not I + W = 2 (I=1, W=1)")));
  unsplit.stages = {{.b = 2}, {.b = 2.5}};
  EXPECT_THAT(CheckOneChunkCosts(unsplit, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 1: B=2.5")));
  CostModel wide_input;
  wide_input.stages = {{}, {.activation_bytes = 10, .input_bytes = 20}};
  EXPECT_THAT(CheckOneChunkCosts(wide_input, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 1: input_bytes 20 exceeds activation_bytes 10")));
  // I = W = B / 2 as measured files store them passes.
  CostModel measured;
  measured.uniform = {
      .f = 538.3, .b = 835.2969999313354, .i = 417.6484999656677, .w = 417.6484999656677};
  PS_EXPECT_OK(CheckOneChunkCosts(measured, 2));
  EXPECT_THAT(RefineCosts(CostModel{}, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("V >= 1 (got P=4, V=0)")));
}

// Extreme but representable inputs: bytes near INT64_MAX overflowed the rounding up, and
// V near INT_MAX overflowed P*V (and returned OK with no stages).
TEST(RefineCostsTest, RefusesWhatItCannotCutWithoutOverflow) {
  CostModel huge;
  huge.uniform.activation_bytes = std::numeric_limits<std::int64_t>::max();
  EXPECT_THAT(RefineCosts(huge, 2, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cost model: the default activation_bytes is "
                                 "9223372036854775807, not a valid byte count; give an integer "
                                 "in [0, 1125899906842624] (2^50)")));
  CostModel negative;
  negative.stages = {{}, {.b = -2, .i = -1, .w = -1}};
  EXPECT_THAT(CheckOneChunkCosts(negative, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cost model: stage 1's b is -2, not a valid time; give a number "
                                 "in [0, 1e+15]")));
  CostModel two;
  two.stages.resize(2);
  EXPECT_THAT(RefineCosts(two, 2, std::numeric_limits<int>::max()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("refining costs supports at most P=65536 ranks and V=1024 chunks "
                                 "per rank, as the generators (got P=2, V=2147483647)")));
  EXPECT_THAT(RefineCosts(CostModel{}, std::numeric_limits<int>::max(), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(got P=2147483647, V=2)")));
  // At the bounds: 2^50 bytes cut in 3 round up, V = 1024 gives P*V stages.
  CostModel top;
  top.uniform.activation_bytes = kMaxCostBytes;
  top.stages = {top.uniform, top.uniform};
  PS_ASSERT_OK_AND_ASSIGN(const CostModel cut, RefineCosts(top, 2, 3));
  EXPECT_EQ(cut.uniform.activation_bytes, kMaxCostBytes / 3 + 1);
  PS_ASSERT_OK_AND_ASSIGN(const CostModel thin, RefineCosts(two, 2, 1024));
  EXPECT_EQ(thin.stages.size(), 2048u);
}

TEST(CompareSchedulesTest, EveryScheduleRunsTheSameWorkAndRanksByItsBubble) {
  // Unit costs per stage (F=1, B=2, I=W=1), P=4, M=8: every rank computes M (F + B) = 24
  // whatever the schedule; the makespan is that plus the bubble.
  std::vector<std::string> names;
  for (const ScheduleInfo& info : AllSchedules()) names.emplace_back(info.name);
  const std::vector<ComparedSchedule> rows = CompareSchedules(names, 4, 8, 0, CostModel{});
  ASSERT_EQ(rows.size(), names.size());
  std::map<std::string, double> makespan;
  for (const ComparedSchedule& row : rows) {
    PS_ASSERT_OK(row.status);
    for (const RankStats& rank : row.sim.ranks) EXPECT_DOUBLE_EQ(rank.busy, 24) << row.schedule;
    makespan[row.schedule] = row.sim.makespan;
  }
  EXPECT_EQ(makespan["gpipe"], 33);
  EXPECT_EQ(makespan["1f1b"], 33);
  EXPECT_EQ(makespan["interleaved-1f1b"], 28.5);  // (P-1)(F+B)/V of bubble
  EXPECT_EQ(makespan["zb-h1"], 27);               // (P-1)(F+I-W)
  EXPECT_EQ(makespan["interleaved-zb"], 25.5);    // the same over V
  EXPECT_EQ(makespan["zb-v"], 25.5);
  // Without keep_timelines no timeline is kept (millions of spans per schedule at the
  // planner's limits); with it, every action's span is.
  EXPECT_TRUE(rows[0].sim.timeline.spans.empty());
  const std::vector<ComparedSchedule> drawn =
      CompareSchedules({"1f1b"}, 4, 8, 0, CostModel{}, {.keep_timelines = true});
  EXPECT_EQ(drawn[0].sim.timeline.spans.size(), 64u);  // 4 ranks x 8 x (F, B)
  const auto zb = std::find_if(rows.begin(), rows.end(),
                               [](const ComparedSchedule& r) { return r.schedule == "zb-h1"; });
  ASSERT_TRUE(zb->closed_form.has_value());
  EXPECT_DOUBLE_EQ(*zb->closed_form, zb->sim.bubble_fraction);
}

TEST(CompareSchedulesTest, ShapesASchedulesRefuseAreSkippedWithTheirReason) {
  const std::vector<ComparedSchedule> rows =
      CompareSchedules({"interleaved-zb", "1f1b", "nope"}, 4, 9, 0, CostModel{});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_THAT(rows[0].status, StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("use --microbatches=8 or --microbatches=10")));
  PS_EXPECT_OK(rows[1].status);
  EXPECT_EQ(rows[1].num_chunks, 1);
  EXPECT_THAT(rows[2].status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("known schedules")));
  // Costs that do not fit the one-chunk cut are every schedule's reason.
  CostModel two_stages;
  two_stages.stages.resize(2);
  for (const ComparedSchedule& row : CompareSchedules({"1f1b", "zb-v"}, 4, 8, 0, two_stages)) {
    EXPECT_THAT(row.status,
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"stages\" has 2 entries")))
        << row.schedule;
  }
}

TEST(CompareSchedulesTest, RefineRefinesTheSearchedRowsAndKeepsTheirSearchedSteps) {
  // The uneven stages of zb_search_test's RefineShortensAnUnevenPipeline: zb-1p's row is
  // the refined order (48.2) and remembers the searched one's step (48.9); 1f1b's order is
  // fixed and has nothing to remember; without the option no row has one.
  const CostModel costs = testing::UnevenFourStages();
  const std::vector<ComparedSchedule> rows =
      CompareSchedules({"1f1b", "zb-1p", "zb-v-1p"}, 4, 12, 0, costs, {.refine = true});
  ASSERT_EQ(rows.size(), 3u);
  for (const ComparedSchedule& row : rows) PS_ASSERT_OK(row.status);
  EXPECT_FALSE(rows[0].unrefined_step_time.has_value());
  ASSERT_TRUE(rows[1].unrefined_step_time.has_value());
  EXPECT_NEAR(*rows[1].unrefined_step_time, 48.9, 1e-9);
  EXPECT_NEAR(rows[1].sim.step_time, 48.2, 1e-9);
  ASSERT_TRUE(rows[2].unrefined_step_time.has_value());
  EXPECT_LE(rows[2].sim.step_time, *rows[2].unrefined_step_time);
  for (const ComparedSchedule& row : CompareSchedules({"zb-1p"}, 4, 12, 0, costs)) {
    EXPECT_FALSE(row.unrefined_step_time.has_value());
    EXPECT_NEAR(row.sim.step_time, 48.9, 1e-9);
  }
}

}  // namespace
}  // namespace pipesched::scheduler
