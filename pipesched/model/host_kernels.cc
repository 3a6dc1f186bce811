// Host kernels: OpenBLAS for gemm, plain loops for the rest. Reductions accumulate in
// double so that their result does not depend on the batch split more than necessary.
#include "pipesched/model/host_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipesched/base/host_memory.h"

// OpenBLAS's own pool of work buffers (driver/others/memory.c), exported by libopenblas
// but declared in no header: a buffer taken from the pool, mapped when none is free.
extern "C" void* blas_memory_alloc(int procpos);
extern "C" void blas_memory_free(void* buffer);

namespace pipesched::model::host {
namespace {

CBLAS_TRANSPOSE ToCblas(Transpose t) { return t == Transpose::kYes ? CblasTrans : CblasNoTrans; }

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

void SetBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

namespace {

struct BlasReservation {
  std::mutex mu;
  int reserved = 0;
  // What one buffer maps: OpenBLAS's BUFFER_SIZE for x86-64 builds (32 << 22) and a page,
  // or more where a larger mapping is seen (other builds map 32 or 64 MiB: errs high).
  std::int64_t buffer_bytes = (std::int64_t{128} << 20) + 4096;
};

BlasReservation& Reservation() {
  static BlasReservation* r = new BlasReservation();
  return *r;
}

}  // namespace

int BlasPoolSize() {
  // OpenBLAS's pool has max(50, 2 x MAX_THREADS) slots (driver/others/memory.c); past them
  // it takes "overflow" slots, mapped again on every use (and, in 0.3.21, freeing many of
  // them writes past its own array). openblas_get_config() says "... MAX_THREADS=64".
  const std::string config = openblas_get_config();
  const std::size_t at = config.find("MAX_THREADS=");
  int max_threads = 64;
  if (at != std::string::npos) {
    max_threads = std::atoi(config.c_str() + at + std::strlen("MAX_THREADS="));
    if (max_threads < 1) max_threads = 64;
  }
  // Less the buffers OpenBLAS's own threads hold for their lifetime (one per CPU but the
  // caller's, started when the library loads, idle since SetBlasSingleThreaded).
  const int own_threads = std::max(0, std::min(openblas_get_num_procs(), max_threads) - 1);
  return std::max(1, std::max(50, 2 * max_threads) - own_threads);
}

absl::Status ReserveBlasWorkspaces(int concurrent) {
  SetBlasSingleThreaded();
  BlasReservation& r = Reservation();
  std::lock_guard<std::mutex> lock(r.mu);
  // Without a limit on mappings none can fail: no facts to read for each buffer.
  const std::optional<MemoryHeadroom> limit = MappingHeadroom(ReadMemoryFacts());
  const bool limited = limit.has_value();
  // Beyond the pool nothing stays mapped to be reserved: past it every use maps, and a
  // mapping that fails under the limit would retry forever.
  const int pool = BlasPoolSize();
  if (limited && concurrent > pool) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "OpenBLAS keeps ", pool, " work buffers mapped for reuse, and ", concurrent,
        " threads multiplying at once are more: past them it maps a buffer on each use, "
        "and retries forever where a mapping fails, which a limit on mappings makes possible: ",
        DescribeHeadroom(*limit), "; use at most ", pool,
        " threads multiplying at once, or lift the limit"));
  }
  concurrent = std::min(concurrent, pool);
  if (concurrent <= r.reserved) return absl::OkStatus();
  std::vector<void*> held;
  held.reserve(concurrent);
  absl::Status status;
  while (static_cast<int>(held.size()) < concurrent) {
    // The first `reserved` come from buffers held at once before: mapped, and free.
    const bool may_map = static_cast<int>(held.size()) >= r.reserved;
    std::optional<MemoryFacts> before;
    if (may_map && limited) {
      before = ReadMemoryFacts();
      const std::optional<MemoryHeadroom> room = MappingHeadroom(*before);
      if (room.has_value() && room->bytes < r.buffer_bytes) {
        status = absl::ResourceExhaustedError(absl::StrCat(
            "OpenBLAS maps a ", HumanBytes(r.buffer_bytes), " work buffer for each of ", concurrent,
            " threads multiplying at once and cannot map buffer ", held.size() + 1,
            " (it would retry forever): ", DescribeHeadroom(*room),
            "; use fewer threads multiplying at once, or raise that limit"));
        break;
      }
    }
    void* buffer = blas_memory_alloc(0);
    if (buffer == nullptr) {
      status = absl::ResourceExhaustedError(absl::StrCat("OpenBLAS gave no work buffer for thread ",
                                                         held.size() + 1, " of ", concurrent,
                                                         " multiplying at once"));
      break;
    }
    held.push_back(buffer);
    if (before.has_value() && before->vm_size.has_value()) {
      // A new mapping larger than assumed: learn it (upward only, so that another
      // thread's unmapping meanwhile cannot make the next check too lenient).
      const std::optional<std::int64_t> vm_size = ReadMemoryFacts().vm_size;
      const std::int64_t grew = vm_size.value_or(*before->vm_size) - *before->vm_size;
      if (grew > r.buffer_bytes && grew <= (std::int64_t{1} << 30)) r.buffer_bytes = grew;
    }
  }
  // However it ended, this many were held at once: mapped, and free again below.
  r.reserved = std::max(r.reserved, static_cast<int>(held.size()));
  for (void* buffer : held) blas_memory_free(buffer);
  return status;
}

