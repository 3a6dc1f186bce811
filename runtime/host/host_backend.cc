// Host backend. How CUDA's semantics are emulated:
//   - Stream: a worker thread draining a FIFO of tasks. Synchronize() waits until the
//     count of finished tasks reaches the count enqueued at the call.
//   - Event: `recorded` counts Record calls (generations); a record enqueues a marker
//     task that marks its generation complete when the stream reaches it. Wait captures
//     the generation recorded at enqueue time, and the waiting stream's worker blocks on
//     the event's condition variable until exactly that generation is complete, so a
//     later re-record cannot satisfy (nor delay) an already-enqueued wait. Generations
//     may complete out of order when recorded on different streams, hence a pending set
//     rather than a single "completed up to" counter.
//   - Poison: the first error returned by a host function is kept; later host functions
//     are skipped but markers, waits and frees still run, so no other stream hangs.
#include "runtime/host/host_backend.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/strings.h"
#include "runtime/memory_account.h"

namespace pipesched::runtime {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::align_val_t kAlignment{64};

class HostDevice;
class HostBackend;

// State shared between an event and the marker / wait tasks that refer to it, so that
// destroying the event with records pending is safe.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0;          // generations recorded so far
  std::vector<std::uint64_t> pending;  // recorded, not yet reached
  std::uint64_t last_completed = 0;    // highest generation reached
  double last_timestamp_us = 0;        // when last_completed was reached

  // Requires mu.
  bool Completed(std::uint64_t generation) const {
    return generation <= recorded &&
           std::find(pending.begin(), pending.end(), generation) == pending.end();
  }
};

class HostStream final : public Stream {
 public:
  HostStream(HostDevice& device, std::string name);
  ~HostStream() override;

  Device& device() const override;
  const std::string& name() const override { return name_; }
  absl::Status Wait(const Event& event) override;
  absl::Status EnqueueHost(std::function<absl::Status()> fn) override;
  absl::Status EnqueueBusyWait(double microseconds) override;
  absl::Status Synchronize() override;
  void* native_handle() const override { return nullptr; }

  // Runs `task` in stream order whether or not the stream is poisoned (markers, waits,
  // frees).
  void EnqueueInternal(std::function<void()> task);
  // Runs `fn` in stream order unless the stream is poisoned by then; its error poisons.
  absl::Status EnqueueWork(std::function<absl::Status()> fn);
  HostDevice& host_device() const { return device_; }

 private:
  void Run();
  absl::Status PoisonStatus() const;  // requires mu_

  HostDevice& device_;
  const std::string name_;
  std::atomic<bool> poisoned_{false};

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // worker waits for tasks
  std::condition_variable done_cv_;  // Synchronize waits for completions
  std::deque<std::function<void()>> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  int sync_waiters_ = 0;
  bool worker_idle_ = false;
  bool stop_ = false;
  absl::Status error_;
  std::thread worker_;
};

class HostEvent final : public Event {
 public:
  HostEvent(HostDevice& device, bool timing, std::string name)
      : device_(device), timing_(timing), name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  absl::Status Record(Stream& stream) override;
  absl::StatusOr<bool> Query() override;
  absl::Status Synchronize() override;
  absl::StatusOr<double> ElapsedMillis(const Event& start) const override;
  absl::StatusOr<double> TimestampMicros() const override;

  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  HostDevice& device_;
  const bool timing_;
  const std::string name_;
  std::shared_ptr<EventState> state_ = std::make_shared<EventState>();
};

class HostDevice final : public Device {
 public:
  HostDevice(HostBackend& backend, int index, std::int64_t capacity)
      : backend_(backend),
        index_(index),
        description_(absl::StrCat("host:", index)),
        memory_(capacity) {}

  BackendKind kind() const override { return BackendKind::kHost; }
  int index() const override { return index_; }
  std::string description() const override { return description_; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) override;
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent(bool timing, std::string_view name) override;
  absl::StatusOr<Buffer> Allocate(std::size_t bytes, Stream& stream) override;
  absl::Status CopyAsync(void* dst, const void* src, std::size_t bytes, const Device& src_device,
                         Stream& stream) override;
  absl::Status CopyToHost(void* host_dst, const void* src, std::size_t bytes) override;
  absl::Status CopyFromHost(void* dst, const void* host_src, std::size_t bytes) override;
  MemoryStats memory_stats() const override { return memory_.stats(); }
  void ResetPeakMemory() override { memory_.ResetPeak(); }

  HostBackend& backend() const { return backend_; }
  const std::string& desc() const { return description_; }
  void Free(void* data, std::size_t size) {
    ::operator delete(data, kAlignment);
    memory_.Release(static_cast<std::int64_t>(size));
  }

 protected:
  void FreeNow(void* data, std::size_t size) override { Free(data, size); }
  absl::Status FreeAsyncImpl(void* data, std::size_t size, Stream& stream) override;

