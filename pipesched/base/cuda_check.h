// The one way a CUDA runtime call is checked. Every call goes through these macros:
//   PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
//   absl::Status s = PS_CUDA_STATUS(cudaEventQuery(event));
// A failure becomes an absl::Status carrying the error's name and text, the expression,
// file and line; CUDA's last-error slot is cleared (cudaGetLastError) so that a later
// unrelated check does not report it again. Sticky errors (a kernel fault) cannot be
// cleared by anything but the process exiting: they keep coming back from every call.
// Include only from sources that link CUDA::cudart; never from a public seam header.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pipesched {

// Maps a CUDA error to the closest absl code: out of memory -> ResourceExhausted, no
// device / driver -> Unavailable, bad arguments -> InvalidArgument, not ready ->
// Unavailable, anything else -> Internal.
inline absl::StatusCode CudaErrorCode(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotReady:
      return absl::StatusCode::kUnavailable;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

inline absl::Status CudaStatus(cudaError_t error, const char* expr, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();  // clear the last-error slot; see the file comment
  return absl::Status(CudaErrorCode(error),
                      absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error),
                                   ") in `", expr, "` at ", file, ":", line));
}

// True when `status` came from PS_CUDA_STATUS of a call that failed with `error`; for the
// few calls whose "errors" are answers (cudaEventQuery's cudaErrorNotReady).
inline bool IsCudaError(const absl::Status& status, cudaError_t error) {
  return !status.ok() && absl::StartsWith(status.message(), cudaGetErrorName(error));
}

// Makes `device` current for its scope and restores the caller's current device after;
// costs one cudaGetDevice when `device` is current already. status(): the switch's error
// (check it before launching: a launch must never go to the wrong device unnoticed).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      current = -1;
    }
    if (current != device) {
      status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice(device)", __FILE__, __LINE__);
      if (status_.ok()) previous_ = current;
    }
  }
  ~CudaDeviceGuard() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;  // -1: nothing to restore
  absl::Status status_;
};

}  // namespace pipesched

// absl::Status of one CUDA runtime call.
#define PS_CUDA_STATUS(expr) ::pipesched::CudaStatus((expr), #expr, __FILE__, __LINE__)

// Returns the absl::Status of a failed CUDA runtime call from the enclosing function.
#define PS_CUDA_RETURN_IF_ERROR(expr)                      \
  do {                                                     \
    ::absl::Status ps_cuda_status_ = PS_CUDA_STATUS(expr); \
    if (!ps_cuda_status_.ok()) return ps_cuda_status_;     \
  } while (0)

// After a kernel launch (<<<...>>> returns nothing): the launch error, if any.
#define PS_CUDA_LAUNCH_STATUS() PS_CUDA_STATUS(cudaGetLastError())
