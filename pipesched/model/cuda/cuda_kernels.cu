// The model's small CUDA kernels. Simple and memory-bound by design: elementwise ops use a
// grid-stride loop; the bias gradient uses one thread per column (rows are the
// micro-batch, a few hundred at most); the loss is one block with a warp per row, whose
// sum is deterministic. Reductions accumulate in double like the host.
#include <cmath>

#include "pipesched/model/cuda/cuda_kernels.h"

namespace pipesched::model::cuda_detail {
namespace {

constexpr int kThreads = 256;

int Blocks(std::int64_t n) {
  std::int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65535) blocks = 65535;
  return blocks < 1 ? 1 : static_cast<int>(blocks);
}

// Runs `launch` (one <<<>>>) and returns that launch's own error. The last-error slot is
// cleared first: calls that do not go through PS_CUDA_STATUS (cuBLAS's and NCCL's
// internal ones) may have left an error there, which is not this launch's. A sticky
// error (a kernel fault) cannot be cleared and comes back from the launch itself.
template <typename Launch>
cudaError_t CheckedLaunch(Launch&& launch) {
  (void)cudaGetLastError();
  launch();
  return cudaGetLastError();
}

#define PS_GRID_STRIDE(i, n)                                                                       \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

__global__ void AddBiasKernel(float* y, const float* bias, int rows, int cols) {
  PS_GRID_STRIDE(i, static_cast<std::int64_t>(rows) * cols) { y[i] += bias[i % cols]; }
}

__global__ void ColumnSumKernel(const float* x, float* out, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double acc = 0.0;
  for (int r = 0; r < rows; ++r) acc += x[static_cast<std::int64_t>(r) * cols + c];
  out[c] = static_cast<float>(out[c] + acc);
}

__global__ void GeluKernel(const float* x, float* y, std::int64_t n) {
  PS_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
  }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, std::int64_t n) {
  PS_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752440f));
    const float pdf = 0.39894228040143267794f * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

__global__ void AddKernel(const float* a, const float* b, float* out, std::int64_t n) {
  PS_GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
}

__global__ void FillKernel(float* x, std::int64_t n, float value) {
  PS_GRID_STRIDE(i, n) { x[i] = value; }
}

// c: (rows, cols) with leading dimension ldc; c = beta * c, and 0 without reading c
// when beta == 0 (it may hold NaN).
__global__ void ScaleMatrixKernel(float* c, int rows, int cols, int ldc, float beta) {
  PS_GRID_STRIDE(i, static_cast<std::int64_t>(rows) * cols) {
    float* x = c + (i / cols) * ldc + i % cols;
    *x = beta == 0.0f ? 0.0f : beta * *x;
  }
}

// One block of kLossThreads; warp w takes rows w, w + warps, ...: per row a warp max and a
// warp sum of exp (shuffles, no block barrier), then its dlogits. Each warp adds its rows'
// losses in row order and thread 0 adds the warps' partial sums in warp order, so the sum
// is the same on every run.
constexpr int kLossThreads = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

