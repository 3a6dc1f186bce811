// zb-1p, zb-2p and the zb-v-* ones: schedules searched for a cost model under a memory limit. What
// a user relies on: the result is a valid schedule for the costs given, it keeps its memory limit,
// it is never slower than zb-h1 (zb-2p never slower than zb-1p), it is zb-h1's order when costs are
// unit, and it reaches the one-step lower bound where that is reachable with 2P activations.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/lower.h"
#include "pipesched/scheduler/refine.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "test_costs.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;
using testing::RandomStages;

absl::StatusOr<SimResult> Search(const std::string& name, int p, int m, const CostModel& costs) {
  PS_ASSIGN_OR_RETURN(
      Schedule schedule,
      GenerateSchedule(name, {.num_ranks = p, .num_microbatches = m, .costs = &costs}));
  PS_RETURN_IF_ERROR(Validate(schedule));
  return Simulate(schedule, costs);
}

int PeakLive(const SimResult& sim) {
  int peak = 0;
  for (const RankStats& rank : sim.ranks) peak = std::max(peak, rank.peak_live_microbatches);
  return peak;
}

CostModel Uniform(double f, double i, double w, double comm) {
  CostModel costs;
  costs.uniform = {.f = f, .b = i + w, .i = i, .w = w};
  costs.comm_uniform = comm;
  return costs;
}

TEST(ZbSearchTest, UnitCostsGiveZbH1sOrder) {
  // zb-h1 meets the one-step bound 3M + P - 1 there: nothing shorter exists.
  for (const char* name : {"zb-1p", "zb-2p"}) {
    for (int p : {1, 2, 4, 8}) {
      for (int m : {1, 3, 8, 16}) {
        SCOPED_TRACE(absl::StrCat(name, " P=", p, " M=", m));
        PS_ASSERT_OK_AND_ASSIGN(Schedule searched,
                                GenerateSchedule(name, {.num_ranks = p, .num_microbatches = m}));
        PS_ASSERT_OK_AND_ASSIGN(Schedule h1,
                                GenerateSchedule("zb-h1", {.num_ranks = p, .num_microbatches = m}));
        EXPECT_EQ(searched.name, name);
        EXPECT_EQ(searched.programs, h1.programs);
      }
    }
  }
}

TEST(ZbSearchTest, ReachesTheOneStepBoundWithTwicePActivations) {
  // The last rank starts after P-1 forwards and transfers and then has M(F+I+W) of work:
  // P=4, M=8, T_W = 0.5: 3 + 8 x 2.5 = 23 (zb-h1: 3 x (F + I - W) idle, 24.5).
  PS_ASSERT_OK_AND_ASSIGN(SimResult cheap_w, Search("zb-2p", 4, 8, Uniform(1, 1, 0.5, 0)));
  EXPECT_DOUBLE_EQ(cheap_w.makespan, 23);
  PS_ASSERT_OK_AND_ASSIGN(SimResult h1, Search("zb-h1", 4, 8, Uniform(1, 1, 0.5, 0)));
  EXPECT_DOUBLE_EQ(h1.makespan, 24.5);
  PS_ASSERT_OK_AND_ASSIGN(SimResult one, Search("zb-1p", 4, 8, Uniform(1, 1, 0.5, 0)));
  EXPECT_DOUBLE_EQ(one.makespan, 24.5);  // within P activations zb-h1's is as short
  // Transfers of 0.5: 3 x (1 + 0.5) + 8 x 3 = 28.5 (zb-h1: 33).
  PS_ASSERT_OK_AND_ASSIGN(SimResult comm, Search("zb-2p", 4, 8, Uniform(1, 1, 1, 0.5)));
  EXPECT_DOUBLE_EQ(comm.makespan, 28.5);
  EXPECT_LE(PeakLive(comm), 8);
  EXPECT_GT(PeakLive(comm), 4);  // the bound needed more than zb-h1's memory
}

TEST(ZbSearchTest, NeverSlowerThanZbH1AndKeepsItsMemoryLimit) {
  // Random uneven stages and transfers: each search is valid for its costs, within its
  // limit, and ordered zb-2p <= zb-1p <= zb-h1 in makespan; somewhere each gains.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> time(0.2, 2.0);
  int gains_1p = 0, gains_2p = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 8);
    const int m = 1 + static_cast<int>(rng() % 24);
    CostModel costs = RandomStages(rng, p, /*phases=*/false);
    costs.comm_uniform = (rng() % 3 == 0) ? 0 : time(rng) / 4;
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": P=", p, " M=", m));
    PS_ASSERT_OK_AND_ASSIGN(SimResult h1, Search("zb-h1", p, m, costs));
    PS_ASSERT_OK_AND_ASSIGN(SimResult one, Search("zb-1p", p, m, costs));
    PS_ASSERT_OK_AND_ASSIGN(SimResult two, Search("zb-2p", p, m, costs));
    EXPECT_LE(PeakLive(one), std::min(p, m));
    EXPECT_LE(PeakLive(two), std::min(2 * p, m));
    EXPECT_LE(one.makespan, h1.makespan);
    EXPECT_LE(two.makespan, one.makespan);
    gains_1p += one.makespan < h1.makespan;
    gains_2p += two.makespan < one.makespan;
  }
  EXPECT_GT(gains_1p, 0);
  EXPECT_GT(gains_2p, 0);
}

