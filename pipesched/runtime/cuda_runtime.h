// CUDA-facing helpers for code that enqueues its own kernels on seam streams (model/,
// comm/, embedders). Includes the CUDA runtime header, unlike runtime.h: include it
// only from sources compiled with CUDA (pipesched::runtime links CUDA::cudart then).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::runtime {

// The cudaStream_t behind a CUDA-backend stream, InvalidArgument for any other stream.
inline absl::StatusOr<cudaStream_t> CudaStreamOf(const Stream& stream) {
  if (stream.device().kind() != BackendKind::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat("stream '", stream.name(), "' on ",
                                                   stream.device().description(),
                                                   " is not a CUDA stream"));
  }
  return static_cast<cudaStream_t>(stream.native_handle());
}

// The same without the check, for hot paths that already know the backend.
inline cudaStream_t UncheckedCudaStream(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.native_handle());
}

}  // namespace pipesched::runtime