__global__ void __launch_bounds__(kLossThreads)
    SoftmaxCrossEntropyKernel(const float* logits, const std::int32_t* labels, int rows,
                              int classes, float grad_scale, float* loss, float* dlogits) {
  __shared__ double warp_total[kLossThreads / 32];
  __shared__ int warp_bad[kLossThreads / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  const double scale = static_cast<double>(grad_scale) / rows;
  double total = 0.0;  // the same in every lane of the warp
  bool bad_any = false;
  for (int r = warp; r < rows; r += warps) {  // warp-uniform: every lane takes every row
    const float* l = logits + static_cast<std::int64_t>(r) * classes;
    float* d = dlogits + static_cast<std::int64_t>(r) * classes;
    const int label = labels[r];
    const bool bad = label < 0 || label >= classes;
    double mx = -INFINITY;
    for (int c = lane; c < classes; c += 32) mx = fmax(mx, static_cast<double>(l[c]));
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(kFullMask, mx, o));
    double sum = 0.0;
    for (int c = lane; c < classes; c += 32) sum += exp(static_cast<double>(l[c]) - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(kFullMask, sum, o);
    sum = __shfl_sync(kFullMask, sum, 0);  // lane 0's order, in every lane
    const double lse = mx + log(sum);
    // Every lane reads the label's logit before any lane overwrites it (dlogits may alias
    // logits; each lane writes only the columns it read itself above).
    const double picked = bad ? 0.0 : static_cast<double>(l[label]);
    __syncwarp(kFullMask);
    for (int c = lane; c < classes; c += 32) {
      const double p = exp(static_cast<double>(l[c]) - lse);
      d[c] = bad ? NAN : static_cast<float>(scale * (p - (c == label ? 1.0 : 0.0)));
    }
    total += lse - picked;
    bad_any = bad_any || bad;
  }
  if (lane == 0) {
    warp_total[warp] = total;
    warp_bad[warp] = bad_any ? 1 : 0;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double sum = 0.0;
  bool bad = false;
  for (int w = 0; w < warps; ++w) {
    sum += warp_total[w];
    bad = bad || warp_bad[w] != 0;
  }
  // rows == 0: a loss of 0, as the host (not 0 / 0).
  loss[0] = bad ? NAN : (rows > 0 ? static_cast<float>(sum / rows) : 0.f);
}

__global__ void SgdKernel(float* param, const float* grad, float* buf, std::int64_t n, float lr,
                          float momentum, float weight_decay) {
  PS_GRID_STRIDE(i, n) {
    float g = grad[i] + weight_decay * param[i];
    if (momentum != 0.0f) {
      buf[i] = momentum * buf[i] + g;
      g = buf[i];
    }
    param[i] -= lr * g;
  }
}

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, std::int64_t n,
                            float decay, float beta1, float beta2, float eps, float step_size,
                            float bc2_sqrt) {
  PS_GRID_STRIDE(i, n) {
    const float g = grad[i];
    float p = param[i] * decay;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    param[i] = p;
  }
}

}  // namespace

// Empty shapes launch nothing (a grid of 0 blocks is a launch error), as the host loops
// do nothing; the loss is the exception: it is written (0) even for 0 rows.

cudaError_t LaunchAddBias(float* y, const float* bias, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  return CheckedLaunch([&] {
    AddBiasKernel<<<Blocks(static_cast<std::int64_t>(rows) * cols), kThreads, 0, stream>>>(
        y, bias, rows, cols);
  });
}

cudaError_t LaunchColumnSumAccumulate(const float* x, float* out, int rows, int cols,
                                      cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;  // out += 0
  return CheckedLaunch([&] {
    ColumnSumKernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, stream>>>(x, out, rows, cols);
  });
}

cudaError_t LaunchGelu(const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return CheckedLaunch([&] { GeluKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n); });
}

cudaError_t LaunchGeluBackward(const float* x, const float* dy, float* dx, std::int64_t n,
                               cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return CheckedLaunch(
      [&] { GeluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, dy, dx, n); });
}

cudaError_t LaunchAdd(const float* a, const float* b, float* out, std::int64_t n,
                      cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return CheckedLaunch([&] { AddKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, out, n); });
}

cudaError_t LaunchFill(float* x, std::int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return CheckedLaunch([&] { FillKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, value); });
}

cudaError_t LaunchScaleMatrix(float* c, int rows, int cols, int ldc, float beta,
                              cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  return CheckedLaunch([&] {
    ScaleMatrixKernel<<<Blocks(static_cast<std::int64_t>(rows) * cols), kThreads, 0, stream>>>(
        c, rows, cols, ldc, beta);
  });
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows,
                                      int classes, float grad_scale, float* loss, float* dlogits,
                                      cudaStream_t stream) {
  return CheckedLaunch([&] {
    SoftmaxCrossEntropyKernel<<<1, kLossThreads, 0, stream>>>(logits, labels, rows, classes,
                                                              grad_scale, loss, dlogits);
  });
}

cudaError_t LaunchSgdStep(float* param, const float* grad, float* momentum_buf, std::int64_t n,
                          float lr, float momentum, float weight_decay, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return CheckedLaunch([&] {
    SgdKernel<<<Blocks(n), kThreads, 0, stream>>>(param, grad, momentum_buf, n, lr, momentum,
                                                  weight_decay);
  });
}

cudaError_t LaunchAdamWStep(float* param, const float* grad, float* m, float* v, std::int64_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            float step_size, float bc2_sqrt, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return CheckedLaunch([&] {
    AdamWKernel<<<Blocks(n), kThreads, 0, stream>>>(param, grad, m, v, n, 1.0f - lr * weight_decay,
                                                    beta1, beta2, eps, step_size, bc2_sqrt);
  });
}

}  // namespace pipesched::model::cuda_detail
