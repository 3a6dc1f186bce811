// Stage-to-stage transfer seam: moves one activation (forward) or one input gradient
// (backward) from the device of one stage to the device of the next. What it is: a
// table of ways to move bytes between two devices, chosen per backend. What it is not:
// a memory manager — both buffers belong to the caller, who orders their allocation,
// writes and frees with events.
//
// In-process transports copy on the destination's transfer stream ("pull"):
//   host:  Device::CopyAsync (a memcpy on the stream's worker thread);
//   CUDA:  cudaMemcpyPeerAsync on the destination's transfer stream.
// A two-sided transport (NCCL send/recv between processes, with multi-host support)
// enqueues a send on the source stream and a receive on the destination stream; the
// seam already carries both sides for it.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/runtime.h"

namespace pipesched::comm {

// One side of a transfer: a device, that device's transfer stream, and the buffer
// (source: read; destination: written). Device pointers.
struct Endpoint {
  runtime::Device* device = nullptr;
  runtime::Stream* stream = nullptr;
  void* data = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;  // "host-copy", "cuda-peer"
  // True when Move also enqueues work on src.stream (NCCL send/recv); the caller must
  // then order the reuse of src.data after an event recorded on src.stream too.
  virtual bool two_sided() const = 0;

  // Moves `bytes` from src.data to dst.data. Before the call, order dst.stream (and
  // src.stream when two_sided()) after the writes of src.data and the allocation of
  // dst.data. Afterwards, work ordered after dst.stream's current position sees the
  // data; src.data may be overwritten or freed by work ordered after dst.stream's (and,
  // when two_sided(), src.stream's) current position. Enqueued on dst.stream (and
  // src.stream); returns immediately.
  virtual absl::Status Move(const Endpoint& src, const Endpoint& dst, std::size_t bytes) = 0;
};

// The in-process transport for `kind`: host copy for the host backend, CUDA peer copy
// for CUDA (Unavailable when built without CUDA).
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(runtime::BackendKind kind);

// Always available: copies through Device::CopyAsync of the destination device, whatever
// the backend (on CUDA the runtime's copy is itself a peer copy).
std::unique_ptr<Transport> CreateDeviceCopyTransport();

}  // namespace pipesched::comm
