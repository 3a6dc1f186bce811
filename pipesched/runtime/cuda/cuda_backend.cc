// CUDA backend: the seam over the CUDA runtime API.
//   - Handles (streams, events, memory pools) are move-only RAII wrappers created by
//     factories returning StatusOr and destroyed on their own device, never throwing.
//   - Streams are cudaStreamNonBlocking; events cudaEventDisableTiming unless timing.
//   - Memory is stream-ordered: cudaMallocFromPoolAsync from one pool per device (release
//     threshold at maximum, so freed memory is reused rather than returned to the
//     driver), cudaFreeAsync; accounting drops once the free is reached: an event
//     recorded behind it is polled at the next Allocate or memory_stats() (not a host
//     function per free, which would stall its stream on CUDA's callback thread).
//   - Peer access is enabled between every pair of devices that supports it, for both
//     kernels and the pools.
//   - Timestamps: each device keeps an anchor, an event of its own whose host time we
//     noted when it completed (recorded on an idle stream between two host clock reads);
//     TimestampMicros = anchor time + elapsed(anchor, e). cudaEventElapsedTime returns
//     float milliseconds, whose rounding step grows with the interval (62 us at 10
//     minutes), so an anchor older than kAnchorMaxAgeMillis is replaced by a fresh one
//     before it is used: intervals stay short, timestamps keep ~1 us precision however
//     long the process runs.
//   - Destroying a stream waits for its work, as the seam promises (cudaStreamDestroy
//     alone returns at once and would leave queued host functions to run after their
//     captures are gone); an aborted stream is waited for at most kAbortGraceMillis.
//     One still running then (a host function that does not return) makes its device
//     abandoned for the whole process (AbortRegistry), and so does an aborted stream that
//     a device-wide wait finds still running after the grace period: from then on
//     nothing waits for that device (a Buffer freed without FreeAsync is kept, not freed,
//     by any backend), and a backend that cannot wait for its devices keeps them for the
//     life of the process. cuBLAS's handle destruction waits for the device by itself:
//     restart the process after an abandoned CUDA step.
//   - Synchronous copies from the host wait until the data has landed (a pageable
//     cudaMemcpy may return once the bytes are staged, on the legacy stream, which our
//     non-blocking streams are not ordered after); a Buffer freed without FreeAsync
//     waits for every device first (cudaFree does not wait for pool memory).
//   - Abort (watchdog): poisons the stream so that host functions not yet started are
//     skipped; kernels, copies and event waits already enqueued cannot be cancelled.
//   - Strict mode: the wrapper remembers whether an event was ever recorded, so waiting
//     on a never-recorded one fails here too instead of being CUDA's silent no-op.
// Every CUDA call goes through base/cuda_check.h.
#include "pipesched/runtime/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/cuda_check.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/runtime/cuda/busy_wait.h"
#include "pipesched/runtime/memory_account.h"

