// The closed forms of formulas.h, checked against numbers worked out by hand.
#include "pipesched/scheduler/formulas.h"

#include <limits>
#include <string_view>

#include "gtest/gtest.h"
#include "pipesched/scheduler/lower.h"
#include "pipesched/scheduler/registry.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

FormulaInputs Inputs(int p, int v, int m, StageCosts costs = {}) {
  return FormulaInputs{.num_ranks = p, .num_chunks = v, .num_microbatches = m, .costs = costs};
}

TEST(FormulasTest, GPipeAnd1F1BFillAndDrain) {
  // (P-1)/(M+P-1): P=4, M=8 -> 3/11.
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("gpipe", Inputs(4, 1, 8)), 3.0 / 11);
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("1f1b", Inputs(4, 1, 8)), 3.0 / 11);
  // Independent of the F/B split, and M need not be a multiple of P.
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("1f1b", Inputs(3, 1, 5, {.f = 2, .b = 7})), 2.0 / 7);
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("1f1b", Inputs(1, 1, 5)), 0);
  // ratio = f / (1 - f) = (P-1)/M.
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleRatio("1f1b", Inputs(4, 1, 8)), 3.0 / 8);
}

TEST(FormulasTest, Interleaved) {
  // ratio (P-1)/(V*M) = 3/16 for P=4, V=2, M=8; fraction = 3/19.
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleRatio("interleaved-1f1b", Inputs(4, 2, 8)), 3.0 / 16);
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("interleaved-1f1b", Inputs(4, 2, 8)), 3.0 / 19);
  // V = 1 is plain 1F1B.
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("interleaved-1f1b", Inputs(4, 1, 8)),
                   *ClosedFormBubbleFraction("1f1b", Inputs(4, 1, 8)));
  // Also for an M >= P that P does not divide (M = 6: 3/12, fraction 3/15 = 0.2), not
  // for M < P, nor for an M the generator's equal rounds refuse (M = 9 at P = 4).
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("interleaved-1f1b", Inputs(4, 2, 6)), 0.2);
  EXPECT_FALSE(ClosedFormBubbleFraction("interleaved-1f1b", Inputs(4, 2, 3)).has_value());
  EXPECT_FALSE(ClosedFormBubbleFraction("interleaved-1f1b", Inputs(4, 2, 9)).has_value());
}

TEST(FormulasTest, ZeroBubbleH1) {
  // T_F = T_I = T_W = 1, P=4, M=8: bubble 3*(1+1-1) = 3 per rank, makespan 8*3 + 3 = 27.
  const StageCosts unit{.f = 1, .b = 2, .i = 1, .w = 1};
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("zb-h1", Inputs(4, 1, 8, unit)), 3.0 / 27);
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleRatio("zb-h1", Inputs(4, 1, 8, unit)), 3.0 / 24);
  // One third of 1F1B's bubble time, 3*(F+B) = 9 per rank.
  const double one_f_one_b = 3.0 * (unit.f + unit.b);
  EXPECT_DOUBLE_EQ(3.0, one_f_one_b / 3);
  // T_F=2, T_I=3, T_W=1, P=3, M=4: bubble 2*4 = 8, makespan 4*6 + 8 = 32.
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("zb-h1", Inputs(3, 1, 4, {.f = 2, .i = 3, .w = 1})),
                   8.0 / 32);
  // Outside the regime: M < P, or W longer than F + I.
  EXPECT_FALSE(ClosedFormBubbleFraction("zb-h1", Inputs(4, 1, 3, unit)).has_value());
  EXPECT_FALSE(
      ClosedFormBubbleFraction("zb-h1", Inputs(4, 1, 8, {.f = 1, .i = 1, .w = 3})).has_value());
  // ... or W longer than F or than I, where the simulated bubble is larger (it printed
  // 0.0000 against a simulated 0.0857 for W=2, 0.0508 against 0.0968 for W=1.5).
  for (const StageCosts& c :
       {StageCosts{.f = 1, .i = 1, .w = 2}, StageCosts{.f = 1, .i = 1, .w = 1.5},
        StageCosts{.f = 1, .i = 0.5, .w = 1}, StageCosts{.f = 3, .i = 1, .w = 2},
        StageCosts{.f = 0, .i = 1, .w = 1}}) {
    EXPECT_FALSE(ClosedFormBubbleFraction("zb-h1", Inputs(4, 1, 8, c)).has_value()) << c.w;
  }
  EXPECT_FALSE(
      ClosedFormBubbleFraction("zb-h1", Inputs(2, 1, 2, {.f = 0, .i = 1, .w = 1})).has_value());
  // Inside it: W no longer than F and I; W = 0 at any M (1F1B with B = I); P = 1.
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("zb-h1", Inputs(4, 1, 8, {.f = 2, .i = 1, .w = 1})),
                   6.0 / 38);
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("zb-h1", Inputs(4, 1, 2, {.f = 1, .i = 1, .w = 0})),
                   3.0 / 5);
  EXPECT_DOUBLE_EQ(*ClosedFormBubbleFraction("zb-h1", Inputs(1, 1, 3, {.f = 1, .i = 1, .w = 5})),
                   0);
}