TEST(ZbSearchTest, SearchedForTheCostsItIsGiven) {
  // The same shape searched for two cost models gives two orders, each at least as fast
  // under its own costs as the other's.
  const CostModel comm = Uniform(1, 1, 1, 0.5);
  const CostModel cheap_w = Uniform(1, 1, 0.25, 0);
  PS_ASSERT_OK_AND_ASSIGN(
      Schedule for_comm,
      GenerateSchedule("zb-2p", {.num_ranks = 4, .num_microbatches = 8, .costs = &comm}));
  PS_ASSERT_OK_AND_ASSIGN(
      Schedule for_w,
      GenerateSchedule("zb-2p", {.num_ranks = 4, .num_microbatches = 8, .costs = &cheap_w}));
  EXPECT_NE(for_comm.programs, for_w.programs);
  PS_ASSERT_OK_AND_ASSIGN(SimResult own, Simulate(for_comm, comm));
  PS_ASSERT_OK_AND_ASSIGN(SimResult other, Simulate(for_w, comm));
  EXPECT_LE(own.makespan, other.makespan);
  PS_ASSERT_OK_AND_ASSIGN(own, Simulate(for_w, cheap_w));
  PS_ASSERT_OK_AND_ASSIGN(other, Simulate(for_comm, cheap_w));
  EXPECT_LE(own.makespan, other.makespan);
}

TEST(ZbSearchTest, ActionGapsAndZeroCostsStillGiveValidSchedules) {
  CostModel costs = Uniform(1, 0, 0, 0);  // free backward: everything else waits on F
  costs.action_gap = 0.1;
  for (const char* name : {"zb-1p", "zb-2p"}) {
    for (int p : {1, 3, 5}) {
      SCOPED_TRACE(absl::StrCat(name, " P=", p));
      PS_ASSERT_OK_AND_ASSIGN(SimResult sim, Search(name, p, 7, costs));
      PS_ASSERT_OK_AND_ASSIGN(SimResult h1, Search("zb-h1", p, 7, costs));
      EXPECT_LE(sim.makespan, h1.makespan);
    }
  }
  // Nothing to order by: the search must still finish (no stall) with a valid schedule.
  PS_EXPECT_OK(Search("zb-2p", 3, 5, Uniform(0, 0, 0, 0)));
  // Per-action gaps, which the search's own clock does not see until it starts an action.
  CostModel gaps = Uniform(1, 1, 0.5, 0.2);
  for (int mb = 0; mb < 6; ++mb) gaps.gaps[{1, Op::kI, mb}] = 0.7;
  gaps.gaps[{2, Op::kF, 3}] = 2;
  PS_ASSERT_OK_AND_ASSIGN(SimResult with_gaps, Search("zb-2p", 3, 6, gaps));
  PS_ASSERT_OK_AND_ASSIGN(SimResult h1_gaps, Search("zb-h1", 3, 6, gaps));
  EXPECT_LE(with_gaps.makespan, h1_gaps.makespan);
}

TEST(ZbSearchTest, ZeroGradsAndOptimizerStepsCountAsSimulateCountsThem) {
  // Rank 1 zeroes its gradients for 4 before its first action: the search must see its
  // lane start there, as Simulate does, or it picks an order that only looks shorter.
  CostModel late;
  late.stages = {{.f = 2, .b = 2, .i = 1.5, .w = 0.5},
                 {.f = 0.5, .b = 2.5, .i = 0.5, .w = 2, .zero_grad = 4}};
  late.comm_uniform = 0.5;
  PS_ASSERT_OK_AND_ASSIGN(SimResult h1, Search("zb-h1", 2, 2, late));
  for (const char* name : {"zb-1p", "zb-2p"}) {
    PS_ASSERT_OK_AND_ASSIGN(SimResult searched, Search(name, 2, 2, late));
    EXPECT_LE(searched.step_time, h1.step_time) << name;
  }
  // Random zero-grads and optimizer steps: the whole step is never longer than zb-h1's.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> time(0.2, 2.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int p = 2 + static_cast<int>(rng() % 5);
    const int m = 1 + static_cast<int>(rng() % 12);
    CostModel costs = RandomStages(rng, p, /*phases=*/true);
    costs.comm_uniform = time(rng) / 4;
    costs.action_gap = time(rng) / 10;
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": P=", p, " M=", m));
    PS_ASSERT_OK_AND_ASSIGN(SimResult base, Search("zb-h1", p, m, costs));
    PS_ASSERT_OK_AND_ASSIGN(SimResult two, Search("zb-2p", p, m, costs));
    EXPECT_LE(two.step_time, base.step_time);
  }
}