namespace pipesched::runtime {

int CudaDeviceCount() {
  // Any failure means "no GPU": machines without one report cudaErrorInsufficientDriver.
  static const int count = [] {
    int n = 0;
    return PS_CUDA_STATUS(cudaGetDeviceCount(&n)).ok() ? n : 0;
  }();
  return count;
}

namespace {

using Clock = std::chrono::steady_clock;

// An anchor older than this (host time) is replaced before a timestamp is taken from it:
// cudaEventElapsedTime's float milliseconds then round to well under a microsecond.
constexpr double kAnchorMaxAgeMillis = 4000;

// A query's "not ready" is an answer, not an error: clear it from the thread's last-error
// slot too (as PyTorch does), so that no later cudaGetLastError -- ours before a launch,
// or cuBLAS's and NCCL's after theirs -- mistakes it for a failure.
cudaError_t NotReadyCleared(cudaError_t state) {
  if (state == cudaErrorNotReady) (void)cudaGetLastError();
  return state;
}

// A move-only owner of one CUDA handle of type T, destroyed on `device` by Traits.
template <typename T, typename Traits>
class CudaHandle {
 public:
  CudaHandle() = default;
  CudaHandle(int device, T handle) : device_(device), handle_(handle) {}
  CudaHandle(CudaHandle&& other) noexcept
      : device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}
  CudaHandle& operator=(CudaHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      device_ = other.device_;
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  ~CudaHandle() { Reset(); }

  T get() const { return handle_; }
  int device() const { return device_; }

 private:
  void Reset() {
    if (handle_ == nullptr) return;
    CudaDeviceGuard guard(device_);
    (void)Traits::Destroy(handle_);  // errors cannot be reported from a destructor
    handle_ = nullptr;
  }
  int device_ = -1;
  T handle_ = nullptr;
};

struct StreamTraits {
  static absl::Status Destroy(cudaStream_t s) { return PS_CUDA_STATUS(cudaStreamDestroy(s)); }
};
struct EventTraits {
  static absl::Status Destroy(cudaEvent_t e) { return PS_CUDA_STATUS(cudaEventDestroy(e)); }
};
struct PoolTraits {
  static absl::Status Destroy(cudaMemPool_t p) { return PS_CUDA_STATUS(cudaMemPoolDestroy(p)); }
};
using StreamHandle = CudaHandle<cudaStream_t, StreamTraits>;
using EventHandle = CudaHandle<cudaEvent_t, EventTraits>;
using PoolHandle = CudaHandle<cudaMemPool_t, PoolTraits>;

absl::StatusOr<StreamHandle> CreateStreamHandle(int device) {
  CudaDeviceGuard guard(device);
  PS_RETURN_IF_ERROR(guard.status());
  cudaStream_t stream = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return StreamHandle(device, stream);
}

absl::StatusOr<EventHandle> CreateEventHandle(int device, bool timing) {
  CudaDeviceGuard guard(device);
  PS_RETURN_IF_ERROR(guard.status());
  cudaEvent_t event = nullptr;
  PS_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return EventHandle(device, event);
}

absl::StatusOr<PoolHandle> CreatePoolHandle(int device) {
  CudaDeviceGuard guard(device);
  PS_RETURN_IF_ERROR(guard.status());
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  PS_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&pool, &props));
  PoolHandle handle(device, pool);
  // Keep freed memory in the pool: a training step frees and reallocates the same sizes.
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  PS_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  // No hidden waits: by default an allocation may reuse a block freed on another stream
  // whose free has not been reached yet, by making the allocating stream wait for that
  // stream. The executor frees boundary buffers on the send stream and allocates them on
  // the compute stream, which must never wait for an outgoing copy (the simulator plans
  // no such wait): the pool grows instead. Reuse ordered by events the streams already
  // wait on (cudaMemPoolReuseFollowEventDependencies) stays on.
  int internal_dependencies = 0;
  PS_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies,
                                                  &internal_dependencies));
  return handle;
}

class CudaBackend;
class CudaDevice;

// A timing event of the device's own, recorded on an idle stream between two host clock
// reads: `micros` (their midpoint, on the backend's clock) is when it completed, to half
// the round trip (a few microseconds).
struct Anchor {
  EventHandle event;
  double micros = 0;
  double host_millis = 0;  // when it was made, for its age
};

// Shared with host functions in flight, which may outlive the CudaStream object
// (cudaStreamDestroy returns before the stream's work is done).
struct StreamErrorState {
  std::string prefix;  // "stream 'x' on cuda:0: "
  std::atomic<bool> poisoned{false};
  std::atomic<bool> aborted{false};  // Stream::Abort: host functions not started are skipped
  std::mutex mu;
  absl::Status error;

  absl::Status Get() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  void Set(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error.ok()) return;
    error = absl::Status(status.code(), absl::StrCat(prefix, status.message()));
    poisoned.store(true, std::memory_order_release);
  }
};

struct HostCall {
  std::shared_ptr<StreamErrorState> state;
  std::function<absl::Status()> fn;
};

void CUDART_CB RunHostCall(void* data) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(data));
  if (call->state->poisoned.load(std::memory_order_acquire)) return;
  absl::Status status;
  // As on the host backend: a function that throws poisons its stream, it does not end the
  // process from CUDA's callback thread.
  try {
    status = call->fn();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("work on the stream threw: ", e.what()));
  } catch (...) {
    status = absl::InternalError("work on the stream threw a non-standard exception");
  }
  if (!status.ok()) call->state->Set(status);
}

