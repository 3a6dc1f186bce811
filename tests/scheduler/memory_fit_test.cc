// SearchWithinMemory: a searched schedule held to a device's bytes. What a user relies on:
// the order returned fits, it is the loosest limit that fits (one more chunk activation
// would not), it is the order the search gives for that limit, and when nothing fits the
// message says how far off the tightest order is.
#include "pipesched/scheduler/memory_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/scheduler/validate.h"
#include "test_costs.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

CostModel UnitCostsWithBytes(std::int64_t activation_bytes, double comm = 0) {
  CostModel costs;
  costs.uniform = {.f = 1, .b = 2, .i = 1, .w = 1, .activation_bytes = activation_bytes};
  costs.comm_uniform = comm;
  return costs;
}

// Peak bytes of the search's order for `name` within `stages_worth` (0: its own limit).
std::int64_t PeakAt(const std::string& name, GeneratorParams params, const CostModel& costs,
                    double stages_worth) {
  params.max_activations = stages_worth;
  absl::StatusOr<Schedule> schedule = GenerateSchedule(name, params);
  if (!schedule.ok()) return -1;
  absl::StatusOr<SimResult> sim = Simulate(*schedule, costs);
  return sim.ok() ? PeakBytes(*sim) : -1;
}

// With transfers of half an F, zb-2p uses its 2P = 8 micro-batches at P=4 (unit costs
// need only P).
TEST(MemoryFitTest, TheOwnLimitIsKeptWhenItFits) {
  const CostModel costs = UnitCostsWithBytes(kMiB, 0.5);
  const GeneratorParams params{.num_ranks = 4, .num_microbatches = 16, .costs = &costs};
  PS_ASSERT_OK_AND_ASSIGN(MemoryFit fit, SearchWithinMemory("zb-2p", params, costs, 8 * kMiB));
  PS_ASSERT_OK_AND_ASSIGN(Schedule own, GenerateSchedule("zb-2p", params));
  EXPECT_EQ(fit.schedule.programs, own.programs);
  EXPECT_EQ(fit.max_activations, 0);
  EXPECT_EQ(fit.searches, 1);
  EXPECT_EQ(fit.own_peak_bytes, 8 * kMiB);  // 2P micro-batches of 1 MiB on rank 0
  EXPECT_EQ(PeakBytes(fit.sim), 8 * kMiB);
}

// zb-2p holds 2P = 8 micro-batches at P=4; in 5 MiB the search is held to 5, which is
// slower than 8 but faster than 1F1B's 4 (both at 1 MiB each).
TEST(MemoryFitTest, ZeroBubbleTwoPInLessMemoryTakesTheLoosestLimitThatFits) {
  const CostModel costs = UnitCostsWithBytes(kMiB, 0.5);
  const GeneratorParams params{.num_ranks = 4, .num_microbatches = 16, .costs = &costs};
  PS_ASSERT_OK_AND_ASSIGN(MemoryFit fit, SearchWithinMemory("zb-2p", params, costs, 5 * kMiB));
  EXPECT_EQ(fit.max_activations, 5);
  EXPECT_EQ(PeakBytes(fit.sim), 5 * kMiB);
  EXPECT_EQ(fit.own_peak_bytes, 8 * kMiB);
  EXPECT_EQ(PeakAt("zb-2p", params, costs, 6), 6 * kMiB);  // one more does not fit
  PS_ASSERT_OK_AND_ASSIGN(Schedule at_five, GenerateSchedule("zb-2p", {.num_ranks = 4,
                                                                       .num_microbatches = 16,
                                                                       .costs = &costs,
                                                                       .max_activations = 5}));
  EXPECT_EQ(fit.schedule.programs, at_five.programs);
  PS_EXPECT_OK(Validate(fit.schedule));
  // Bisection over [1, 7]: 4, 6, 5.
  EXPECT_EQ(fit.searches, 4);
  PS_ASSERT_OK_AND_ASSIGN(Schedule f1b, GenerateSchedule("1f1b", {4, 16}));
  PS_ASSERT_OK_AND_ASSIGN(SimResult f1b_sim, Simulate(f1b, costs));
  PS_ASSERT_OK_AND_ASSIGN(MemoryFit own, SearchWithinMemory("zb-2p", params, costs, 8 * kMiB));
  EXPECT_LT(fit.sim.makespan, f1b_sim.makespan);
  EXPECT_GE(fit.sim.makespan, own.sim.makespan);
}

