// Host backend. How CUDA's semantics are emulated:
//   - Stream: a worker thread draining a FIFO of tasks. Synchronize() waits until the
//     count of finished tasks reaches the count enqueued at the call (the worker wakes it
//     then, not at every task).
//   - Event: `recorded` counts Record calls (generations); a record enqueues a marker
//     task that marks its generation complete when the stream reaches it. Wait captures
//     the generation recorded at enqueue time, and the waiting stream's worker waits
//     until exactly that generation is complete, so a later re-record cannot satisfy
//     (nor delay) an already-enqueued wait. Generations may complete out of order when
//     recorded on different streams, hence a pending set rather than a single
//     "completed up to" counter.
//   - Fast paths: a wait whose generation has already completed enqueues nothing, and a
//     record or free on a drained stream (every task enqueued so far has completed)
//     takes effect on the calling thread, under the stream's lock: the stream has
//     already reached that point, and its sleeping worker is not woken for it. When the
//     host issues behind the streams (short work), most hand-offs take these paths.
//   - Spin, then sleep: a wait task first polls the event's `completions` counter (an
//     atomic; it takes the event's mutex only when the counter moved) for up to
//     BackendOptions::host_spin_micros, then sleeps on the event's condition variable.
//     A sleeping thread costs its waker a futex call and itself a reschedule, tens of
//     microseconds on a VM whose idle vCPUs halt; a hand-off between busy streams rarely
//     needs that long. The poll pauses the CPU between reads and yields it every 32 polls
//     (about a microsecond); a yield that took long means other threads wanted the CPU (a loaded
//     machine, or more streams than cores), and the wait sleeps at once, so that the
//     thread it waits for can run and the sleeper keeps the scheduler's wake-up
//     preference. A marker notifies only when someone sleeps on the event. Workers with
//     an empty queue sleep at once: polling there cost more under load than it saved.
//   - Poison: the first error returned by a host function is kept; later host functions
//     are skipped but markers, waits and frees still run, so no other stream hangs.
//   - Abort (watchdog): poisons, and from then on waits return at once (a polling wait
//     sees the flag, a sleeping one is woken through the event it is registered on) and
//     busy waits end; frees reached afterwards are deferred (with waits skipped, work in
//     flight on another stream may still use the memory): the stream's destructor hands
//     them to its device, which runs them once the last of its streams is destroyed --
//     a buffer freed on one stream may still be in use by a host function of another
//     stream of the device that has not returned yet -- or leaks them if one of those
//     streams had to be detached. The worker's state lives in a shared StreamCore so
//     that the destructor can detach a worker whose host function does not return (see
//     Stream::Abort).
#include "pipesched/runtime/host/host_backend.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/runtime/memory_account.h"

namespace pipesched::runtime {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::align_val_t kAlignment{64};

// Frees that must never run -- their memory may still be in use by a host function that
// ignored an abort -- kept unrun for the life of the process: reachable, so that leak
// checkers (ASan's) report only what is lost by mistake, not what is kept on purpose.
void KeepUnrun(std::vector<std::function<void()>> frees) {
  if (frees.empty()) return;
  static std::mutex* mu = new std::mutex;
  static auto* kept = new std::vector<std::function<void()>>;
  std::lock_guard<std::mutex> lock(*mu);
  for (std::function<void()>& free_fn : frees) kept->push_back(std::move(free_fn));
}

// Allocations from this size on are checked against the memory the machine has left.
constexpr std::size_t kCheckedAllocationBytes = std::size_t{64} << 20;

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// How often a spinning wait reads the clock and yields the CPU, in polls (a poll and its
// pause take tens of nanoseconds).
constexpr unsigned kPollsPerYield = 32;
// A yield that took longer than this let another thread run: the CPUs are contended, so
// the spinner sleeps instead (see "Spin, then sleep" above).
constexpr auto kContendedYield = std::chrono::microseconds(20);

// Polls `ready` until it holds (true), or for at most `limit` (false: the caller sleeps).
template <typename Ready>
bool SpinUntil(Clock::duration limit, const Ready& ready) {
  if (limit <= Clock::duration::zero()) return false;
  const Clock::time_point deadline = Clock::now() + limit;
  for (unsigned polls = 1;; ++polls) {  // wraps harmlessly
    if (ready()) return true;
    if (polls % kPollsPerYield != 0) {
      CpuRelax();
      continue;
    }
    const Clock::time_point before = Clock::now();
    if (before >= deadline) return false;
    std::this_thread::yield();
    if (Clock::now() - before > kContendedYield) return false;
  }
}

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
  int sleepers = 0;                    // threads blocked on cv
  // Bumped under mu whenever a record completes: a spinning wait polls it and takes mu
  // only when it changed.
  std::atomic<std::uint64_t> completions{0};