// Aborted streams and abandoned devices, for the whole process: a device-wide wait
// (cudaDeviceSynchronize) waits for every stream on the device, whichever backend made it.
// An aborted stream whose work still runs after the grace period (a host function that
// does not return) makes its device abandoned: from then on nothing waits for that
// device, and memory that work may use is kept rather than freed. Restart the process to
// get the device back.
class AbortRegistry {
 public:
  static AbortRegistry& Get() {
    static AbortRegistry* registry = new AbortRegistry();
    return *registry;
  }
  void NoteAborted(int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.insert({device, stream});
  }
  // Before the stream is destroyed; `still_running`: its device is abandoned.
  void Forget(int device, cudaStream_t stream, bool still_running) {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.erase({device, stream});
    if (still_running) abandoned_.insert(device);
  }
  void MarkAbandoned(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_.insert(device);
  }
  bool Abandoned(int device) const {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_.count(device) > 0;
  }
  // Whether `device`'s work can be waited for: gives each aborted stream there the grace
  // period to drain (polling), and marks the device abandoned when one does not.
  bool Drainable(int device) {
    std::lock_guard<std::mutex> lock(mu_);  // held: Forget waits, so no stream goes meanwhile
    if (abandoned_.count(device) > 0) return false;
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(Stream::kAbortGraceMillis);
    for (auto it = aborted_.lower_bound({device, nullptr});
         it != aborted_.end() && it->first == device; ++it) {
      while (NotReadyCleared(cudaStreamQuery(it->second)) == cudaErrorNotReady) {
        if (Clock::now() >= deadline) {
          abandoned_.insert(device);
          return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::set<std::pair<int, cudaStream_t>> aborted_;
  std::set<int> abandoned_;
};

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDevice& device, std::string name, StreamHandle handle);
  ~CudaStream() override;

  Device& device() const override;
  const std::string& name() const override { return name_; }
  absl::Status Wait(const Event& event) override;
  absl::Status EnqueueHost(std::function<absl::Status()> fn) override;
  absl::Status EnqueueBusyWait(double microseconds) override;
  absl::Status Synchronize() override;
  // The first host-function error or abort, else a device fault (sticky) seen by the
  // stream: both poison it.
  absl::Status status() const override;
  // Device work cannot be cancelled: poisons (so host functions not yet started are
  // skipped); NCCL communicators are aborted by their AllReducer.
  void Abort(const absl::Status& reason) override;
  bool aborted() const override { return error_->aborted.load(std::memory_order_acquire); }
  void* native_handle() const override { return handle_.get(); }

  cudaStream_t get() const { return handle_.get(); }
  CudaDevice& cuda_device() const { return device_; }
  absl::Status PoisonStatus() const {
    return error_->poisoned.load(std::memory_order_acquire) ? error_->Get() : absl::OkStatus();
  }

 private:
  CudaDevice& device_;
  const std::string name_;
  StreamHandle handle_;
  std::shared_ptr<StreamErrorState> error_ = std::make_shared<StreamErrorState>();
};

class CudaEvent final : public Event {
 public:
  CudaEvent(CudaDevice& device, bool timing, std::string name, EventHandle handle)
      : device_(device), timing_(timing), name_(std::move(name)), handle_(std::move(handle)) {}

  const std::string& name() const override { return name_; }
  absl::Status Record(Stream& stream) override;
  absl::StatusOr<bool> Query() override;
  absl::Status Synchronize() override;
  absl::StatusOr<double> ElapsedMillis(const Event& start) const override;
  absl::StatusOr<double> TimestampMicros() const override;

  cudaEvent_t get() const { return handle_.get(); }
  bool recorded() const { return recorded_.load(std::memory_order_acquire); }

 private:
  absl::Status CheckTimed() const;

  CudaDevice& device_;
  const bool timing_;
  const std::string name_;
  EventHandle handle_;
  std::atomic<bool> recorded_{false};
};

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(CudaBackend& backend, int index,
                                                            std::int64_t capacity);

  BackendKind kind() const override { return BackendKind::kCuda; }
  int index() const override { return index_; }
  std::string description() const override { return description_; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) override;
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent(bool timing, std::string_view name) override;
  absl::StatusOr<Buffer> Allocate(std::size_t bytes, Stream& stream) override;
  absl::Status CopyAsync(void* dst, const void* src, std::size_t bytes, const Device& src_device,
                         Stream& stream) override;
  absl::Status CopyToHost(void* host_dst, const void* src, std::size_t bytes) override;
  absl::Status CopyFromHost(void* dst, const void* host_src, std::size_t bytes) override;
  MemoryStats memory_stats() const override {
    ReleaseReachedFrees();
    return memory_.stats();
  }
  absl::StatusOr<std::optional<std::int64_t>> AvailableBytes() override;
  void ResetPeakMemory() override {
    ReleaseReachedFrees();
    memory_.ResetPeak();
  }

  CudaBackend& backend() const { return backend_; }
  const std::string& desc() const { return description_; }
  cudaMemPool_t pool() const { return pool_.get(); }
  // The anchor of this device's timestamps, replaced first when it is older than
  // kAnchorMaxAgeMillis (see the file comment). Shared: a caller keeps using the one it
  // got while another thread replaces it.
  absl::StatusOr<std::shared_ptr<const Anchor>> CurrentAnchor() const;

 protected:
  void FreeNow(void* data, std::size_t size) override;
  absl::Status FreeAsyncImpl(void* data, std::size_t size, Stream& stream) override;

 private:
  CudaDevice(CudaBackend& backend, int index, std::string description, std::int64_t capacity)
      : backend_(backend), index_(index), description_(std::move(description)), memory_(capacity) {}

  CudaBackend& backend_;
  const int index_;
  const std::string description_;
  // Counted on the host thread that allocates, frees or asks (ReleaseReachedFrees).
  mutable MemoryAccount memory_;
  // Stream-ordered frees not yet counted: each with an event recorded behind its
  // cudaFreeAsync. They are counted (ReleaseReachedFrees) when the event has completed,
  // at the next Allocate or memory_stats(): a host function per free would do it at the
  // exact moment, but would stop its stream until CUDA's callback thread ran it, and
  // CUDA may run the host functions of all streams one at a time.
  struct PendingFree {
    EventHandle reached;
    std::int64_t bytes;
  };
  void ReleaseReachedFrees() const;
  mutable std::mutex frees_mu_;
  mutable std::vector<PendingFree> pending_frees_;
  mutable std::vector<EventHandle> spare_events_;
  PoolHandle pool_;
  mutable std::mutex anchor_mu_;
  mutable std::shared_ptr<const Anchor> anchor_;
  std::atomic<int> next_event_id_{0};
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const BackendOptions& options);
  // Host functions still queued (frees, user callbacks) refer to the devices' state.
  // When a device's work cannot be waited for (AbortRegistry: a stream there abandoned),
  // the devices, their pools and anchors are kept for the life of the process instead,
  // and marked abandoned (a kept device must not reach this backend again): a host
  // function that never returns would hold the wait forever, and may still use them.
  ~CudaBackend() override {
    if (SynchronizeAll()) return;
    static auto* kept = new std::vector<std::unique_ptr<CudaDevice>>;
    static std::mutex* kept_mu = new std::mutex;
    std::lock_guard<std::mutex> lock(*kept_mu);
    for (auto& device : devices_) {
      AbortRegistry::Get().MarkAbandoned(device->index());
      kept->push_back(std::move(device));
    }
  }