// A stage with an all-reduce time has its gradients reduced after its last W, on the
// rank's comm lane, and its optimizer step waits for that (Simulate places the
// ALLREDUCE). The search must time its candidates so: a fuzzed cost model (stage 2
// reduces for 3 units) made zb-v-1p pick an order whose step was longer than zb-v's.
TEST(ZbSearchTest, AllReducesCountAsSimulateCountsThem) {
  CostModel fuzzed;
  fuzzed.uniform = {.f = 0, .b = 2, .i = 1, .w = 1, .allreduce = 1};
  fuzzed.stages = {
      {.f = 1.2, .b = 2.4, .i = 1, .w = 1, .allreduce = 1},
      {.f = 0.1, .b = 2, .i = 0.5, .w = 0.75, .allreduce = 1},
      {.f = 0, .b = 2, .i = 1, .w = 1, .allreduce = 3, .zero_grad = 0.25, .optimizer = 0.5},
      {.f = 0, .b = 2, .i = 1, .w = 1, .allreduce = 1}};
  fuzzed.comm = {1.1, 0.2, 0.3};
  fuzzed.action_gap = 0.05;
  const std::pair<const char*, const char*> pairs[] = {{"zb-v-1p", "zb-v"},
                                                       {"interleaved-zb-1p", "interleaved-zb"}};
  for (auto [searched, handcrafted] : pairs) {
    for (int m : {2, 3, 4}) {
      SCOPED_TRACE(absl::StrCat(searched, " M=", m));
      const GeneratorParams params{
          .num_ranks = 2, .num_microbatches = m, .num_chunks = 2, .costs = &fuzzed};
      absl::StatusOr<Schedule> base = GenerateSchedule(handcrafted, params);
      if (!base.ok()) continue;
      PS_ASSERT_OK_AND_ASSIGN(Schedule found, GenerateSchedule(searched, params));
      PS_ASSERT_OK_AND_ASSIGN(SimResult base_sim, Simulate(*base, fuzzed));
      if (PeakLive(base_sim) > 4) continue;  // above the search's limit: not a candidate
      PS_ASSERT_OK_AND_ASSIGN(SimResult found_sim, Simulate(found, fuzzed));
      EXPECT_LE(found_sim.step_time, base_sim.step_time * (1 + 1e-12));
    }
  }
  // Random all-reduce times on some stages, some given per action: never a longer step
  // than the handcrafted order.
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> time(0.2, 2.0);
  for (int trial = 0; trial < 60; ++trial) {
    const int p = 2 + static_cast<int>(rng() % 4);
    const int m = 1 + static_cast<int>(rng() % 10);
    const bool v_shaped = trial % 2 == 1;
    CostModel costs = RandomStages(rng, v_shaped ? 2 * p : p, /*phases=*/trial % 3 == 0);
    for (int s = 0; s < static_cast<int>(costs.stages.size()); ++s) {
      costs.stages[s].allreduce = rng() % 2 ? 4 * time(rng) : 0;
      // A per-action entry takes the all-reduce's place, in Simulate and in the search.
      if (costs.stages[s].allreduce > 0 && rng() % 2) {
        costs.actions[{s, Op::kAllReduce, -1}] = 10 * time(rng);
      }
    }
    costs.comm_uniform = (rng() % 3) * 0.25;
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": P=", p, " M=", m));
    const GeneratorParams params{
        .num_ranks = p, .num_microbatches = m, .num_chunks = v_shaped ? 2 : 1, .costs = &costs};
    PS_ASSERT_OK_AND_ASSIGN(Schedule base, GenerateSchedule(v_shaped ? "zb-v" : "zb-h1", params));
    PS_ASSERT_OK_AND_ASSIGN(Schedule found,
                            GenerateSchedule(v_shaped ? "zb-v-1p" : "zb-2p", params));
    PS_ASSERT_OK_AND_ASSIGN(SimResult base_sim, Simulate(base, costs));
    PS_ASSERT_OK_AND_ASSIGN(SimResult found_sim, Simulate(found, costs));
    EXPECT_LE(found_sim.step_time, base_sim.step_time * (1 + 1e-12));
  }
}

