// Per-device byte accounting shared by the backends: current and peak bytes live through
// Device::Allocate, and an optional capacity. Thread-safe: frees are counted on stream
// worker threads or the calling thread (host), or on the host thread that next allocates
// or reads the stats once the free's event has completed (CUDA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::runtime {

class MemoryAccount {
 public:
  // `capacity` 0 = unlimited.
  explicit MemoryAccount(std::int64_t capacity) : capacity_(capacity) {}

  // Counts `bytes` as live, or ResourceExhausted naming `device`, the request and what is
  // free when the capacity would be exceeded.
  absl::Status Reserve(std::int64_t bytes, const std::string& device) {
    std::lock_guard<std::mutex> lock(mu_);
    if (capacity_ > 0 && stats_.current_bytes + bytes > capacity_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          device, ": cannot allocate ", bytes, " bytes: ", capacity_ - stats_.current_bytes,
          " bytes free of a capacity of ", capacity_, " (", stats_.current_bytes, " in use)"));
    }
    stats_.current_bytes += bytes;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
    return absl::OkStatus();
  }

  void Release(std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.current_bytes -= bytes;
  }

  MemoryStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void ResetPeak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
  }

  std::int64_t capacity() const { return capacity_; }

 private:
  const std::int64_t capacity_;
  mutable std::mutex mu_;
  MemoryStats stats_;
};

}  // namespace pipesched::runtime