  // Waits for all work on every device; errors are left to the streams to report.
  // False, without waiting for it, where a device's work cannot be waited for
  // (AbortRegistry::Drainable).
  bool SynchronizeAll() const {
    bool all = true;
    for (const auto& device : devices_) {
      if (!AbortRegistry::Get().Drainable(device->index())) {
        all = false;
        continue;
      }
      CudaDeviceGuard guard(device->index());
      (void)PS_CUDA_STATUS(cudaDeviceSynchronize());
    }
    return all;
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  Device& device(int index) override { return *devices_.at(index); }

  bool strict() const { return strict_; }
  double NowMicros() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count();
  }

 private:
  explicit CudaBackend(bool strict) : strict_(strict), epoch_(Clock::now()) {}
  absl::Status EnablePeerAccess();

  const bool strict_;
  const Clock::time_point epoch_;
  std::vector<std::unique_ptr<CudaDevice>> devices_;
};

CudaStream* AsCudaStream(Stream& stream) { return dynamic_cast<CudaStream*>(&stream); }

absl::Status NotCuda(const Stream& stream, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(Absl(what), ": stream '", stream.name(), "' is not a CUDA-backend stream"));
}

// ---- CudaStream -------------------------------------------------------------------

CudaStream::CudaStream(CudaDevice& device, std::string name, StreamHandle handle)
    : device_(device), name_(std::move(name)), handle_(std::move(handle)) {
  error_->prefix = absl::StrCat("stream '", name_, "' on ", device_.desc(), ": ");
}

