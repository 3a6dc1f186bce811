// Runtime scenarios written once against the seam and run on every backend: the host
// test checks their results against the CUDA semantics the host backend promises, and
// the GPU test checks that the CUDA backend gives the same results as the host one.
// Each returns what a user observes (an order, a status, byte counts), never "it ran".
// Work that must take time is EnqueueBusyWait (a GPU kernel on CUDA); host functions
// only append to a log, because CUDA may serialise host functions of different streams.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/base/status.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::runtime::scenarios {

// Thread-safe append-only log of host-function runs.
class Log {
 public:
  absl::Status Add(std::string entry) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back(std::move(entry));
    return absl::OkStatus();
  }
  std::vector<std::string> entries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_;
  }
  // Enqueues "append `entry`" on `stream`.
  absl::Status On(Stream& stream, std::string entry) {
    return stream.EnqueueHost([this, entry = std::move(entry)] { return Add(entry); });
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> entries_;
};

inline std::unique_ptr<Backend> MustCreate(BackendKind kind, int num_devices, bool strict,
                                           std::int64_t capacity = 0) {
  BackendOptions options;
  options.kind = kind;
  options.num_devices = num_devices;
  options.strict = strict;
  options.memory_capacity_bytes = capacity;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  return backend.ok() ? std::move(*backend) : nullptr;
}

// 200 host functions on one stream, the first behind a busy wait: "0".."199" in order.
inline absl::StatusOr<std::vector<std::string>> OrderWithinStream(Device& device) {
  Log log;  // outlives the streams, whose work refers to it
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream("order"));
  PS_RETURN_IF_ERROR(stream->EnqueueBusyWait(5000));
  for (int i = 0; i < 200; ++i) PS_RETURN_IF_ERROR(log.On(*stream, std::to_string(i)));
  PS_RETURN_IF_ERROR(stream->Synchronize());
  return log.entries();
}

