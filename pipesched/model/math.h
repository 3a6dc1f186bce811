// The math seam of the built-in MLP: every op the model needs, on raw device pointers,
// enqueued on a runtime::Stream. Two implementations chosen by the device's backend:
//   host: OpenBLAS (single-threaded inside each stream, so that stages run in parallel
//         on their own stream threads) plus plain loops; each op is one closure
//         enqueued with Stream::EnqueueHost;
//   cuda: cuBLAS sgemm in fp32 with CUBLAS_DEFAULT_MATH, which never uses TF32 for
//         sgemm (TF32 stays off so that results match the host's to ~1e-5), plus small
//         kernels, launched on the stream's cudaStream_t, every launch checked. Empty
//         shapes behave as on the host.
// It is not a tensor library: no shapes, no allocation, no autograd. model/chunk.h builds
// the layers on top of it.
//
// Conventions: every matrix is row-major, dimensions and leading dimensions are in
// elements. Every op is enqueued on `stream` (the last parameter) and returns
// immediately; the returned Status reports enqueue errors only. Errors found while the
// op runs (host: a label out of range) poison the stream and surface from
// Stream::Synchronize(); the CUDA kernels report no data errors (see SoftmaxCrossEntropy).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::model {

enum class Transpose { kNo, kYes };

// PyTorch torch.optim.SGD semantics with dampening 0 and nesterov off:
//   g = grad + weight_decay * p
//   buf = momentum * buf + g          (buf starts at 0, so the first step is buf = g)
//   p -= lr * (momentum != 0 ? buf : g)
struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

// PyTorch torch.optim.AdamW semantics (amsgrad off), step t counted from 1:
//   p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

class Math {
 public:
  virtual ~Math() = default;
  virtual runtime::BackendKind kind() const = 0;

  // c: (m, n) = alpha * op(a) * op(b) + beta * c, where op(a): (m, k), op(b): (k, n).
  // With beta == 0, c is not read (it may hold NaN). k <= 0: c = beta * c (0 when
  // beta == 0); m <= 0 or n <= 0: nothing.
  virtual absl::Status Gemm(Transpose trans_a, Transpose trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc, runtime::Stream& stream) = 0;

  // y: (rows, cols); y[r][c] += bias[c].
  virtual absl::Status AddBias(float* y, const float* bias, int rows, int cols,
                               runtime::Stream& stream) = 0;

  // out[c] += sum_r x[r][c]; x: (rows, cols), out: (cols). The bias gradient.
  virtual absl::Status ColumnSumAccumulate(const float* x, float* out, int rows, int cols,
                                           runtime::Stream& stream) = 0;

  // y = gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), elementwise over n; y may
  // alias x.
  virtual absl::Status Gelu(const float* x, float* y, std::int64_t n, runtime::Stream& stream) = 0;

  // dx = dy * gelu'(x), gelu'(x) = Phi(x) + x * phi(x); dx may alias x or dy.
  virtual absl::Status GeluBackward(const float* x, const float* dy, float* dx, std::int64_t n,
                                    runtime::Stream& stream) = 0;

  // out = a + b, elementwise over n; out may alias a or b.
  virtual absl::Status Add(const float* a, const float* b, float* out, std::int64_t n,
                           runtime::Stream& stream) = 0;

  // x[i] = value for i < n.
  virtual absl::Status Fill(float* x, std::int64_t n, float value, runtime::Stream& stream) = 0;

  // Softmax cross-entropy against integer labels. logits: (rows, classes), labels: (rows)
  // in [0, classes).
  //   loss[0] = (1 / rows) * sum_r -log softmax(logits[r])[labels[r]]   (one float)
  //   dlogits = grad_scale / rows * (softmax(logits) - onehot(labels))
  // dlogits may alias logits. rows == 0: loss[0] = 0. A label out of range: the host
  // poisons the stream with InvalidArgument naming the row and the label (writing
  // nothing); CUDA returns OK and never poisons the stream: it writes NaN to loss[0] and
  // to that row of dlogits (the other rows are correct), so check the loss for NaN.
  virtual absl::Status SoftmaxCrossEntropy(const float* logits, const std::int32_t* labels,
                                           int rows, int classes, float grad_scale, float* loss,
                                           float* dlogits, runtime::Stream& stream) = 0;

  // One optimizer update of n parameters (see SgdParams); momentum_buf is unused (may be
  // null) when params.momentum == 0.
  virtual absl::Status SgdStep(float* param, const float* grad, float* momentum_buf, std::int64_t n,
                               const SgdParams& params, runtime::Stream& stream) = 0;

  // One AdamW update (see AdamWParams); `step` is the 1-based step count t.
  virtual absl::Status AdamWStep(float* param, const float* grad, float* m, float* v,
                                 std::int64_t n, const AdamWParams& params, std::int64_t step,
                                 runtime::Stream& stream) = 0;
};

// Makes now what `kind`'s math needs for `concurrent_streams` streams to run it at once,
// so that a step cannot fail or hang getting it: on the host, OpenBLAS's work buffers
// (see host_kernels.h; ResourceExhausted when `ulimit -v` or `ulimit -d` leaves no room
// for them, naming the limit); nothing on CUDA (cuBLAS's workspace comes with each
// Math). Call it before the step, once the streams exist; cheap when made before.
absl::Status PrepareMath(runtime::BackendKind kind, int concurrent_streams);

// The implementation for `device`'s backend. Unavailable for CUDA when built without it.
// The object must only be used with streams of `device`, from one host thread at a time.
absl::StatusOr<std::unique_ptr<Math>> CreateMath(runtime::Device& device);

}  // namespace pipesched::model