void CudaStream::Abort(const absl::Status& reason) {
  error_->Set(reason.ok() ? absl::CancelledError("aborted") : reason);
  error_->aborted.store(true, std::memory_order_release);
  AbortRegistry::Get().NoteAborted(device_.index(), handle_.get());
}

CudaStream::~CudaStream() {
  if (!aborted()) {
    (void)PS_CUDA_STATUS(cudaStreamSynchronize(handle_.get()));
    return;
  }
  // Device work cannot be cancelled: give it the grace period, as the host backend does,
  // unless its device is abandoned already (no second wait for the same stuck function).
  AbortRegistry& registry = AbortRegistry::Get();
  const int device = device_.index();
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kAbortGraceMillis);
  bool running = true;
  while (true) {
    running = NotReadyCleared(cudaStreamQuery(handle_.get())) == cudaErrorNotReady;
    if (!running || registry.Abandoned(device) || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Still running: cudaStreamDestroy returns at once and CUDA releases the stream when its
  // work is done; nothing may wait for the device from now on.
  registry.Forget(device, handle_.get(), running);
}

Device& CudaStream::device() const { return device_; }

absl::Status CudaStream::status() const {
  PS_RETURN_IF_ERROR(PoisonStatus());
  const cudaError_t state = NotReadyCleared(cudaStreamQuery(handle_.get()));
  if (state == cudaSuccess || state == cudaErrorNotReady) return absl::OkStatus();
  error_->Set(PS_CUDA_STATUS(state));
  return error_->Get();
}

absl::Status CudaStream::Wait(const Event& event) {
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  if (cuda_event == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("stream '", name_, "' on ", device_.desc(),
                                                   " cannot wait on event '", event.name(),
                                                   "': it is not a CUDA-backend event"));
  }
  if (!cuda_event->recorded()) {
    if (device_.backend().strict()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stream '", name_, "' on ", device_.desc(), " waits on event '", event.name(),
          "', which was never recorded (CUDA would silently not wait); record it first"));
    }
    return absl::OkStatus();
  }
  PS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(handle_.get(), cuda_event->get(), 0));
  return absl::OkStatus();
}

absl::Status CudaStream::EnqueueHost(std::function<absl::Status()> fn) {
  if (!fn) return absl::InvalidArgumentError("EnqueueHost: empty function");
  PS_RETURN_IF_ERROR(PoisonStatus());
  auto call = std::make_unique<HostCall>(HostCall{error_, std::move(fn)});
  PS_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(handle_.get(), &RunHostCall, call.get()));
  call.release();  // owned by RunHostCall now
  return absl::OkStatus();
}

absl::Status CudaStream::EnqueueBusyWait(double microseconds) {
  // An hour is far beyond any use and keeps the nanoseconds well inside 64 bits.
  if (!(microseconds >= 0) || microseconds > 3.6e9) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnqueueBusyWait: microseconds must be in [0, 3.6e9], not ", microseconds));
  }
  CudaDeviceGuard guard(device_.index());
  PS_RETURN_IF_ERROR(guard.status());
  const auto nanoseconds = static_cast<unsigned long long>(microseconds * 1000.0);
  PS_CUDA_RETURN_IF_ERROR(cuda_detail::LaunchBusyWait(nanoseconds, handle_.get()));
  return absl::OkStatus();
}

absl::Status CudaStream::Synchronize() {
  PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(handle_.get()));
  return error_->Get();
}

// ---- CudaEvent --------------------------------------------------------------------

absl::Status CudaEvent::Record(Stream& stream) {
  CudaStream* cuda_stream = AsCudaStream(stream);
  if (cuda_stream == nullptr) return NotCuda(stream, absl::StrCat("record '", name_, "'"));
  if (&cuda_stream->cuda_device() != &device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event '", name_, "' belongs to ", device_.desc(), " and cannot be recorded on stream '",
        stream.name(), "' of ", cuda_stream->cuda_device().desc()));
  }
  PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(handle_.get(), cuda_stream->get()));
  recorded_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaEvent::Query() {
  // cudaEventQuery reports a never-recorded event as complete, as the seam promises. Not
  // ready is an answer, not an error: no message is built for it (the executor polls).
  const cudaError_t state = NotReadyCleared(cudaEventQuery(handle_.get()));
  if (state == cudaSuccess) return true;
  if (state == cudaErrorNotReady) return false;
  return PS_CUDA_STATUS(state);
}

