// CUDA implementations of the comm/ seams: the peer-copy transport and the NCCL
// all-reduce with a local-kernel path for replicas that share a GPU. Compiled only when
// pipesched is built with CUDA and NCCL (PIPESCHED_HAS_CUDA).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pipesched/base/cuda_check.h"
#include "pipesched/base/nccl_check.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/cuda/reduce_kernels.h"
#include "pipesched/comm/internal.h"
#include "pipesched/runtime/cuda_runtime.h"

namespace pipesched::comm::internal {
namespace {

class CudaPeerTransport final : public Transport {
 public:
  std::string_view name() const override { return "cuda-peer"; }
  bool two_sided() const override { return false; }
  absl::Status Move(const Endpoint& src, const Endpoint& dst, std::size_t bytes,
                    runtime::Stream& on) override {
    if (src.device == nullptr || dst.device == nullptr) {
      return absl::InvalidArgumentError("Transport::Move: an endpoint has no device");
    }
    if (src.device->kind() != runtime::BackendKind::kCuda ||
        dst.device->kind() != runtime::BackendKind::kCuda) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda-peer Move from ", src.device->description(), " to ",
                       dst.device->description(), ": both endpoints must be CUDA devices"));
    }
    // The runtime's copy is the same cudaMemcpyPeerAsync (a plain device-to-device copy
    // within one GPU), and it rejects a stream of another backend and returns the
    // stream's first error once it is poisoned, as transport.h promises.
    return dst.device->CopyAsync(dst.data, src.data, bytes, *src.device, on);
  }
};

// Participants grouped by GPU: NCCL (one rank per GPU) runs over the first participant
// of each GPU (its leader); the others are summed onto their leader by a kernel first,
// and get the result copied back after. One participant needs nothing: no communicator,
// no event, and AllReduceAverage returns at once.
// Threading: AllReduceAverage, AsyncError and Abort must be called from one host thread
// at a time. The executor does: it issues a step and runs its watchdog (AsyncError,
// Abort) on the thread that calls Step. So comms_ takes no lock; aborted_ is atomic so
// that reading it is never a data race, but an Abort from another thread during a call
// would still race on comms_.
class NcclAllReducer final : public AllReducer {
 public:
  static absl::StatusOr<std::unique_ptr<AllReducer>> Create(
      const std::vector<runtime::Device*>& devices, const AllReducerOptions& options) {
    auto r = std::unique_ptr<NcclAllReducer>(new NcclAllReducer());
    const int size = static_cast<int>(devices.size());
    r->devices_ = devices;
    r->processes_ = options.processes;
    r->global_size_ = size * (options.processes != nullptr ? options.processes->size() : 1);
    r->leader_of_.resize(size);
    std::map<int, int> leader_by_gpu;
    for (int i = 0; i < size; ++i) {
      auto [it, inserted] = leader_by_gpu.emplace(devices[i]->index(), i);
      r->leader_of_[i] = it->second;
      if (inserted) r->leaders_.push_back(i);
    }
    r->events_.resize(size);
    if (r->leaders_.size() < devices.size()) {  // the local path needs an event per participant
      for (int i = 0; i < size; ++i) {
        PS_ASSIGN_OR_RETURN(r->events_[i],
                            devices[i]->CreateEvent(false, absl::StrCat("all-reduce part ", i)));
      }
    }
    if (options.processes != nullptr && options.processes->size() > 1) {
      PS_RETURN_IF_ERROR(r->InitAcrossProcesses(*options.processes, options.channel));
    } else if (r->leaders_.size() > 1) {
      std::vector<int> gpus;
      for (int leader : r->leaders_) gpus.push_back(devices[leader]->index());
      r->comms_.resize(gpus.size());
      PS_NCCL_RETURN_IF_ERROR(
          ncclCommInitAll(r->comms_.data(), static_cast<int>(gpus.size()), gpus.data()));
      r->nccl_ranks_ = static_cast<int>(gpus.size());
    }
    return std::unique_ptr<AllReducer>(std::move(r));
  }

  ~NcclAllReducer() override {
    for (ncclComm_t comm : comms_) {
      if (comm != nullptr) (void)ncclCommDestroy(comm);
    }
  }