// Stream `a` (on `da`) works 30 ms then logs "a" and records; stream `b` (on `db`) waits
// and logs "b". Expected: {"a", "b"}. Without the wait, "b" would come first.
inline absl::StatusOr<std::vector<std::string>> CrossStreamWait(Device& da, Device& db) {
  Log log;  // outlives the streams, whose work refers to it
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> a, da.CreateStream("a"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> b, db.CreateStream("b"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, da.CreateEvent(false, "a done"));
  PS_RETURN_IF_ERROR(a->EnqueueBusyWait(30000));
  PS_RETURN_IF_ERROR(log.On(*a, "a"));
  PS_RETURN_IF_ERROR(done->Record(*a));
  PS_RETURN_IF_ERROR(b->Wait(*done));
  PS_RETURN_IF_ERROR(log.On(*b, "b"));
  PS_RETURN_IF_ERROR(b->Synchronize());
  PS_RETURN_IF_ERROR(a->Synchronize());
  return log.entries();
}

// Record, enqueue a wait, then re-record the same event behind 200 ms of work: the wait
// is satisfied by the first record. Expected: {"a1", "b", "a2"}; {"a1", "a2", "b"} would
// mean the wait followed the re-record.
inline absl::StatusOr<std::vector<std::string>> WaitCapturesLatestRecord(Device& device) {
  Log log;  // outlives the streams, whose work refers to it
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> a, device.CreateStream("a"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> b, device.CreateStream("b"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device.CreateEvent(false, "e"));
  PS_RETURN_IF_ERROR(a->EnqueueBusyWait(20000));
  PS_RETURN_IF_ERROR(log.On(*a, "a1"));
  PS_RETURN_IF_ERROR(event->Record(*a));
  PS_RETURN_IF_ERROR(b->Wait(*event));
  PS_RETURN_IF_ERROR(log.On(*b, "b"));
  PS_RETURN_IF_ERROR(a->EnqueueBusyWait(200000));
  PS_RETURN_IF_ERROR(log.On(*a, "a2"));
  PS_RETURN_IF_ERROR(event->Record(*a));
  PS_RETURN_IF_ERROR(b->Synchronize());
  PS_RETURN_IF_ERROR(a->Synchronize());
  return log.entries();
}

// Waits on an event that was never recorded, then logs "after". Strict: the Wait's
// status. Otherwise OK and the log shows the wait did not block.
struct NeverRecordedResult {
  absl::Status wait;
  std::vector<std::string> log;
};
inline absl::StatusOr<NeverRecordedResult> WaitOnNeverRecorded(Device& device) {
  Log log;  // outlives the streams, whose work refers to it
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream("waiter"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device.CreateEvent(false, "F(0,0) done"));
  NeverRecordedResult result;
  result.wait = stream->Wait(*event);
  PS_RETURN_IF_ERROR(log.On(*stream, "after"));
  PS_RETURN_IF_ERROR(stream->Synchronize());
  result.log = log.entries();
  return result;
}

// Query before any record, while a record waits behind 100 ms of work, and after
// Event::Synchronize. Expected: {true, false, true}.
inline absl::StatusOr<std::vector<bool>> QueryAndSynchronize(Device& device) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream("s"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device.CreateEvent());
  std::vector<bool> seen;
  PS_ASSIGN_OR_RETURN(bool before, event->Query());
  seen.push_back(before);
  PS_RETURN_IF_ERROR(stream->EnqueueBusyWait(100000));
  PS_RETURN_IF_ERROR(event->Record(*stream));
  PS_ASSIGN_OR_RETURN(bool during, event->Query());
  seen.push_back(during);
  PS_RETURN_IF_ERROR(event->Synchronize());
  PS_ASSIGN_OR_RETURN(bool after, event->Query());
  seen.push_back(after);
  PS_RETURN_IF_ERROR(stream->Synchronize());
  return seen;
}

// Timing events around 20 ms of work: elapsed milliseconds and both timestamps.
struct TimingResult {
  double elapsed_ms;
  double start_us;
  double end_us;
};
inline absl::StatusOr<TimingResult> Timing(Device& device) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream("timed"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Event> start, device.CreateEvent(true, "start"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Event> end, device.CreateEvent(true, "end"));
  // Warm up first: CUDA loads a kernel's module at its first launch (lazy loading),
  // which would count inside the timed interval.
  PS_RETURN_IF_ERROR(stream->EnqueueBusyWait(0));
  PS_RETURN_IF_ERROR(stream->Synchronize());
  PS_RETURN_IF_ERROR(start->Record(*stream));
  PS_RETURN_IF_ERROR(stream->EnqueueBusyWait(20000));
  PS_RETURN_IF_ERROR(end->Record(*stream));
  PS_RETURN_IF_ERROR(stream->Synchronize());
  TimingResult result;
  PS_ASSIGN_OR_RETURN(result.elapsed_ms, end->ElapsedMillis(*start));
  PS_ASSIGN_OR_RETURN(result.start_us, start->TimestampMicros());
  PS_ASSIGN_OR_RETURN(result.end_us, end->TimestampMicros());
  return result;
}

// Two streams (on `da` and `db`) each busy for 50 ms: host wall milliseconds until both
// are done. Concurrent streams take ~50 ms, serialised ones ~100 ms.
inline absl::StatusOr<double> OverlapWallMillis(Device& da, Device& db) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> a, da.CreateStream("a"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> b, db.CreateStream("b"));
  // Warm both streams up so that thread or context start-up is not timed.
  PS_RETURN_IF_ERROR(a->Synchronize());
  PS_RETURN_IF_ERROR(b->Synchronize());
  const auto start = std::chrono::steady_clock::now();
  PS_RETURN_IF_ERROR(a->EnqueueBusyWait(50000));
  PS_RETURN_IF_ERROR(b->EnqueueBusyWait(50000));
  PS_RETURN_IF_ERROR(a->Synchronize());
  PS_RETURN_IF_ERROR(b->Synchronize());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// current_bytes after each step of: allocate 1000 and 3000 bytes; free the 1000 behind
// 100 ms of work (still counted right after FreeAsync), synchronize (freed), allocate 500,
// free the rest, synchronize. Expected current: {1000, 4000, 4000, 3000, 3500, 0}, peak
// 4000.
struct MemoryResult {
  std::vector<std::int64_t> current;
  std::int64_t peak;
};
inline absl::StatusOr<MemoryResult> StreamOrderedMemory(Device& device) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream("mem"));
  device.ResetPeakMemory();
  const std::int64_t base = device.memory_stats().current_bytes;
  MemoryResult result;
  auto note = [&] { result.current.push_back(device.memory_stats().current_bytes - base); };
  PS_ASSIGN_OR_RETURN(Buffer a, device.Allocate(1000, *stream));
  note();
  PS_ASSIGN_OR_RETURN(Buffer b, device.Allocate(3000, *stream));
  note();
  PS_RETURN_IF_ERROR(stream->EnqueueBusyWait(100000));
  PS_RETURN_IF_ERROR(a.FreeAsync(*stream));
  note();
  PS_RETURN_IF_ERROR(stream->Synchronize());
  note();
  PS_ASSIGN_OR_RETURN(Buffer c, device.Allocate(500, *stream));
  note();
  PS_RETURN_IF_ERROR(b.FreeAsync(*stream));
  PS_RETURN_IF_ERROR(c.FreeAsync(*stream));
  PS_RETURN_IF_ERROR(stream->Synchronize());
  note();
  result.peak = device.memory_stats().peak_bytes - base;
  return result;
}

