// The device seam: Device, Stream, Event, Buffer, chosen at run time. CUDA semantics,
// emulated faithfully by the host backend so that everything above is tested without
// a GPU:
//   - a Stream is an in-order queue of work on one device;
//   - Event::Record(stream) captures "everything enqueued on stream so far";
//     Stream::Wait(event) makes later work on that stream wait for the event's most
//     recent record (later re-records do not affect waits already enqueued);
//   - waiting on a never-recorded event is a silent no-op on CUDA; the host backend in
//     strict mode reports it as an error instead (FailedPrecondition from Wait).
// Everything that enqueues takes the stream last, returns immediately, and never blocks
// the host.
//
// Lifetimes: Streams, Events and Buffers must not outlive the Backend that created them;
// destroy (or free) them first. Destroying a Stream waits for its enqueued work.
// Threading: one Stream or Event may be used from one host thread at a time; different
// Streams and Events may be driven from different threads.
//
// Errors: nothing throws; every call returns absl::Status. Passing an object of another
// backend (a CUDA stream to a host device) is InvalidArgument. CUDA failures map as in
// base/cuda_check.h: ResourceExhausted (out of memory), Unavailable (no usable device),
// InvalidArgument (bad handle or value), Internal (anything else). Work that fails while
// it runs poisons its stream: the stream's Synchronize(), and its later EnqueueHost and
// CopyAsync calls, return that first error (see Stream::EnqueueHost).
//
// Changes since the first seam (all source-compatible for callers):
//   - CreateEvent takes an optional `name` used in error messages;
//   - Event::name(), Stream::EnqueueBusyWait(microseconds), CudaDeviceCount();
//   - BackendOptions::memory_capacity_bytes; BackendOptions::strict applies to CUDA too;
//   - Stream::status(), Stream::Abort(reason), Stream::aborted() for watchdogs (default
//     implementations: OK, no-op, false), so that a stuck step can be abandoned.
//   - BackendOptions::host_spin_micros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipesched::runtime {

enum class BackendKind { kHost, kCuda };

std::string_view BackendName(BackendKind kind);  // "host", "cuda"

class Device;
class Stream;

struct MemoryStats {
  std::int64_t current_bytes = 0;
  std::int64_t peak_bytes = 0;
};

// Device memory. Move-only; the destructor frees synchronously if FreeAsync was not
// called. data() is a device pointer on CUDA, a host pointer on the host backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t size() const { return size_; }
  Device* device() const { return device_; }
  explicit operator bool() const { return data_ != nullptr; }

  // Frees the memory once all work enqueued on `stream` so far is done (stream-ordered;
  // enqueued on `stream`; returns immediately). The Buffer is empty afterwards; freeing
  // an empty Buffer is a no-op. memory_stats() drops when the free is reached.
  // InvalidArgument when `stream` belongs to another backend (the Buffer keeps its memory
  // and frees it in its destructor).
  absl::Status FreeAsync(Stream& stream);

 private:
  friend class Device;
  Buffer(Device* device, void* data, std::size_t size)
      : device_(device), data_(data), size_(size) {}
  void Reset();
  Device* device_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

