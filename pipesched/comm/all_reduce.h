// Data-parallel gradient reduction seam: averages a gradient buffer across the D
// replicas of one pipeline stage, in place, with NCCL's semantics:
//   - one call issues every participant's part, each on that participant's own
//     stream (one process drives all replicas of the stage);
//   - the reduction happens once all D parts have been reached on their streams, and
//     no participant's stream proceeds past its part before the reduction is done;
//   - calls on one AllReducer must be issued in the same order for every participant
//     (they are: one call issues all parts).
// Implementations:
//   host: an in-process rendezvous; the last stream to arrive sums the D buffers in
//         participant order (so every replica gets bit-identical values), scales by 1/D
//         and releases the others. A participant gives up with DeadlineExceeded after
//         AllReducerOptions::timeout_seconds, or with Cancelled at once on Abort().
//   CUDA: NCCL communicators over the participants' GPUs (ncclCommInitAll), ncclAvg,
//         the D calls grouped; participants that share a GPU are first summed onto one
//         leader by a local kernel (NCCL allows one rank per GPU), and the leaders'
//         result is copied back to them.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::comm {

// Participant i's buffer (device memory on participant i's device) and the stream its
// part is enqueued on (a stream of that device, usually its comm stream).
struct ReducePart {
  float* data = nullptr;
  runtime::Stream* stream = nullptr;
};

class AllReducer {
 public:
  virtual ~AllReducer() = default;
  virtual std::string_view name() const = 0;  // "host", "nccl", "nccl+local", "local"
  virtual int size() const = 0;               // D participants

  // Averages `count` floats across the participants in place: afterwards every
  // parts[i].data holds the mean of the D inputs. parts.size() == size(), parts[i] on
  // participant i's device. Enqueued on each parts[i].stream; returns immediately.
  // InvalidArgument when parts.size() != size() or a part has no stream or buffer; NCCL
  // and CUDA errors as base/cuda_check.h maps them. Errors while the reduction runs
  // poison the participants' streams (their Synchronize() reports them).
  virtual absl::Status AllReduceAverage(std::span<const ReducePart> parts, std::size_t count) = 0;

  // For a watchdog that gave up on a step (returns immediately; the reducer is unusable
  // afterwards). Host: participants waiting at a rendezvous return Cancelled, later calls
  // fail. NCCL: ncclCommAbort on every communicator, so kernels stuck waiting for a peer
  // exit.
  virtual void Abort() {}
  // Non-blocking: an error the communicator reported asynchronously (NCCL:
  // ncclCommGetAsyncError on each communicator), OK otherwise.
  virtual absl::Status AsyncError() { return absl::OkStatus(); }
};

struct AllReducerOptions {
  // Host: how long a participant waits at the rendezvous for the others before failing
  // with DeadlineExceeded (a participant whose stream failed earlier may never arrive);
  // 0 = until Abort(). The executor passes its step timeout.
  double timeout_seconds = 120;
  // Data parallelism across processes (comm/bootstrap.h), not owned; null: this process
  // holds every participant. With it, every process creates its reducer over its own
  // participants (the same number in each) with the same `channel`, and each call
  // averages over all of them: size() x processes->size() participants, process rank
  // major (process q's participant i is participant q * size() + i). Every process
  // issues the same calls in the same order.
  //   host: the last local participant to arrive sends the local buffers to the other
  //         processes through the bootstrap (an emulation: bytes through files for the
  //         file kind) and sums all of them in that global order, so the result has the
  //         same bits as one process holding every participant;
  //   CUDA: one NCCL communicator over every process's GPUs, created with
  //         ncclCommInitRank, its id sent by the bootstrap.
  // Abort() aborts the bootstrap too.
  Bootstrap* processes = nullptr;
  std::string channel = "all-reduce";  // the bootstrap channel, one per reducer
};

// One communicator over `devices` (participant i on devices[i]; devices may repeat), and
// over the other processes' participants with options.processes. InvalidArgument for an
// empty list or devices of different backends; Unavailable for CUDA devices when built
// without CUDA or NCCL; with processes, the bootstrap's errors (the CUDA kind exchanges
// its NCCL id here) and FailedPrecondition when the processes hold different numbers of
// participants.
absl::StatusOr<std::unique_ptr<AllReducer>> CreateAllReducer(
    const std::vector<runtime::Device*>& devices, const AllReducerOptions& options = {});

}  // namespace pipesched::comm