// Copies 1 MiB of a pattern from device `src` to device `dst` on a stream of `dst`, and
// back to the host. Returns the bytes read back.
inline absl::StatusOr<std::vector<unsigned char>> CopyAcrossDevices(Device& src, Device& dst) {
  constexpr std::size_t kBytes = 1 << 20;
  std::vector<unsigned char> pattern(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 3);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> s_src, src.CreateStream("src"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> s_dst, dst.CreateStream("dst"));
  PS_ASSIGN_OR_RETURN(Buffer from, src.Allocate(kBytes, *s_src));
  PS_ASSIGN_OR_RETURN(Buffer to, dst.Allocate(kBytes, *s_dst));
  PS_RETURN_IF_ERROR(s_src->Synchronize());
  PS_RETURN_IF_ERROR(s_dst->Synchronize());
  PS_RETURN_IF_ERROR(src.CopyFromHost(from.data(), pattern.data(), kBytes));
  PS_RETURN_IF_ERROR(dst.CopyAsync(to.data(), from.data(), kBytes, src, *s_dst));
  PS_RETURN_IF_ERROR(s_dst->Synchronize());
  std::vector<unsigned char> back(kBytes, 0);
  PS_RETURN_IF_ERROR(dst.CopyToHost(back.data(), to.data(), kBytes));
  return back;
}

// A host function fails; the one after it must not run. Returns the log, Synchronize's
// status and a later EnqueueHost's status.
struct PoisonResult {
  std::vector<std::string> log;
  absl::Status synchronize;
  absl::Status later_enqueue;
  bool event_completed;  // a record after the failure still completes
};
inline absl::StatusOr<PoisonResult> PoisonedStream(Device& device) {
  Log log;  // outlives the streams, whose work refers to it
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream("stage1"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device.CreateEvent());
  PS_RETURN_IF_ERROR(log.On(*stream, "before"));
  // Holds the failure back until "after" is enqueued: enqueueing on a stream that has
  // already failed would itself return the error.
  PS_RETURN_IF_ERROR(stream->EnqueueBusyWait(50000));
  PS_RETURN_IF_ERROR(
      stream->EnqueueHost([] { return absl::DataLossError("NaN in activations of F(1,3)"); }));
  PS_RETURN_IF_ERROR(log.On(*stream, "after"));
  PS_RETURN_IF_ERROR(event->Record(*stream));
  PoisonResult result;
  result.synchronize = stream->Synchronize();
  result.later_enqueue = log.On(*stream, "later");
  PS_RETURN_IF_ERROR(event->Synchronize());
  PS_ASSIGN_OR_RETURN(result.event_completed, event->Query());
  result.log = log.entries();
  return result;
}

