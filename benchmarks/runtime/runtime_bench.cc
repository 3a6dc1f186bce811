// Cost of the runtime seam's primitives, per backend. Goal (docs): under 5 us each on the
// host backend. Host benchmarks measure host wall time including completion (the batch
// ends with Synchronize); Cuda ones time the GPU side with events (UseManualTime).
//   BM_*Enqueue:      EnqueueHost of an empty closure, amortised over a batch.
//   BM_*RecordWait:   a ping-pong between two streams (a records, b waits, b records,
//                     a waits), reported per record/wait hand-off (two per round).
//   BM_HostRecordWaitNoSpin: the same with BackendOptions::host_spin_micros = 0 (waits
//                     sleep at once), to show what polling before sleeping buys.
// Iterations are batches of 1000, so a time of 2.0 ms per iteration is 2.0 us per op.
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::runtime {
namespace {

constexpr int kBatch = 1000;

std::unique_ptr<Backend> MakeBackend(BackendKind kind, benchmark::State& state,
                                     int host_spin_micros = BackendOptions{}.host_spin_micros) {
  BackendOptions options;
  options.kind = kind;
  options.num_devices = 1;
  options.host_spin_micros = host_spin_micros;
  auto backend = CreateBackend(options);
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return nullptr;
  }
  return std::move(*backend);
}

#define BENCH_CHECK(expr)                              \
  do {                                                 \
    auto ps_bench_status_ = (expr);                    \
    if (!ps_bench_status_.ok()) {                      \
      state.SkipWithError(std::string(#expr).c_str()); \
      return;                                          \
    }                                                  \
  } while (0)

// Reports `per_op`: seconds per operation (shown as e.g. "2.1u"), `ops` per iteration.
void PerOp(benchmark::State& state, int ops) {
  state.counters["per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * ops,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// One batch of `kBatch` empty host functions, then wait for them.
void Enqueue(benchmark::State& state, BackendKind kind) {
  auto backend = MakeBackend(kind, state);
  if (backend == nullptr) return;
  Device& device = backend->device(0);
  auto stream = device.CreateStream("bench").value();
  auto start = device.CreateEvent(true).value();
  auto end = device.CreateEvent(true).value();
  for (auto _ : state) {
    BENCH_CHECK(start->Record(*stream));
    for (int i = 0; i < kBatch; ++i) {
      BENCH_CHECK(stream->EnqueueHost([] { return absl::OkStatus(); }));
    }
    BENCH_CHECK(end->Record(*stream));
    BENCH_CHECK(stream->Synchronize());
    if (kind == BackendKind::kCuda) {
      state.SetIterationTime(end->ElapsedMillis(*start).value() / 1000.0);
    }
  }
  PerOp(state, kBatch);
}

// `kBatch` ping-pongs between two streams on one device, then wait.
void RecordWait(benchmark::State& state, BackendKind kind,
                int host_spin_micros = BackendOptions{}.host_spin_micros) {
  auto backend = MakeBackend(kind, state, host_spin_micros);
  if (backend == nullptr) return;
  Device& device = backend->device(0);
  auto a = device.CreateStream("a").value();
  auto b = device.CreateStream("b").value();
  auto ea = device.CreateEvent().value();
  auto eb = device.CreateEvent().value();
  auto start = device.CreateEvent(true).value();
  auto end = device.CreateEvent(true).value();
  for (auto _ : state) {
    BENCH_CHECK(start->Record(*a));
    for (int i = 0; i < kBatch; ++i) {
      BENCH_CHECK(ea->Record(*a));
      BENCH_CHECK(b->Wait(*ea));
      BENCH_CHECK(eb->Record(*b));
      BENCH_CHECK(a->Wait(*eb));
    }
    BENCH_CHECK(end->Record(*a));
    BENCH_CHECK(a->Synchronize());
    if (kind == BackendKind::kCuda) {
      state.SetIterationTime(end->ElapsedMillis(*start).value() / 1000.0);
    }
  }
  PerOp(state, 2 * kBatch);  // per hand-off
}

void BM_HostEnqueue(benchmark::State& state) { Enqueue(state, BackendKind::kHost); }
void BM_HostRecordWait(benchmark::State& state) { RecordWait(state, BackendKind::kHost); }
void BM_HostRecordWaitNoSpin(benchmark::State& state) {
  RecordWait(state, BackendKind::kHost, /*host_spin_micros=*/0);
}
void BM_CudaEnqueue(benchmark::State& state) { Enqueue(state, BackendKind::kCuda); }
void BM_CudaRecordWait(benchmark::State& state) { RecordWait(state, BackendKind::kCuda); }

BENCHMARK(BM_HostEnqueue)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_HostRecordWait)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_HostRecordWaitNoSpin)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CudaEnqueue)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK(BM_CudaRecordWait)->Unit(benchmark::kMillisecond)->UseManualTime();

}  // namespace
}  // namespace pipesched::runtime
