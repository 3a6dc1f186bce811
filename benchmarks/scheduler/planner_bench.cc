// planner_bench: the cost of planning a step on the host, per action. The goal
// (docs: under 200 ns per action for generate + validate + simulate of 1F1B at P=64,
// M=1024, i.e. 131k actions) is measured here, never asserted by a test.
//
// The "per_action" counter is seconds per action (Google Benchmark prints it with an
// SI prefix: "150n" is 150 ns). BM_Plan is the whole pipeline; the others split it.
// BM_Search times the searched schedules for uneven stages, with and without
// GeneratorParams::refine, and reports the step each gives ("step") and, refined, the
// share of the searched order's step that the refinement saved ("saved_pct").
#include <random>
#include <string>

#include "benchmark/benchmark.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::scheduler {
namespace {

// Args: P, V (0 = the schedule's default), M.
GeneratorParams Params(const benchmark::State& state) {
  return GeneratorParams{.num_ranks = static_cast<int>(state.range(0)),
                         .num_microbatches = static_cast<int>(state.range(2)),
                         .num_chunks = static_cast<int>(state.range(1))};
}

// Generates once outside the timed loop; SkipWithError on a generator failure.
bool Prepare(benchmark::State& state, const std::string& name, Schedule* schedule) {
  absl::StatusOr<Schedule> generated = GenerateSchedule(name, Params(state));
  if (!generated.ok()) {
    state.SkipWithError(std::string(generated.status().message()).c_str());
    return false;
  }
  *schedule = *std::move(generated);
  return true;
}

void SetPerAction(benchmark::State& state, std::size_t actions) {
  state.counters["actions"] = static_cast<double>(actions);
  state.counters["per_action"] = benchmark::Counter(
      static_cast<double>(actions),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_Plan(benchmark::State& state, const std::string& name) {
  const CostModel costs;
  std::size_t actions = 0;
  for (auto _ : state) {
    absl::StatusOr<Schedule> schedule = GenerateSchedule(name, Params(state));
    if (!schedule.ok()) {
      state.SkipWithError(std::string(schedule.status().message()).c_str());
      return;
    }
    if (absl::Status valid = Validate(*schedule); !valid.ok()) {
      state.SkipWithError(std::string(valid.message()).c_str());
      return;
    }
    absl::StatusOr<SimResult> result = Simulate(*schedule, costs);
    if (!result.ok()) {
      state.SkipWithError(std::string(result.status().message()).c_str());
      return;
    }
    actions = schedule->NumActions();
    benchmark::DoNotOptimize(result->makespan);
  }
  SetPerAction(state, actions);
}

void BM_Generate(benchmark::State& state, const std::string& name) {
  std::size_t actions = 0;
  for (auto _ : state) {
    absl::StatusOr<Schedule> schedule = GenerateSchedule(name, Params(state));
    if (!schedule.ok()) {
      state.SkipWithError(std::string(schedule.status().message()).c_str());
      return;
    }
    actions = schedule->NumActions();
    benchmark::DoNotOptimize(schedule->programs.data());
  }
  SetPerAction(state, actions);
}

void BM_Validate(benchmark::State& state, const std::string& name) {
  Schedule schedule;
  if (!Prepare(state, name, &schedule)) return;
  for (auto _ : state) {
    absl::Status status = Validate(schedule);
    benchmark::DoNotOptimize(status);
  }
  SetPerAction(state, schedule.NumActions());
}

void BM_Simulate(benchmark::State& state, const std::string& name) {
  Schedule schedule;
  if (!Prepare(state, name, &schedule)) return;
  const CostModel costs;
  for (auto _ : state) {
    absl::StatusOr<SimResult> result = Simulate(schedule, costs);
    benchmark::DoNotOptimize(result);
  }
  SetPerAction(state, schedule.NumActions());
}

// Uneven stages, the same for every run: F, I, W drawn from [0.6, 1.6) (W times 0.8) for
// each of the V P virtual stages, transfers of 0.1.
CostModel UnevenStages(int stages) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> time(0.6, 1.6);
  CostModel costs;
  costs.comm_uniform = 0.1;
  for (int s = 0; s < stages; ++s) {
    StageCosts& c = costs.stages.emplace_back();
    c.f = time(rng);
    c.i = time(rng);
    c.w = 0.8 * time(rng);
    c.b = c.i + c.w;
  }
  return costs;
}

// Args: P, M; the schedule's own V.
void BM_Search(benchmark::State& state, const std::string& name, bool refine) {
  const int p = static_cast<int>(state.range(0));
  const CostModel costs = UnevenStages(FindSchedule(name)->default_chunks * p);
  GeneratorParams params{.num_ranks = p,
                         .num_microbatches = static_cast<int>(state.range(1)),
                         .costs = &costs,
                         .refine = refine};
  absl::StatusOr<Schedule> schedule;
  for (auto _ : state) {
    schedule = GenerateSchedule(name, params);
    if (!schedule.ok()) {
      state.SkipWithError(std::string(schedule.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(schedule->programs.data());
  }
  absl::StatusOr<SimResult> sim = Simulate(*schedule, costs);
  params.refine = false;
  absl::StatusOr<Schedule> searched = GenerateSchedule(name, params);
  absl::StatusOr<SimResult> searched_sim =
      searched.ok() ? Simulate(*searched, costs) : searched.status();
  if (!sim.ok() || !searched_sim.ok()) {
    state.SkipWithError("the generated order does not simulate");
    return;
  }
  state.counters["step"] = sim->step_time;
  if (refine) {
    const double saved = 100 * (searched_sim->step_time - sim->step_time) / searched_sim->step_time;
    state.counters["saved_pct"] = saved > 1e-7 ? saved : 0;  // else only rounding differs
  }
}

#define PIPESCHED_SEARCH_BENCH(schedule, id)                                \
  BENCHMARK_CAPTURE(BM_Search, id##_searched, std::string(schedule), false) \
      ->ArgNames({"P", "M"})                                                \
      ->Args({4, 16})                                                       \
      ->Args({8, 32})                                                       \
      ->Unit(benchmark::kMillisecond);                                      \
  BENCHMARK_CAPTURE(BM_Search, id##_refined, std::string(schedule), true)   \
      ->ArgNames({"P", "M"})                                                \
      ->Args({4, 16})                                                       \
      ->Args({8, 32})                                                       \
      ->Unit(benchmark::kMillisecond)

PIPESCHED_SEARCH_BENCH("zb-1p", zb_1p);
PIPESCHED_SEARCH_BENCH("zb-2p", zb_2p);
PIPESCHED_SEARCH_BENCH("zb-v-1p", zb_v_1p);
PIPESCHED_SEARCH_BENCH("zb-v-half", zb_v_half);

#define PIPESCHED_PLANNER_BENCH(fn)                                        \
  BENCHMARK_CAPTURE(fn, 1f1b, std::string("1f1b"))                         \
      ->ArgNames({"P", "V", "M"})                                          \
      ->Args({64, 1, 1024})                                                \
      ->Args({8, 1, 64})                                                   \
      ->Unit(benchmark::kMillisecond);                                     \
  BENCHMARK_CAPTURE(fn, interleaved_1f1b, std::string("interleaved-1f1b")) \
      ->ArgNames({"P", "V", "M"})                                          \
      ->Args({64, 4, 1024})                                                \
      ->Unit(benchmark::kMillisecond)

PIPESCHED_PLANNER_BENCH(BM_Plan);
PIPESCHED_PLANNER_BENCH(BM_Generate);
PIPESCHED_PLANNER_BENCH(BM_Validate);
PIPESCHED_PLANNER_BENCH(BM_Simulate);

}  // namespace
}  // namespace pipesched::scheduler

BENCHMARK_MAIN();
