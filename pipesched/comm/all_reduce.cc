// AllReducer factory and the host in-process collective (comm/all_reduce.h).
#include "pipesched/comm/all_reduce.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
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

// The other processes of a reducer across processes (AllReducerOptions::processes).
struct Across {
  Bootstrap* processes = nullptr;
  std::string channel;
};

// One all-reduce call: the D participants meet here on their streams' worker threads.
struct Rendezvous {
  Rendezvous(int size, std::size_t count, std::shared_ptr<AbortState> abort, const Across* across)
      : data(size, nullptr), count(count), abort(std::move(abort)), across(across) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<float*> data;
  std::size_t count;
  std::shared_ptr<AbortState> abort;
  const Across* across;  // null within one process; owned by the reducer
  int arrived = 0;
  bool done = false;
  bool failed = false;
  std::string failure;  // why the last participant's reduction failed
};

class HostAllReducer final : public AllReducer {
 public:
  HostAllReducer(int size, const AllReducerOptions& options)
      : size_(size),
        options_(options),
        across_{.processes = options.processes, .channel = options.channel} {}
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
    auto rendezvous = std::make_shared<Rendezvous>(
        size_, count, abort_, across_.processes != nullptr ? &across_ : nullptr);
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
    if (across_.processes != nullptr) across_.processes->Abort();
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
      absl::Status reduced = r.across == nullptr ? ReduceLocal(r) : ReduceAcross(r, call);
      if (reduced.ok()) {
        r.done = true;
      } else {
        r.failed = true;
        r.failure =
            absl::StrCat("participant ", participant, "'s reduction failed: ", reduced.message());
      }
      r.cv.notify_all();
      return reduced;
    }
    auto over = [&r] {
      return r.done || r.failed || r.abort->aborted.load(std::memory_order_acquire);
    };
    // The timeout bounds the wait for the local participants; once all are there, an
    // exchange with the other processes is bounded by the bootstrap's own timeout.
    auto over_or_all_here = [&r, &over] {
      return over() || r.arrived == static_cast<int>(r.data.size());
    };
    bool timed_out = false;
    // Past 30 years a timeout is none (as the bootstrap's: its duration would overflow the
    // clock, and the wait would end at once).
    if (timeout_seconds > 0 && timeout_seconds <= 1e9) {
      timed_out =
          !r.cv.wait_for(lock, std::chrono::duration<double>(timeout_seconds), over_or_all_here);
    } else {
      r.cv.wait(lock, over_or_all_here);
    }
    if (!timed_out) r.cv.wait(lock, over);
    if (r.done) return absl::OkStatus();
    if (!r.failure.empty()) {  // every participant arrived; the exchange across processes failed
      return absl::CancelledError(absl::StrCat("host all-reduce call ", call, ": participant ",
                                               participant, " gives up: ", r.failure));
    }
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

  // r.data[0..] := the mean of `parts` (global participant order, which may include
  // r.data's own buffers), summed in that order so that every replica ends with the same
  // bits: one process holding all participants and several holding some agree.
  static void AverageInto(Rendezvous& r, const std::vector<const float*>& parts) {
    const float scale = 1.0f / static_cast<float>(parts.size());
    float* first = r.data[0];
    for (std::size_t k = 0; k < r.count; ++k) {
      float sum = parts[0][k];
      for (std::size_t p = 1; p < parts.size(); ++p) sum += parts[p][k];
      first[k] = sum * scale;  // every parts[p][k] is read above, before this write
    }
    for (std::size_t p = 1; p < r.data.size(); ++p) std::copy(first, first + r.count, r.data[p]);
  }

  static absl::Status ReduceLocal(Rendezvous& r) {
    AverageInto(r, std::vector<const float*>(r.data.begin(), r.data.end()));
    return absl::OkStatus();
  }

  // Sends this process's buffers to the others and sums every process's in global
  // participant order (process rank major), as ReduceLocal would over all of them. Runs
  // with r.mu held: the local participants wait for it anyway.
  static absl::Status ReduceAcross(Rendezvous& r, std::int64_t call) {
    Bootstrap& processes = *r.across->processes;
    const std::size_t local = r.data.size();
    const std::size_t bytes_per_part = r.count * sizeof(float);
    std::string mine(local * bytes_per_part, '\0');
    for (std::size_t p = 0; p < local; ++p) {
      if (bytes_per_part > 0)
        std::memcpy(mine.data() + p * bytes_per_part, r.data[p], bytes_per_part);
    }
    PS_ASSIGN_OR_RETURN(std::vector<std::string> all, processes.AllGather(r.across->channel, mine));
    const int own = processes.rank();
    std::vector<std::vector<float>> theirs(all.size());
    for (int q = 0; q < static_cast<int>(all.size()); ++q) {
      if (q == own) continue;
      if (all[q].size() != mine.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("host all-reduce call ", call, " on channel '", Absl(r.across->channel),
                         "': process ", processes.job_rank(q), " sent ", all[q].size(),
                         " bytes, this process ", mine.size(), " (", local, " participants of ",
                         r.count, " floats): every process must reduce the same buffers"));
      }
      theirs[q].resize(local * r.count);
      if (!mine.empty()) std::memcpy(theirs[q].data(), all[q].data(), mine.size());
    }
    std::vector<const float*> parts;  // global participant order
    for (int q = 0; q < static_cast<int>(all.size()); ++q) {
      for (std::size_t p = 0; p < local; ++p) {
        parts.push_back(q == own ? r.data[p] : theirs[q].data() + p * r.count);
      }
    }
    AverageInto(r, parts);
    return absl::OkStatus();
  }

  const int size_;
  const AllReducerOptions options_;
  const Across across_;
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
  if (options.processes != nullptr) {
    // Every process must bring as many participants of one backend (the host kind
    // would fail at the first call; NCCL would hang).
    PS_RETURN_IF_ERROR(
        CheckAgreement(*options.processes, options.channel, "all-reduce participants",
                       absl::StrCat(devices.size(), " ",
                                    Absl(runtime::BackendName(devices[0]->kind())), " devices")));
  }
  switch (devices[0]->kind()) {
    case runtime::BackendKind::kHost:
      return internal::CreateHostAllReducer(static_cast<int>(devices.size()), options);
    case runtime::BackendKind::kCuda:
#ifdef PIPESCHED_HAS_CUDA
      return internal::CreateNcclAllReducer(devices, options);
#else
      return absl::UnavailableError(
          "the NCCL all-reduce is not available: pipesched was built without CUDA");
#endif
  }
  return absl::InvalidArgumentError("unknown backend kind");
}

}  // namespace pipesched::comm