 private:
  HostBackend& backend_;
  const int index_;
  const std::string description_;
  MemoryAccount memory_;
  std::atomic<int> next_event_id_{0};
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(const BackendOptions& options)
      : strict_(options.strict), epoch_(Clock::now()) {
    for (int i = 0; i < options.num_devices; ++i) {
      devices_.push_back(std::make_unique<HostDevice>(*this, i, options.memory_capacity_bytes));
    }
  }

  BackendKind kind() const override { return BackendKind::kHost; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  Device& device(int index) override { return *devices_.at(index); }

  bool strict() const { return strict_; }
  double NowMicros() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count();
  }

 private:
  const bool strict_;
  const Clock::time_point epoch_;
  std::vector<std::unique_ptr<HostDevice>> devices_;
};

HostStream* AsHostStream(Stream& stream) { return dynamic_cast<HostStream*>(&stream); }

absl::Status NotHost(const Stream& stream, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(Absl(what), ": stream '", stream.name(), "' is not a host-backend stream"));
}

// ---- HostStream -------------------------------------------------------------------

HostStream::HostStream(HostDevice& device, std::string name)
    : device_(device), name_(std::move(name)) {
  worker_ = std::thread([this] { Run(); });
  // Thread names show up in debuggers, perf and TSan reports; at most 15 characters.
  std::string thread_name = absl::StrCat("ps", device_.index(), ":", name_).substr(0, 15);
  pthread_setname_np(worker_.native_handle(), thread_name.c_str());
}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  worker_.join();  // the worker drains the queue first
}

Device& HostStream::device() const { return device_; }

void HostStream::Run() {
  std::deque<std::function<void()>> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty()) {
        if (stop_) return;
        worker_idle_ = true;
        work_cv_.wait(lock, [this] { return !queue_.empty() || stop_; });
        worker_idle_ = false;
        if (queue_.empty()) return;
      }
      batch.swap(queue_);
    }
    // Taking the whole batch amortises the lock over many small tasks.
    while (!batch.empty()) {
      std::function<void()> task = std::move(batch.front());
      batch.pop_front();
      task();
      task = nullptr;  // destroy captures before the work counts as done
      std::lock_guard<std::mutex> lock(mu_);
      ++completed_;
      if (sync_waiters_ > 0) done_cv_.notify_all();
    }
  }
}

void HostStream::EnqueueInternal(std::function<void()> task) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ++enqueued_;
    wake = worker_idle_;
  }
  if (wake) work_cv_.notify_one();
}

absl::Status HostStream::PoisonStatus() const { return error_; }

absl::Status HostStream::EnqueueWork(std::function<absl::Status()> fn) {
  if (poisoned_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    return PoisonStatus();
  }
  EnqueueInternal([this, fn = std::move(fn)] {
    if (poisoned_.load(std::memory_order_acquire)) return;
    absl::Status status = fn();
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) {
      error_ = absl::Status(status.code(), absl::StrCat("stream '", name_, "' on ", device_.desc(),
                                                        ": ", status.message()));
      poisoned_.store(true, std::memory_order_release);
    }
  });
  return absl::OkStatus();
}

absl::Status HostStream::EnqueueHost(std::function<absl::Status()> fn) {
  if (!fn) return absl::InvalidArgumentError("EnqueueHost: empty function");
  return EnqueueWork(std::move(fn));
}

absl::Status HostStream::EnqueueBusyWait(double microseconds) {
  if (!(microseconds >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueBusyWait: microseconds must be >= 0, not ", microseconds));
  }
  EnqueueInternal([microseconds] {
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(microseconds));
  });
  return absl::OkStatus();
}

absl::Status HostStream::Wait(const Event& event) {
  const auto* host_event = dynamic_cast<const HostEvent*>(&event);
  if (host_event == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("stream '", name_, "' on ", device_.desc(),
                                                   " cannot wait on event '", event.name(),
                                                   "': it is not a host-backend event"));
  }
  std::shared_ptr<EventState> state = host_event->state();
  std::uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = state->recorded;
  }
  if (generation == 0) {
    if (device_.backend().strict()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stream '", name_, "' on ", device_.desc(), " waits on event '", event.name(),
          "', which was never recorded (CUDA would silently not wait); record it first"));
    }
    return absl::OkStatus();
  }
  EnqueueInternal([state = std::move(state), generation] {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->Completed(generation); });
  });
  return absl::OkStatus();
}

absl::Status HostStream::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t target = enqueued_;
  ++sync_waiters_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
  --sync_waiters_;
  return PoisonStatus();
}

// ---- HostEvent --------------------------------------------------------------------

