// The one way a cuBLAS call is checked, beside base/cuda_check.h's CUDA macros:
//   PS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(...));
// A failure becomes an absl::Status carrying the status name and text, the expression,
// file and line. Include only from sources that link CUDA::cublas.
#pragma once

#include <cublas_v2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipesched {

inline absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const absl::StatusCode code =
      status == CUBLAS_STATUS_ALLOC_FAILED    ? absl::StatusCode::kResourceExhausted
      : status == CUBLAS_STATUS_INVALID_VALUE ? absl::StatusCode::kInvalidArgument
                                              : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat(cublasGetStatusName(status), " (", cublasGetStatusString(status), ") in `",
                         expr, "` at ", file, ":", line));
}

}  // namespace pipesched

#define PS_CUBLAS_STATUS(expr) ::pipesched::CublasStatus((expr), #expr, __FILE__, __LINE__)

#define PS_CUBLAS_RETURN_IF_ERROR(expr)                        \
  do {                                                         \
    ::absl::Status ps_cublas_status_ = PS_CUBLAS_STATUS(expr); \
    if (!ps_cublas_status_.ok()) return ps_cublas_status_;     \
  } while (0)