class Event {
 public:
  // Destroying an event with records still pending is allowed (as cudaEventDestroy).
  virtual ~Event() = default;
  // The name given to CreateEvent, else "event#<n>"; used in error messages.
  virtual const std::string& name() const = 0;
  // Captures all work enqueued on `stream` so far. Enqueued on `stream`; returns
  // immediately. `stream` must be on the event's device (as in CUDA) and backend:
  // InvalidArgument otherwise.
  virtual absl::Status Record(Stream& stream) = 0;
  // True when the most recent record has completed (or the event was never recorded).
  // Does not block. CUDA errors only.
  virtual absl::StatusOr<bool> Query() = 0;
  // Blocks the host until the most recent record has completed (at once if never
  // recorded). CUDA errors only: the error of failed work on the recording stream is
  // reported by that stream's Synchronize(), not here.
  virtual absl::Status Synchronize() = 0;
  // Milliseconds between `start`'s and this event's most recent records; both must
  // have completed and been created with timing. FailedPrecondition otherwise;
  // InvalidArgument when `start` belongs to another backend.
  virtual absl::StatusOr<double> ElapsedMillis(const Event& start) const = 0;
  // Microseconds since the backend's epoch (its creation) at which the most recent record
  // completed; lets the executor place spans of different devices on one time axis.
  // Only for timing events that have completed: FailedPrecondition otherwise.
  // Host: a steady-clock reading taken when the record is reached. CUDA: the elapsed
  // time from a per-device origin event recorded (and waited for) when the backend was
  // created, plus that origin's host time; devices agree to within tens of microseconds.
  virtual absl::StatusOr<double> TimestampMicros() const = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() const = 0;
  // The name given to CreateStream; error messages of work on this stream start with it.
  virtual const std::string& name() const = 0;
  // Later work on this stream waits for `event`'s most recent record at the time of this
  // call (a later re-record does not affect it). `event` may belong to another device of
  // the same backend. Enqueued on this stream; returns immediately. Strict mode:
  // FailedPrecondition naming the event and the stream if `event` was never recorded;
  // otherwise that wait is a no-op, as in CUDA.
  virtual absl::Status Wait(const Event& event) = 0;
  // Runs `fn` on the host once all earlier work on the stream is done, in stream order
  // (host backend: on the stream's worker thread; CUDA: cudaLaunchHostFunc, so `fn`
  // must not call CUDA nor block on other streams' host work: CUDA may serialise host
  // functions of different streams). A non-OK status returned by `fn` poisons the
  // stream for good: it is reported, prefixed with the stream's name, by Synchronize()
  // and by later EnqueueHost / CopyAsync calls, and later host functions on the stream
  // are skipped (event records, waits and frees still happen, so other streams waiting
  // on this one do not hang). A `fn` that throws poisons the stream the same way, with an
  // Internal status quoting the exception. Enqueued on this stream; returns immediately.
  // InvalidArgument for an empty `fn`; the stream's first error once it is poisoned.
  virtual absl::Status EnqueueHost(std::function<absl::Status()> fn) = 0;
  // Occupies the stream for `microseconds` (host: the worker sleeps; CUDA: a one-thread
  // kernel spins on the GPU's global timer). Synthetic stage durations and tests.
  // Enqueued on this stream; returns immediately. InvalidArgument for a duration outside
  // [0, 3.6e9] (an hour) or NaN.
  virtual absl::Status EnqueueBusyWait(double microseconds) = 0;
  // Blocks the host until all enqueued work is done; returns the first error of work
  // run on this stream, if any (and keeps returning it: a failed stream stays failed).
  virtual absl::Status Synchronize() = 0;
  // The first error of work run on this stream so far (OK if none); never blocks. Lets a
  // watchdog that polls events notice a failed stream without synchronizing.
  virtual absl::Status status() const;
  // Abandons the stream's pending work, for a watchdog that gave up on a step; returns
  // immediately. The stream is poisoned with `reason` (unless it failed already): host
  // functions and busy waits not yet started are skipped and waits on events no longer
  // wait, while event records still happen, so the stream drains quickly and nothing
  // waiting on its events hangs (it may then run on stale data: abort every stream of a
  // step). The stream stays unusable (later EnqueueHost returns the error).
  //   Host backend: a wait or a busy wait in progress ends at once; frees reached after
  //   the abort run once every stream of the device has been destroyed (work in flight
  //   on other streams may still use the memory until they are aborted and drained
  //   too). A host function in
  //   progress cannot be interrupted: it may poll aborted() and return early. If it has
  //   not returned when the stream is destroyed, the destructor waits for it up to
  //   kAbortGraceMillis, then runs the remaining records itself and detaches the worker
  //   thread, which exits when the function returns (the device's deferred frees are
  //   leaked, as the function may still use that memory; it must not touch memory its
  //   owners free meanwhile; a function that never returns keeps its thread).
  //   CUDA: host functions not yet started are skipped; device work (kernels, copies,
  //   event waits) cannot be cancelled; a communicator stuck in a collective is
  //   aborted through its comm::AllReducer::Abort.
  virtual void Abort(const absl::Status& reason);
  // True once Abort was called. Safe to call from any thread, including from a host
  // function running on this stream (a cooperative cancellation token).
  virtual bool aborted() const;
  static constexpr int kAbortGraceMillis = 2000;
  // The raw handle: cudaStream_t on CUDA, nullptr on the host backend.
  virtual void* native_handle() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual BackendKind kind() const = 0;
  virtual int index() const = 0;
  virtual std::string description() const = 0;  // "host:0", "cuda:0 (NVIDIA H200)"

