// sgemm throughput (GFLOP/s) on the MLP's three gemm shapes, for micro-batch B and
// hidden size H:
//   F: y (B, H) = x (B, H) W^T        I: dx (B, H) = dz (B, H) W        W: dW (H, H) += dz^T x
// Host: through the math seam on a host stream (enqueue + wait each gemm, so the
// seam's overhead is included) and direct cblas_sgemm with OpenBLAS single-threaded on
// the same shape (its peak for that shape on one core). Host times are process CPU
// time (the seam's gemm runs on the stream's thread; shared build machines are loaded). Cuda:
// through the seam, timed with events (UseManualTime); SkipWithError without a GPU. Every
// seam call is checked: a failing op ends its benchmark with an error, never a number.
#include <cblas.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "benchmark/benchmark.h"
#include "pipesched/base/status.h"
#include "pipesched/model/host_kernels.h"
#include "pipesched/model/math.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::model {
namespace {

struct Shape {
  Transpose ta, tb;
  int m, n, k, lda, ldb, ldc;
};

// kind 0 = F, 1 = I, 2 = W.
Shape ShapeOf(int kind, int b, int h) {
  switch (kind) {
    case 0:
      return {Transpose::kNo, Transpose::kYes, b, h, h, h, h, h};
    case 1:
      return {Transpose::kNo, Transpose::kNo, b, h, h, h, h, h};
    default:
      return {Transpose::kYes, Transpose::kNo, h, h, b, h, h, h};
  }
}

// Skips the benchmark with the failed expression and its status, so that a failing op is
// reported (ERROR OCCURRED) instead of timed.
#define BENCH_CHECK(expr)                                                                 \
  do {                                                                                    \
    const absl::Status ps_bench_status_ = (expr);                                         \
    if (!ps_bench_status_.ok()) {                                                         \
      state.SkipWithError(                                                                \
          (std::string(#expr) + ": " + std::string(ps_bench_status_.message())).c_str()); \
      return;                                                                             \
    }                                                                                     \
  } while (0)

const char* KindName(int kind) { return kind == 0 ? "F" : kind == 1 ? "I" : "W"; }

// `calls`: gemms per benchmark iteration.
void SetCounters(benchmark::State& state, const Shape& s, int kind, int calls = 1) {
  const double flops = 2.0 * s.m * s.n * s.k * calls;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(KindName(kind));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int kind : {0, 1, 2})
    for (int batch : {32, 128, 256})
      for (int h : {256, 1024}) b->Args({kind, batch, h});
  b->ArgNames({"kind", "B", "H"});
}

void BM_HostSgemmDirect(benchmark::State& state) {
  const Shape s = ShapeOf(state.range(0), state.range(1), state.range(2));
  host::SetBlasSingleThreaded();
  std::vector<float> a(static_cast<std::size_t>(s.m) * s.k + s.k * s.m, 0.5f),
      bm(static_cast<std::size_t>(s.k) * s.n + s.n * s.k, 0.25f),
      c(static_cast<std::size_t>(s.m) * s.n, 0.0f);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, s.ta == Transpose::kYes ? CblasTrans : CblasNoTrans,
                s.tb == Transpose::kYes ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(),
                s.lda, bm.data(), s.ldb, 0.0f, c.data(), s.ldc);
    benchmark::DoNotOptimize(c.data());
  }
  SetCounters(state, s, state.range(0));
}
BENCHMARK(BM_HostSgemmDirect)->Apply(Args)->MeasureProcessCPUTime();

void BM_HostSgemmSeam(benchmark::State& state) {
  const Shape s = ShapeOf(state.range(0), state.range(1), state.range(2));
  runtime::BackendOptions options;
  auto backend = runtime::CreateBackend(options);
  if (!backend.ok()) return state.SkipWithError(std::string(backend.status().message()).c_str());
  runtime::Device& device = (*backend)->device(0);
  auto stream = device.CreateStream("bench");
  auto math = CreateMath(device);
  if (!stream.ok() || !math.ok()) return state.SkipWithError("host setup failed");
  std::vector<float> a(static_cast<std::size_t>(s.m) * s.k + s.k * s.m, 0.5f),
      bm(static_cast<std::size_t>(s.k) * s.n + s.n * s.k, 0.25f),
      c(static_cast<std::size_t>(s.m) * s.n, 0.0f);
  for (auto _ : state) {
    BENCH_CHECK((*math)->Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), s.lda, bm.data(), s.ldb,
                              0.0f, c.data(), s.ldc, **stream));
    BENCH_CHECK((*stream)->Synchronize());
  }
  SetCounters(state, s, state.range(0));
}
BENCHMARK(BM_HostSgemmSeam)->Apply(Args)->MeasureProcessCPUTime();

// What the CUDA benchmarks share: device 0 of the CUDA backend, a stream, the math seam
// and two timing events.
struct CudaBench {
  std::unique_ptr<runtime::Backend> backend;
  runtime::Device* device = nullptr;
  std::unique_ptr<runtime::Stream> stream;
  std::unique_ptr<Math> math;
  std::unique_ptr<runtime::Event> start, stop;

  // "no usable GPU: <why>" (or built without CUDA) when there is none.
  static absl::StatusOr<CudaBench> Create() {
    runtime::BackendOptions options;
    options.kind = runtime::BackendKind::kCuda;
    CudaBench b;
    PS_ASSIGN_OR_RETURN(b.backend, runtime::CreateBackend(options));
    b.device = &b.backend->device(0);
    PS_ASSIGN_OR_RETURN(b.stream, b.device->CreateStream("bench"));
    PS_ASSIGN_OR_RETURN(b.math, CreateMath(*b.device));
    PS_ASSIGN_OR_RETURN(b.start, b.device->CreateEvent(/*timing=*/true));
    PS_ASSIGN_OR_RETURN(b.stop, b.device->CreateEvent(/*timing=*/true));
    return b;
  }

