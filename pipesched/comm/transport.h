// Stage-to-stage transfer seam: moves one activation (forward) or one input gradient
// (backward) from the device of one stage to the device of the next. What it is: a
// table of ways to move bytes between two devices, chosen per backend. What it is not:
// a memory manager — both buffers belong to the caller, who orders their allocation,
// writes and frees with events.
//
// In-process transports copy on one transfer stream chosen by the caller (the executor
// pulls activations on the receiver's stream and pushes gradients on the sender's):
//   host:  Device::CopyAsync (a memcpy on the stream's worker thread);
//   CUDA:  cudaMemcpyPeerAsync on that stream.
// A two-sided transport (NCCL send/recv between processes, with multi-host support)
// enqueues a send on the source stream and a receive on the destination stream; the
// seam already carries both sides for it.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/runtime/runtime.h"

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
  // True when Move enqueues a send on src.stream and a receive on dst.stream (NCCL
  // send/recv across processes) rather than one copy on the stream it is given.
  virtual bool two_sided() const = 0;

  // Moves `bytes` from src.data to dst.data. One-sided transports (the in-process
  // copies) enqueue the whole copy on `stream`, a transfer stream of either endpoint's
  // device that the caller has ordered (with event waits) after the writes of src.data
  // and the allocation of dst.data; afterwards, work ordered after `stream`'s current
  // position sees the data and may reuse src.data. Two-sided transports (two_sided())
  // enqueue a send on src.stream and a receive on dst.stream instead, each ordered
  // likewise, and ignore `stream`. Returns immediately. InvalidArgument when an endpoint
  // has no device or the devices and stream are of different backends; the stream's
  // first error once it is poisoned (runtime::Device::CopyAsync).
  virtual absl::Status Move(const Endpoint& src, const Endpoint& dst, std::size_t bytes,
                            runtime::Stream& stream) = 0;
};

// The in-process transport for `kind`: host copy for the host backend, CUDA peer copy
// for CUDA (Unavailable when built without CUDA).
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(runtime::BackendKind kind);

// Always available: copies through Device::CopyAsync of the destination device, whatever
// the backend (on CUDA the runtime's copy is itself a peer copy).
std::unique_ptr<Transport> CreateDeviceCopyTransport();

}  // namespace pipesched::comm