TEST(ZbSearchTest, VShapedSearchNeverSlowerThanZbV) {
  // zb-v-1p: zb-v's placement and peak (2P chunk activations), the order searched. With
  // unit costs and M >= 2P zb-v's steady state has no bubble and the search keeps its
  // order; with fewer micro-batches it fills zb-v's warm-up better (P=8, M=8: 55, as
  // interleaved-zb, against zb-v's 62).
  const CostModel unit;
  for (int p : {1, 2, 3, 4}) {
    for (int m : {2 * p, 3 * p}) {
      SCOPED_TRACE(absl::StrCat("P=", p, " M=", m));
      PS_ASSERT_OK_AND_ASSIGN(Schedule searched,
                              GenerateSchedule("zb-v-1p", {.num_ranks = p, .num_microbatches = m}));
      PS_ASSERT_OK_AND_ASSIGN(Schedule zbv,
                              GenerateSchedule("zb-v", {.num_ranks = p, .num_microbatches = m}));
      EXPECT_EQ(searched.programs, zbv.programs);
      EXPECT_EQ(searched.placement.kind, PlacementKind::kV);
    }
  }
  PS_ASSERT_OK_AND_ASSIGN(SimResult short_m, Search("zb-v-1p", 8, 8, unit));
  PS_ASSERT_OK_AND_ASSIGN(SimResult zbv_short_m, Search("zb-v", 8, 8, unit));
  EXPECT_DOUBLE_EQ(short_m.makespan, 55);
  EXPECT_DOUBLE_EQ(zbv_short_m.makespan, 62);
  // Uneven stages (2P of them) and transfers: never a longer step, never above 2P.
  std::mt19937 rng(5);
  int gains = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 6);
    const int m = 1 + static_cast<int>(rng() % 16);
    CostModel costs = RandomStages(rng, 2 * p, /*phases=*/trial % 2 == 1);
    costs.comm_uniform = (rng() % 3) * 0.25;
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": P=", p, " M=", m));
    PS_ASSERT_OK_AND_ASSIGN(SimResult zbv, Search("zb-v", p, m, costs));
    PS_ASSERT_OK_AND_ASSIGN(SimResult searched, Search("zb-v-1p", p, m, costs));
    for (const RankStats& rank : searched.ranks) {
      EXPECT_LE(rank.peak_live_microbatches, std::min(2 * p, 2 * m));
    }
    EXPECT_LE(searched.step_time, zbv.step_time);
    gains += searched.step_time < zbv.step_time;
  }
  EXPECT_GT(gains, 0);
  // Two stages' optimizer steps on one rank, summed as Simulate sums them: the other order
  // of the sum differs in the last bit (12.900000000000002 against 12.9) and made the
  // search prefer an order whose step is one rounding longer than zb-v's.
  CostModel rounding;
  rounding.stages = {{.f = 0.1, .b = 1.7, .i = 1, .w = 0.7, .zero_grad = 1.1, .optimizer = 0.2},
                     {.f = 0.2, .b = 3, .i = 2, .w = 1, .zero_grad = 2, .optimizer = 1.1},
                     {.f = 0.2, .b = 0.4, .i = 0.1, .w = 0.3, .zero_grad = 2, .optimizer = 1.1},
                     {.f = 0, .b = 2.7, .i = 0.7, .w = 2, .zero_grad = 0.3, .optimizer = 0.2}};
  rounding.comm_uniform = 0.2;
  rounding.action_gap = 0.3;
  PS_ASSERT_OK_AND_ASSIGN(SimResult zbv_rounding, Search("zb-v", 2, 1, rounding));
  PS_ASSERT_OK_AND_ASSIGN(SimResult searched_rounding, Search("zb-v-1p", 2, 1, rounding));
  EXPECT_LE(searched_rounding.step_time, zbv_rounding.step_time);
  EXPECT_THAT(GenerateSchedule("zb-v-1p", {.num_ranks = 4, .num_microbatches = 8, .num_chunks = 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("zb-v-1p runs exactly 2 chunks per rank (got V=1); use "
                                 "--virtual=2, or zb-1p for a searched schedule with one chunk")));
}

// zb-v-half and zb-v-min (V-Half, V-Min of Qi et al. 2024): zb-v's placement within
// 2 floor((P+2)/2) and 2 floor((P+4)/3) chunk activations. What a user relies on: the
// limit holds for any costs, the memory buys time against 1F1B at equal work, and with
// unit costs the steady state has no bubble (the makespan grows by exactly the work).
TEST(ZbSearchTest, VHalfAndVMinKeepTheirMemoryAndBeat1F1B) {
  EXPECT_EQ(ZbVHalfLimit(8), 10);  // 5 stages' worth against 1F1B's 8
  EXPECT_EQ(ZbVMinLimit(8), 8);    // 4
  EXPECT_EQ(ZbVMinLimit(16), 12);  // 6 against 16
  std::mt19937 rng(3);
  for (int p = 1; p <= 8; ++p) {
    for (int m : {1, p, 2 * p, 4 * p + 3}) {
      for (int trial = 0; trial < 3; ++trial) {
        CostModel costs;
        if (trial > 0) {
          costs = RandomStages(rng, 2 * p, /*phases=*/trial == 2);
          costs.comm_uniform = (rng() % 3) * 0.25;
        }
        SCOPED_TRACE(absl::StrCat("P=", p, " M=", m, " trial ", trial));
        for (const auto& [name, limit] :
             {std::pair{"zb-v-half", ZbVHalfLimit(p)}, std::pair{"zb-v-min", ZbVMinLimit(p)}}) {
          PS_ASSERT_OK_AND_ASSIGN(SimResult sim, Search(name, p, m, costs));
          EXPECT_LE(PeakLive(sim), std::min(limit, 2 * m)) << name;
        }
      }
    }
  }
  // Equal work: a chunk costs half a stage. P=8, M=32: 107.5 and 109.5 against 1F1B's 117
  // and zb-v's 99.5, with 5 and 4 stages' activations against their 8.
  const CostModel half_stage = Uniform(0.5, 0.5, 0.5, 0);
  for (int p : {4, 8, 16}) {
    SCOPED_TRACE(absl::StrCat("P=", p));
    const int m = 4 * p;
    PS_ASSERT_OK_AND_ASSIGN(SimResult one_f_one_b, Search("1f1b", p, m, Uniform(1, 1, 1, 0)));
    PS_ASSERT_OK_AND_ASSIGN(SimResult v_1p, Search("zb-v-1p", p, m, half_stage));
    PS_ASSERT_OK_AND_ASSIGN(SimResult v_half, Search("zb-v-half", p, m, half_stage));
    PS_ASSERT_OK_AND_ASSIGN(SimResult v_min, Search("zb-v-min", p, m, half_stage));
    EXPECT_LE(v_1p.makespan, v_half.makespan);
    EXPECT_LE(v_half.makespan, v_min.makespan);
    EXPECT_LT(v_min.makespan, one_f_one_b.makespan);
    if (p == 8) {
      EXPECT_DOUBLE_EQ(v_half.makespan, 107.5);
      EXPECT_DOUBLE_EQ(v_min.makespan, 109.5);
      EXPECT_DOUBLE_EQ(one_f_one_b.makespan, 117);
    }
  }
  // Unit costs per chunk: 6 per micro-batch on each rank, and no more in steady state.
  const CostModel unit;
  for (int p : {2, 4, 8}) {
    for (const char* name : {"zb-v-half", "zb-v-min"}) {
      SCOPED_TRACE(absl::StrCat(name, " P=", p));
      PS_ASSERT_OK_AND_ASSIGN(SimResult short_run, Search(name, p, 50, unit));
      PS_ASSERT_OK_AND_ASSIGN(SimResult long_run, Search(name, p, 200, unit));
      EXPECT_DOUBLE_EQ(long_run.makespan - 6 * 200, short_run.makespan - 6 * 50);
    }
  }
  EXPECT_THAT(
      GenerateSchedule("zb-v-min", {.num_ranks = 4, .num_microbatches = 8, .num_chunks = 3}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("zb-v-min runs exactly 2 chunks per rank (got V=3)")));
}