// On zb-v's placement a limit moves in half stages (one chunk activation of two); the
// bytes of a chunk are half a stage's.
TEST(MemoryFitTest, VPlacementLimitsMoveByOneChunk) {
  const CostModel costs = UnitCostsWithBytes(kMiB / 2);  // per chunk: a stage is 1 MiB
  const GeneratorParams params{.num_ranks = 4, .num_microbatches = 16, .costs = &costs};
  PS_ASSERT_OK_AND_ASSIGN(MemoryFit fit,
                          SearchWithinMemory("zb-v-1p", params, costs, 3 * kMiB + kMiB / 2));
  EXPECT_EQ(fit.max_activations, 3.5);
  EXPECT_LE(PeakBytes(fit.sim), 3 * kMiB + kMiB / 2);
  EXPECT_GT(PeakAt("zb-v-1p", params, costs, 4), 3 * kMiB + kMiB / 2);
  PS_EXPECT_OK(Validate(fit.schedule));
}

// Stages whose activations differ: the bytes, not the count, decide. Rank 0's stage holds
// 4 MiB per micro-batch, the others 1 MiB: 12 MiB allows 3 micro-batches there.
TEST(MemoryFitTest, UnevenStagesAreHeldByTheirBytes) {
  CostModel costs = UnitCostsWithBytes(kMiB);
  costs.stages.assign(4, costs.uniform);
  costs.stages[0].activation_bytes = 4 * kMiB;
  const GeneratorParams params{.num_ranks = 4, .num_microbatches = 12, .costs = &costs};
  PS_ASSERT_OK_AND_ASSIGN(MemoryFit fit, SearchWithinMemory("zb-1p", params, costs, 12 * kMiB));
  EXPECT_EQ(fit.own_peak_bytes, 16 * kMiB);  // P = 4 micro-batches on rank 0
  EXPECT_EQ(fit.max_activations, 3);
  EXPECT_EQ(fit.sim.ranks[0].peak_live_bytes, 12 * kMiB);
}

// Random per-stage times and bytes: whatever is returned fits, and one chunk activation
// more would not (or gives no order).
TEST(MemoryFitTest, RandomModelsFitAndOneMoreWouldNot) {
  std::mt19937 rng(5);
  int tightened = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int p = 2 + static_cast<int>(rng() % 4);
    const int m = 2 + static_cast<int>(rng() % 14);
    const std::string name = trial % 3 == 0 ? "zb-v-1p" : (trial % 3 == 1 ? "zb-2p" : "zb-1p");
    const int v = name == "zb-v-1p" ? 2 : 1;
    const CostModel costs = testing::RandomStages(rng, p * v, /*phases=*/false, /*max_mib=*/8);
    const GeneratorParams params{.num_ranks = p, .num_microbatches = m, .costs = &costs};
    const std::int64_t own = PeakAt(name, params, costs, 0);
    const std::int64_t capacity = own / 2 + static_cast<std::int64_t>(rng() % (own / 2));
    SCOPED_TRACE(absl::StrCat(name, " P=", p, " M=", m, " capacity ", capacity, " own ", own));
    absl::StatusOr<MemoryFit> fit = SearchWithinMemory(name, params, costs, capacity);
    if (!fit.ok()) {
      EXPECT_THAT(fit, StatusIs(absl::StatusCode::kResourceExhausted,
                                HasSubstr("even when searched within one stage's worth")));
      EXPECT_GT(PeakAt(name, params, costs, 1), capacity);
      continue;
    }
    EXPECT_LE(PeakBytes(fit->sim), capacity);
    PS_EXPECT_OK(Validate(fit->schedule));
    if (fit->max_activations > 0) {
      ++tightened;
      const std::int64_t looser = PeakAt(name, params, costs, fit->max_activations + 1.0 / v);
      EXPECT_TRUE(looser < 0 || looser > capacity) << looser;
    }
  }
  EXPECT_GE(tightened, 12);  // most capacities are below the own order's peak
}