absl::Status CudaEvent::Synchronize() {
  PS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(handle_.get()));
  return absl::OkStatus();
}

absl::Status CudaEvent::CheckTimed() const {
  if (!timing_) {
    return absl::FailedPreconditionError(
        absl::StrCat("event '", name_, "' was created without timing"));
  }
  if (!recorded()) {
    return absl::FailedPreconditionError(absl::StrCat("event '", name_, "' was never recorded"));
  }
  return absl::OkStatus();
}

// cudaEventElapsedTime's "not ready" means a record has not completed.
absl::StatusOr<double> ElapsedBetween(cudaEvent_t start, cudaEvent_t end, const std::string& name) {
  float ms = 0;
  absl::Status status = PS_CUDA_STATUS(cudaEventElapsedTime(&ms, start, end));
  if (IsCudaError(status, cudaErrorNotReady)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "event '", name, "': its most recent record has not completed (", status.message(), ")"));
  }
  PS_RETURN_IF_ERROR(status);
  return static_cast<double>(ms);
}

absl::StatusOr<double> CudaEvent::TimestampMicros() const {
  PS_RETURN_IF_ERROR(CheckTimed());
  PS_ASSIGN_OR_RETURN(std::shared_ptr<const Anchor> anchor, device_.CurrentAnchor());
  PS_ASSIGN_OR_RETURN(const double ms, ElapsedBetween(anchor->event.get(), get(), name_));
  return anchor->micros + ms * 1000.0;
}

absl::StatusOr<double> CudaEvent::ElapsedMillis(const Event& start) const {
  const auto* cuda_start = dynamic_cast<const CudaEvent*>(&start);
  if (cuda_start == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElapsedMillis: event '", start.name(), "' is not a CUDA-backend event"));
  }
  PS_RETURN_IF_ERROR(cuda_start->CheckTimed());
  PS_RETURN_IF_ERROR(CheckTimed());
  if (&cuda_start->device_ == &device_) return ElapsedBetween(cuda_start->get(), get(), name_);
  // Events of two devices: through the shared time axis.
  PS_ASSIGN_OR_RETURN(const double start_us, cuda_start->TimestampMicros());
  PS_ASSIGN_OR_RETURN(const double end_us, TimestampMicros());
  return (end_us - start_us) / 1000.0;
}

// ---- CudaDevice -------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<const Anchor>> MakeAnchor(const CudaBackend& backend, int index);

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(CudaBackend& backend, int index,
                                                               std::int64_t capacity) {
  CudaDeviceGuard guard(index);
  PS_RETURN_IF_ERROR(guard.status());
  cudaDeviceProp props = {};
  PS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, index));
  std::unique_ptr<CudaDevice> device(new CudaDevice(
      backend, index, absl::StrCat("cuda:", index, " (", props.name, ")"), capacity));
  PS_ASSIGN_OR_RETURN(device->pool_, CreatePoolHandle(index));
  PS_ASSIGN_OR_RETURN(device->anchor_, MakeAnchor(backend, index));
  return device;
}

absl::StatusOr<std::shared_ptr<const Anchor>> MakeAnchor(const CudaBackend& backend, int index) {
  auto anchor = std::make_shared<Anchor>();
  PS_ASSIGN_OR_RETURN(anchor->event, CreateEventHandle(index, /*timing=*/true));
  PS_ASSIGN_OR_RETURN(StreamHandle stream, CreateStreamHandle(index));
  PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()));
  const double before = backend.NowMicros();
  PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(anchor->event.get(), stream.get()));
  PS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(anchor->event.get()));
  const double after = backend.NowMicros();
  anchor->micros = (before + after) / 2;
  anchor->host_millis = after / 1000;
  return std::shared_ptr<const Anchor>(std::move(anchor));
}

absl::StatusOr<std::shared_ptr<const Anchor>> CudaDevice::CurrentAnchor() const {
  std::lock_guard<std::mutex> lock(anchor_mu_);
  if (backend_.NowMicros() / 1000 - anchor_->host_millis > kAnchorMaxAgeMillis) {
    PS_ASSIGN_OR_RETURN(anchor_, MakeAnchor(backend_, index_));
  }
  return anchor_;
}

absl::StatusOr<std::unique_ptr<Stream>> CudaDevice::CreateStream(std::string_view name) {
  PS_ASSIGN_OR_RETURN(StreamHandle handle, CreateStreamHandle(index_));
  return std::make_unique<CudaStream>(*this, std::string(name), std::move(handle));
}