  // Requires mu.
  bool Completed(std::uint64_t generation) const {
    return generation <= recorded &&
           std::find(pending.begin(), pending.end(), generation) == pending.end();
  }
};

// Everything the worker thread touches, shared with it, so that a worker detached by the
// destructor of an aborted stream (its host function would not return) stays valid.
struct StreamCore {
  std::string name;            // the stream's
  std::string device_desc;     // "host:0"
  const Clock::duration spin;  // how long a wait polls before it sleeps
  std::atomic<bool> poisoned{false};
  std::atomic<bool> aborted{false};

  std::mutex mu;
  std::condition_variable work_cv;  // worker waits for tasks
  std::condition_variable done_cv;  // Synchronize waits for completions
  std::condition_variable exit_cv;  // the destructor of an aborted stream waits for exit
  std::deque<std::function<void()>> queue;
  std::uint64_t enqueued = 0;
  std::uint64_t completed = 0;
  int sync_waiters = 0;
  // The smallest `completed` count a Synchronize waits for: the worker wakes waiters when
  // it gets there, not at every completion.
  std::uint64_t sync_wake_at = std::numeric_limits<std::uint64_t>::max();
  bool worker_idle = false;
  bool stop = false;
  bool exited = false;
  bool detached = false;
  absl::Status error;
  std::shared_ptr<EventState> waiting_on;  // the event a wait task is blocked on
  // Frees reached after Abort: handed by the destructor, once the worker has exited, to
  // the device, which runs them when all its streams are gone (HostDevice::StreamClosed),
  // because waits are skipped after an abort and work still in flight on another stream
  // may use the memory until that stream drains too.
  std::vector<std::function<void()>> deferred_frees;

  // Busy waits sleep here so that Abort can end them.
  std::mutex sleep_mu;
  std::condition_variable sleep_cv;

  explicit StreamCore(Clock::duration spin_limit) : spin(spin_limit) {}

  // Requires mu.
  void SetError(const absl::Status& status) {
    if (!error.ok()) return;
    error = absl::Status(status.code(), absl::StrCat("stream '", name, "' on ", device_desc, ": ",
                                                     status.message()));
    poisoned.store(true, std::memory_order_release);
  }
};

class HostStream final : public Stream {
 public:
  // Starts the stream's worker thread; ResourceExhausted when the machine allows no more
  // threads (std::thread throws then).
  static absl::StatusOr<std::unique_ptr<HostStream>> Create(HostDevice& device, std::string name);
  ~HostStream() override;

  Device& device() const override;
  const std::string& name() const override { return name_; }
  absl::Status Wait(const Event& event) override;
  absl::Status EnqueueHost(std::function<absl::Status()> fn) override;
  absl::Status EnqueueBusyWait(double microseconds) override;
  absl::Status Synchronize() override;
  absl::Status status() const override;
  void Abort(const absl::Status& reason) override;
  bool aborted() const override { return core_->aborted.load(std::memory_order_acquire); }
  void* native_handle() const override { return nullptr; }

  // Runs `task` in stream order whether or not the stream is poisoned (markers, waits,
  // frees).
  void EnqueueInternal(std::function<void()> task);
  // Runs `fn` in stream order unless the stream is poisoned by then; its error poisons.
  absl::Status EnqueueWork(std::function<absl::Status()> fn);
  // Runs `free_fn` in stream order, or once the stream is destroyed if it was aborted.
  void EnqueueFree(std::function<void()> free_fn);
  // Runs `task` on the calling thread, under the stream's lock, when everything enqueued
  // so far has completed (the stream has reached this point already): a marker or free
  // then costs no hand-off to the worker, which stays asleep. `unless_aborted`: not on an
  // aborted stream either (read under the lock, after the completions it relies on).
  // False: nothing ran.
  template <typename Task>
  bool RunIfDrained(Task& task, bool unless_aborted = false);
  HostDevice& host_device() const { return device_; }

