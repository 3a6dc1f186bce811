// AnalyzeIdle (stages/bubble_analysis.h) on the simulated timeline of 1F1B, P=4, for a
// growing number of micro-batches: the cost of decomposing a step's idle time, which
// `train` and `bench` pay once per measured step. Unit costs with a 0.1 transfer, so
// every rank has gaps to cut. Items = compute spans.
#include <string>

#include "benchmark/benchmark.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/stages/bubble_analysis.h"

namespace pipesched::stages {
namespace {

void BM_AnalyzeIdle(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  auto schedule = scheduler::GenerateSchedule("1f1b", {.num_ranks = 4, .num_microbatches = m});
  if (!schedule.ok()) return state.SkipWithError(std::string(schedule.status().message()).c_str());
  scheduler::CostModel costs;
  costs.comm_uniform = 0.1;
  auto sim = scheduler::Simulate(*schedule, costs);
  if (!sim.ok()) return state.SkipWithError(std::string(sim.status().message()).c_str());
  for (auto _ : state) {
    auto analysis = AnalyzeIdle(sim->timeline, {}, 4);
    if (!analysis.ok()) {
      return state.SkipWithError(std::string(analysis.status().message()).c_str());
    }
    benchmark::DoNotOptimize(analysis->total.dependency);
  }
  state.SetItemsProcessed(state.iterations() * 2 * 4 * static_cast<std::int64_t>(m));
}
BENCHMARK(BM_AnalyzeIdle)->RangeMultiplier(8)->Range(64, 32768)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pipesched::stages