absl::Status HostEvent::Record(Stream& stream) {
  HostStream* host_stream = AsHostStream(stream);
  if (host_stream == nullptr) return NotHost(stream, absl::StrCat("record '", name_, "'"));
  if (&host_stream->host_device() != &device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event '", name_, "' belongs to ", device_.desc(), " and cannot be recorded on stream '",
        stream.name(), "' of ", host_stream->host_device().desc()));
  }
  std::uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    generation = ++state_->recorded;
    state_->pending.push_back(generation);
  }
  const HostBackend& backend = device_.backend();
  host_stream->EnqueueInternal([state = state_, generation, timing = timing_, &backend] {
    const double now = timing ? backend.NowMicros() : 0.0;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      std::erase(state->pending, generation);
      if (generation > state->last_completed) {
        state->last_completed = generation;
        state->last_timestamp_us = now;
      }
    }
    state->cv.notify_all();
  });
  return absl::OkStatus();
}

absl::StatusOr<bool> HostEvent::Query() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->Completed(state_->recorded);
}

absl::Status HostEvent::Synchronize() {
  std::unique_lock<std::mutex> lock(state_->mu);
  const std::uint64_t generation = state_->recorded;
  state_->cv.wait(lock, [&] { return state_->Completed(generation); });
  return absl::OkStatus();
}

absl::StatusOr<double> HostEvent::TimestampMicros() const {
  if (!timing_) {
    return absl::FailedPreconditionError(
        absl::StrCat("event '", name_, "' was created without timing"));
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->recorded == 0) {
    return absl::FailedPreconditionError(absl::StrCat("event '", name_, "' was never recorded"));
  }
  if (!state_->Completed(state_->recorded)) {
    return absl::FailedPreconditionError(
        absl::StrCat("event '", name_, "': its most recent record has not completed"));
  }
  return state_->last_timestamp_us;
}

absl::StatusOr<double> HostEvent::ElapsedMillis(const Event& start) const {
  const auto* host_start = dynamic_cast<const HostEvent*>(&start);
  if (host_start == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElapsedMillis: event '", start.name(), "' is not a host-backend event"));
  }
  PS_ASSIGN_OR_RETURN(const double start_us, host_start->TimestampMicros());
  PS_ASSIGN_OR_RETURN(const double end_us, TimestampMicros());
  return (end_us - start_us) / 1000.0;
}

// ---- HostDevice -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Stream>> HostDevice::CreateStream(std::string_view name) {
  return std::make_unique<HostStream>(*this, std::string(name));
}

absl::StatusOr<std::unique_ptr<Event>> HostDevice::CreateEvent(bool timing, std::string_view name) {
  std::string event_name =
      name.empty() ? absl::StrCat("event#", next_event_id_.fetch_add(1)) : std::string(name);
  return std::make_unique<HostEvent>(*this, timing, std::move(event_name));
}

absl::StatusOr<Buffer> HostDevice::Allocate(std::size_t bytes, Stream& stream) {
  if (AsHostStream(stream) == nullptr) return NotHost(stream, "Allocate");
  if (bytes == 0) return Buffer();
  PS_RETURN_IF_ERROR(memory_.Reserve(static_cast<std::int64_t>(bytes), description_));
  void* data = ::operator new(bytes, kAlignment, std::nothrow);
  if (data == nullptr) {
    memory_.Release(static_cast<std::int64_t>(bytes));
    return absl::ResourceExhaustedError(
        absl::StrCat(description_, ": cannot allocate ", bytes, " bytes: out of host memory"));
  }
  return MakeBuffer(this, data, bytes);
}

absl::Status HostDevice::FreeAsyncImpl(void* data, std::size_t size, Stream& stream) {
  HostStream* host_stream = AsHostStream(stream);
  if (host_stream == nullptr) return NotHost(stream, "FreeAsync");
  host_stream->EnqueueInternal([this, data, size] { Free(data, size); });
  return absl::OkStatus();
}

absl::Status HostDevice::CopyAsync(void* dst, const void* src, std::size_t bytes,
                                   const Device& src_device, Stream& stream) {
  HostStream* host_stream = AsHostStream(stream);
  if (host_stream == nullptr) return NotHost(stream, "CopyAsync");
  if (src_device.kind() != BackendKind::kHost) {
    return absl::InvalidArgumentError(absl::StrCat("CopyAsync to ", description_, " from ",
                                                   src_device.description(),
                                                   ": devices of different backends"));
  }
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError("CopyAsync: null pointer");
  }
  return host_stream->EnqueueWork([dst, src, bytes] {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  });
}

absl::Status HostDevice::CopyToHost(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostDevice::CopyFromHost(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateHostBackend(const BackendOptions& options) {
  if (options.num_devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the host backend needs num_devices >= 1, not ", options.num_devices));
  }
  return std::make_unique<HostBackend>(options);
}

}  // namespace pipesched::runtime