 private:
  HostStream(HostDevice& device, std::string name, std::shared_ptr<StreamCore> core,
             std::thread worker);
  static void Run(const std::shared_ptr<StreamCore>& core);

  HostDevice& device_;
  const std::string name_;
  std::shared_ptr<StreamCore> core_;
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
  absl::StatusOr<std::optional<std::int64_t>> AvailableBytes() override {
    if (memory_.capacity() == 0) return std::optional<std::int64_t>();  // the machine's
    return std::optional<std::int64_t>(
        std::max<std::int64_t>(0, memory_.capacity() - memory_.stats().current_bytes));
  }
  void ResetPeakMemory() override { memory_.ResetPeak(); }

  HostBackend& backend() const { return backend_; }
  const std::string& desc() const { return description_; }
  void Free(void* data, std::size_t size);
  // Every stream of the device registers here; a closing stream hands over the frees it
  // deferred after an abort and says whether its worker was detached (the header).
  void StreamOpened() {
    std::lock_guard<std::mutex> lock(graveyard_mu_);
    ++open_streams_;
  }
  void StreamClosed(std::vector<std::function<void()>> deferred_frees, bool detached);

 protected:
  void FreeNow(void* data, std::size_t size) override { Free(data, size); }
  absl::Status FreeAsyncImpl(void* data, std::size_t size, Stream& stream) override;

 private:
  HostBackend& backend_;
  const int index_;
  const std::string description_;
  MemoryAccount memory_;
  std::atomic<int> next_event_id_{0};
  std::mutex graveyard_mu_;
  int open_streams_ = 0;
  std::vector<std::function<void()>> graveyard_;  // deferred frees of closed streams
  bool leak_graveyard_ = false;                   // a closed stream's worker was detached
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(const BackendOptions& options)
      : strict_(options.strict),
        spin_(std::chrono::microseconds(options.host_spin_micros)),
        epoch_(Clock::now()),
        memory_budget_(HostMemoryHeadroom()) {
    for (int i = 0; i < options.num_devices; ++i) {
      devices_.push_back(std::make_unique<HostDevice>(*this, i, options.memory_capacity_bytes));
    }
  }

  BackendKind kind() const override { return BackendKind::kHost; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  Device& device(int index) override { return *devices_.at(index); }

  bool strict() const { return strict_; }
  Clock::duration spin() const { return spin_; }
  Clock::time_point epoch() const { return epoch_; }
  // Without a capacity, every device's allocations come out of the machine's memory:
  // together they must stay within what it had available when the backend was created
  // (nullopt = unknown: not checked). Allocations that are not yet touched do not show in
  // MemAvailable, so the live bytes are counted here.
  const std::optional<MemoryHeadroom>& memory_budget() const { return memory_budget_; }
  std::atomic<std::int64_t>& live_bytes() { return live_bytes_; }
  double NowMicros() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count();
  }

 private:
  const bool strict_;
  const Clock::duration spin_;
  const Clock::time_point epoch_;
  const std::optional<MemoryHeadroom> memory_budget_;
  std::atomic<std::int64_t> live_bytes_{0};
  std::vector<std::unique_ptr<HostDevice>> devices_;
};

HostStream* AsHostStream(Stream& stream) { return dynamic_cast<HostStream*>(&stream); }

absl::Status NotHost(const Stream& stream, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(Absl(what), ": stream '", stream.name(), "' is not a host-backend stream"));
}

// ---- HostStream -------------------------------------------------------------------

// Why no thread could start, and what would help. pthread_create's EAGAIN is the thread
// limit (ulimit -u), or no room for the new thread's stack under the process's mapping
// limits (ulimit -v, -d).
std::string NoThreadWhy() {
  const std::int64_t stack = DefaultThreadStackBytes();
  constexpr char kFewer[] = "use fewer pipeline ranks and replicas (each runs four streams)";
  const std::optional<MemoryHeadroom> room = MappingHeadroom(ReadMemoryFacts());
  // Within a few stacks of the limit, the stack is why: the room is read after the
  // failure, and threads that ended meanwhile may have given theirs back.
  if (room.has_value() && room->bytes < 4 * stack) {
    return absl::StrCat(DescribeHeadroom(*room), " and each thread maps a ", HumanBytes(stack),
                        " stack; the host backend runs one thread per stream: ", kFewer,
                        ", or raise that limit");
  }
  return absl::StrCat(
      "the host backend runs one thread per stream and this machine allows no more; ", kFewer,
      ", or raise the process's thread limit (ulimit -u)");
}

