// AllReducer factory and the host in-process collective (comm/all_reduce.h).
#include "pipesched/comm/all_reduce.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/comm/internal.h"

namespace pipesched::comm {
namespace internal {
namespace {

struct Rendezvous;

// Shared by a reducer and its calls in flight: Abort wakes every live rendezvous.
struct AbortState {
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::vector<std::weak_ptr<Rendezvous>> live;
};

// One all-reduce call: the D participants meet here on their streams' worker threads.
struct Rendezvous {
  Rendezvous(int size, std::size_t count, std::shared_ptr<AbortState> abort)
      : data(size, nullptr), count(count), abort(std::move(abort)) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<float*> data;
  std::size_t count;
  std::shared_ptr<AbortState> abort;
  int arrived = 0;
  bool done = false;
  bool failed = false;
};

class HostAllReducer final : public AllReducer {
 public:
  HostAllReducer(int size, const AllReducerOptions& options) : size_(size), options_(options) {}
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
    if (abort_->aborted.load(std::memory_order_acquire)) {
      return absl::CancelledError("host all-reduce: aborted");
    }
    auto rendezvous = std::make_shared<Rendezvous>(size_, count, abort_);
    {
      std::lock_guard<std::mutex> lock(abort_->mu);
      std::erase_if(abort_->live, [](const std::weak_ptr<Rendezvous>& r) { return r.expired(); });
      abort_->live.push_back(rendezvous);
    }
    const std::int64_t call = next_call_++;
    const double timeout = options_.timeout_seconds;
    for (int i = 0; i < size_; ++i) {
      float* data = parts[i].data;
      absl::Status s = parts[i].stream->EnqueueHost([rendezvous, i, data, call, timeout]() {
        return Arrive(*rendezvous, i, data, call, timeout);
      });
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(abort_->mu);
    abort_->aborted.store(true, std::memory_order_release);
    for (const std::weak_ptr<Rendezvous>& weak : abort_->live) {
      if (std::shared_ptr<Rendezvous> r = weak.lock()) {
        { std::lock_guard<std::mutex> r_lock(r->mu); }
        r->cv.notify_all();
      }
    }
    abort_->live.clear();
  }

 private:
  static absl::Status Arrive(Rendezvous& r, int participant, float* data, std::int64_t call,
                             double timeout_seconds) {
    std::unique_lock<std::mutex> lock(r.mu);
    if (r.failed || r.abort->aborted.load(std::memory_order_acquire)) {
      return absl::CancelledError(absl::StrCat("host all-reduce call ", call, ": participant ",
                                               participant,
                                               " arrived after the call was given up"));
    }
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
    auto over = [&r] {
      return r.done || r.failed || r.abort->aborted.load(std::memory_order_acquire);
    };
    bool timed_out = false;
    if (timeout_seconds > 0) {
      timed_out = !r.cv.wait_for(lock, std::chrono::duration<double>(timeout_seconds), over);
    } else {
      r.cv.wait(lock, over);
    }
    if (r.done) return absl::OkStatus();
    r.failed = true;  // participants still to come fail at once
    r.cv.notify_all();
    const std::string waited = absl::StrCat("host all-reduce call ", call, ": participant ",
                                            participant, " waited but only ", r.arrived, " of ",
                                            r.data.size(), " participants arrived");
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrCat(waited, " within ", timeout_seconds,
                       " s (did another participant's stream fail earlier?)"));
    }
    return absl::CancelledError(absl::StrCat(waited, "; aborted"));
  }

  const int size_;
  const AllReducerOptions options_;
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
  std::int64_t next_call_ = 0;
};

}  // namespace

std::unique_ptr<AllReducer> CreateHostAllReducer(int size, const AllReducerOptions& options) {
  return std::make_unique<HostAllReducer>(size, options);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<AllReducer>> CreateAllReducer(
    const std::vector<runtime::Device*>& devices, const AllReducerOptions& options) {
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
      return internal::CreateHostAllReducer(static_cast<int>(devices.size()), options);
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