  // Streams are non-blocking on CUDA; a host stream is one worker thread. `name` prefixes
  // the errors of its work. CUDA errors only; the host backend does not fail.
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) = 0;
  // `timing`: the event can be used with ElapsedMillis / TimestampMicros (CUDA events
  // are created with cudaEventDisableTiming otherwise, which makes them cheaper).
  // `name`: shown in error messages, e.g. "F(1,3) done". CUDA errors only.
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent(bool timing = false,
                                                             std::string_view name = {}) = 0;

  // Stream-ordered allocation: usable by work enqueued on `stream` after this call
  // (and by other streams once they wait on an event recorded after it). Counted in
  // memory_stats() from this call on. Host memory is 64-byte aligned; 0 bytes gives an
  // empty Buffer. ResourceExhausted naming the device, the size requested and the bytes
  // free when it cannot be satisfied (BackendOptions::memory_capacity_bytes or the GPU);
  // InvalidArgument when `stream` belongs to another backend (host: another backend
  // object too) or, on the host, to another device. Returns immediately.
  virtual absl::StatusOr<Buffer> Allocate(std::size_t bytes, Stream& stream) = 0;

  // Copies `bytes` from `src` (any device of the same backend) to `dst`. Enqueued on
  // `stream`; returns immediately. InvalidArgument when `src_device` or `stream` belongs
  // to another backend or a pointer is null; the stream's first error once it is poisoned.
  virtual absl::Status CopyAsync(void* dst, const void* src, std::size_t bytes,
                                 const Device& src_device, Stream& stream) = 0;
  // Synchronous host <-> device copies, for setup and checking, never inside a step.
  // They are not ordered with any stream: synchronize the streams that write `src` or
  // read `dst` first. Host: never fail. CUDA: the copy's error.
  virtual absl::Status CopyToHost(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, std::size_t bytes) = 0;

  // Current and peak bytes allocated through Allocate on this device.
  virtual MemoryStats memory_stats() const = 0;
  // Bytes Allocate could still hand out on this device now, or nullopt when the device
  // has no memory of its own: a host device without a capacity
  // (BackendOptions::memory_capacity_bytes) shares the machine's memory with every other
  // host device (base/host_memory.h's HostMemoryAvailableBytes is what this process can still
  // take). A host device with a capacity: capacity - current bytes. CUDA: the GPU's free memory
  // plus what this device's stream-ordered pool holds freed, at most capacity - current bytes when
  // there is a capacity; the CUDA error otherwise. On CUDA it can overestimate what one
  // stream gets: the pool does not hand a block freed on one stream to another before the
  // free is ordered before it, and cuBLAS workspaces and NCCL buffers are taken outside it.
  virtual absl::StatusOr<std::optional<std::int64_t>> AvailableBytes() = 0;
  virtual void ResetPeakMemory() = 0;

 protected:
  friend class Buffer;
  // Buffer plumbing for backends.
  static Buffer MakeBuffer(Device* device, void* data, std::size_t size) {
    return Buffer(device, data, size);
  }
  virtual void FreeNow(void* data, std::size_t size) = 0;
  virtual absl::Status FreeAsyncImpl(void* data, std::size_t size, Stream& stream) = 0;
};

struct BackendOptions {
  BackendKind kind = BackendKind::kHost;
  int num_devices = 1;  // host: how many emulated devices; CUDA: 0 = all visible
  // Waiting on a never-recorded event is an error (FailedPrecondition from Wait) instead
  // of CUDA's silent no-op. Both backends; on in tests.
  bool strict = false;
  // Per-device cap on the bytes live through Allocate; 0 = unlimited (host) or the GPU's
  // own memory (CUDA). Lets a host run reproduce a GPU's memory limit.
  std::int64_t memory_capacity_bytes = 0;
  // Host backend: how long a stream's worker polls for the event it waits on before it
  // sleeps (keeping a core busy meanwhile). A record/wait hand-off between two streams
  // then skips the thread wake-up, tens of microseconds on a VM whose idle CPUs halt.
  // The poll gives way as soon as another thread wants the CPU, so a loaded machine
  // sleeps as before. 0 = never poll. Ignored by CUDA.
  int host_spin_micros = 50;
};

// Owns the devices. Destroy every Stream, Event and Buffer first.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual int device_count() const = 0;
  // `index` must be in [0, device_count()): outside it is a programming error, and
  // throws std::out_of_range (vector::at's), the one exception of this API.
  virtual Device& device(int index) = 0;
};

// Creates a backend. InvalidArgument for num_devices < 0 (host: < 1) or a negative
// memory_capacity_bytes. CUDA: Unavailable when no GPU is usable (any
// cudaGetDeviceCount error counts as none), or when built without CUDA.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// True when the CUDA backend was compiled in and at least one GPU is usable.
bool CudaAvailable();
// How many GPUs are usable: 0 when built without CUDA or when cudaGetDeviceCount fails
// for any reason (machines without a GPU report "insufficient driver"). Cached.
int CudaDeviceCount();

// "auto" (CUDA when CudaAvailable(), else host), "host", "cuda". InvalidArgument
// naming the accepted values otherwise.
absl::StatusOr<BackendKind> ResolveBackend(std::string_view name);

}  // namespace pipesched::runtime