absl::StatusOr<std::unique_ptr<HostStream>> HostStream::Create(HostDevice& device,
                                                               std::string name) {
  auto core = std::make_shared<StreamCore>(device.backend().spin());
  core->name = name;
  core->device_desc = device.desc();
  std::thread worker;
  try {
    worker = std::thread([core] { Run(core); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat(device.desc(),
                                                     ": cannot start the worker thread of stream '",
                                                     name, "' (", e.what(), "): ", NoThreadWhy()));
  }
  return std::unique_ptr<HostStream>(
      new HostStream(device, std::move(name), std::move(core), std::move(worker)));
}

HostStream::HostStream(HostDevice& device, std::string name, std::shared_ptr<StreamCore> core,
                       std::thread worker)
    : device_(device), name_(std::move(name)), core_(std::move(core)), worker_(std::move(worker)) {
  device_.StreamOpened();
  // Thread names show up in debuggers, perf and TSan reports; at most 15 characters.
  std::string thread_name = absl::StrCat("ps", device_.index(), ":", name_).substr(0, 15);
  pthread_setname_np(worker_.native_handle(), thread_name.c_str());
}

HostStream::~HostStream() {
  StreamCore& core = *core_;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    core.stop = true;
  }
  core.work_cv.notify_one();
  if (!aborted()) {
    worker_.join();  // the worker drains the queue first
    device_.StreamClosed({}, /*detached=*/false);
    return;
  }
  // Aborted: the queue drains at once unless a host function does not return.
  std::unique_lock<std::mutex> lock(core.mu);
  if (core.exit_cv.wait_for(lock, std::chrono::milliseconds(kAbortGraceMillis),
                            [&core] { return core.exited; })) {
    lock.unlock();
    worker_.join();
    device_.StreamClosed(std::move(core.deferred_frees), /*detached=*/false);
    return;
  }
  // Run what is left here (records and frees; host functions and waits are skipped in
  // aborted mode), and leave the worker to exit when its function returns.
  core.detached = true;
  std::deque<std::function<void()>> rest;
  rest.swap(core.queue);
  lock.unlock();
  for (std::function<void()>& task : rest) task();
  // The deferred frees stay unrun (KeepUnrun): its host function may still use that
  // memory (a leak, for a function that ignored the abort). So does every free deferred
  // by the device's other streams. The worker adds none once it sees `detached`.
  {
    std::lock_guard<std::mutex> core_lock(core.mu);
    KeepUnrun(std::move(core.deferred_frees));
    core.deferred_frees.clear();
  }
  worker_.detach();
  device_.StreamClosed({}, /*detached=*/true);
}

Device& HostStream::device() const { return device_; }

void HostStream::Run(const std::shared_ptr<StreamCore>& core_ptr) {
  StreamCore& core = *core_ptr;
  std::deque<std::function<void()>> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(core.mu);
      if (core.queue.empty()) {
        if (core.stop) break;
        core.worker_idle = true;
        core.work_cv.wait(lock, [&core] { return !core.queue.empty() || core.stop; });
        core.worker_idle = false;
        if (core.queue.empty()) break;
      }
      batch.swap(core.queue);
    }
    // Taking the whole batch amortises the lock over many small tasks.
    while (!batch.empty()) {
      std::function<void()> task = std::move(batch.front());
      batch.pop_front();
      task();
      task = nullptr;  // destroy captures before the work counts as done
      std::lock_guard<std::mutex> lock(core.mu);
      if (core.detached) {
        // The stream is gone: what is left of the batch may refer to its device, so it
        // never runs. It is kept, not dropped: it holds the frees that this worker took
        // before the destructor detached it (the destructor only sees the queue), and
        // dropping them would lose that memory (a leak ASan reports).
        KeepUnrun({std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end())});
        batch.clear();
        break;
      }
      ++core.completed;
      if (core.sync_waiters > 0 && core.completed >= core.sync_wake_at) {
        core.sync_wake_at =
            std::numeric_limits<std::uint64_t>::max();  // each waiter not done yet sets it again
        core.done_cv.notify_all();
      }
    }
  }
  std::lock_guard<std::mutex> lock(core.mu);
  core.exited = true;
  core.exit_cv.notify_all();
}