// interleaved-zb-1p: interleaved-zb's loop placement (V >= 2) within V P chunk
// activations, any M. It is never slower than interleaved-zb where that order exists and
// fits the limit, and with unit costs it is as fast; where M is not a multiple of P
// interleaved-zb holds more (P=4, M=6, V=2: 10 chunk activations) and the search stays
// within 8.
TEST(ZbSearchTest, InterleavedSearchKeepsItsMemoryAndNeverLosesToInterleavedZb) {
  std::mt19937 rng(13);
  int gains = 0, compared = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 6);
    const int v = 2 + static_cast<int>(rng() % 2);
    const int m = 1 + static_cast<int>(rng() % 16);
    CostModel costs;
    if (trial % 4 != 0) {
      costs = RandomStages(rng, v * p, /*phases=*/trial % 4 == 3);
      costs.comm_uniform = (rng() % 3) * 0.25;
    }
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": P=", p, " V=", v, " M=", m));
    PS_ASSERT_OK_AND_ASSIGN(
        Schedule schedule,
        GenerateSchedule(
            "interleaved-zb-1p",
            {.num_ranks = p, .num_microbatches = m, .num_chunks = v, .costs = &costs}));
    PS_ASSERT_OK(Validate(schedule));
    EXPECT_EQ(schedule.num_chunks(), v);
    EXPECT_EQ(schedule.placement.kind, PlacementKind::kLoop);
    PS_ASSERT_OK_AND_ASSIGN(SimResult searched, Simulate(schedule, costs));
    EXPECT_LE(PeakLive(searched), std::min(v * p, v * m));
    absl::StatusOr<Schedule> izb = GenerateSchedule(
        "interleaved-zb", {.num_ranks = p, .num_microbatches = m, .num_chunks = v});
    if (!izb.ok()) continue;  // M not in whole rounds: only the search runs it
    PS_ASSERT_OK_AND_ASSIGN(SimResult handcrafted, Simulate(*izb, costs));
    if (PeakLive(handcrafted) > v * p) continue;
    ++compared;
    EXPECT_LE(searched.step_time, handcrafted.step_time);
    if (trial % 4 == 0) {  // unit costs
      EXPECT_DOUBLE_EQ(searched.makespan, handcrafted.makespan);
    }
    gains += searched.step_time < handcrafted.step_time;
  }
  EXPECT_GT(compared, 20);
  EXPECT_GT(gains, 0);
  PS_ASSERT_OK_AND_ASSIGN(SimResult six, Search("interleaved-zb-1p", 4, 6, CostModel{}));
  EXPECT_EQ(PeakLive(six), 8);
  PS_ASSERT_OK_AND_ASSIGN(Schedule izb_six, GenerateSchedule("interleaved-zb", {4, 6, 2}));
  PS_ASSERT_OK_AND_ASSIGN(SimResult izb_six_sim, Simulate(izb_six, CostModel{}));
  EXPECT_EQ(PeakLive(izb_six_sim), 10);
  EXPECT_DOUBLE_EQ(six.makespan, izb_six_sim.makespan);
  EXPECT_THAT(GenerateSchedule("interleaved-zb-1p",
                               {.num_ranks = 4, .num_microbatches = 8, .num_chunks = 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("interleaved-zb-1p needs V >= 2 chunks per rank (got V=1); use "
                                 "--virtual=2 or more, or zb-1p for a searched schedule with one "
                                 "chunk")));
}

