// The one way a GPU test skips. Use at the top of a TEST body (or in SetUp):
//   PS_SKIP_IF_NO_GPU();          // skips unless at least one GPU is usable
//   PS_SKIP_IF_FEWER_GPUS(2);     // skips unless at least two are
// The skip message says why (e.g. "cudaErrorInsufficientDriver"), so a GPU machine
// that skips by mistake is noticed in ctest's output. Link pipesched::runtime.
#pragma once

#include <string>

#include "gtest/gtest.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::testing {

// Why the CUDA backend cannot be created here; "" when it can.
inline std::string NoGpuReason() {
  if (runtime::CudaAvailable()) return "";
  runtime::BackendOptions options;
  options.kind = runtime::BackendKind::kCuda;
  options.num_devices = 0;
  absl::StatusOr<std::unique_ptr<runtime::Backend>> backend = runtime::CreateBackend(options);
  return backend.ok() ? "CudaAvailable() is false" : std::string(backend.status().message());
}

}  // namespace pipesched::testing

#define PS_SKIP_IF_NO_GPU() PS_SKIP_IF_FEWER_GPUS(1)

#define PS_SKIP_IF_FEWER_GPUS(n)                                                                \
  do {                                                                                          \
    if (::pipesched::runtime::CudaDeviceCount() < (n)) {                                        \
      if (::pipesched::runtime::CudaAvailable()) {                                              \
        GTEST_SKIP() << "needs " << (n) << " GPUs, " << ::pipesched::runtime::CudaDeviceCount() \
                     << " usable";                                                              \
      }                                                                                         \
      GTEST_SKIP() << ::pipesched::testing::NoGpuReason();                                      \
    }                                                                                           \
  } while (0)
