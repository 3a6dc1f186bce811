// The backend-neutral half of the seam: Buffer, backend names and the backend table.
#include "pipesched/runtime/runtime.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pipesched/base/strings.h"
#include "pipesched/runtime/host/host_backend.h"
#if PIPESCHED_WITH_CUDA
#include "pipesched/runtime/cuda/cuda_backend.h"
#endif

namespace pipesched::runtime {
namespace {

// The one place backends are registered: adding a backend is one file and one row here.
struct BackendEntry {
  BackendKind kind;
  std::string_view name;
  absl::StatusOr<std::unique_ptr<Backend>> (*create)(const BackendOptions&);
};

#if !PIPESCHED_WITH_CUDA
absl::StatusOr<std::unique_ptr<Backend>> CudaUnavailable(const BackendOptions&) {
  return absl::UnavailableError(
      "the CUDA backend is not available: pipesched was built without CUDA");
}
#endif

constexpr BackendEntry kBackends[] = {
    {BackendKind::kHost, "host", &CreateHostBackend},
#if PIPESCHED_WITH_CUDA
    {BackendKind::kCuda, "cuda", &CreateCudaBackend},
#else
    {BackendKind::kCuda, "cuda", &CudaUnavailable},
#endif
};

const BackendEntry* Find(BackendKind kind) {
  for (const BackendEntry& entry : kBackends) {
    if (entry.kind == kind) return &entry;
  }
  return nullptr;
}

}  // namespace

absl::Status Stream::status() const { return absl::OkStatus(); }
void Stream::Abort(const absl::Status&) {}
bool Stream::aborted() const { return false; }

Buffer::Buffer(Buffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Buffer::~Buffer() { Reset(); }

void Buffer::Reset() {
  if (data_ != nullptr) device_->FreeNow(data_, size_);
  device_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

absl::Status Buffer::FreeAsync(Stream& stream) {
  if (data_ == nullptr) return absl::OkStatus();
  absl::Status status = device_->FreeAsyncImpl(data_, size_, stream);
  if (!status.ok()) return status;  // still owned; the destructor frees it
  device_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  return absl::OkStatus();
}

std::string_view BackendName(BackendKind kind) {
  const BackendEntry* entry = Find(kind);
  return entry != nullptr ? entry->name : "unknown";
}

bool CudaAvailable() { return CudaDeviceCount() > 0; }

#if !PIPESCHED_WITH_CUDA
int CudaDeviceCount() { return 0; }
#endif

absl::StatusOr<BackendKind> ResolveBackend(std::string_view name) {
  if (name == "auto") return CudaAvailable() ? BackendKind::kCuda : BackendKind::kHost;
  for (const BackendEntry& entry : kBackends) {
    if (entry.name == name) return entry.kind;
  }
  std::string accepted = "auto";
  for (const BackendEntry& entry : kBackends) absl::StrAppend(&accepted, ", ", Absl(entry.name));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", Absl(name), "': expected one of ", accepted));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  const BackendEntry* entry = Find(options.kind);
  if (entry == nullptr) return absl::InvalidArgumentError("unknown backend kind");
  if (options.num_devices < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_devices must be >= 0, not ", options.num_devices));
  }
  if (options.memory_capacity_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_capacity_bytes must be >= 0, not ", options.memory_capacity_bytes));
  }
  return entry->create(options);
}

}  // namespace pipesched::runtime
