// CUDA implementations of the comm/ seams: the peer-copy transport and the NCCL
// all-reduce with a local-kernel path for replicas that share a GPU. Compiled only when
// pipesched is built with CUDA and NCCL (PIPESCHED_HAS_CUDA).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/nccl_check.h"
#include "base/status.h"
#include "base/strings.h"
#include "comm/cuda/reduce_kernels.h"
#include "comm/internal.h"
#include "runtime/cuda_runtime.h"

namespace pipesched::comm::internal {
namespace {

// Makes `device` current for the scope (kernels and copies must be launched with the
// stream's device current).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class CudaPeerTransport final : public Transport {
 public:
  std::string_view name() const override { return "cuda-peer"; }
  bool two_sided() const override { return false; }
  absl::Status Move(const Endpoint& src, const Endpoint& dst, std::size_t bytes,
                    runtime::Stream& on) override {
    if (src.device == nullptr || dst.device == nullptr) {
      return absl::InvalidArgumentError("Transport::Move: an endpoint has no device");
    }
    if (bytes == 0) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(cudaStream_t stream, runtime::CudaStreamOf(on));
    DeviceGuard guard(on.device().index());
    PS_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(dst.data, dst.device->index(), src.data,
                                                src.device->index(), bytes, stream));
    return absl::OkStatus();
  }
};

// Participants grouped by GPU: NCCL (one rank per GPU) runs over the first participant
// of each GPU (its leader); the others are summed onto their leader by a kernel first,
// and get the result copied back after.
class NcclAllReducer final : public AllReducer {
 public:
  static absl::StatusOr<std::unique_ptr<AllReducer>> Create(
      const std::vector<runtime::Device*>& devices) {
    auto r = std::unique_ptr<NcclAllReducer>(new NcclAllReducer());
    const int size = static_cast<int>(devices.size());
    r->leader_of_.resize(size);
    r->devices_ = devices;
    std::map<int, int> leader_by_gpu;
    for (int i = 0; i < size; ++i) {
      auto [it, inserted] = leader_by_gpu.emplace(devices[i]->index(), i);
      r->leader_of_[i] = it->second;
      if (inserted) r->leaders_.push_back(i);
    }
    r->events_.resize(size);
    for (int i = 0; i < size; ++i) {
      if (r->leader_of_[i] == i && r->leaders_.size() == devices.size()) continue;
      PS_ASSIGN_OR_RETURN(r->events_[i],
                          devices[i]->CreateEvent(false, absl::StrCat("all-reduce part ", i)));
    }
    if (r->leaders_.size() > 1) {
      std::vector<int> gpus;
      for (int leader : r->leaders_) gpus.push_back(devices[leader]->index());
      r->comms_.resize(gpus.size());
      PS_NCCL_RETURN_IF_ERROR(
          ncclCommInitAll(r->comms_.data(), static_cast<int>(gpus.size()), gpus.data()));
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
    for (ncclComm_t& comm : comms_) {
      if (comm != nullptr) (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    aborted_ = true;
  }

  absl::Status AsyncError() override {
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
    return leaders_.size() > 1 ? "nccl+local" : "local";
  }
  int size() const override { return static_cast<int>(devices_.size()); }

  absl::Status AllReduceAverage(std::span<const ReducePart> parts, std::size_t count) override {
    const int size = this->size();
    if (static_cast<int>(parts.size()) != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-reduce over ", size, " participants was given ", parts.size(), " parts"));
    }
    if (aborted_) return absl::CancelledError("NCCL all-reduce: the communicators were aborted");
    if (count == 0) return absl::OkStatus();
    if (leaders_.size() == devices_.size()) {
      // One participant per GPU: NCCL averages directly.
      PS_NCCL_RETURN_IF_ERROR(ncclGroupStart());
      absl::Status issued = absl::OkStatus();
      for (int i = 0; i < size && issued.ok(); ++i) {
        issued = PS_NCCL_STATUS(ncclAllReduce(parts[i].data, parts[i].data, count, ncclFloat,
                                              ncclAvg, comms_[i],
                                              runtime::UncheckedCudaStream(*parts[i].stream)));
      }
      PS_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
      return issued;
    }
    // 1. Members hand their gradients to their leader, which sums them.
    for (int i = 0; i < size; ++i) {
      const int leader = leader_of_[i];
      if (leader == i) continue;
      PS_RETURN_IF_ERROR(events_[i]->Record(*parts[i].stream));
      PS_RETURN_IF_ERROR(parts[leader].stream->Wait(*events_[i]));
      DeviceGuard guard(devices_[leader]->index());
      PS_CUDA_RETURN_IF_ERROR(LaunchAddInto(parts[leader].data, parts[i].data, count,
                                            runtime::UncheckedCudaStream(*parts[leader].stream)));
    }
    // 2. The leaders sum across GPUs, then scale to the mean.
    if (leaders_.size() > 1) {
      PS_NCCL_RETURN_IF_ERROR(ncclGroupStart());
      absl::Status issued = absl::OkStatus();
      for (std::size_t k = 0; k < leaders_.size() && issued.ok(); ++k) {
        const ReducePart& part = parts[leaders_[k]];
        issued =
            PS_NCCL_STATUS(ncclAllReduce(part.data, part.data, count, ncclFloat, ncclSum, comms_[k],
                                         runtime::UncheckedCudaStream(*part.stream)));
      }
      PS_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
      PS_RETURN_IF_ERROR(issued);
    }
    for (int leader : leaders_) {
      DeviceGuard guard(devices_[leader]->index());
      PS_CUDA_RETURN_IF_ERROR(LaunchScale(parts[leader].data, 1.0f / static_cast<float>(size),
                                          count,
                                          runtime::UncheckedCudaStream(*parts[leader].stream)));
    }
    // 3. Members copy the mean back; leaders wait for those copies, so that no stream
    //    proceeds past its part before the whole reduction is done.
    for (int leader : leaders_) {
      if (!events_[leader]) continue;
      PS_RETURN_IF_ERROR(events_[leader]->Record(*parts[leader].stream));
    }
    for (int i = 0; i < size; ++i) {
      const int leader = leader_of_[i];
      if (leader == i) continue;
      PS_RETURN_IF_ERROR(parts[i].stream->Wait(*events_[leader]));
      DeviceGuard guard(devices_[i]->index());
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
  std::vector<runtime::Device*> devices_;
  std::vector<int> leader_of_;  // per participant: the participant that reduces for its GPU
  std::vector<int> leaders_;    // one per distinct GPU, in participant order
  std::vector<std::unique_ptr<runtime::Event>> events_;  // per participant (local path)
  std::vector<ncclComm_t> comms_;                        // per leader, when > 1 GPU
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Transport> CreateCudaPeerTransport() {
  return std::make_unique<CudaPeerTransport>();
}

absl::StatusOr<std::unique_ptr<AllReducer>> CreateNcclAllReducer(
    const std::vector<runtime::Device*>& devices) {
  return NcclAllReducer::Create(devices);
}

}  // namespace pipesched::comm::internal