// GeneratorParams::refine: the limit is chosen from the orders as searched (a refined
// order may use more of a limit, which would choose a tighter one), and the order returned
// is refined only where the refined one fits too. So --refine within a device never takes
// a longer step than without it, and always fits.
TEST(MemoryFitTest, RefineNeverCostsTheFitAndNeverLengthensTheStep) {
  std::mt19937 rng(17);
  int shorter = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int p = 2 + static_cast<int>(rng() % 3);
    const int m = 2 + static_cast<int>(rng() % 8);
    const std::string name = trial % 2 == 0 ? "zb-v-min" : "zb-1p";
    const int v = name == "zb-v-min" ? 2 : 1;
    const CostModel costs = testing::RandomStages(rng, p * v, /*phases=*/false, /*max_mib=*/4);
    GeneratorParams params{.num_ranks = p, .num_microbatches = m, .costs = &costs};
    const std::int64_t own = PeakAt(name, params, costs, 0);
    const std::int64_t capacity = own / 2 + static_cast<std::int64_t>(rng() % own);
    SCOPED_TRACE(absl::StrCat(name, " P=", p, " M=", m, " capacity ", capacity, " own ", own));
    absl::StatusOr<MemoryFit> plain = SearchWithinMemory(name, params, costs, capacity);
    params.refine = true;
    absl::StatusOr<MemoryFit> refined = SearchWithinMemory(name, params, costs, capacity);
    ASSERT_EQ(plain.ok(), refined.ok()) << refined.status();
    if (!plain.ok()) continue;
    EXPECT_FALSE(plain->unrefined_step_time.has_value());
    EXPECT_EQ(refined->max_activations, plain->max_activations);  // the same limit
    EXPECT_LE(PeakBytes(refined->sim), capacity);
    PS_EXPECT_OK(Validate(refined->schedule));
    ASSERT_TRUE(refined->unrefined_step_time.has_value());
    EXPECT_EQ(*refined->unrefined_step_time, plain->sim.step_time);
    EXPECT_LE(refined->sim.step_time, plain->sim.step_time);
    if (refined->refined_too_large) {
      EXPECT_EQ(refined->schedule.programs, plain->schedule.programs);
    }
    shorter += refined->sim.step_time < plain->sim.step_time;
  }
  EXPECT_GE(shorter, 3) << "of 12";
}

// What each stage holds whatever the order comes off the device first: 8 MiB with 3 MiB
// static leaves 5 MiB for zb-2p's activations, as in 5 MiB without it.
TEST(MemoryFitTest, StaticBytesComeOffTheDeviceFirst) {
  CostModel costs = UnitCostsWithBytes(kMiB, 0.5);
  costs.uniform.static_bytes = 3 * kMiB;
  const GeneratorParams params{.num_ranks = 4, .num_microbatches = 16, .costs = &costs};
  PS_ASSERT_OK_AND_ASSIGN(MemoryFit fit, SearchWithinMemory("zb-2p", params, costs, 8 * kMiB));
  EXPECT_EQ(fit.max_activations, 5);
  EXPECT_EQ(fit.chunk_activations, 5);
  EXPECT_EQ(fit.own_peak_bytes, 11 * kMiB);
  EXPECT_EQ(PeakBytes(fit.sim), 8 * kMiB);
  EXPECT_EQ(fit.sim.ranks[0].static_bytes, 3 * kMiB);
  // Static bytes that take the whole device: no limit helps, and the message says why,
  // before any search within a limit.
  EXPECT_THAT(SearchWithinMemory("zb-2p", params, costs, 3 * kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "zb-2p cannot fit in 3.00 MiB per device: rank 0's parameters, gradients "
                       "and optimizer state (static_bytes) alone take 3.00 MiB, none left for "
                       "activations; give more "
                       "memory, or more stages (fewer layers on each device)"));
  // Just above them, one stage's worth is what is left: a micro-batch of 1 MiB does not fit
  // in 0.5 MiB, and the message counts the static bytes in the peak.
  EXPECT_THAT(
      SearchWithinMemory("zb-2p", params, costs, 3 * kMiB + kMiB / 2),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("rank 0 peaks at 4.00 MiB")));
  // Given the own order and its simulation, the same fit without searching it again.
  PS_ASSERT_OK_AND_ASSIGN(Schedule own, GenerateSchedule("zb-2p", params));
  PS_ASSERT_OK_AND_ASSIGN(SimResult own_sim, Simulate(own, costs));
  PS_ASSERT_OK_AND_ASSIGN(MemoryFit again,
                          SearchWithinMemory("zb-2p", params, costs, 8 * kMiB, own, own_sim));
  EXPECT_EQ(again.schedule.programs, fit.schedule.programs);
  EXPECT_EQ(again.searches, fit.searches);
}