// GeneratorParams::max_activations replaces a searched schedule's own limit, in stages'
// worth (chunk activations / V): zb-v-1p held to 3 stages at P=4 is zb-v-half's search.
TEST(ZbSearchTest, MaxActivationsReplacesTheOwnLimit) {
  PS_ASSERT_OK_AND_ASSIGN(Schedule half, GenerateSchedule("zb-v-half", {4, 16, 2}));
  PS_ASSERT_OK_AND_ASSIGN(
      Schedule held,
      GenerateSchedule("zb-v-1p", {.num_ranks = 4, .num_microbatches = 16, .max_activations = 3}));
  EXPECT_EQ(held.programs, half.programs);
  std::mt19937 rng(17);
  for (int trial = 0; trial < 20; ++trial) {
    const int p = 2 + static_cast<int>(rng() % 5);
    const int m = 1 + static_cast<int>(rng() % 16);
    const double stages_worth = 1 + (rng() % 8) * 0.25;
    const CostModel two_chunks = RandomStages(rng, 2 * p, /*phases=*/false);
    CostModel one_chunk = two_chunks;  // one entry per virtual stage
    one_chunk.stages.resize(p);
    SCOPED_TRACE(absl::StrCat("P=", p, " M=", m, " limit ", stages_worth));
    for (const char* name : {"zb-v-1p", "zb-v-min", "zb-2p"}) {
      const int v = name[3] == 'v' ? 2 : 1;
      const CostModel& costs = v == 2 ? two_chunks : one_chunk;
      PS_ASSERT_OK_AND_ASSIGN(Schedule schedule,
                              GenerateSchedule(name, {.num_ranks = p,
                                                      .num_microbatches = m,
                                                      .costs = &costs,
                                                      .max_activations = stages_worth}));
      PS_ASSERT_OK(Validate(schedule));
      PS_ASSERT_OK_AND_ASSIGN(SimResult sim, Simulate(schedule, costs));
      EXPECT_LE(PeakLive(sim), static_cast<int>(std::floor(stages_worth * v))) << name;
    }
  }
  EXPECT_THAT(
      GenerateSchedule("zb-v-min", {.num_ranks = 4, .num_microbatches = 8, .max_activations = 0.5}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("zb-v-min cannot keep 0.5 stages' worth of activations per rank: a "
                         "micro-batch holds one on each of a rank's chunks; give a limit from 1 "
                         "to 65536, or 0 for zb-v-min's own")));
  // Costs for another shape are refused, not read for the wrong stages.
  const CostModel seven = RandomStages(rng, 7, /*phases=*/false);
  EXPECT_THAT(GenerateSchedule("zb-2p", {.num_ranks = 2, .num_microbatches = 4, .costs = &seven}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot search zb-2p for these costs: cost model: \"stages\" has "
                                 "7 entries but the schedule has 2 virtual stages")));
  // The others ignore it: their order fixes their memory.
  PS_ASSERT_OK_AND_ASSIGN(Schedule zbv, GenerateSchedule("zb-v", {4, 8, 2}));
  PS_ASSERT_OK_AND_ASSIGN(
      Schedule zbv_held,
      GenerateSchedule("zb-v", {.num_ranks = 4, .num_microbatches = 8, .max_activations = 1}));
  EXPECT_EQ(zbv_held.programs, zbv.programs);
}

TEST(ZbSearchTest, GivenDualPipeVsMemoryTheVSearchNeverLosesToIt) {
  // dualpipe-v holds 2P+1 chunk activations (P + 1/2 stages' worth): with that limit its
  // order, its B's run as I then W, is a candidate of the V searches. Split, a gradient
  // leaves as its I ends instead of after the whole B: P=4, M=8, transfers 0.05 take 25.8
  // against dualpipe-v's 26.1 (and zb-v-1p's own 26.15 at 2P).
  const CostModel comm = Uniform(0.5, 0.5, 0.5, 0.05);
  PS_ASSERT_OK_AND_ASSIGN(SimResult dualpipe, Search("dualpipe-v", 4, 8, comm));
  EXPECT_DOUBLE_EQ(dualpipe.makespan, 26.1);
  EXPECT_EQ(PeakLive(dualpipe), 9);
  PS_ASSERT_OK_AND_ASSIGN(SimResult own, Search("zb-v-1p", 4, 8, comm));
  EXPECT_DOUBLE_EQ(own.makespan, 26.15);
  PS_ASSERT_OK_AND_ASSIGN(Schedule held, GenerateSchedule("zb-v-1p", {.num_ranks = 4,
                                                                      .num_microbatches = 8,
                                                                      .costs = &comm,
                                                                      .max_activations = 4.5}));
  PS_ASSERT_OK(Validate(held));
  PS_ASSERT_OK_AND_ASSIGN(SimResult held_sim, Simulate(held, comm));
  EXPECT_DOUBLE_EQ(held_sim.makespan, 25.8);
  EXPECT_EQ(PeakLive(held_sim), 9);

  std::mt19937 rng(29);
  for (int trial = 0; trial < 20; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 6);
    const int m = 2 * p + static_cast<int>(rng() % 12);
    CostModel costs = RandomStages(rng, 2 * p, /*phases=*/false);
    costs.comm_uniform = (rng() % 3) * 0.25;
    SCOPED_TRACE(absl::StrCat("P=", p, " M=", m));
    PS_ASSERT_OK_AND_ASSIGN(SimResult fixed, Search("dualpipe-v", p, m, costs));
    for (const char* name : {"zb-v-1p", "zb-v-half", "zb-v-min"}) {
      PS_ASSERT_OK_AND_ASSIGN(Schedule searched,
                              GenerateSchedule(name, {.num_ranks = p,
                                                      .num_microbatches = m,
                                                      .costs = &costs,
                                                      .max_activations = p + 0.5}));
      PS_ASSERT_OK(Validate(searched));
      PS_ASSERT_OK_AND_ASSIGN(SimResult sim, Simulate(searched, costs));
      EXPECT_LE(sim.makespan, fixed.makespan * (1 + 1e-9)) << name;
      EXPECT_LE(PeakLive(sim), 2 * p + 1) << name;
    }
  }
}