int ReservedBlasWorkspaces() {
  BlasReservation& r = Reservation();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.reserved;
}

void Gemm(Transpose trans_a, Transpose trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // BLAS leaves C alone or scales it; make beta == 0 mean "overwrite" here too.
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, ToCblas(trans_a), ToCblas(trans_b), m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

void AddBias(float* y, const float* bias, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    float* row = y + static_cast<std::int64_t>(r) * cols;
    for (int c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void ColumnSumAccumulate(const float* x, float* out, int rows, int cols) {
  std::vector<double> acc(cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    const float* row = x + static_cast<std::int64_t>(r) * cols;
    for (int c = 0; c < cols; ++c) acc[c] += row[c];
  }
  for (int c = 0; c < cols; ++c) out[c] = static_cast<float>(out[c] + acc[c]);
}

void Gelu(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::erf(v * static_cast<float>(kInvSqrt2)));
  }
}

void GeluBackward(const float* x, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + std::erf(v * static_cast<float>(kInvSqrt2)));
    const float pdf = static_cast<float>(kInvSqrt2Pi) * std::exp(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

void Add(const float* a, const float* b, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void Fill(float* x, std::int64_t n, float value) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = value;
}

absl::Status SoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows,
                                 int classes, float grad_scale, float* loss, float* dlogits) {
  for (int r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= classes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("label %d of sample %d is out of range [0, %d)", labels[r], r, classes));
    }
  }
  double total = 0.0;
  const float scale = grad_scale / static_cast<float>(rows);
  for (int r = 0; r < rows; ++r) {
    const float* l = logits + static_cast<std::int64_t>(r) * classes;
    float* d = dlogits + static_cast<std::int64_t>(r) * classes;
    float max = l[0];
    for (int c = 1; c < classes; ++c) max = std::max(max, l[c]);
    double sum = 0.0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(l[c]) - max);
    const double lse = max + std::log(sum);
    const int label = labels[r];
    total += lse - l[label];
    for (int c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(l[c]) - lse);
      d[c] = static_cast<float>(scale * (p - (c == label ? 1.0 : 0.0)));
    }
  }
  loss[0] = static_cast<float>(rows > 0 ? total / rows : 0.0);
  return absl::OkStatus();
}

void SgdStep(float* param, const float* grad, float* momentum_buf, std::int64_t n,
             const SgdParams& params) {
  for (std::int64_t i = 0; i < n; ++i) {
    float g = grad[i] + params.weight_decay * param[i];
    if (params.momentum != 0.0f) {
      momentum_buf[i] = params.momentum * momentum_buf[i] + g;
      g = momentum_buf[i];
    }
    param[i] -= params.lr * g;
  }
}

void AdamWStep(float* param, const float* grad, float* m, float* v, std::int64_t n,
               const AdamWParams& params, std::int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(params.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(params.beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(params.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - params.lr * params.weight_decay;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    param[i] *= decay;
    m[i] = params.beta1 * m[i] + (1.0f - params.beta1) * g;
    v[i] = params.beta2 * v[i] + (1.0f - params.beta2) * g * g;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + params.eps;
    param[i] -= step_size * m[i] / denom;
  }
}

}  // namespace pipesched::model::host
