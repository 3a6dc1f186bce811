// PlaceAllReduce: one ALLREDUCE per stage right after the stage's last B/W on its rank,
// for every generator; schedules stay valid; D = 1 is unchanged; bad input is an error.
#include "pipesched/scheduler/lower.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/scheduler/refine.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Programs(const Schedule& s) {
  std::vector<std::string> rows;
  for (const std::vector<Action>& program : s.programs) {
    std::vector<std::string> tokens;
    for (const Action& a : program) tokens.push_back(ToString(a));
    rows.push_back(absl::StrJoin(tokens, " "));
  }
  return rows;
}

Schedule FromRows(int p, int v, int m, PlacementKind kind,
                  const std::vector<std::vector<std::string>>& rows) {
  Schedule s;
  s.name = "hand";
  s.placement = Placement{.kind = kind, .num_ranks = p, .num_chunks = v};
  s.num_microbatches = m;
  for (const auto& row : rows) {
    std::vector<Action> program;
    for (const std::string& token : row) program.push_back(ParseAction(token).value());
    s.programs.push_back(program);
  }
  return s;
}

TEST(PlaceAllReduceTest, OneReplicaIsUnchanged) {
  PS_ASSERT_OK_AND_ASSIGN(Schedule s,
                          GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  PS_ASSERT_OK_AND_ASSIGN(Schedule lowered, PlaceAllReduce(s, 1));
  EXPECT_EQ(Programs(lowered), Programs(s));
}

TEST(PlaceAllReduceTest, OneFOneBReducesAfterTheLastBackward) {
  Schedule s = FromRows(2, 1, 2, PlacementKind::kLoop,
                        {{"0F0", "0F1", "0B0", "0B1"}, {"1F0", "1B0", "1F1", "1B1"}});
  PS_ASSERT_OK_AND_ASSIGN(Schedule lowered, PlaceAllReduce(s, 2));
  EXPECT_THAT(Programs(lowered),
              ElementsAre("0F0 0F1 0B0 0B1 0ALLREDUCE", "1F0 1B0 1F1 1B1 1ALLREDUCE"));
  PS_EXPECT_OK(Validate(lowered));
}

TEST(PlaceAllReduceTest, InterleavedReducesEachChunkAsSoonAsItIsDone) {
  // Two chunks on one rank (P=1, V=2): stage 1's gradients are final after 1B1, while
  // stage 0 still runs its backwards; its all-reduce overlaps them.
  Schedule s = FromRows(1, 2, 2, PlacementKind::kLoop,
                        {{"0F0", "1F0", "0F1", "1F1", "1B0", "1B1", "0B0", "0B1"}});
  PS_ASSERT_OK_AND_ASSIGN(Schedule lowered, PlaceAllReduce(s, 4));
  EXPECT_THAT(Programs(lowered),
              ElementsAre("0F0 1F0 0F1 1F1 1B0 1B1 1ALLREDUCE 0B0 0B1 0ALLREDUCE"));
  PS_EXPECT_OK(Validate(lowered));
}

TEST(PlaceAllReduceTest, SplitBackwardReducesAfterTheLastW) {
  Schedule s =
      FromRows(1, 1, 2, PlacementKind::kLoop, {{"0F0", "0F1", "0I0", "0I1", "0W0", "0W1"}});
  PS_ASSERT_OK_AND_ASSIGN(Schedule lowered, PlaceAllReduce(s, 2));
  EXPECT_THAT(Programs(lowered), ElementsAre("0F0 0F1 0I0 0I1 0W0 0W1 0ALLREDUCE"));
}

TEST(PlaceAllReduceTest, KeepsAllReducesTheScheduleAlreadyPlaces) {
  Schedule s =
      FromRows(1, 2, 1, PlacementKind::kLoop, {{"0F0", "1F0", "1B0", "0B0", "1ALLREDUCE"}});
  PS_ASSERT_OK_AND_ASSIGN(Schedule lowered, PlaceAllReduce(s, 2));
  EXPECT_THAT(Programs(lowered), ElementsAre("0F0 1F0 1B0 0B0 0ALLREDUCE 1ALLREDUCE"));
}

TEST(PlaceAllReduceTest, EveryGeneratorStaysValidWithOneAllReducePerStage) {
  int checked = 0;
  for (const ScheduleInfo& info : AllSchedules()) {
    for (int p : {1, 2, 4}) {
      for (int m : {1, 4, 8}) {
        GeneratorParams params{.num_ranks = p, .num_microbatches = m};
        absl::StatusOr<Schedule> s = GenerateSchedule(info.name, params);
        if (!s.ok()) continue;  // a combination the schedule does not support
        ++checked;
        SCOPED_TRACE(std::string(info.name) + " P=" + std::to_string(p) +
                     " M=" + std::to_string(m));
        PS_ASSERT_OK_AND_ASSIGN(Schedule lowered, PlaceAllReduce(*s, 2));
        PS_EXPECT_OK(Validate(lowered));
        EXPECT_EQ(lowered.NumActions(), s->NumActions() + s->num_stages());
        // Each ALLREDUCE directly follows a B or W of its own stage, and no later action
        // on the rank is a backward of that stage.
        for (const std::vector<Action>& program : lowered.programs) {
          for (std::size_t i = 0; i < program.size(); ++i) {
            if (program[i].op != Op::kAllReduce) continue;
            int stage = program[i].stage;
            ASSERT_GT(i, 0u);
            EXPECT_EQ(program[i - 1].stage, stage);
            EXPECT_TRUE(program[i - 1].op == Op::kB || program[i - 1].op == Op::kW)
                << ToString(program[i - 1]) << " precedes " << ToString(program[i]);
            for (std::size_t k = i + 1; k < program.size(); ++k) {
              EXPECT_FALSE(program[k].stage == stage &&
                           (program[k].op == Op::kB || program[k].op == Op::kW));
            }
          }
        }
      }
    }
  }
  EXPECT_GE(checked, 30);
}

TEST(PlaceAllReduceTest, RejectsBadReplicaCounts) {
  PS_ASSERT_OK_AND_ASSIGN(Schedule s,
                          GenerateSchedule("gpipe", {.num_ranks = 2, .num_microbatches = 2}));
  EXPECT_THAT(PlaceAllReduce(s, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1, not 0")));
}

TEST(PlaceAllReduceTest, RejectsAStageWithoutBackward) {
  Schedule s = FromRows(1, 1, 1, PlacementKind::kLoop, {{"0F0"}});
  EXPECT_THAT(PlaceAllReduce(s, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("all-reduce of stage 0")));
}

// An unvalidated schedule gets Validate()'s shape errors, not std::length_error (P < 0) or
// an int overflow of P*V that returned OK with no stage reduced.
TEST(PlaceAllReduceTest, RejectsBadShapesBeforeSizingAnything) {
  Schedule negative = FromRows(1, 1, 1, PlacementKind::kLoop, {{"0F0", "0B0"}});
  negative.placement.num_ranks = -2;
  EXPECT_THAT(PlaceAllReduce(negative, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("schedule 'hand': P (ranks) must be >= 1, got -2")));
  Schedule wide = FromRows(1, 1, 1, PlacementKind::kLoop, {{"0F0", "0B0"}});
  wide.placement.num_ranks = 1 << 16;
  wide.placement.num_chunks = 1 << 16;
  wide.programs.resize(1 << 16);
  EXPECT_THAT(PlaceAllReduce(wide, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("schedule 'hand': 2 actions over 4294967296 stages is more than "
                                 "this tool handles")));
  Schedule sparse = FromRows(2, 1, 1, PlacementKind::kLoop, {{"0F0", "0B0"}, {}});
  sparse.placement.num_chunks = 1 << 20;
  EXPECT_THAT(PlaceAllReduce(sparse, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has 2 actions, fewer than the P*V*M = 2*1048576*1 = 2097152 "
                                 "forwards it needs")));
  Schedule short_programs = FromRows(2, 1, 1, PlacementKind::kLoop, {{"0F0", "0B0"}});
  EXPECT_THAT(
      PlaceAllReduce(short_programs, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 1 rank programs but P = 2")));
  Schedule no_microbatches = FromRows(1, 1, 1, PlacementKind::kLoop, {{"0F0", "0B0"}});
  no_microbatches.num_microbatches = 0;
  EXPECT_THAT(PlaceAllReduce(no_microbatches, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("M (micro-batches) must be >= 1, got 0")));
}

// SplitBackward: each B becomes its I then W in place, so that a B schedule can be
// refined (RefineSchedule takes F, I and W only), stays valid, does the same work where
// B = I + W, and is never longer.
TEST(SplitBackwardTest, EachBBecomesItsIThenWInPlace) {
  Schedule s = FromRows(2, 1, 2, PlacementKind::kLoop,
                        {{"0F0", "0F1", "0B0", "0B1"}, {"1F0", "1B0", "1F1", "1B1"}});
  const Schedule split = SplitBackward(s);
  EXPECT_THAT(Programs(split), ElementsAre("0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1I0 1W0 1F1 1I1 1W1"));
  EXPECT_EQ(split.name, "hand");
  PS_EXPECT_OK(Validate(split));
  EXPECT_EQ(Programs(SplitBackward(split)), Programs(split));  // nothing left to split
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b"}) {
    PS_ASSERT_OK_AND_ASSIGN(Schedule generated,
                            GenerateSchedule(name, {.num_ranks = 4, .num_microbatches = 8}));
    const Schedule generated_split = SplitBackward(generated);
    PS_EXPECT_OK(Validate(generated_split)) << name;
    PS_ASSERT_OK_AND_ASSIGN(SimResult before, Simulate(generated, CostModel{}));
    PS_ASSERT_OK_AND_ASSIGN(SimResult after, Simulate(generated_split, CostModel{}));
    // The same work (B = I + W = 2), and never longer: an I hands its gradient upstream
    // before its W runs (GPipe and 1F1B at P=4, M=8: 33 -> 30).
    for (int r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(after.ranks[r].busy, before.ranks[r].busy);
    EXPECT_LE(after.makespan, before.makespan) << name;
    // And it can now be refined: never a longer step.
    PS_ASSERT_OK_AND_ASSIGN(Schedule refined, RefineSchedule(generated_split, CostModel{}));
    PS_ASSERT_OK_AND_ASSIGN(SimResult refined_sim, Simulate(refined, CostModel{}));
    EXPECT_LE(refined_sim.step_time, after.step_time) << name;
  }
  // The refinement's refusal of a B says how to split it.
  EXPECT_THAT(RefineSchedule(s, CostModel{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(scheduler::SplitBackward splits each B)")));
}

}  // namespace
}  // namespace pipesched::scheduler
