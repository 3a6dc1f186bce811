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
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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
  // enqueued on `stream`; returns immediately). The Buffer is empty afterwards.
  absl::Status FreeAsync(Stream& stream);

 private:
  friend class Device;
  Buffer(Device* device, void* data, std::size_t size) : device_(device), data_(data), size_(size) {}
  void Reset();
  Device* device_ = nullptr;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  // Captures all work enqueued on `stream` so far. Enqueued on `stream`; returns
  // immediately.
  virtual absl::Status Record(Stream& stream) = 0;
  // True when the most recent record has completed (or the event was never recorded).
  virtual absl::StatusOr<bool> Query() = 0;
  // Blocks the host until the most recent record has completed.
  virtual absl::Status Synchronize() = 0;
  // Milliseconds between `start`'s and this event's most recent records; both must
  // have completed and been created with timing. FailedPrecondition otherwise.
  virtual absl::StatusOr<double> ElapsedMillis(const Event& start) const = 0;
  // Host: microseconds since the backend's epoch at which the most recent record
  // completed; lets the executor place spans of different devices on one time axis.
  // Only for timing events that have completed.
  virtual absl::StatusOr<double> TimestampMicros() const = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() const = 0;
  virtual const std::string& name() const = 0;
  // Later work on this stream waits for `event`'s most recent record. Enqueued on this
  // stream; returns immediately. Host strict mode: FailedPrecondition if `event` was
  // never recorded.
  virtual absl::Status Wait(const Event& event) = 0;
  // Runs `fn` on the host once all earlier work on the stream is done, in stream order
  // (host backend: on the stream's worker thread; CUDA: cudaLaunchHostFunc, so `fn`
  // must not call CUDA). A non-OK status returned by `fn` poisons the stream: it is
  // reported by Synchronize() and by later Enqueue calls.
  virtual absl::Status EnqueueHost(std::function<absl::Status()> fn) = 0;
  // Blocks the host until all enqueued work is done; returns the first error of work
  // run on this stream, if any.
  virtual absl::Status Synchronize() = 0;
  // The raw handle: cudaStream_t on CUDA, nullptr on the host backend.
  virtual void* native_handle() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual BackendKind kind() const = 0;
  virtual int index() const = 0;
  virtual std::string description() const = 0;  // "host:0", "cuda:0 (NVIDIA H200)"

  // Streams are non-blocking on CUDA; a host stream is one worker thread.
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) = 0;
  // `timing`: the event can be used with ElapsedMillis / TimestampMicros.
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent(bool timing = false) = 0;

  // Stream-ordered allocation: usable by work enqueued on `stream` after this call
  // (and by other streams once they wait on an event recorded after it).
  // ResourceExhausted naming the size and what is free when it cannot be satisfied.
  virtual absl::StatusOr<Buffer> Allocate(std::size_t bytes, Stream& stream) = 0;

  // Copies `bytes` from `src` (any device of the same backend) to `dst`. Enqueued on
  // `stream`; returns immediately.
  virtual absl::Status CopyAsync(void* dst, const void* src, std::size_t bytes,
                                 const Device& src_device, Stream& stream) = 0;
  // Synchronous host <-> device copies, for setup and checking, never inside a step.
  virtual absl::Status CopyToHost(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, std::size_t bytes) = 0;

  // Current and peak bytes allocated through Allocate on this device.
  virtual MemoryStats memory_stats() const = 0;
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
  bool strict = false;  // host: waiting on a never-recorded event is an error
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual int device_count() const = 0;
  virtual Device& device(int index) = 0;
};

// Creates a backend. CUDA: Unavailable when no GPU is usable (any cudaGetDeviceCount
// error counts as none), or when built without CUDA.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// True when the CUDA backend was compiled in and at least one GPU is usable.
bool CudaAvailable();

// "auto" (CUDA when CudaAvailable(), else host), "host", "cuda". InvalidArgument
// naming the accepted values otherwise.
absl::StatusOr<BackendKind> ResolveBackend(std::string_view name);

}  // namespace pipesched::runtime
