// Executor overhead per action on the host backend (and on CUDA, Cuda_*, which skip with a
// message when no GPU is usable): a whole training step of a schedule
// whose stage work enqueues nothing (tests/stages/toy_stage_work.h with empty = true), so
// that what is timed is the executor's issue walk, its events, waits, stream-ordered
// allocations and frees, transfers and the host streams completing them. Reported as
// time per action ("us_per_action": step wall time / actions issued, counting each
// compute action, transfer and all-reduce of every replica once). Goal: < 5 us.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/stages/executor.h"
#include "stages/toy_stage_work.h"

namespace pipesched::stages {
namespace {

void BM_ExecutorStep(benchmark::State& state, const std::string& schedule_name,
                     runtime::BackendKind kind = runtime::BackendKind::kHost) {
  const int p = static_cast<int>(state.range(0));
  const int m = static_cast<int>(state.range(1));
  const int d = static_cast<int>(state.range(2));
  auto schedule =
      scheduler::GenerateSchedule(schedule_name, {.num_ranks = p, .num_microbatches = m});
  if (!schedule.ok()) {
    state.SkipWithError(std::string(schedule.status().message()).c_str());
    return;
  }
  // CUDA: all visible GPUs, (replica, rank) pairs round-robin over them; the stage work
  // enqueues nothing, so what is timed is the executor's events, waits, stream-ordered
  // allocations and peer copies, issue plus completion as the host sees it (wall time:
  // device-side events would leave out the issue cost this benchmark is about).
  auto created = runtime::CreateBackend(
      {.kind = kind, .num_devices = kind == runtime::BackendKind::kHost ? p * d : 0});
  if (!created.ok()) {
    state.SkipWithError(std::string(created.status().message()).c_str());  // says why
    return;
  }
  std::unique_ptr<runtime::Backend> backend = *std::move(created);
  const int stages = schedule->num_stages();
  testing::ToyOptions toy{.features = 4, .batch = 2, .empty = true};
  auto factory = [stages, toy](
                     int stage, int,
                     runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    return std::make_unique<testing::ToyStage>(stage, stages, toy, device);
  };
  auto ex = Executor::Create(*schedule, *backend, factory, {.num_replicas = d});
  if (!ex.ok()) {
    state.SkipWithError(std::string(ex.status().message()).c_str());
    return;
  }
  std::vector<float> x(static_cast<std::size_t>(d) * m * 8), t(x.size());
  StepInputs in{.inputs = std::as_bytes(std::span(x)), .targets = std::as_bytes(std::span(t))};
  const double actions = static_cast<double>((*ex)->actions_per_step());
  double total_us = 0;
  std::int64_t steps = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*ex)->Step(in);
    total_us +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    ++steps;
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      break;
    }
  }
  state.counters["actions"] = actions;
  state.counters["us_per_action"] = steps > 0 ? total_us / (steps * actions) : 0;
  ex->reset();
}

BENCHMARK_CAPTURE(BM_ExecutorStep, gpipe, std::string("gpipe"))
    ->Args({1, 32, 1})
    ->Args({4, 32, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ExecutorStep, one_f_one_b, std::string("1f1b"))
    ->Args({2, 8, 1})
    ->Args({4, 32, 1})
    ->Args({4, 32, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ExecutorStep, zb_h1, std::string("zb-h1"))
    ->Args({4, 32, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ExecutorStep, Cuda_one_f_one_b, std::string("1f1b"),
                  runtime::BackendKind::kCuda)
    ->Args({2, 8, 1})
    ->Args({4, 32, 1})
    ->Args({4, 32, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ExecutorStep, Cuda_gpipe, std::string("gpipe"), runtime::BackendKind::kCuda)
    ->Args({4, 32, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace pipesched::stages