absl::StatusOr<std::unique_ptr<Event>> CudaDevice::CreateEvent(bool timing, std::string_view name) {
  PS_ASSIGN_OR_RETURN(EventHandle handle, CreateEventHandle(index_, timing));
  std::string event_name =
      name.empty() ? absl::StrCat("event#", next_event_id_.fetch_add(1)) : std::string(name);
  return std::make_unique<CudaEvent>(*this, timing, std::move(event_name), std::move(handle));
}

absl::StatusOr<Buffer> CudaDevice::Allocate(std::size_t bytes, Stream& stream) {
  CudaStream* cuda_stream = AsCudaStream(stream);
  if (cuda_stream == nullptr) return NotCuda(stream, "Allocate");
  if (bytes == 0) return Buffer();
  if (bytes > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max() / 2)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(description_, ": cannot allocate ", bytes, " bytes: beyond any GPU"));
  }
  ReleaseReachedFrees();
  PS_RETURN_IF_ERROR(memory_.Reserve(static_cast<std::int64_t>(bytes), description_));
  void* data = nullptr;
  absl::Status status =
      PS_CUDA_STATUS(cudaMallocFromPoolAsync(&data, bytes, pool_.get(), cuda_stream->get()));
  if (status.ok()) return MakeBuffer(this, data, bytes);
  memory_.Release(static_cast<std::int64_t>(bytes));
  if (!absl::IsResourceExhausted(status)) return status;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  {
    CudaDeviceGuard guard(index_);
    (void)PS_CUDA_STATUS(cudaMemGetInfo(&free_bytes, &total_bytes));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(description_, ": cannot allocate ", bytes, " bytes: ", free_bytes,
                   " bytes free of ", total_bytes, " on the GPU (", memory_.stats().current_bytes,
                   " allocated through pipesched): ", status.message()));
}

absl::StatusOr<std::optional<std::int64_t>> CudaDevice::AvailableBytes() {
  ReleaseReachedFrees();
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  std::uint64_t reserved = 0;
  std::uint64_t used = 0;
  {
    CudaDeviceGuard guard(index_);
    PS_RETURN_IF_ERROR(guard.status());
    PS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    // What the pool keeps after frees (up to its release threshold) is not free to the
    // GPU but is to the pool's next allocation.
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemPoolGetAttribute(pool_.get(), cudaMemPoolAttrReservedMemCurrent, &reserved));
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemPoolGetAttribute(pool_.get(), cudaMemPoolAttrUsedMemCurrent, &used));
  }
  std::int64_t available = static_cast<std::int64_t>(free_bytes) +
                           static_cast<std::int64_t>(reserved > used ? reserved - used : 0);
  if (memory_.capacity() > 0) {
    available = std::min(
        available, std::max<std::int64_t>(0, memory_.capacity() - memory_.stats().current_bytes));
  }
  return std::optional<std::int64_t>(available);
}

void CudaDevice::FreeNow(void* data, std::size_t size) {
  // A kept device (its backend gone) is abandoned: keep the memory, touch nothing else.
  if (AbortRegistry::Get().Abandoned(index_)) return;
  // cudaFree does not wait for memory of a stream-ordered pool (CUDA 13): wait for every
  // device first, since a peer copy on another GPU may still read it. Where that work
  // cannot be waited for (an abandoned stream), keep the memory (and count it) rather than
  // hand it to the next allocation. Errors cannot be reported from a Buffer's destructor.
  if (!backend_.SynchronizeAll()) return;
  CudaDeviceGuard guard(index_);
  (void)PS_CUDA_STATUS(cudaFree(data));
  memory_.Release(static_cast<std::int64_t>(size));
}

