// Private to comm/: the two small kernels the local (same-GPU) reduction needs. Plain
// CUDA types only, so that nvcc never sees Abseil. Enqueued on `stream`, which must be on
// the current device; return immediately, with the error of their own launch (the
// last-error slot is cleared before it, so an earlier unchecked call's error is not
// reported as theirs) or cudaSuccess; n == 0 launches nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace pipesched::comm::internal {

// dst[i] += src[i] for i < n; dst, src: (n) floats on the stream's device.
cudaError_t LaunchAddInto(float* dst, const float* src, std::size_t n, cudaStream_t stream);
// x[i] *= scale for i < n.
cudaError_t LaunchScale(float* x, float scale, std::size_t n, cudaStream_t stream);

}  // namespace pipesched::comm::internal