// 100 bytes per micro-batch, 10 of them the received input.
CostModel HundredBytesTenOfThemInput() {
  CostModel costs;
  costs.uniform.activation_bytes = 100;
  costs.uniform.input_bytes = 10;
  return costs;
}

// Selective recomputation within a device: 1F1B P=4 M=8, 100 bytes per micro-batch of
// which 10 are the received input, peaks at 400/310/210/110. In 250 bytes rank 0 and then
// rank 1 recompute their stage (4 x 10 + 90, 3 x 10 + 90 + the next input); rank 2 fits
// as it is. Their longer backwards make a step of 40, where every stage recomputing
// would take 44 and none 33.
TEST(MemoryFitTest, RecomputeWithinMemoryRecomputesWhereARankDoesNotFit) {
  PS_ASSERT_OK_AND_ASSIGN(const Schedule s,
                          GenerateSchedule("1f1b", {.num_ranks = 4, .num_microbatches = 8}));
  const CostModel costs = HundredBytesTenOfThemInput();
  PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit fit, RecomputeWithinMemory(s, costs, 250));
  EXPECT_EQ(fit.stages, (std::vector<int>{0, 1}));
  ASSERT_EQ(fit.sim.ranks.size(), 4u);
  EXPECT_EQ(fit.sim.ranks[0].peak_live_bytes, 130);
  EXPECT_EQ(fit.sim.ranks[1].peak_live_bytes, 130);
  EXPECT_EQ(fit.sim.ranks[2].peak_live_bytes, 210);
  EXPECT_EQ(fit.sim.ranks[3].peak_live_bytes, 110);
  EXPECT_EQ(fit.without.ranks[0].peak_live_bytes, 400);
  EXPECT_DOUBLE_EQ(fit.without.step_time, 33);
  EXPECT_DOUBLE_EQ(fit.sim.step_time, 40);
  EXPECT_EQ(fit.costs.stages.size(), 4u);
  EXPECT_EQ(fit.costs.stages[0].recompute_bytes, 90);
  EXPECT_EQ(fit.costs.stages[2].recompute_bytes, 0);
  PS_ASSERT_OK_AND_ASSIGN(const CostModel all, WithRecompute(costs));
  PS_ASSERT_OK_AND_ASSIGN(const SimResult every, Simulate(s, all));
  EXPECT_DOUBLE_EQ(every.step_time, 44);
  // Room for all of it: nothing recomputes.
  PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit roomy, RecomputeWithinMemory(s, costs, 400));
  EXPECT_TRUE(roomy.stages.empty());
  EXPECT_DOUBLE_EQ(roomy.sim.step_time, 33);
  // 100 bytes: rank 0 still holds 4 inputs and one rebuilt stage, 130.
  EXPECT_THAT(RecomputeWithinMemory(s, costs, 100),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("rank 0 does not fit in 100 B per device even with every stage "
                                 "of it recomputing its activations: it peaks at 130 B")));
  EXPECT_THAT(RecomputeWithinMemory(s, costs, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1 byte")));
}

// Each of `ranks` ranks on a memory of its own with `capacity` bytes.
std::vector<SharedMemory> EachAlone(int ranks, std::int64_t capacity) {
  std::vector<SharedMemory> memories;
  for (int r = 0; r < ranks; ++r) {
    memories.push_back(
        {.name = absl::StrCat("device ", r), .ranks = {r}, .capacity_bytes = capacity});
  }
  return memories;
}

// `costs` recomputing as pipesched's executor does: keeping 40 (input and boundary
// buffers), rebuilding 60, B and I each one F longer.
CostModel KeepingForty(CostModel costs) {
  costs.uniform.activation_bytes = 40;
  costs.uniform.recompute_bytes = 60;
  costs.uniform.b += costs.uniform.f;
  costs.uniform.i += costs.uniform.f;
  return costs;
}

// With what a stage costs when it recomputes given: the same 1F1B as above, but a
// recomputing stage keeps 40 of its 100 bytes (its input and 30 of boundary buffers, as
// pipesched's executor does), not only the 10 of its input. In 250 bytes per rank ranks 0
// and 1 still recompute, and peak at 4 x 40 + 60 = 220 and 3 x 40 + 60 + the next input
// = 190; 200 bytes, which the derived costs fit, is then too little for rank 0.
TEST(MemoryFitTest, RecomputeWithinMemoryTakesTheGivenRecomputingCosts) {
  PS_ASSERT_OK_AND_ASSIGN(const Schedule s,
                          GenerateSchedule("1f1b", {.num_ranks = 4, .num_microbatches = 8}));
  const CostModel costs = HundredBytesTenOfThemInput();
  const CostModel recomputing = KeepingForty(costs);
  PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit fit,
                          RecomputeWithinMemory(s, costs, recomputing, EachAlone(4, 250)));
  EXPECT_EQ(fit.stages, (std::vector<int>{0, 1}));
  ASSERT_EQ(fit.sim.ranks.size(), 4u);
  EXPECT_EQ(fit.sim.ranks[0].peak_live_bytes, 220);
  EXPECT_EQ(fit.sim.ranks[1].peak_live_bytes, 190);
  EXPECT_EQ(fit.sim.ranks[2].peak_live_bytes, 210);
  EXPECT_EQ(fit.without.ranks[0].peak_live_bytes, 400);
  EXPECT_DOUBLE_EQ(fit.sim.step_time, 40);  // the same longer backwards as derived
  ASSERT_EQ(fit.costs.stages.size(), 4u);
  EXPECT_EQ(fit.costs.stages[0].activation_bytes, 40);
  EXPECT_EQ(fit.costs.stages[2].activation_bytes, 100);
  PS_ASSERT_OK(RecomputeWithinMemory(s, costs, 200).status());
  EXPECT_THAT(RecomputeWithinMemory(s, costs, recomputing, EachAlone(4, 200)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("device 0 does not fit: its rank peaks at 220 B but it has "
                                 "200 B, with every stage there that can recompute recomputing")));
  // Only stages that recompute in `recomputing` and not in `costs` are candidates.
  CostModel never = costs;
  EXPECT_THAT(RecomputeWithinMemory(s, costs, never, EachAlone(4, 250)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("device 0 does not fit")));
  CostModel short_list = recomputing;
  short_list.stages.assign(3, recomputing.uniform);
  EXPECT_THAT(RecomputeWithinMemory(s, costs, short_list, EachAlone(4, 250)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the recomputing costs have 3 stages, the schedule 4")));
  CostModel replayed = costs;
  replayed.actions[{0, Op::kF, 0}] = 1;
  EXPECT_THAT(
      RecomputeWithinMemory(s, replayed, recomputing, EachAlone(4, 250)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("per-action durations in the costs")));
  EXPECT_THAT(RecomputeWithinMemory(s, costs, recomputing, EachAlone(5, 250)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("device 4 holds rank 4, but the schedule has ranks 0 to 3")));
  EXPECT_THAT(RecomputeWithinMemory(s, costs, recomputing, EachAlone(4, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1 byte")));
}

// Ranks that share a memory are held to it together: ranks 0 and 1 (400 + 310 without)
// on one GPU of 540 need only stage 0 (220 + 310 = 530), where each alone in 270 would
// need both; in 500 they need both (220 + 190 = 410), and 400 is too little even so.
// Ranks 2 and 3 (210 + 110) fit 400 together as they are.
TEST(MemoryFitTest, RecomputeWithinMemoryHoldsRanksSharingAMemoryTogether) {
  PS_ASSERT_OK_AND_ASSIGN(const Schedule s,
                          GenerateSchedule("1f1b", {.num_ranks = 4, .num_microbatches = 8}));
  const CostModel costs = HundredBytesTenOfThemInput();
  const CostModel recomputing = KeepingForty(costs);
  auto two_gpus = [](std::int64_t first) {
    return std::vector<SharedMemory>{{.name = "gpu 0", .ranks = {0, 1}, .capacity_bytes = first},
                                     {.name = "gpu 1", .ranks = {2, 3}, .capacity_bytes = 400}};
  };
  PS_ASSERT_OK_AND_ASSIGN(RecomputeFit fit,
                          RecomputeWithinMemory(s, costs, recomputing, two_gpus(540)));
  EXPECT_EQ(fit.stages, (std::vector<int>{0}));
  PS_ASSERT_OK_AND_ASSIGN(fit, RecomputeWithinMemory(s, costs, recomputing, EachAlone(4, 270)));
  EXPECT_EQ(fit.stages, (std::vector<int>{0, 1}));
  PS_ASSERT_OK_AND_ASSIGN(fit, RecomputeWithinMemory(s, costs, recomputing, two_gpus(500)));
  EXPECT_EQ(fit.stages, (std::vector<int>{0, 1}));
  EXPECT_THAT(RecomputeWithinMemory(s, costs, recomputing, two_gpus(400)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("gpu 0 does not fit: its ranks peak at 410 B but it has 400 B")));
  // A memory all four share (the host's), 1030 without: 850 with stage 0 is still above
  // 800, and stage 1 lowers the sum more (to 730) than stage 2 would (790).
  PS_ASSERT_OK_AND_ASSIGN(
      fit, RecomputeWithinMemory(
               s, costs, recomputing,
               {{.name = "host memory", .ranks = {0, 1, 2, 3}, .capacity_bytes = 800}}));
  EXPECT_EQ(fit.stages, (std::vector<int>{0, 1}));
  EXPECT_LE(fit.sim.ranks[0].peak_live_bytes + fit.sim.ranks[1].peak_live_bytes +
                fit.sim.ranks[2].peak_live_bytes + fit.sim.ranks[3].peak_live_bytes,
            800);
}

// Two stages on a rank: zb-v's rank 0 holds stage 0 (100 bytes per micro-batch) and stage
// 3 (800), which runs its F right before its backward and so holds one at a time.
// Recomputing stage 3 drops the most bytes but lowers no peak (1.1 KiB); stage 0 alone
// fits 1000 at a step of 28, where both would take 32.
TEST(MemoryFitTest, RecomputeWithinMemoryTakesTheStageThatLowersThePeak) {
  PS_ASSERT_OK_AND_ASSIGN(
      const Schedule s,
      GenerateSchedule("zb-v", {.num_ranks = 2, .num_microbatches = 4, .num_chunks = 2}));
  CostModel costs;
  costs.uniform.activation_bytes = 100;
  costs.stages.assign(4, costs.uniform);
  costs.stages[3].activation_bytes = 800;
  PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit fit, RecomputeWithinMemory(s, costs, 1000));
  EXPECT_EQ(fit.stages, (std::vector<int>{0}));
  EXPECT_EQ(fit.sim.ranks[0].peak_live_bytes, 800);
  EXPECT_EQ(fit.without.ranks[0].peak_live_bytes, 1100);
  EXPECT_DOUBLE_EQ(fit.sim.step_time, 28);
  PS_ASSERT_OK_AND_ASSIGN(const CostModel stage_3, WithRecomputeOn(costs, {3}, 4));
  PS_ASSERT_OK_AND_ASSIGN(const SimResult lowers_nothing, Simulate(s, stage_3));
  EXPECT_EQ(lowers_nothing.ranks[0].peak_live_bytes, 1100);
  // A stage whose costs recompute already (measured so) is not chosen again: here rank 0
  // has nothing left to drop.
  PS_ASSERT_OK_AND_ASSIGN(const CostModel measured, WithRecomputeOn(costs, {0, 3}, 4));
  EXPECT_THAT(RecomputeWithinMemory(s, measured, 500),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("rank 0 does not fit in 500 B per device even with every stage "
                                 "of it recomputing")));
  PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit as_is, RecomputeWithinMemory(s, measured, 800));
  EXPECT_TRUE(as_is.stages.empty());
}

// Few candidates: every set is simulated and the shortest step that fits is kept. On
// zb-v's rank 1 (stages 1 and 2) either stage alone fits 1074 bytes; stage 1 lowers the
// peak more (the greedy rule's choice, step 36.48) but has the dearer forward, while stage
// 2's extra forward lands in rank 1's idle time: the step stays 33.32.
TEST(MemoryFitTest, RecomputeWithinMemoryKeepsTheShortestStepOfEverySetThatFits) {
  PS_ASSERT_OK_AND_ASSIGN(
      const Schedule s,
      GenerateSchedule("zb-v", {.num_ranks = 2, .num_microbatches = 4, .num_chunks = 2}));
  CostModel costs;
  costs.stages = {
      {.f = 1.57, .b = 2.47, .i = 1.93, .w = 0.54, .activation_bytes = 228, .input_bytes = 13},
      {.f = 1.77, .b = 1.74, .i = 1.19, .w = 0.55, .activation_bytes = 293, .input_bytes = 66},
      {.f = 0.52, .b = 2.43, .i = 1.69, .w = 0.74, .activation_bytes = 225, .input_bytes = 53},
      {.f = 1.61, .b = 2.68, .i = 1.19, .w = 1.49, .activation_bytes = 144, .input_bytes = 26}};
  PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit fit, RecomputeWithinMemory(s, costs, 1074));
  EXPECT_TRUE(fit.exhaustive);
  EXPECT_EQ(fit.stages, (std::vector<int>{2}));
  EXPECT_NEAR(fit.without.step_time, 33.32, 1e-9);
  EXPECT_NEAR(fit.sim.step_time, 33.32, 1e-9);
  EXPECT_EQ(PeakBytes(fit.sim), 985);
  PS_ASSERT_OK_AND_ASSIGN(const CostModel stage_1, WithRecomputeOn(costs, {1}, 4));
  PS_ASSERT_OK_AND_ASSIGN(const SimResult greedy, Simulate(s, stage_1));
  EXPECT_EQ(PeakBytes(greedy), 938);           // lower, but
  EXPECT_NEAR(greedy.step_time, 36.48, 1e-9);  // longer
}

// Against every set, on random models: what is returned fits, and no set that fits and
// has no smaller set that fits has a shorter step (a set is not grown past one that fits:
// recomputing more only adds work).
TEST(MemoryFitTest, RecomputeWithinMemoryMatchesEverySetOnRandomModels) {
  std::mt19937 rng(20261203);
  std::uniform_real_distribution<double> time(0.5, 2.0);
  std::uniform_int_distribution<int> bytes(50, 400);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const bool v = trial % 2 == 1;
    const int ranks = 2 + trial % 3;
    PS_ASSERT_OK_AND_ASSIGN(
        const Schedule s,
        GenerateSchedule(v ? "zb-v" : "1f1b", {.num_ranks = ranks,
                                               .num_microbatches = 4 + 2 * (trial % 3),
                                               .num_chunks = v ? 2 : 1}));
    const int stages = s.num_stages();
    CostModel costs;
    for (int st = 0; st < stages; ++st) {
      const double i = time(rng), w = time(rng) / 2;
      const std::int64_t a = bytes(rng);
      costs.stages.push_back({.f = time(rng),
                              .b = i + w,
                              .i = i,
                              .w = w,
                              .activation_bytes = a,
                              .input_bytes = 1 + a / 5});
    }
    PS_ASSERT_OK_AND_ASSIGN(const SimResult plain, Simulate(s, costs));
    PS_ASSERT_OK_AND_ASSIGN(const CostModel all, WithRecompute(costs));
    PS_ASSERT_OK_AND_ASSIGN(const SimResult every, Simulate(s, all));
    const std::int64_t lo = PeakBytes(every), hi = PeakBytes(plain);
    if (hi - lo < 2) continue;
    const std::int64_t capacity = lo + (hi - lo) * (1 + trial % 4) / 5;
    PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit fit, RecomputeWithinMemory(s, costs, capacity));
    ASSERT_TRUE(fit.exhaustive) << trial;
    ASSERT_LE(PeakBytes(fit.sim), capacity) << trial;
    std::vector<std::uint32_t> fitting;
    for (std::uint32_t mask = 0; mask < (std::uint32_t{1} << stages); ++mask) {
      std::vector<int> set;
      for (int st = 0; st < stages; ++st) {
        if ((mask >> st) & 1) set.push_back(st);
      }
      PS_ASSERT_OK_AND_ASSIGN(const CostModel c, WithRecomputeOn(costs, set, stages));
      PS_ASSERT_OK_AND_ASSIGN(const SimResult sim, Simulate(s, c));
      if (PeakBytes(sim) > capacity) continue;
      const bool minimal = std::none_of(fitting.begin(), fitting.end(), [mask](std::uint32_t f) {
        return (mask & f) == f;  // masks come in increasing order: subsets first
      });
      fitting.push_back(mask);
      if (minimal) {
        EXPECT_LE(fit.sim.step_time, sim.step_time + 1e-9)
            << "trial " << trial << ": " << ::testing::PrintToString(set) << " is shorter than "
            << ::testing::PrintToString(fit.stages);
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

// Many candidates: the greedy rule, which still fits.
TEST(MemoryFitTest, RecomputeWithinMemoryIsGreedyBeyondTwelveCandidates) {
  PS_ASSERT_OK_AND_ASSIGN(
      const Schedule s,
      GenerateSchedule("interleaved-1f1b",
                       {.num_ranks = 8, .num_microbatches = 16, .num_chunks = 2}));
  const CostModel costs = HundredBytesTenOfThemInput();
  PS_ASSERT_OK_AND_ASSIGN(const SimResult plain, Simulate(s, costs));
  ASSERT_GT(PeakBytes(plain), 1000);
  // Every rank above it: all 16 stages could help.
  PS_ASSERT_OK_AND_ASSIGN(const RecomputeFit fit, RecomputeWithinMemory(s, costs, 1000));
  EXPECT_FALSE(fit.exhaustive);
  EXPECT_FALSE(fit.stages.empty());
  EXPECT_LE(PeakBytes(fit.sim), 1000);
}

// The limit as --max-activations takes it back: floor(X V) must give the same chunk
// activations, so 7 of 3 is "2.4", not six digits of 7/3 (which floor to 6).
TEST(MemoryFitTest, MaxActivationsTextTurnsBackIntoTheSameLimit) {
  EXPECT_EQ(MaxActivationsText(5, 1), "5");
  EXPECT_EQ(MaxActivationsText(3, 2), "1.5");
  EXPECT_EQ(MaxActivationsText(4, 2), "2");
  EXPECT_EQ(MaxActivationsText(7, 3), "2.4");
  for (int v = 1; v <= 8; ++v) {
    for (int limit = v; limit <= 64 * v; ++limit) {
      const double x = std::stod(MaxActivationsText(limit, v));
      ASSERT_EQ(static_cast<int>(std::floor(x * v + 1e-9)), limit) << limit << " of " << v;
    }
  }
}

TEST(MemoryFitTest, NothingFitsSaysHowFarTheTightestOrderIs) {
  const CostModel costs = UnitCostsWithBytes(kMiB);
  const GeneratorParams params{.num_ranks = 4, .num_microbatches = 8, .costs = &costs};
  EXPECT_THAT(SearchWithinMemory("zb-2p", params, costs, kMiB / 2),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "zb-2p does not fit in 512.0 KiB per device even when searched within "
                       "one stage's worth of activations per rank (1 chunk activation): rank 0 "
                       "peaks at 1.00 MiB; give more memory or smaller activations"));
}

TEST(MemoryFitTest, OnlySearchedSchedulesWithoutALimitOfTheirOwn) {
  const CostModel costs = UnitCostsWithBytes(kMiB);
  EXPECT_THAT(
      SearchWithinMemory("1f1b", {.num_ranks = 4, .num_microbatches = 8}, costs, kMiB),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1f1b's order fixes its memory")));
  EXPECT_THAT(
      SearchWithinMemory("zb-2p", {.num_ranks = 4, .num_microbatches = 8, .max_activations = 2},
                         costs, kMiB),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give no max_activations")));
  EXPECT_THAT(SearchWithinMemory("zb-2p", {.num_ranks = 4, .num_microbatches = 8}, costs, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be positive")));
  EXPECT_THAT(SearchWithinMemory("zb-9p", {.num_ranks = 4, .num_microbatches = 8}, costs, kMiB),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("zb-9p")));
}

}  // namespace
}  // namespace pipesched::scheduler
