// AllReducer factory and the host in-process collective (comm/all_reduce.h).
#include "comm/all_reduce.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal.h"

namespace pipesched::comm {
namespace internal {
namespace {

// How long a stream waits at the rendezvous for the other participants before it gives
// up with an error instead of hanging (a participant whose stream failed earlier may
// never arrive).
constexpr std::chrono::seconds kRendezvousTimeout(120);

// One all-reduce call: the D participants meet here on their streams' worker threads.
struct Rendezvous {
  explicit Rendezvous(int size, std::size_t count) : data(size, nullptr), count(count) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<float*> data;
  std::size_t count;
  int arrived = 0;
  bool done = false;
  bool failed = false;
};

class HostAllReducer final : public AllReducer {
 public:
  explicit HostAllReducer(int size) : size_(size) {}
  std::string_view name() const override { return "host"; }
  int size() const override { return size_; }

  absl::Status AllReduceAverage(std::span<const ReducePart> parts, std::size_t count) override {
    if (static_cast<int>(parts.size()) != size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-reduce over ", size_, " participants was given ", parts.size(), " parts"));
    }
    for (const ReducePart& part : parts) {
      if (part.stream == nullptr || (count > 0 && part.data == nullptr)) {
        return absl::InvalidArgumentError("all-reduce part without stream or buffer");
      }
    }
    auto rendezvous = std::make_shared<Rendezvous>(size_, count);
    const std::int64_t call = next_call_++;
    for (int i = 0; i < size_; ++i) {
      float* data = parts[i].data;
      absl::Status s = parts[i].stream->EnqueueHost(
          [rendezvous, i, data, call]() { return Arrive(*rendezvous, i, data, call); });
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Arrive(Rendezvous& r, int participant, float* data, std::int64_t call) {
    std::unique_lock<std::mutex> lock(r.mu);
    r.data[participant] = data;
    if (++r.arrived == static_cast<int>(r.data.size())) {
      // Sum in participant order so that every replica ends with the same bits.
      const float scale = 1.0f / static_cast<float>(r.data.size());
      float* first = r.data[0];
      for (std::size_t k = 0; k < r.count; ++k) {
        float sum = first[k];
        for (std::size_t p = 1; p < r.data.size(); ++p) sum += r.data[p][k];
        first[k] = sum * scale;
      }
      for (std::size_t p = 1; p < r.data.size(); ++p) {
        std::copy(first, first + r.count, r.data[p]);
      }
      r.done = true;
      r.cv.notify_all();
      return absl::OkStatus();
    }
    if (!r.cv.wait_for(lock, kRendezvousTimeout, [&r] { return r.done || r.failed; })) {
      r.failed = true;
      r.cv.notify_all();
    }
    if (!r.done) {
      return absl::DeadlineExceededError(
          absl::StrCat("host all-reduce call ", call, ": participant ", participant, " waited ",
                       kRendezvousTimeout.count(), " s but only ", r.arrived, " of ", r.data.size(),
                       " participants arrived (did another participant's stream fail earlier?)"));
    }
    return absl::OkStatus();
  }

  const int size_;
  std::int64_t next_call_ = 0;
};

}  // namespace

std::unique_ptr<AllReducer> CreateHostAllReducer(int size) {
  return std::make_unique<HostAllReducer>(size);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<AllReducer>> CreateAllReducer(
    const std::vector<runtime::Device*>& devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("an all-reduce needs at least one participant");
  }
  for (runtime::Device* device : devices) {
    if (device == nullptr || device->kind() != devices[0]->kind()) {
      return absl::InvalidArgumentError("all-reduce participants must be devices of one backend");
    }
  }
  switch (devices[0]->kind()) {
    case runtime::BackendKind::kHost:
      return internal::CreateHostAllReducer(static_cast<int>(devices.size()));
    case runtime::BackendKind::kCuda:
#ifdef PIPESCHED_HAS_CUDA
      return internal::CreateNcclAllReducer(devices);
#else
      return absl::UnavailableError(
          "the NCCL all-reduce is not available: pipesched was built without CUDA");
#endif
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace pipesched::comm
