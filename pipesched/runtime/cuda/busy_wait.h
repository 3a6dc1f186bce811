// The one kernel of the runtime: a single thread spinning on the GPU's global timer, so
// that EnqueueBusyWait occupies a CUDA stream for a set time (synthetic stage durations,
// overlap tests). Kept apart from the rest so that nvcc compiles one tiny file.
#pragma once

#include <cuda_runtime_api.h>

namespace pipesched::runtime::cuda_detail {

// Enqueued on `stream`; returns immediately with the launch error (cudaGetLastError).
// The current device must be the stream's.
cudaError_t LaunchBusyWait(unsigned long long nanoseconds, cudaStream_t stream);

}  // namespace pipesched::runtime::cuda_detail
