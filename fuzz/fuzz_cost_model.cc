// libFuzzer target: cost-model JSON -> ParseCostModelJson -> Simulate of 1f1b (P=4, M=8)
// and interleaved-1f1b (P=2, V=2, M=4) with it, and zb-2p (P=3, M=5), zb-v-1p (P=2,
// V=2, M=3), zb-v-min (P=3, V=2, M=5) and interleaved-zb-1p (P=2, V=2, M=4) searched for it.
// Holds the library to: no crash; simulating a valid generated schedule succeeds under
// any cost model the parser accepts and CheckCostsFit finds fitting (what the command
// line checks before it simulates); and the searches succeed for any such model, with a
// step no longer than zb-h1's (zb-v's, interleaved-zb's) under it, and zb-v-min valid
// within its memory; and zb-2p and zb-v-1p held to half their own peak bytes
// (SearchWithinMemory) either fit them with a valid order or are ResourceExhausted; and
// zb-1p (P=2, M=3) refined (GeneratorParams::refine) is valid, within P activations and
// no slower than as searched; and the same costs with activation recomputation
// (WithRecompute) simulate 1f1b and interleaved-1f1b no faster and in no more memory per
// rank, or are refused as InvalidArgument.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/generators/generators.h"
#include "pipesched/scheduler/memory_fit.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::scheduler {
namespace {

const std::vector<Schedule>& Schedules() {
  static const std::vector<Schedule>* schedules = [] {
    auto* out = new std::vector<Schedule>;
    for (auto [name, params] : {std::pair{"1f1b", GeneratorParams{4, 8, 0}},
                                std::pair{"interleaved-1f1b", GeneratorParams{2, 4, 2}}}) {
      absl::StatusOr<Schedule> s = GenerateSchedule(name, params);
      PS_FUZZ_CHECK(s.ok(), s.status());
      out->push_back(*std::move(s));
    }
    return out;
  }();
  return *schedules;
}

// `searched` searched for `costs` (when they fit the shape) succeeds, and its step is no
// longer than the handcrafted order's under them: both are timed the same way (up to the
// rounding of sums taken in another order).
void CheckSearch(const CostModel& costs, const char* searched, const char* handcrafted,
                 GeneratorParams params) {
  if (!CheckCostsFit(costs, params.num_ranks, params.num_chunks).ok()) return;
  params.costs = &costs;
  absl::StatusOr<Schedule> found = GenerateSchedule(searched, params);
  PS_FUZZ_CHECK(found.ok(), found.status());
  absl::StatusOr<Schedule> base = GenerateSchedule(handcrafted, params);
  PS_FUZZ_CHECK(base.ok(), base.status());
  absl::StatusOr<SimResult> sim = Simulate(*found, costs);
  absl::StatusOr<SimResult> sim_base = Simulate(*base, costs);
  PS_FUZZ_CHECK(sim.ok() && sim_base.ok(), sim.ok() ? sim_base.status() : sim.status());
  PS_FUZZ_CHECK(sim->step_time <= sim_base->step_time * (1 + 1e-12),
                "a searched schedule takes a longer step than the handcrafted one");
}

// zb-1p searched for `costs` and refined (when they fit the shape) is valid, keeps its
// limit and takes no longer a step than the searched order. A small shape: the
// refinement times thousands of orders.
void CheckRefine(const CostModel& costs) {
  GeneratorParams params{.num_ranks = 2, .num_microbatches = 3, .num_chunks = 1};
  if (!CheckCostsFit(costs, params.num_ranks, params.num_chunks).ok()) return;
  params.costs = &costs;
  absl::StatusOr<Schedule> searched = GenerateSchedule("zb-1p", params);
  PS_FUZZ_CHECK(searched.ok(), searched.status());
  params.refine = true;
  absl::StatusOr<Schedule> refined = GenerateSchedule("zb-1p", params);
  PS_FUZZ_CHECK(refined.ok(), refined.status());
  const absl::Status valid = Validate(*refined);
  PS_FUZZ_CHECK(valid.ok(), valid);
  absl::StatusOr<SimResult> before = Simulate(*searched, costs);
  absl::StatusOr<SimResult> after = Simulate(*refined, costs);
  PS_FUZZ_CHECK(before.ok() && after.ok(), before.ok() ? after.status() : before.status());
  PS_FUZZ_CHECK(after->step_time <= before->step_time * (1 + 1e-12),
                "the refined order takes a longer step than the searched one");
  for (const RankStats& rank : after->ranks) {
    PS_FUZZ_CHECK(rank.peak_live_microbatches <= 2, "refined zb-1p above its activation limit");
  }
}

// zb-v-min searched for `costs` (when they fit the shape) is valid and keeps its limit.
void CheckMin(const CostModel& costs, GeneratorParams params) {
  if (!CheckCostsFit(costs, params.num_ranks, params.num_chunks).ok()) return;
  params.costs = &costs;
  absl::StatusOr<Schedule> found = GenerateSchedule("zb-v-min", params);
  PS_FUZZ_CHECK(found.ok(), found.status());
  const absl::Status valid = Validate(*found);
  PS_FUZZ_CHECK(valid.ok(), valid);
  absl::StatusOr<SimResult> sim = Simulate(*found, costs);
  PS_FUZZ_CHECK(sim.ok(), sim.status());
  for (const RankStats& rank : sim->ranks) {
    PS_FUZZ_CHECK(rank.peak_live_microbatches <= ZbVMinLimit(params.num_ranks),
                  "zb-v-min above its activation limit");
  }
}

// `name` searched within half the bytes its own order peaks at (when it has any): an
// order that fits, valid, or ResourceExhausted.
void CheckFit(const CostModel& costs, const char* name, GeneratorParams params) {
  if (!CheckCostsFit(costs, params.num_ranks, params.num_chunks).ok()) return;
  params.costs = &costs;
  absl::StatusOr<Schedule> own = GenerateSchedule(name, params);
  PS_FUZZ_CHECK(own.ok(), own.status());
  absl::StatusOr<SimResult> own_sim = Simulate(*own, costs);
  PS_FUZZ_CHECK(own_sim.ok(), own_sim.status());
  const std::int64_t capacity = PeakBytes(*own_sim) / 2;
  if (capacity <= 0) return;
  absl::StatusOr<MemoryFit> fit = SearchWithinMemory(name, params, costs, capacity);
  if (!fit.ok()) {
    PS_FUZZ_CHECK(fit.status().code() == absl::StatusCode::kResourceExhausted, fit.status());
    return;
  }
  PS_FUZZ_CHECK(PeakBytes(fit->sim) <= capacity, "a fitted order above its capacity");
  const absl::Status valid = Validate(fit->schedule);
  PS_FUZZ_CHECK(valid.ok(), valid);
}

// Recomputation keeps a subset of what each micro-batch held and makes B and I longer:
// no rank's peak may grow, and no step may shorten (durations only grew, the order is the
// same). Refused only as InvalidArgument (costs that recompute already, a B + F above
// kMaxCostTime).
void CheckRecompute(const CostModel& costs, const Schedule& schedule, const SimResult& plain) {
  absl::StatusOr<CostModel> recomputing = WithRecompute(costs);
  if (!recomputing.ok()) {
    PS_FUZZ_CHECK(recomputing.status().code() == absl::StatusCode::kInvalidArgument,
                  recomputing.status());
    return;
  }
  absl::StatusOr<SimResult> sim = Simulate(schedule, *recomputing);
  if (!sim.ok()) {
    PS_FUZZ_CHECK(sim.status().code() == absl::StatusCode::kInvalidArgument, sim.status());
    return;
  }
  PS_FUZZ_CHECK(sim->makespan >= plain.makespan * (1 - 1e-12),
                "recomputation shortened the makespan");
  for (std::size_t r = 0; r < sim->ranks.size(); ++r) {
    PS_FUZZ_CHECK(sim->ranks[r].peak_live_bytes <= plain.ranks[r].peak_live_bytes,
                  "recomputation raised a rank's peak bytes");
  }
}

void FuzzOne(std::string_view text) {
  absl::StatusOr<CostModel> costs = ParseCostModelJson(text);
  if (!costs.ok()) return;
  for (const Schedule& schedule : Schedules()) {
    const bool fits = CheckCostsFit(*costs, schedule.num_ranks(), schedule.num_chunks()).ok();
    absl::StatusOr<SimResult> sim = Simulate(schedule, *costs);
    if (!fits) continue;  // it may be refused, and must not crash
    PS_FUZZ_CHECK(sim.ok(), sim.status());
    PS_FUZZ_CHECK(!(sim->makespan < 0), "negative makespan");
    PS_FUZZ_CHECK(std::isfinite(sim->step_time) && sim->step_time >= sim->makespan,
                  "a step shorter than its makespan");
    CheckRecompute(*costs, schedule, *sim);
  }
  CheckSearch(*costs, "zb-2p", "zb-h1", {.num_ranks = 3, .num_microbatches = 5, .num_chunks = 1});
  CheckSearch(*costs, "zb-v-1p", "zb-v", {.num_ranks = 2, .num_microbatches = 3, .num_chunks = 2});
  CheckMin(*costs, {.num_ranks = 3, .num_microbatches = 5, .num_chunks = 2});
  CheckRefine(*costs);
  CheckFit(*costs, "zb-2p", {.num_ranks = 3, .num_microbatches = 5, .num_chunks = 1});
  CheckFit(*costs, "zb-v-1p", {.num_ranks = 2, .num_microbatches = 3, .num_chunks = 2});
  // interleaved-zb's P=2, M=4 order fits interleaved-zb-1p's limit (4 chunk activations).
  CheckSearch(*costs, "interleaved-zb-1p", "interleaved-zb",
              {.num_ranks = 2, .num_microbatches = 4, .num_chunks = 2});
}

}  // namespace
}  // namespace pipesched::scheduler

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pipesched::scheduler::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
