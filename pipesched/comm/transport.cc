// Transport factories and the device-copy transport (comm/transport.h).
#include "pipesched/comm/transport.h"

#include "absl/strings/str_cat.h"
#include "pipesched/comm/internal.h"

namespace pipesched::comm {
namespace {

class DeviceCopyTransport final : public Transport {
 public:
  std::string_view name() const override { return "host-copy"; }
  bool two_sided() const override { return false; }
  absl::Status Move(const Endpoint& src, const Endpoint& dst, std::size_t bytes,
                    runtime::Stream& stream) override {
    if (src.device == nullptr || dst.device == nullptr) {
      return absl::InvalidArgumentError("Transport::Move: an endpoint has no device");
    }
    return dst.device->CopyAsync(dst.data, src.data, bytes, *src.device, stream);
  }
};

}  // namespace

std::unique_ptr<Transport> CreateDeviceCopyTransport() {
  return std::make_unique<DeviceCopyTransport>();
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(runtime::BackendKind kind) {
  switch (kind) {
    case runtime::BackendKind::kHost:
      return CreateDeviceCopyTransport();
    case runtime::BackendKind::kCuda:
#ifdef PIPESCHED_HAS_CUDA
      return internal::CreateCudaPeerTransport();
#else
      return absl::UnavailableError(
          "the CUDA peer-copy transport is not available: pipesched was built without CUDA");
#endif
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace pipesched::comm