TEST(ZbSearchTest, CostsItCannotTimeAreInvalidArgument) {
  CostModel negative = Uniform(1, 1, 1, 0);
  negative.stages = {{}, {.f = -1}};
  EXPECT_THAT(
      GenerateSchedule("zb-1p", {.num_ranks = 2, .num_microbatches = 4, .costs = &negative}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("cannot search a schedule for these costs: stage 1's f is -1")));
  CostModel nan_gap = Uniform(1, 1, 1, 0);
  nan_gap.action_gap = std::nan("");
  EXPECT_THAT(GenerateSchedule("zb-2p", {.num_ranks = 2, .num_microbatches = 4, .costs = &nan_gap}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the action gap is nan")));
}

// The limits (2P, V*P, ZbVHalfLimit(P), ...) are taken after the parameter checks: P =
// INT_MAX overflowed 2 * P before (UB, caught by UBSan), now it is the same error as
// every other generator's.
TEST(ZbSearchTest, ExtremeRankCountsAreTheGeneratorsErrors) {
  for (const char* name :
       {"zb-1p", "zb-2p", "zb-v-1p", "interleaved-zb-1p", "zb-v-half", "zb-v-min"}) {
    EXPECT_THAT(GenerateSchedule(
                    name, {.num_ranks = std::numeric_limits<int>::max(), .num_microbatches = 1}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat(name,
                                                " supports at most 65536 ranks (got "
                                                "P=2147483647)"))));
    EXPECT_THAT(GenerateSchedule(
                    name, {.num_ranks = std::numeric_limits<int>::min(), .num_microbatches = 1}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat(name,
                                                " needs at least one pipeline rank (got "
                                                "P=-2147483648)"))));
  }
}

// Every time in the model is checked, not only those the search reads.
TEST(ZbSearchTest, CostsOutsideTheirRangesAreRefusedByName) {
  CostModel costs = Uniform(1, 1, 1, 0);
  costs.uniform.b = -10;
  EXPECT_THAT(GenerateSchedule("zb-2p", {.num_ranks = 2, .num_microbatches = 4, .costs = &costs}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot search a schedule for these costs: the default b is -10, "
                                 "not a valid time; give a number in [0, 1e+15]")));
  costs.uniform.b = 2;
  costs.uniform.workspace_bytes = -1;
  EXPECT_THAT(GenerateSchedule("zb-1p", {.num_ranks = 2, .num_microbatches = 4, .costs = &costs}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the default workspace_bytes is -1, not a valid byte count")));
}

TEST(ZbSearchTest, RefusesOtherChunkCounts) {
  EXPECT_THAT(
      GenerateSchedule("zb-1p", {.num_ranks = 4, .num_microbatches = 8, .num_chunks = 2}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("zb-1p runs exactly 1 chunk per rank (got V=2); use --virtual=1")));
  EXPECT_THAT(GenerateSchedule("zb-2p", {.num_ranks = 0, .num_microbatches = 8}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("zb-2p needs at least one pipeline rank")));
}

// GeneratorParams::refine: the searched order improved by local search. What a user
// relies on: never a longer step than the search's own order, still valid and within the
// schedule's limit, the same answer every time, and shorter where single moves help.
TEST(ZbSearchTest, RefineNeverLengthensTheStepAndKeepsTheLimit) {
  struct Shape {
    const char* name;
    int chunks;
    int (*limit)(int p);  // chunk activations per rank
  };
  const Shape shapes[] = {
      {"zb-1p", 1, [](int p) { return p; }},
      {"zb-2p", 1, [](int p) { return 2 * p; }},
      {"zb-v-1p", 2, [](int p) { return 2 * p; }},
      {"zb-v-half", 2, &ZbVHalfLimit},
      {"zb-v-min", 2, &ZbVMinLimit},
      {"interleaved-zb-1p", 2, [](int p) { return 2 * p; }},
  };
  std::mt19937 rng(29);
  int gains = 0;
  for (const Shape& shape : shapes) {
    for (int trial = 0; trial < 6; ++trial) {
      const int p = 2 + static_cast<int>(rng() % 3);
      const int m = 2 + static_cast<int>(rng() % 7);
      CostModel costs = RandomStages(rng, shape.chunks * p, /*phases=*/trial % 4 == 3);
      costs.comm_uniform = (rng() % 3) * 0.1;
      SCOPED_TRACE(absl::StrCat(shape.name, " P=", p, " M=", m, " trial ", trial));
      GeneratorParams params{.num_ranks = p, .num_microbatches = m, .costs = &costs};
      PS_ASSERT_OK_AND_ASSIGN(Schedule searched, GenerateSchedule(shape.name, params));
      params.refine = true;
      PS_ASSERT_OK_AND_ASSIGN(Schedule refined, GenerateSchedule(shape.name, params));
      PS_ASSERT_OK(Validate(refined));
      EXPECT_EQ(refined.name, shape.name);
      PS_ASSERT_OK_AND_ASSIGN(SimResult before, Simulate(searched, costs));
      PS_ASSERT_OK_AND_ASSIGN(SimResult after, Simulate(refined, costs));
      EXPECT_LE(after.step_time, before.step_time);
      EXPECT_LE(PeakLive(after), std::min(shape.limit(p), shape.chunks * m));
      gains += after.step_time < before.step_time;
      PS_ASSERT_OK_AND_ASSIGN(Schedule again, GenerateSchedule(shape.name, params));
      EXPECT_EQ(again.programs, refined.programs);
    }
  }
  EXPECT_GT(gains, 10) << "of 36";
}

TEST(ZbSearchTest, RefineShortensAnUnevenPipeline) {
  // Four uneven stages (docs/schedules.md's example): the search's zb-1p order takes 48.9,
  // the refined one 48.2 within the same 4 activations per rank; at the one-step bound
  // (unit costs) there is nothing to gain and zb-h1's order stays.
  const CostModel costs = testing::UnevenFourStages();
  GeneratorParams params{.num_ranks = 4, .num_microbatches = 12, .costs = &costs};
  PS_ASSERT_OK_AND_ASSIGN(Schedule searched, GenerateSchedule("zb-1p", params));
  params.refine = true;
  PS_ASSERT_OK_AND_ASSIGN(Schedule refined, GenerateSchedule("zb-1p", params));
  PS_ASSERT_OK_AND_ASSIGN(SimResult before, Simulate(searched, costs));
  PS_ASSERT_OK_AND_ASSIGN(SimResult after, Simulate(refined, costs));
  EXPECT_NEAR(before.step_time, 48.9, 1e-9);
  EXPECT_NEAR(after.step_time, 48.2, 1e-9);
  EXPECT_LE(PeakLive(after), 4);
  // With --max-activations the refinement keeps that limit instead.
  params.max_activations = 2;
  PS_ASSERT_OK_AND_ASSIGN(Schedule tight, GenerateSchedule("zb-1p", params));
  PS_ASSERT_OK_AND_ASSIGN(SimResult tight_sim, Simulate(tight, costs));
  EXPECT_LE(PeakLive(tight_sim), 2);
  for (int p : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("unit costs, P=", p));
    PS_ASSERT_OK_AND_ASSIGN(
        Schedule unit,
        GenerateSchedule("zb-1p", {.num_ranks = p, .num_microbatches = 8, .refine = true}));
    PS_ASSERT_OK_AND_ASSIGN(Schedule h1,
                            GenerateSchedule("zb-h1", {.num_ranks = p, .num_microbatches = 8}));
    EXPECT_EQ(unit.programs, h1.programs);
  }
}