void HostStream::EnqueueInternal(std::function<void()> task) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->queue.push_back(std::move(task));
    ++core_->enqueued;
    wake = core_->worker_idle;
  }
  if (wake) core_->work_cv.notify_one();
}

template <typename Task>
bool HostStream::RunIfDrained(Task& task, bool unless_aborted) {
  std::lock_guard<std::mutex> lock(core_->mu);
  if (core_->completed != core_->enqueued || core_->detached) return false;
  if (unless_aborted && core_->aborted.load(std::memory_order_acquire)) return false;
  task();
  return true;
}

void HostStream::EnqueueFree(std::function<void()> free_fn) {
  // A wait that an abort ended early completed without its producer: "drained" then
  // proves nothing about other streams' use of the memory, so the free takes the
  // deferred path below.
  if (RunIfDrained(free_fn, /*unless_aborted=*/true)) return;
  EnqueueInternal([core = core_, free_fn = std::move(free_fn)]() mutable {
    if (core->aborted.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(core->mu);
      core->deferred_frees.push_back(std::move(free_fn));
      return;
    }
    free_fn();
  });
}

absl::Status HostStream::status() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->error;
}

void HostStream::Abort(const absl::Status& reason) {
  StreamCore& core = *core_;
  std::shared_ptr<EventState> waiting;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    core.SetError(reason.ok() ? absl::CancelledError("aborted") : reason);
    core.aborted.store(true, std::memory_order_release);
    waiting = core.waiting_on;
  }
  // A wait task registers its event under core.mu before checking `aborted` under the
  // event's mutex: either it sees the flag, or it is registered and woken here.
  if (waiting != nullptr) {
    { std::lock_guard<std::mutex> lock(waiting->mu); }
    waiting->cv.notify_all();
  }
  { std::lock_guard<std::mutex> lock(core.sleep_mu); }
  core.sleep_cv.notify_all();
}

absl::Status HostStream::EnqueueWork(std::function<absl::Status()> fn) {
  if (core_->poisoned.load(std::memory_order_acquire)) return status();
  EnqueueInternal([core = core_, fn = std::move(fn)] {
    if (core->poisoned.load(std::memory_order_acquire)) return;
    absl::Status status;
    // Work that throws (a user's StageWork, say) fails its stream like work that returns an
    // error, instead of ending the process from the worker thread.
    try {
      status = fn();
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("work on the stream threw: ", e.what()));
    } catch (...) {
      status = absl::InternalError("work on the stream threw a non-standard exception");
    }
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(core->mu);
    core->SetError(status);
  });
  return absl::OkStatus();
}

absl::Status HostStream::EnqueueHost(std::function<absl::Status()> fn) {
  if (!fn) return absl::InvalidArgumentError("EnqueueHost: empty function");
  return EnqueueWork(std::move(fn));
}

absl::Status HostStream::EnqueueBusyWait(double microseconds) {
  // As the CUDA stream's: an hour at most (an infinite or huge duration would overflow
  // the clock, and the wait would end at once).
  if (!(microseconds >= 0 && microseconds <= 3.6e9)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueBusyWait: microseconds must be in [0, 3.6e9], not ", microseconds));
  }
  EnqueueInternal([core = core_, microseconds] {
    std::unique_lock<std::mutex> lock(core->sleep_mu);
    core->sleep_cv.wait_for(lock, std::chrono::duration<double, std::micro>(microseconds),
                            [&core] { return core->aborted.load(std::memory_order_acquire); });
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
  bool completed;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    generation = state->recorded;
    completed = generation > 0 && state->Completed(generation);
  }
  // A generation that has completed stays completed: the wait would be a no-op.
  if (completed) return absl::OkStatus();
  if (generation == 0) {
    if (device_.backend().strict()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stream '", name_, "' on ", device_.desc(), " waits on event '", event.name(),
          "', which was never recorded (CUDA would silently not wait); record it first"));
    }
    return absl::OkStatus();
  }
  EnqueueInternal([core = core_, state = std::move(state), generation] {
    auto aborted = [&core] { return core->aborted.load(std::memory_order_acquire); };
    if (aborted()) return;
    // Read before the first check, so that any completion after it shows as a change.
    std::uint64_t seen = state->completions.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->Completed(generation)) return;
    }
    {
      std::lock_guard<std::mutex> lock(core->mu);
      core->waiting_on = state;
    }
    const bool done = SpinUntil(core->spin, [&] {
      if (aborted()) return true;
      const std::uint64_t now = state->completions.load(std::memory_order_acquire);
      if (now == seen) return false;
      seen = now;
      std::lock_guard<std::mutex> lock(state->mu);
      return state->Completed(generation);
    });
    if (!done) {
      std::unique_lock<std::mutex> lock(state->mu);
      ++state->sleepers;
      state->cv.wait(lock, [&] { return state->Completed(generation) || aborted(); });
      --state->sleepers;
    }
    std::lock_guard<std::mutex> lock(core->mu);
    core->waiting_on.reset();
  });
  return absl::OkStatus();
}