// A host function that ignores Stream::Abort and outlives its stream and its backend (an
// embedder's callback stuck far past a step's timeout). The grace period
// (Stream::kAbortGraceMillis) is given once: to a buffer freed while the aborted stream
// still exists, or to the stream's destructor. After that, freeing buffers, destroying
// the backend, and a new backend of the same kind in the same process must not wait for
// the function, which would hold them until it returned (forever, for one that never
// does). The function's state is shared, so it may run on after all of them.
struct AbandonedResult {
  bool started = false;
  double early_free_ms = 0;       // a Buffer freed (no FreeAsync) before the stream goes
  double stream_destroy_ms = 0;   // the aborted stream's destructor
  double free_ms = 0;             // a Buffer freed after that
  double backend_destroy_ms = 0;  // the backend's destructor
  double second_backend_ms = 0;   // a new backend: create, allocate, free, destroy
  bool returned_early = false;    // the function had returned before it was released
  bool returned = false;          // ... and did once released
};
inline absl::StatusOr<AbandonedResult> AbandonedHostFunction(BackendKind kind) {
  using Clock = std::chrono::steady_clock;
  auto millis_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  struct Shared {
    std::atomic<bool> started{false}, release{false}, returned{false};
  };
  auto shared = std::make_shared<Shared>();
  AbandonedResult result;
  std::unique_ptr<Backend> backend = MustCreate(kind, 1, /*strict=*/true);
  if (backend == nullptr) return absl::InternalError("cannot create the backend");
  {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend->device(0).CreateStream("stuck"));
    PS_ASSIGN_OR_RETURN(Buffer early, backend->device(0).Allocate(256, *stream));
    PS_ASSIGN_OR_RETURN(Buffer late, backend->device(0).Allocate(256, *stream));
    PS_RETURN_IF_ERROR(stream->EnqueueHost([shared] {
      shared->started = true;
      const Clock::time_point start = Clock::now();
      while (!shared->release && std::chrono::duration<double>(Clock::now() - start).count() < 30) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      shared->returned = true;
      return absl::OkStatus();
    }));
    const Clock::time_point wait = Clock::now();
    while (!shared->started && millis_since(wait) < 10000) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    result.started = shared->started;
    stream->Abort(absl::DeadlineExceededError("watchdog"));
    Clock::time_point t = Clock::now();
    early = Buffer();
    result.early_free_ms = millis_since(t);
    t = Clock::now();
    stream.reset();
    result.stream_destroy_ms = millis_since(t);
    t = Clock::now();
    late = Buffer();
    result.free_ms = millis_since(t);
  }
  Clock::time_point t = Clock::now();
  backend.reset();
  result.backend_destroy_ms = millis_since(t);
  t = Clock::now();
  {
    std::unique_ptr<Backend> second = MustCreate(kind, 1, /*strict=*/true);
    if (second == nullptr) return absl::InternalError("cannot create a second backend");
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, second->device(0).CreateStream("next"));
    PS_ASSIGN_OR_RETURN(Buffer buffer, second->device(0).Allocate(256, *stream));
    PS_RETURN_IF_ERROR(stream->Synchronize());
    buffer = Buffer();
    stream.reset();
  }
  result.second_backend_ms = millis_since(t);
  result.returned_early = shared->returned;
  shared->release = true;
  const Clock::time_point wait = Clock::now();
  while (!shared->returned && millis_since(wait) < 10000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  result.returned = shared->returned;
  return result;
}

// What AbandonedHostFunction's result breaks of the promises above, one line each; empty
// when none. Before the fix the CUDA backend's frees and destructor waited for the device,
// that is for the function (30 s here; forever for one that never returns).
inline std::string AbandonedProblems(const AbandonedResult& r) {
  std::string problems;
  auto check = [&problems](bool ok, const std::string& what) {
    if (!ok) problems += what + "\n";
  };
  const double grace = Stream::kAbortGraceMillis;
  check(r.started, "the host function never started");
  check(r.early_free_ms < grace + 3000,
        "a free before the stream's destruction took " + std::to_string(r.early_free_ms) + " ms");
  check(r.stream_destroy_ms < grace + 3000,
        "the aborted stream's destructor took " + std::to_string(r.stream_destroy_ms) + " ms");
  check(r.early_free_ms + r.stream_destroy_ms >= 0.9 * grace,
        "the grace period was not given: " + std::to_string(r.early_free_ms) + " + " +
            std::to_string(r.stream_destroy_ms) + " ms");
  check(r.free_ms < 1000, "a free took " + std::to_string(r.free_ms) + " ms");
  check(r.backend_destroy_ms < 1000,
        "the backend's destructor took " + std::to_string(r.backend_destroy_ms) + " ms");
  check(r.second_backend_ms < 5000,
        "a second backend took " + std::to_string(r.second_backend_ms) + " ms");
  check(!r.returned_early, "the function returned before it was released");
  check(r.returned, "the function did not return once released");
  return problems;
}

}  // namespace pipesched::runtime::scenarios
