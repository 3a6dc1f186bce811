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
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "pipesched/base/status.h"
#include "pipesched/comm/bootstrap.h"
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
  const StageWorkFactory factory = testing::ToyFactory(stages, toy);
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

// The same step of 1F1B with its P ranks split across `processes` processes
// (ExecutorOptions::pipeline), here threads with a host backend each, meeting through
// in-process bootstraps: the benchmark's thread is process 0 and times its steps, the
// others step alongside it (a fixed number of iterations, so that every process makes
// the same). Against one_f_one_b with the same P and M, the difference is the cost of
// the crossings (a message each way per micro-batch, from host functions) and of the
// step's end (every process's rows gathered to every process).
void BM_SplitExecutorStep(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0));
  const int m = static_cast<int>(state.range(1));
  const int processes = static_cast<int>(state.range(2));
  auto schedule = scheduler::GenerateSchedule("1f1b", {.num_ranks = p, .num_microbatches = m});
  auto bootstraps = comm::CreateInProcessBootstraps(processes);
  if (!schedule.ok() || !bootstraps.ok()) {
    state.SkipWithError("cannot make the schedule or the bootstraps");
    return;
  }
  const int stages = schedule->num_stages();
  testing::ToyOptions toy{.features = 4, .batch = 2, .empty = true};
  const StageWorkFactory factory = testing::ToyFactory(stages, toy);
  std::vector<float> x(static_cast<std::size_t>(m) * 8), t(x.size());
  StepInputs in{.inputs = std::as_bytes(std::span(x)), .targets = std::as_bytes(std::span(t))};
  const std::int64_t steps = state.max_iterations;
  // Process q: its executor, then `steps` steps; the first error ends it (and, through
  // the executor's Fail, the others).
  auto run = [&](int q, benchmark::State* timed) -> absl::Status {
    PS_ASSIGN_OR_RETURN(auto backend, runtime::CreateBackend(
                                          {.kind = runtime::BackendKind::kHost, .num_devices = p}));
    PS_ASSIGN_OR_RETURN(auto ex, Executor::Create(*schedule, *backend, factory,
                                                  {.pipeline = (*bootstraps)[q].get()}));
    if (timed == nullptr) {
      for (std::int64_t i = 0; i < steps; ++i) PS_RETURN_IF_ERROR(ex->Step(in).status());
      return absl::OkStatus();
    }
    for (auto _ : *timed) PS_RETURN_IF_ERROR(ex->Step(in).status());
    return absl::OkStatus();
  };
  std::vector<absl::Status> others(processes);
  std::vector<std::thread> threads;
  for (int q = 1; q < processes; ++q) threads.emplace_back([&, q] { others[q] = run(q, nullptr); });
  const absl::Status mine = run(0, &state);
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : others) {
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  }
  if (!mine.ok()) state.SkipWithError(std::string(mine.message()).c_str());
}

BENCHMARK(BM_SplitExecutorStep)
    ->Args({4, 32, 2})
    ->Args({4, 32, 4})
    ->Iterations(200)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

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