  // A collective whose peer never arrives spins forever on the GPU: ncclCommAbort makes
  // its kernels exit (the stream then proceeds past them with undefined results). The
  // communicators are gone afterwards; later calls fail.
  void Abort() override {
    aborted_.store(true, std::memory_order_release);
    if (processes_ != nullptr) processes_->Abort();
    for (ncclComm_t& comm : comms_) {
      if (comm != nullptr) (void)ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  absl::Status AsyncError() override {
    // A process that failed stops no collective by itself: its peers' kernels wait for it
    // until the executor's watchdog aborts them, which this makes it do at once.
    if (processes_ != nullptr) PS_RETURN_IF_ERROR(processes_->Failure());
    for (std::size_t k = 0; k < comms_.size(); ++k) {
      if (comms_[k] == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      PS_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comms_[k], &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        return absl::InternalError(absl::StrCat("NCCL communicator ", k, " of all-reduce '",
                                                Absl(name()), "' reported an asynchronous error ",
                                                static_cast<int>(async), " (",
                                                ncclGetErrorString(async), ")"));
      }
    }
    return absl::OkStatus();
  }

  std::string_view name() const override {
    if (leaders_.size() == devices_.size()) return "nccl";
    return nccl_ranks_ > 1 ? "nccl+local" : "local";
  }
  int size() const override { return static_cast<int>(devices_.size()); }

  absl::Status AllReduceAverage(std::span<const ReducePart> parts, std::size_t count) override {
    const int size = this->size();
    if (static_cast<int>(parts.size()) != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-reduce over ", size, " participants was given ", parts.size(), " parts"));
    }
    for (int i = 0; i < size; ++i) {
      const ReducePart& part = parts[i];
      if (part.stream == nullptr || (count > 0 && part.data == nullptr)) {
        return absl::InvalidArgumentError(
            absl::StrCat("all-reduce part ", i, " without stream or buffer"));
      }
      // Also makes UncheckedCudaStream below safe: devices_ are CUDA devices.
      if (&part.stream->device() != devices_[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("all-reduce part ", i, ": stream '", part.stream->name(), "' is on ",
                         part.stream->device().description(), ", not on participant ", i,
                         "'s device ", devices_[i]->description()));
      }
    }
    if (aborted_.load(std::memory_order_acquire)) {
      return absl::CancelledError("NCCL all-reduce: the communicators were aborted");
    }
    if (global_size_ == 1 || count == 0) return absl::OkStatus();  // the mean of one is itself
    if (nccl_ranks_ == global_size_) {
      // One participant per GPU in every process (each its own leader): NCCL averages.
      return GroupedAllReduce(parts, count, ncclAvg);
    }
    // 1. Members hand their gradients to their leader, which sums them.
    for (int i = 0; i < size; ++i) {
      const int leader = leader_of_[i];
      if (leader == i) continue;
      PS_RETURN_IF_ERROR(events_[i]->Record(*parts[i].stream));
      PS_RETURN_IF_ERROR(parts[leader].stream->Wait(*events_[i]));
      CudaDeviceGuard guard(devices_[leader]->index());
      PS_RETURN_IF_ERROR(guard.status());
      PS_CUDA_RETURN_IF_ERROR(LaunchAddInto(parts[leader].data, parts[i].data, count,
                                            runtime::UncheckedCudaStream(*parts[leader].stream)));
    }
    // 2. The leaders sum across GPUs (and processes), then scale to the mean.
    if (!comms_.empty()) PS_RETURN_IF_ERROR(GroupedAllReduce(parts, count, ncclSum));
    for (int leader : leaders_) {
      CudaDeviceGuard guard(devices_[leader]->index());
      PS_RETURN_IF_ERROR(guard.status());
      PS_CUDA_RETURN_IF_ERROR(LaunchScale(parts[leader].data,
                                          1.0f / static_cast<float>(global_size_), count,
                                          runtime::UncheckedCudaStream(*parts[leader].stream)));
    }
    // 3. Members copy the mean back; leaders wait for those copies, so that no stream
    //    proceeds past its part before the whole reduction is done.
    for (int leader : leaders_) {
      PS_RETURN_IF_ERROR(events_[leader]->Record(*parts[leader].stream));
    }
    for (int i = 0; i < size; ++i) {
      const int leader = leader_of_[i];
      if (leader == i) continue;
      PS_RETURN_IF_ERROR(parts[i].stream->Wait(*events_[leader]));
      CudaDeviceGuard guard(devices_[i]->index());
      PS_RETURN_IF_ERROR(guard.status());
      PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(parts[i].data, parts[leader].data,
                                              count * sizeof(float), cudaMemcpyDeviceToDevice,
                                              runtime::UncheckedCudaStream(*parts[i].stream)));
      PS_RETURN_IF_ERROR(events_[i]->Record(*parts[i].stream));
      PS_RETURN_IF_ERROR(parts[leader].stream->Wait(*events_[i]));
    }
    return absl::OkStatus();
  }

 private:
  NcclAllReducer() = default;

  // One ncclAllReduce per leader (leaders_[k] on comms_[k]), in one group. A failed call
  // is reported rather than ncclGroupEnd's status, which may only say "invalid usage".
  absl::Status GroupedAllReduce(std::span<const ReducePart> parts, std::size_t count,
                                ncclRedOp_t op) {
    PS_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    absl::Status issued = absl::OkStatus();
    for (std::size_t k = 0; k < leaders_.size() && issued.ok(); ++k) {
      const ReducePart& part = parts[leaders_[k]];
      issued = PS_NCCL_STATUS(ncclAllReduce(part.data, part.data, count, ncclFloat, op, comms_[k],
                                            runtime::UncheckedCudaStream(*part.stream)));
    }
    absl::Status ended = PS_NCCL_STATUS(ncclGroupEnd());  // always closes the group
    PS_RETURN_IF_ERROR(issued);
    return ended;
  }

  // NCCL ranks over every process's leaders, process rank major: the processes count
  // their leaders (distinct GPUs), rank 0's ncclGetUniqueId goes to all through the
  // bootstrap, and each process inits its leaders' ranks in one group (several GPUs per
  // process need the group, or ncclCommInitRank would wait for the others one by one).
  absl::Status InitAcrossProcesses(Bootstrap& processes, std::string_view channel) {
    // Every device is checked before the first exchange: a process that fails here has
    // given nothing, so the others, waiting for its count, learn of its failure (Fail)
    // instead of entering ncclCommInitRank, which waits for every rank without a
    // timeout; and a failure inside the group after a first ncclCommInitRank would leave
    // ncclGroupEnd waiting likewise.
    for (int leader : leaders_) {
      CudaDeviceGuard guard(devices_[leader]->index());
      PS_RETURN_IF_ERROR(guard.status());
    }
    PS_ASSIGN_OR_RETURN(const std::vector<std::string> counts,
                        processes.AllGather(channel, std::to_string(leaders_.size())));
    int offset = 0;
    int total = 0;
    for (int q = 0; q < static_cast<int>(counts.size()); ++q) {
      int n = 0;
      if (!absl::SimpleAtoi(Absl(counts[q]), &n) || n < 1) {
        return absl::InternalError(absl::StrCat(
            "NCCL all-reduce: process ", q, " sent no GPU count on channel '", Absl(channel), "'"));
      }
      if (q < processes.rank()) offset += n;
      total += n;
    }
    ncclUniqueId id{};
    if (processes.rank() == 0) PS_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    PS_ASSIGN_OR_RETURN(
        const std::string sent,
        Broadcast(processes, channel,
                  std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)), 0));
    if (sent.size() != sizeof(id)) {
      return absl::InternalError(absl::StrCat("NCCL all-reduce: rank 0 sent ", sent.size(),
                                              " bytes for an NCCL id of ", sizeof(id)));
    }
    std::memcpy(&id, sent.data(), sizeof(id));
    comms_.assign(leaders_.size(), nullptr);
    PS_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    absl::Status issued = absl::OkStatus();
    for (std::size_t k = 0; k < leaders_.size() && issued.ok(); ++k) {
      CudaDeviceGuard guard(devices_[leaders_[k]]->index());
      issued = guard.status();
      if (issued.ok()) {
        issued =
            PS_NCCL_STATUS(ncclCommInitRank(&comms_[k], total, id, offset + static_cast<int>(k)));
      }
    }
    absl::Status ended = PS_NCCL_STATUS(ncclGroupEnd());
    PS_RETURN_IF_ERROR(issued);
    PS_RETURN_IF_ERROR(ended);
    nccl_ranks_ = total;
    return absl::OkStatus();
  }

  std::vector<runtime::Device*> devices_;
  Bootstrap* processes_ = nullptr;  // not owned; null within one process
  int global_size_ = 1;             // participants in every process together
  int nccl_ranks_ = 0;              // leaders in every process together (0: no NCCL)
  std::vector<int> leader_of_;      // per participant: the participant that reduces for its GPU
  std::vector<int> leaders_;        // one per distinct GPU, in participant order
  std::vector<std::unique_ptr<runtime::Event>> events_;  // per participant (local path)
  std::vector<ncclComm_t> comms_;                        // per leader, when > 1 GPU
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Transport> CreateCudaPeerTransport() {
  return std::make_unique<CudaPeerTransport>();
}

absl::StatusOr<std::unique_ptr<AllReducer>> CreateNcclAllReducer(
    const std::vector<runtime::Device*>& devices, const AllReducerOptions& options) {
  return NcclAllReducer::Create(devices, options);
}

}  // namespace pipesched::comm::internal
