// Internal: the factories of the Math implementations, registered in math.cc.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "pipesched/model/math.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::model::internal {

absl::StatusOr<std::unique_ptr<Math>> CreateHostMath(runtime::Device& device);
absl::Status PrepareHostMath(int concurrent_streams);
// cuda_math.cu; a stub returning Unavailable when built without CUDA.
absl::StatusOr<std::unique_ptr<Math>> CreateCudaMath(runtime::Device& device);

}  // namespace pipesched::model::internal