// RefineSchedule: any order with I and W split, refined within its own peak. zb-v with
// transfers of 0.3 (P=4, M=8): 54.9 -> 53.7 in the same activations; a schedule with B, or
// lowered, is refused by name.
TEST(ZbSearchTest, RefineScheduleImprovesAnyOrderWithASplitBackward) {
  const CostModel costs = Uniform(1, 1, 1, 0.3);
  PS_ASSERT_OK_AND_ASSIGN(Schedule zb_v,
                          GenerateSchedule("zb-v", {.num_ranks = 4, .num_microbatches = 8}));
  PS_ASSERT_OK_AND_ASSIGN(Schedule refined, RefineSchedule(zb_v, costs));
  PS_ASSERT_OK(Validate(refined));
  EXPECT_EQ(refined.name, "zb-v");
  EXPECT_EQ(refined.placement.kind, PlacementKind::kV);
  PS_ASSERT_OK_AND_ASSIGN(SimResult before, Simulate(zb_v, costs));
  PS_ASSERT_OK_AND_ASSIGN(SimResult after, Simulate(refined, costs));
  EXPECT_NEAR(before.step_time, 54.9, 1e-9);
  EXPECT_NEAR(after.step_time, 53.7, 1e-9);
  EXPECT_LE(PeakLive(after), PeakLive(before));
  // At the one-step bound (unit costs) zb-h1's order has nothing to gain and stays.
  PS_ASSERT_OK_AND_ASSIGN(Schedule h1,
                          GenerateSchedule("zb-h1", {.num_ranks = 4, .num_microbatches = 8}));
  PS_ASSERT_OK_AND_ASSIGN(Schedule same, RefineSchedule(h1, CostModel{}));
  EXPECT_EQ(same.programs, h1.programs);

  PS_ASSERT_OK_AND_ASSIGN(Schedule one_f_one_b,
                          GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 2}));
  EXPECT_THAT(RefineSchedule(one_f_one_b, CostModel{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot refine 1f1b: rank 0 runs 0B0, and the refinement moves "
                                 "only F, I and W actions; give a schedule whose backward is "
                                 "split into I and W")));
  PS_ASSERT_OK_AND_ASSIGN(Schedule reduced, PlaceAllReduce(h1, 2));
  EXPECT_THAT(RefineSchedule(reduced, CostModel{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("refine the schedule before its transfers and all-reduces are "
                                 "lowered into it")));
  CostModel negative = costs;
  negative.uniform.f = -1;
  EXPECT_THAT(RefineSchedule(zb_v, negative),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot refine zb-v for")));
}

}  // namespace
}  // namespace pipesched::scheduler