absl::Status HostStream::Synchronize() {
  std::unique_lock<std::mutex> lock(core_->mu);
  const std::uint64_t target = core_->enqueued;
  ++core_->sync_waiters;
  while (core_->completed < target) {
    core_->sync_wake_at = std::min(core_->sync_wake_at, target);
    core_->done_cv.wait(lock);
  }
  --core_->sync_waiters;
  return core_->error;
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
  // Captures the epoch, not the backend: a detached worker must not refer to it.
  auto marker = [state = state_, generation, timing = timing_, epoch = device_.backend().epoch()] {
    const double now =
        timing ? std::chrono::duration<double, std::micro>(Clock::now() - epoch).count() : 0.0;
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      std::erase(state->pending, generation);
      if (generation > state->last_completed) {
        state->last_completed = generation;
        state->last_timestamp_us = now;
      }
      state->completions.fetch_add(1, std::memory_order_release);
      wake = state->sleepers > 0;
    }
    if (wake) state->cv.notify_all();
  };
  // On a drained stream the record completes here (lock order: stream, then event).
  if (!host_stream->RunIfDrained(marker)) host_stream->EnqueueInternal(std::move(marker));
  return absl::OkStatus();
}

absl::StatusOr<bool> HostEvent::Query() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->Completed(state_->recorded);
}

absl::Status HostEvent::Synchronize() {
  std::unique_lock<std::mutex> lock(state_->mu);
  const std::uint64_t generation = state_->recorded;
  ++state_->sleepers;
  state_->cv.wait(lock, [&] { return state_->Completed(generation); });
  --state_->sleepers;
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
  PS_ASSIGN_OR_RETURN(std::unique_ptr<HostStream> stream,
                      HostStream::Create(*this, std::string(name)));
  return std::unique_ptr<Stream>(std::move(stream));
}

absl::StatusOr<std::unique_ptr<Event>> HostDevice::CreateEvent(bool timing, std::string_view name) {
  std::string event_name =
      name.empty() ? absl::StrCat("event#", next_event_id_.fetch_add(1)) : std::string(name);
  return std::make_unique<HostEvent>(*this, timing, std::move(event_name));
}

// A stream of another host backend (another set of devices and memory account).
absl::Status OtherBackend(const HostStream& stream, const HostBackend& backend,
                          std::string_view what, std::string_view device) {
  if (&stream.host_device().backend() == &backend) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(Absl(what), " on ", Absl(device), ": stream '",
                                                 stream.name(),
                                                 "' belongs to another host backend; use a stream "
                                                 "of this device's backend"));
}

