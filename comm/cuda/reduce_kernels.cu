// The local (same-GPU) reduction kernels of comm/ (cuda/reduce_kernels.h).
#include "comm/cuda/reduce_kernels.h"

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

}  // namespace

cudaError_t LaunchAddInto(float* dst, const float* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddIntoKernel<<<Blocks(n), kThreads, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float* x, float scale, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, scale, n);
  return cudaGetLastError();
}

}  // namespace pipesched::comm::internal
