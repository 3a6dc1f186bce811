// The one way an NCCL call is checked, beside base/cuda_check.h's CUDA macros:
//   PS_NCCL_RETURN_IF_ERROR(ncclAllReduce(...));
// A failure becomes an absl::Status carrying the NCCL result and text, the expression,
// file and line. Include only from sources that link NCCL::nccl.
#pragma once

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipesched {

inline absl::Status NcclStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  const absl::StatusCode code = result == ncclInvalidArgument || result == ncclInvalidUsage
                                    ? absl::StatusCode::kInvalidArgument
                                    : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat("NCCL error ", static_cast<int>(result), " (", ncclGetErrorString(result),
                         ") in `", expr, "` at ", file, ":", line));
}

}  // namespace pipesched

#define PS_NCCL_STATUS(expr) ::pipesched::NcclStatus((expr), #expr, __FILE__, __LINE__)

#define PS_NCCL_RETURN_IF_ERROR(expr)                      \
  do {                                                     \
    ::absl::Status ps_nccl_status_ = PS_NCCL_STATUS(expr); \
    if (!ps_nccl_status_.ok()) return ps_nccl_status_;     \
  } while (0)