absl::StatusOr<Buffer> HostDevice::Allocate(std::size_t bytes, Stream& stream) {
  HostStream* host_stream = AsHostStream(stream);
  if (host_stream == nullptr) return NotHost(stream, "Allocate");
  PS_RETURN_IF_ERROR(OtherBackend(*host_stream, backend_, "Allocate", description_));
  // Stream-ordered on this device: its stream's order is the one the memory follows.
  if (&host_stream->host_device() != this) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Allocate on ", description_, ": stream '", stream.name(), "' is on ",
        host_stream->host_device().desc(), "; allocate on one of this device's streams"));
  }
  if (bytes == 0) return Buffer();
  // Beyond 2^62 the sums below would wrap (and no machine has it): refused as they are.
  constexpr std::size_t kMaxAllocationBytes = std::size_t{1} << 62;
  if (bytes > kMaxAllocationBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(description_, ": cannot allocate ", bytes,
                                                     " bytes: more than 2^62, beyond any "
                                                     "machine's memory"));
  }
  const auto size = static_cast<std::int64_t>(bytes);
  const std::int64_t live = backend_.live_bytes().fetch_add(size) + size;
  // Every refusal undoes what it counted, before the device's account (and its peak) saw it.
  auto refuse = [&](const std::string& why) {
    backend_.live_bytes().fetch_sub(size);
    return absl::ResourceExhaustedError(absl::StrCat(
        description_, ": cannot allocate ", HumanBytes(size), " (", bytes, " bytes): ", why));
  };
  // Linux overcommits: an allocation beyond what the machine has left may succeed and get
  // the process killed once its pages are touched (by the OOM killer, or by a container's
  // memory limit). So, without a capacity: all the backend holds (some of it not touched
  // yet, so not in MemAvailable) must stay within the headroom it had when it was
  // created, and a large allocation also within the headroom now (reading /proc and the
  // cgroup files costs ~50 us, nothing next to touching 64 MiB).
  if (memory_.capacity() == 0) {
    const std::optional<MemoryHeadroom>& budget = backend_.memory_budget();
    if (budget.has_value() && live > budget->bytes) {
      return refuse(absl::StrCat("the host backend would hold ", HumanBytes(live),
                                 " in all, more than it could take when it started (",
                                 DescribeHeadroom(*budget), ")"));
    }
    if (bytes >= kCheckedAllocationBytes) {
      const std::optional<MemoryHeadroom> headroom = HostMemoryHeadroom();
      if (headroom.has_value() && size > headroom->bytes)
        return refuse(DescribeHeadroom(*headroom));
    }
  }
  void* data = ::operator new(bytes, kAlignment, std::nothrow);
  if (data == nullptr) return refuse("out of host memory");
  // With a capacity, the account refuses what exceeds it; without one it cannot fail.
  if (absl::Status fits = memory_.Reserve(size, description_); !fits.ok()) {
    ::operator delete(data, kAlignment);
    backend_.live_bytes().fetch_sub(size);
    return fits;
  }
  return MakeBuffer(this, data, bytes);
}

void HostDevice::Free(void* data, std::size_t size) {
  ::operator delete(data, kAlignment);
  memory_.Release(static_cast<std::int64_t>(size));
  backend_.live_bytes().fetch_sub(static_cast<std::int64_t>(size));
}

void HostDevice::StreamClosed(std::vector<std::function<void()>> deferred_frees, bool detached) {
  std::vector<std::function<void()>> run;
  {
    std::lock_guard<std::mutex> lock(graveyard_mu_);
    for (std::function<void()>& free_fn : deferred_frees) graveyard_.push_back(std::move(free_fn));
    leak_graveyard_ = leak_graveyard_ || detached;
    if (--open_streams_ > 0) return;
    if (!leak_graveyard_) run.swap(graveyard_);
    KeepUnrun(std::move(graveyard_));  // when leaking: kept, never run
    graveyard_.clear();
    leak_graveyard_ = false;
  }
  for (std::function<void()>& free_fn : run) free_fn();
}

absl::Status HostDevice::FreeAsyncImpl(void* data, std::size_t size, Stream& stream) {
  HostStream* host_stream = AsHostStream(stream);
  if (host_stream == nullptr) return NotHost(stream, "FreeAsync");
  PS_RETURN_IF_ERROR(OtherBackend(*host_stream, backend_, "FreeAsync", description_));
  host_stream->EnqueueFree([this, data, size] { Free(data, size); });
  return absl::OkStatus();
}

absl::Status HostDevice::CopyAsync(void* dst, const void* src, std::size_t bytes,
                                   const Device& src_device, Stream& stream) {
  HostStream* host_stream = AsHostStream(stream);
  if (host_stream == nullptr) return NotHost(stream, "CopyAsync");
  PS_RETURN_IF_ERROR(OtherBackend(*host_stream, backend_, "CopyAsync", description_));
  const auto* host_src = dynamic_cast<const HostDevice*>(&src_device);
  if (host_src == nullptr || &host_src->backend() != &backend_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyAsync to ", description_, " from ", src_device.description(),
        host_src == nullptr ? ": devices of different backends"
                            : " of another host backend; copy between devices of one backend"));
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
  if (options.host_spin_micros < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_spin_micros must be >= 0, not ", options.host_spin_micros));
  }
  return std::make_unique<HostBackend>(options);
}

}  // namespace pipesched::runtime