  // Milliseconds for `kReps` back-to-back calls of `op` (so that launch latency does not
  // dominate), between two events: one benchmark iteration, whose time this is (the
  // per-call figure is the `per_call` counter, PerCall). The stream's status is checked
  // too: a failure while the work ran poisons it, not the event.
  static constexpr int kReps = 20;
  template <typename Op>
  absl::StatusOr<double> MillisForReps(Op&& op) {
    PS_RETURN_IF_ERROR(start->Record(*stream));
    for (int r = 0; r < kReps; ++r) PS_RETURN_IF_ERROR(op());
    PS_RETURN_IF_ERROR(stop->Record(*stream));
    PS_RETURN_IF_ERROR(stream->Synchronize());
    return stop->ElapsedMillis(*start);
  }
  // `per_call`: seconds per call (shown as e.g. "12.3u"), from the iterations' time.
  static void PerCall(benchmark::State& state) {
    state.counters["per_call"] = benchmark::Counter(
        kReps, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  }
};

// Skips the benchmark with the status's message and returns when `expr` (a StatusOr)
// failed; else moves its value into `lhs`. Several statements: only at block scope, one
// per line.
#define BENCH_ASSIGN(lhs, expr)                                                           \
  auto PS_BENCH_CONCAT(ps_bench_or_, __LINE__) = (expr);                                  \
  if (!PS_BENCH_CONCAT(ps_bench_or_, __LINE__).ok()) {                                    \
    return state.SkipWithError(                                                           \
        std::string(PS_BENCH_CONCAT(ps_bench_or_, __LINE__).status().message()).c_str()); \
  }                                                                                       \
  lhs = std::move(*PS_BENCH_CONCAT(ps_bench_or_, __LINE__))
#define PS_BENCH_CONCAT(a, b) PS_BENCH_CONCAT_INNER(a, b)
#define PS_BENCH_CONCAT_INNER(a, b) a##b

void BM_CudaSgemmSeam(benchmark::State& state) {
  const Shape s = ShapeOf(state.range(0), state.range(1), state.range(2));
  BENCH_ASSIGN(CudaBench cuda, CudaBench::Create());
  const std::size_t floats = static_cast<std::size_t>(s.m) * s.k + s.k * s.n + s.m * s.n;
  BENCH_ASSIGN(runtime::Buffer buffer, cuda.device->Allocate(sizeof(float) * floats, *cuda.stream));
  float* a = buffer.as<float>();
  float* b = a + static_cast<std::size_t>(s.m) * s.k;
  float* c = b + static_cast<std::size_t>(s.k) * s.n;
  BENCH_CHECK(cuda.math->Fill(a, floats, 0.5f, *cuda.stream));
  for (auto _ : state) {
    BENCH_ASSIGN(const double ms, cuda.MillisForReps([&] {
      return cuda.math->Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a, s.lda, b, s.ldb, 0.0f, c, s.ldc,
                             *cuda.stream);
    }));
    state.SetIterationTime(ms * 1e-3);
  }
  BENCH_CHECK(buffer.FreeAsync(*cuda.stream));
  BENCH_CHECK(cuda.stream->Synchronize());
  SetCounters(state, s, state.range(0), CudaBench::kReps);
  CudaBench::PerCall(state);
}
BENCHMARK(BM_CudaSgemmSeam)->Apply(Args)->UseManualTime();

// The loss of the last stage: softmax cross-entropy forward + dlogits of `rows` rows of
// `classes` logits (in place, as MlpStageWork calls it), through the seam, timed with
// events (`per_call`); the demo's shape is 64 x 10, a language model's head 32000 wide.
void BM_CudaSoftmaxCrossEntropy(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0));
  const int classes = static_cast<int>(state.range(1));
  BENCH_ASSIGN(CudaBench cuda, CudaBench::Create());
  const std::size_t n = static_cast<std::size_t>(rows) * classes;
  BENCH_ASSIGN(
      runtime::Buffer buffer,
      cuda.device->Allocate(sizeof(float) * (n + 1) + sizeof(std::int32_t) * rows, *cuda.stream));
  float* logits = buffer.as<float>();
  float* loss = logits + n;
  auto* labels = reinterpret_cast<std::int32_t*>(loss + 1);
  std::vector<std::int32_t> host_labels(rows);
  for (int r = 0; r < rows; ++r) host_labels[r] = (r * 7) % classes;
  BENCH_CHECK(cuda.stream->Synchronize());  // the allocation, before a blocking copy into it
  BENCH_CHECK(cuda.device->CopyFromHost(labels, host_labels.data(), sizeof(std::int32_t) * rows));
  for (auto _ : state) {
    // Fresh logits each iteration, before the timed events. The loss writes dlogits over
    // them, so the later calls of an iteration read those: the same work.
    BENCH_CHECK(cuda.math->Fill(logits, static_cast<std::int64_t>(n), 0.25f, *cuda.stream));
    BENCH_ASSIGN(const double ms, cuda.MillisForReps([&] {
      return cuda.math->SoftmaxCrossEntropy(logits, labels, rows, classes, 1.0f, loss, logits,
                                            *cuda.stream);
    }));
    state.SetIterationTime(ms * 1e-3);
  }
  BENCH_CHECK(buffer.FreeAsync(*cuda.stream));
  BENCH_CHECK(cuda.stream->Synchronize());
  state.counters["rows"] = rows;
  state.counters["classes"] = classes;
  CudaBench::PerCall(state);
}
BENCHMARK(BM_CudaSoftmaxCrossEntropy)
    ->Args({64, 10})
    ->Args({256, 1000})
    ->Args({256, 32000})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pipesched::model