absl::Status CudaDevice::FreeAsyncImpl(void* data, std::size_t size, Stream& stream) {
  CudaStream* cuda_stream = AsCudaStream(stream);
  if (cuda_stream == nullptr) return NotCuda(stream, "FreeAsync");
  PS_CUDA_RETURN_IF_ERROR(cudaFreeAsync(data, cuda_stream->get()));
  PendingFree pending;
  pending.bytes = static_cast<std::int64_t>(size);
  {
    std::lock_guard<std::mutex> lock(frees_mu_);
    if (!spare_events_.empty()) {
      pending.reached = std::move(spare_events_.back());
      spare_events_.pop_back();
    }
  }
  absl::Status status;
  if (pending.reached.get() == nullptr) {
    absl::StatusOr<EventHandle> event = CreateEventHandle(index_, /*timing=*/false);
    status = event.status();
    if (event.ok()) pending.reached = *std::move(event);
  }
  if (status.ok())
    status = PS_CUDA_STATUS(cudaEventRecord(pending.reached.get(), cuda_stream->get()));
  if (!status.ok()) {
    memory_.Release(pending.bytes);  // the free itself is enqueued: count it now
    return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(frees_mu_);
  pending_frees_.push_back(std::move(pending));
  return absl::OkStatus();
}

void CudaDevice::ReleaseReachedFrees() const {
  std::lock_guard<std::mutex> lock(frees_mu_);
  // In stream order per stream, but streams finish out of order: test every one.
  std::size_t kept = 0;
  for (PendingFree& free : pending_frees_) {
    const cudaError_t state = NotReadyCleared(cudaEventQuery(free.reached.get()));
    if (state == cudaErrorNotReady) {
      pending_frees_[kept++] = std::move(free);
      continue;
    }
    if (state != cudaSuccess) (void)cudaGetLastError();  // a fault: the stream reports it
    memory_.Release(free.bytes);
    spare_events_.push_back(std::move(free.reached));
  }
  pending_frees_.resize(kept);
}

absl::Status CudaDevice::CopyAsync(void* dst, const void* src, std::size_t bytes,
                                   const Device& src_device, Stream& stream) {
  CudaStream* cuda_stream = AsCudaStream(stream);
  if (cuda_stream == nullptr) return NotCuda(stream, "CopyAsync");
  if (src_device.kind() != BackendKind::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat("CopyAsync to ", description_, " from ",
                                                   src_device.description(),
                                                   ": devices of different backends"));
  }
  PS_RETURN_IF_ERROR(cuda_stream->PoisonStatus());
  if (bytes == 0) return absl::OkStatus();
  if (src_device.index() == index_) {
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream->get()));
  } else {
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyPeerAsync(dst, index_, src, src_device.index(), bytes, cuda_stream->get()));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyToHost(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  CudaDeviceGuard guard(index_);
  PS_RETURN_IF_ERROR(guard.status());
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyFromHost(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  CudaDeviceGuard guard(index_);
  PS_RETURN_IF_ERROR(guard.status());
  PS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return once the bytes are staged, before the DMA
  // has landed, and the legacy stream carrying it orders none of our non-blocking streams.
  PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

// ---- CudaBackend ------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  int available = 0;
  absl::Status count = PS_CUDA_STATUS(cudaGetDeviceCount(&available));
  if (!count.ok() || available == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no usable GPU: ", count.ok() ? "cudaGetDeviceCount found none" : count.message()));
  }
  const int wanted = options.num_devices == 0 ? available : options.num_devices;
  if (wanted > available) {
    return absl::InvalidArgumentError(absl::StrCat("asked for ", wanted, " GPUs but ", available,
                                                   " are visible (num_devices = 0 uses all)"));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options.strict));
  for (int i = 0; i < wanted; ++i) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device,
                        CudaDevice::Create(*backend, i, options.memory_capacity_bytes));
    backend->devices_.push_back(std::move(device));
  }
  PS_RETURN_IF_ERROR(backend->EnablePeerAccess());
  return backend;
}

absl::Status CudaBackend::EnablePeerAccess() {
  for (const auto& device : devices_) {
    for (const auto& peer : devices_) {
      if (device == peer) continue;
      int can = 0;
      PS_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device->index(), peer->index()));
      if (can == 0) continue;  // copies between them are staged by the driver instead
      {
        CudaDeviceGuard guard(device->index());
        PS_RETURN_IF_ERROR(guard.status());
        absl::Status status = PS_CUDA_STATUS(cudaDeviceEnablePeerAccess(peer->index(), 0));
        // Another backend in this process may have enabled it already.
        if (!status.ok() && !IsCudaError(status, cudaErrorPeerAccessAlreadyEnabled)) return status;
      }
      // Pool memory is private to its device unless granted: let `device` use `peer`'s.
      cudaMemAccessDesc access = {};
      access.location.type = cudaMemLocationTypeDevice;
      access.location.id = device->index();
      access.flags = cudaMemAccessFlagsProtReadWrite;
      PS_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAccess(peer->pool(), &access, 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace pipesched::runtime
