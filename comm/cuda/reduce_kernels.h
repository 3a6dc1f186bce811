// Private to comm/: the two small kernels the local (same-GPU) reduction needs. Plain
// CUDA types only, so that nvcc never sees Abseil. Enqueued on `stream`; return the
// launch error (cudaGetLastError) or cudaSuccess.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace pipesched::comm::internal {

// dst[i] += src[i] for i < n; dst, src: (n) floats on the stream's device.
cudaError_t LaunchAddInto(float* dst, const float* src, std::size_t n, cudaStream_t stream);
// x[i] *= scale for i < n.
cudaError_t LaunchScale(float* x, float scale, std::size_t n, cudaStream_t stream);

}  // namespace pipesched::comm::internal
