// Private to comm/: the backend factories that transport.cc and all_reduce.cc dispatch
// to. The CUDA ones exist only when built with CUDA (PIPESCHED_HAS_CUDA).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/comm/transport.h"

namespace pipesched::comm::internal {

std::unique_ptr<AllReducer> CreateHostAllReducer(int size, const AllReducerOptions& options = {});

#ifdef PIPESCHED_HAS_CUDA
std::unique_ptr<Transport> CreateCudaPeerTransport();
absl::StatusOr<std::unique_ptr<AllReducer>> CreateNcclAllReducer(
    const std::vector<runtime::Device*>& devices, const AllReducerOptions& options);
#endif

}  // namespace pipesched::comm::internal