TEST(FormulasTest, NulloptOutsideWhatTheFormulasCover) {
  EXPECT_FALSE(ClosedFormBubbleFraction("zb-v", Inputs(4, 2, 8)).has_value());
  EXPECT_FALSE(ClosedFormBubbleFraction("1F1B", Inputs(4, 1, 8)).has_value());  // names exact
  EXPECT_FALSE(ClosedFormBubbleFraction("1f1b", Inputs(0, 1, 8)).has_value());
  EXPECT_FALSE(ClosedFormBubbleFraction("1f1b", Inputs(4, 1, 0)).has_value());
  EXPECT_FALSE(ClosedFormBubbleFraction("1f1b", Inputs(4, 2, 8)).has_value());
  EXPECT_FALSE(ClosedFormBubbleFraction("1f1b", Inputs(4, 1, 8, {.allreduce = 1})).has_value());
  EXPECT_FALSE(ClosedFormBubbleRatio("zb-v", Inputs(4, 2, 8)).has_value());
}

// The forms are for times Simulate would run: none for a NaN, an inf or a negative cost,
// even one the formula does not read (interleaved-1f1b reads only P, V and M).
TEST(FormulasTest, NulloptForCostsThatAreNotTimes) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  ASSERT_TRUE(ClosedFormBubbleFraction("interleaved-1f1b", Inputs(4, 2, 8)).has_value());
  for (const StageCosts& bad :
       {StageCosts{.f = nan}, StageCosts{.f = -1, .i = -1}, StageCosts{.b = inf},
        StageCosts{.w = -0.5}, StageCosts{.zero_grad = nan}, StageCosts{.optimizer = -1}}) {
    for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "interleaved-zb"}) {
      const int v = std::string_view(name).starts_with("interleaved") ? 2 : 1;
      EXPECT_FALSE(ClosedFormBubbleFraction(name, Inputs(4, v, 8, bad)).has_value())
          << name << " f=" << bad.f << " b=" << bad.b << " i=" << bad.i << " w=" << bad.w;
      EXPECT_FALSE(ClosedFormBubbleRatio(name, Inputs(4, v, 8, bad)).has_value()) << name;
    }
  }
  // Zero is a time.
  EXPECT_DOUBLE_EQ(
      *ClosedFormBubbleFraction("zb-h1", Inputs(4, 1, 2, {.f = 1, .b = 0, .i = 1, .w = 0})),
      3.0 / 5);
}

TEST(ClosedFormForTest, OnlyForUniformCostsWithoutTransfersOrGaps) {
  PS_ASSERT_OK_AND_ASSIGN(const Schedule schedule,
                          GenerateSchedule("1f1b", {.num_ranks = 4, .num_microbatches = 8}));
  EXPECT_DOUBLE_EQ(*ClosedFormFor(schedule, CostModel{}), 3.0 / 11);
  CostModel comm;
  comm.comm_uniform = 0.1;
  EXPECT_FALSE(ClosedFormFor(schedule, comm).has_value());
  CostModel gap;
  gap.action_gap = 0.1;
  EXPECT_FALSE(ClosedFormFor(schedule, gap).has_value());
  CostModel listed;
  listed.stages.resize(4);
  EXPECT_FALSE(ClosedFormFor(schedule, listed).has_value());
}

// The formula belongs to the order, not to the name: a file named zb-h1.csv holding
// GPipe's order printed zb-h1's 0.1111 next to its simulated 0.2727.
TEST(ClosedFormForTest, OnlyForTheOrderItsNameGenerates) {
  PS_ASSERT_OK_AND_ASSIGN(Schedule gpipe,
                          GenerateSchedule("gpipe", {.num_ranks = 4, .num_microbatches = 8}));
  PS_ASSERT_OK_AND_ASSIGN(const Schedule zb_h1,
                          GenerateSchedule("zb-h1", {.num_ranks = 4, .num_microbatches = 8}));
  EXPECT_DOUBLE_EQ(*ClosedFormFor(zb_h1, CostModel{}), 3.0 / 27);
  gpipe.name = "zb-h1";
  EXPECT_FALSE(ClosedFormFor(gpipe, CostModel{}).has_value());
  gpipe.name = "1f1b";  // same fill and drain, another order: still not 1F1B's formula
  EXPECT_FALSE(ClosedFormFor(gpipe, CostModel{}).has_value());
  gpipe.name = "gpipe";
  EXPECT_DOUBLE_EQ(*ClosedFormFor(gpipe, CostModel{}), 3.0 / 11);
  // All-reduces that cost nothing change nothing: the compute order decides.
  PS_ASSERT_OK_AND_ASSIGN(const Schedule reduced, PlaceAllReduce(gpipe, 2));
  EXPECT_DOUBLE_EQ(*ClosedFormFor(reduced, CostModel{}), 3.0 / 11);
}

}  // namespace
}  // namespace pipesched::scheduler
