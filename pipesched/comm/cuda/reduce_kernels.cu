// The local (same-GPU) reduction kernels of comm/ (cuda/reduce_kernels.h).
#include "pipesched/comm/cuda/reduce_kernels.h"

namespace pipesched::comm::internal {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

__global__ void AddIntoKernel(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] += src[i];
  }
}

__global__ void ScaleKernel(float* x, float scale, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    x[i] *= scale;
  }
}

unsigned Blocks(std::size_t n) {
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks == 0 ? 1 : blocks) : kMaxBlocks);
}

// Runs `launch` (one <<<>>>) and returns that launch's own error. The last-error slot is
// cleared first: calls that do not go through PS_CUDA_STATUS (NCCL's and cuBLAS's
// internal ones) may have left an error there, which is not this launch's. A sticky
// error (a kernel fault) cannot be cleared and comes back from the launch itself.
template <typename Launch>
cudaError_t CheckedLaunch(Launch&& launch) {
  (void)cudaGetLastError();
  launch();
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAddInto(float* dst, const float* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return CheckedLaunch([&] { AddIntoKernel<<<Blocks(n), kThreads, 0, stream>>>(dst, src, n); });
}

cudaError_t LaunchScale(float* x, float scale, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return CheckedLaunch([&] { ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, scale, n); });
}

}  // namespace pipesched::comm::internal
