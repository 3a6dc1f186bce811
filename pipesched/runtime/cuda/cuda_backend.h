// The CUDA backend, registered in runtime.cc. Compiled only when PIPESCHED_HAS_CUDA.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::runtime {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace pipesched::runtime
