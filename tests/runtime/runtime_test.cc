// Host backend: the CUDA semantics it promises (runtime/runtime.h), checked with the
// shared scenarios, plus host-only behaviour (strict mode, capacity, backend names).
// Every HostRuntime test runs three times, since a wait that polls and one that sleeps
// must keep the same semantics: waits that never poll, that poll for the default time,
// and that poll for up to a second (until satisfied, or until a yield finds the CPU
// contended: on an idle 2-core VM, after a few milliseconds).
#include "pipesched/runtime/runtime.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/host_memory.h"
#include "runtime_scenarios.h"
#include "testing/capped_child.h"
#include "testing/status_matchers.h"

namespace pipesched::runtime {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kDefaultSpin = BackendOptions{}.host_spin_micros;

std::unique_ptr<Backend> Host(int num_devices = 1, bool strict = true, std::int64_t capacity = 0,
                              int spin_micros = kDefaultSpin) {
  BackendOptions options;
  options.num_devices = num_devices;
  options.strict = strict;
  options.memory_capacity_bytes = capacity;
  options.host_spin_micros = spin_micros;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

// The parameter is BackendOptions::host_spin_micros.
class HostRuntime : public ::testing::TestWithParam<int> {
 protected:
  std::unique_ptr<Backend> Host(int num_devices = 1, bool strict = true,
                                std::int64_t capacity = 0) {
    return runtime::Host(num_devices, strict, capacity, GetParam());
  }
};

INSTANTIATE_TEST_SUITE_P(Spin, HostRuntime, ::testing::Values(0, kDefaultSpin, 1000000),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("NoSpin")
                                                  : absl::StrCat("Spin", info.param, "us");
                         });

TEST_P(HostRuntime, RunsWorkInEnqueueOrderWithinAStream) {
  auto backend = Host();
  PS_ASSERT_OK_AND_ASSIGN(std::vector<std::string> log,
                          scenarios::OrderWithinStream(backend->device(0)));
  ASSERT_EQ(log.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(log[i], std::to_string(i));
}

TEST_P(HostRuntime, WaitOrdersWorkAcrossStreamsOfOneDevice) {
  auto backend = Host();
  EXPECT_THAT(scenarios::CrossStreamWait(backend->device(0), backend->device(0)).value(),
              ElementsAre("a", "b"));
}

TEST_P(HostRuntime, WaitOrdersWorkAcrossDevices) {
  auto backend = Host(2);
  EXPECT_THAT(scenarios::CrossStreamWait(backend->device(0), backend->device(1)).value(),
              ElementsAre("a", "b"));
}

TEST_P(HostRuntime, WaitCapturesTheRecordMadeBeforeIt) {
  auto backend = Host();
  EXPECT_THAT(scenarios::WaitCapturesLatestRecord(backend->device(0)).value(),
              ElementsAre("a1", "b", "a2"));
}

TEST_P(HostRuntime, WaitIgnoresEarlierRecordsOnceReRecorded) {
  // Record behind 100 ms of work, re-record at once on an idle stream: a wait enqueued
  // after both follows the second record only, so it does not wait the 100 ms.
  auto backend = Host();
  Device& device = backend->device(0);
  PS_ASSERT_OK_AND_ASSIGN(auto slow, device.CreateStream("slow"));
  PS_ASSERT_OK_AND_ASSIGN(auto fast, device.CreateStream("fast"));
  PS_ASSERT_OK_AND_ASSIGN(auto waiter, device.CreateStream("waiter"));
  PS_ASSERT_OK_AND_ASSIGN(auto event, device.CreateEvent());
  scenarios::Log log;
  PS_ASSERT_OK(slow->EnqueueBusyWait(100000));
  PS_ASSERT_OK(event->Record(*slow));
  PS_ASSERT_OK(log.On(*slow, "slow"));
  PS_ASSERT_OK(event->Record(*fast));
  PS_ASSERT_OK(waiter->Wait(*event));
  PS_ASSERT_OK(log.On(*waiter, "waiter"));
  PS_ASSERT_OK(waiter->Synchronize());
  PS_ASSERT_OK(slow->Synchronize());
  EXPECT_THAT(log.entries(), ElementsAre("waiter", "slow"));
}

TEST_P(HostRuntime, WaitIsNotSatisfiedByALaterRecordThatCompletesFirst) {
  // The wait captures the record behind 30 ms of work; a re-record on an idle stream
  // completes first, which moves the event but must not release the wait.
  auto backend = Host();
  Device& device = backend->device(0);
  scenarios::Log log;  // outlives the streams, whose work refers to it
  PS_ASSERT_OK_AND_ASSIGN(auto slow, device.CreateStream("slow"));
  PS_ASSERT_OK_AND_ASSIGN(auto fast, device.CreateStream("fast"));
  PS_ASSERT_OK_AND_ASSIGN(auto waiter, device.CreateStream("waiter"));
  PS_ASSERT_OK_AND_ASSIGN(auto event, device.CreateEvent());
  PS_ASSERT_OK(slow->EnqueueBusyWait(30000));
  PS_ASSERT_OK(log.On(*slow, "slow"));
  PS_ASSERT_OK(event->Record(*slow));
  PS_ASSERT_OK(waiter->Wait(*event));
  PS_ASSERT_OK(log.On(*waiter, "waiter"));
  PS_ASSERT_OK(event->Record(*fast));
  PS_ASSERT_OK(waiter->Synchronize());
  PS_ASSERT_OK(slow->Synchronize());
  EXPECT_THAT(log.entries(), ElementsAre("slow", "waiter"));
}

TEST_P(HostRuntime, AbortEndsAWaitInProgress) {
  // `waiter` waits on an event recorded behind 10 s of work; aborting it ends the wait
  // and skips the host function behind it, whether the wait has not started yet, polls
  // or sleeps (aborted at once, after 2 ms and after 20 ms).
  for (int delay_ms : {0, 2, 20}) {
    SCOPED_TRACE(absl::StrCat("aborted after ", delay_ms, " ms"));
    auto backend = Host();
    Device& device = backend->device(0);
    scenarios::Log log;  // outlives the streams, whose work refers to it
    PS_ASSERT_OK_AND_ASSIGN(auto slow, device.CreateStream("slow"));
    PS_ASSERT_OK_AND_ASSIGN(auto waiter, device.CreateStream("waiter"));
    PS_ASSERT_OK_AND_ASSIGN(auto event, device.CreateEvent(false, "slow done"));
    PS_ASSERT_OK(slow->EnqueueBusyWait(10e6));
    PS_ASSERT_OK(event->Record(*slow));
    PS_ASSERT_OK(waiter->Wait(*event));
    PS_ASSERT_OK(log.On(*waiter, "waiter"));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    const auto start = std::chrono::steady_clock::now();
    waiter->Abort(absl::DeadlineExceededError("watchdog"));
    EXPECT_THAT(waiter->Synchronize(),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("watchdog")));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
    EXPECT_THAT(log.entries(), ::testing::IsEmpty());
    slow->Abort(absl::CancelledError("test over"));  // ends the busy wait
  }
}

TEST_P(HostRuntime, StrictModeRejectsWaitOnNeverRecordedEvent) {
  auto backend = Host(1, /*strict=*/true);
  PS_ASSERT_OK_AND_ASSIGN(scenarios::NeverRecordedResult result,
                          scenarios::WaitOnNeverRecorded(backend->device(0)));
  EXPECT_THAT(result.wait,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("stream 'waiter' on host:0"),
                             HasSubstr("event 'F(0,0) done'"), HasSubstr("never recorded"))));
  EXPECT_THAT(result.log, ElementsAre("after"));
}

TEST_P(HostRuntime, NonStrictWaitOnNeverRecordedEventIsANoOpLikeCuda) {
  auto backend = Host(1, /*strict=*/false);
  PS_ASSERT_OK_AND_ASSIGN(scenarios::NeverRecordedResult result,
                          scenarios::WaitOnNeverRecorded(backend->device(0)));
  PS_EXPECT_OK(result.wait);
  EXPECT_THAT(result.log, ElementsAre("after"));
}

TEST_P(HostRuntime, UnnamedEventsGetDistinctNames) {
  auto backend = Host();
  PS_ASSERT_OK_AND_ASSIGN(auto e0, backend->device(0).CreateEvent());
  PS_ASSERT_OK_AND_ASSIGN(auto e1, backend->device(0).CreateEvent());
  EXPECT_EQ(e0->name(), "event#0");
  EXPECT_EQ(e1->name(), "event#1");
}

TEST_P(HostRuntime, EventQueryAndSynchronize) {
  auto backend = Host();
  EXPECT_THAT(scenarios::QueryAndSynchronize(backend->device(0)).value(),
              ElementsAre(true, false, true));
}

TEST_P(HostRuntime, RecordOnAnotherDevicesStreamIsRejected) {
  auto backend = Host(2);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, backend->device(1).CreateStream("s1"));
  PS_ASSERT_OK_AND_ASSIGN(auto event, backend->device(0).CreateEvent(false, "e0"));
  EXPECT_THAT(event->Record(*stream),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'e0' belongs to host:0"), HasSubstr("'s1' of host:1"))));
}

// Memory is stream-ordered on its own device, and accounted by its own backend: a
// stream of another device, or of another backend, is refused.
TEST_P(HostRuntime, MemoryAndCopiesRefuseStreamsOfOtherDevicesAndBackends) {
  auto backend = Host(2);
  auto other = Host(1);
  PS_ASSERT_OK_AND_ASSIGN(auto s0, backend->device(0).CreateStream("s0"));
  PS_ASSERT_OK_AND_ASSIGN(auto s1, backend->device(1).CreateStream("s1"));
  PS_ASSERT_OK_AND_ASSIGN(auto foreign, other->device(0).CreateStream("foreign"));
  EXPECT_THAT(backend->device(0).Allocate(64, *s1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Allocate on host:0: stream 's1' is on host:1; allocate on one of "
                                 "this device's streams")));
  EXPECT_THAT(
      backend->device(0).Allocate(64, *foreign),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("stream 'foreign' belongs to another host backend; use a stream of "
                         "this device's backend")));
  EXPECT_EQ(backend->device(0).memory_stats().current_bytes, 0);
  EXPECT_EQ(other->device(0).memory_stats().current_bytes, 0);
  PS_ASSERT_OK_AND_ASSIGN(Buffer a, backend->device(0).Allocate(64, *s0));
  PS_ASSERT_OK_AND_ASSIGN(Buffer b, backend->device(1).Allocate(64, *s1));
  EXPECT_THAT(
      backend->device(1).CopyAsync(b.data(), a.data(), 64, backend->device(0), *foreign),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("belongs to another host backend")));
  EXPECT_THAT(
      backend->device(1).CopyAsync(b.data(), a.data(), 64, other->device(0), *s1),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("CopyAsync to host:1 from host:0 of another host backend; copy between "
                         "devices of one backend")));
  PS_EXPECT_OK(backend->device(1).CopyAsync(b.data(), a.data(), 64, backend->device(0), *s1));
  EXPECT_THAT(a.FreeAsync(*foreign), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("belongs to another host backend")));
  EXPECT_TRUE(a);  // kept, and freed by its destructor
  PS_EXPECT_OK(s1->Synchronize());
}

TEST_P(HostRuntime, TimingEventsMeasureWorkAndAreMonotonic) {
  auto backend = Host();
  PS_ASSERT_OK_AND_ASSIGN(scenarios::TimingResult timing, scenarios::Timing(backend->device(0)));
  EXPECT_GE(timing.elapsed_ms, 19.5);
  EXPECT_LT(timing.elapsed_ms, 1000);
  EXPECT_GE(timing.start_us, 0);
  EXPECT_NEAR(timing.end_us - timing.start_us, timing.elapsed_ms * 1000, 1e-6);
}

// A busy wait outside [0, an hour] is refused: an infinite one would overflow the clock
// and end at once.
TEST_P(HostRuntime, BusyWaitsOutsideAnHourAreRefused) {
  auto backend = Host();
  PS_ASSERT_OK_AND_ASSIGN(auto stream, backend->device(0).CreateStream("s"));
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 3.7e9}) {
    EXPECT_THAT(stream->EnqueueBusyWait(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("EnqueueBusyWait: microseconds must be in [0, 3.6e9]")))
        << bad;
  }
  PS_EXPECT_OK(stream->EnqueueBusyWait(0));
  PS_EXPECT_OK(stream->Synchronize());
}

TEST_P(HostRuntime, TimestampsFollowStreamOrder) {
  auto backend = Host();
  Device& device = backend->device(0);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, device.CreateStream("s"));
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < 50; ++i) {
    PS_ASSERT_OK_AND_ASSIGN(auto event, device.CreateEvent(true));
    PS_ASSERT_OK(event->Record(*stream));
    PS_ASSERT_OK(stream->EnqueueBusyWait(100));
    events.push_back(std::move(event));
  }
  PS_ASSERT_OK(stream->Synchronize());
  double previous = -1;
  for (const auto& event : events) {
    PS_ASSERT_OK_AND_ASSIGN(double t, event->TimestampMicros());
    EXPECT_GT(t, previous);
    previous = t;
  }
}

TEST_P(HostRuntime, TimingNeedsTimingEventsThatCompleted) {
  auto backend = Host();
  Device& device = backend->device(0);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, device.CreateStream("s"));
  PS_ASSERT_OK_AND_ASSIGN(auto plain, device.CreateEvent(false, "plain"));
  PS_ASSERT_OK_AND_ASSIGN(auto timed, device.CreateEvent(true, "timed"));
  EXPECT_THAT(timed->TimestampMicros(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("never recorded")));
  PS_ASSERT_OK(plain->Record(*stream));
  PS_ASSERT_OK(stream->EnqueueBusyWait(100000));
  PS_ASSERT_OK(timed->Record(*stream));
  EXPECT_THAT(timed->TimestampMicros(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not completed")));
  PS_ASSERT_OK(stream->Synchronize());
  EXPECT_THAT(timed->ElapsedMillis(*plain),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("'plain' was created without timing")));
}

TEST_P(HostRuntime, StreamsOnDifferentDevicesRunConcurrently) {
  auto backend = Host(2);
  PS_ASSERT_OK_AND_ASSIGN(double wall_ms,
                          scenarios::OverlapWallMillis(backend->device(0), backend->device(1)));
  EXPECT_GE(wall_ms, 49);
  EXPECT_LT(wall_ms, 95) << "two 50 ms streams did not overlap";
}

TEST_P(HostRuntime, StreamsOfOneDeviceRunConcurrently) {
  auto backend = Host(1);
  PS_ASSERT_OK_AND_ASSIGN(double wall_ms,
                          scenarios::OverlapWallMillis(backend->device(0), backend->device(0)));
  EXPECT_LT(wall_ms, 95) << "two 50 ms streams did not overlap";
}

TEST_P(HostRuntime, MemoryIsAccountedWithStreamOrderedFrees) {
  auto backend = Host();
  PS_ASSERT_OK_AND_ASSIGN(scenarios::MemoryResult memory,
                          scenarios::StreamOrderedMemory(backend->device(0)));
  EXPECT_THAT(memory.current, ElementsAre(1000, 4000, 4000, 3000, 3500, 0));
  EXPECT_EQ(memory.peak, 4000);
}

TEST_P(HostRuntime, MemoryIsPerDeviceAlignedAndFreedByDestructor) {
  auto backend = Host(2);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, backend->device(1).CreateStream("s"));
  {
    PS_ASSERT_OK_AND_ASSIGN(Buffer buffer, backend->device(1).Allocate(100, *stream));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 64, 0u);
    EXPECT_EQ(buffer.size(), 100u);
    EXPECT_EQ(buffer.device(), &backend->device(1));
    Buffer moved = std::move(buffer);
    EXPECT_FALSE(buffer);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(backend->device(1).memory_stats().current_bytes, 100);
    EXPECT_EQ(backend->device(0).memory_stats().current_bytes, 0);
  }
  EXPECT_EQ(backend->device(1).memory_stats().current_bytes, 0);
  EXPECT_EQ(backend->device(1).memory_stats().peak_bytes, 100);
  backend->device(1).ResetPeakMemory();
  EXPECT_EQ(backend->device(1).memory_stats().peak_bytes, 0);
  PS_ASSERT_OK_AND_ASSIGN(Buffer empty, backend->device(1).Allocate(0, *stream));
  EXPECT_FALSE(empty);
  PS_EXPECT_OK(empty.FreeAsync(*stream));
}

TEST_P(HostRuntime, CapacityErrorNamesRequestedAndFreeBytes) {
  auto backend = Host(1, true, /*capacity=*/1 << 20);
  Device& device = backend->device(0);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, device.CreateStream("s"));
  PS_ASSERT_OK_AND_ASSIGN(Buffer first, device.Allocate(600 << 10, *stream));
  EXPECT_THAT(device.Allocate(600 << 10, *stream),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("host:0"), HasSubstr("cannot allocate 614400 bytes"),
                             HasSubstr("434176 bytes free"))));
  PS_ASSERT_OK(first.FreeAsync(*stream));
  PS_ASSERT_OK(stream->Synchronize());
  PS_EXPECT_OK(device.Allocate(600 << 10, *stream).status());
}

// Without a capacity, a large allocation beyond what the machine has available is refused
// up front (Linux would overcommit it and kill the process once its pages are touched),
// and so is one that would take all that the backend holds, on any of its devices, past
// what the machine had when the backend was created: allocations not touched yet do not
// show in MemAvailable.
TEST(HostRuntimeMemory, AllocationsBeyondTheMachinesMemoryAreRefused) {
  const std::optional<std::int64_t> available = HostMemoryAvailableBytes();
  if (!available.has_value()) GTEST_SKIP() << "/proc/meminfo has no MemAvailable";
  auto backend = Host(2);
  Device& d0 = backend->device(0);
  Device& d1 = backend->device(1);
  PS_ASSERT_OK_AND_ASSIGN(auto s0, d0.CreateStream("s0"));
  PS_ASSERT_OK_AND_ASSIGN(auto s1, d1.CreateStream("s1"));
  const auto too_much = static_cast<std::size_t>(*available + (std::int64_t{1} << 30));
  EXPECT_THAT(d0.Allocate(too_much, *s0),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("host:0: cannot allocate "), HasSubstr(" GiB ("),
                             HasSubstr("available"))));
  EXPECT_EQ(d0.memory_stats().current_bytes, 0);
  EXPECT_EQ(d0.memory_stats().peak_bytes, 0);  // a refusal is not a peak
  // Past 2^63 a request turned negative in the accounting and passed every check.
  EXPECT_THAT(d0.Allocate((std::size_t{1} << 63) + 100, *s0),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("host:0: cannot allocate 9223372036854775908 bytes: more than "
                                 "2^62")));
  EXPECT_EQ(d0.memory_stats().current_bytes, 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the rest maps most of the machine's memory (untouched), which the "
                  "sanitizers' shadow memory would have to cover";
#else
  // 60% of the machine, untouched, then 60% more on the other device.
  const auto part = static_cast<std::size_t>(*available / 10 * 6);
  absl::StatusOr<Buffer> first = d0.Allocate(part, *s0);
  if (absl::IsResourceExhausted(first.status())) {
    GTEST_SKIP() << "this machine does not overcommit (vm.overcommit_memory=2): " << first.status();
  }
  PS_ASSERT_OK(first.status());
  EXPECT_THAT(
      d1.Allocate(part, *s1),
      StatusIs(
          absl::StatusCode::kResourceExhausted,
          AllOf(HasSubstr("host:1: cannot allocate "), HasSubstr("the host backend would hold "),
                HasSubstr("more than it could take when it started (the machine has "))));
  EXPECT_EQ(d1.memory_stats().current_bytes, 0);
  EXPECT_EQ(d1.memory_stats().peak_bytes, 0);
  // Freed, it makes room again.
  PS_ASSERT_OK(first->FreeAsync(*s0));
  PS_ASSERT_OK(s0->Synchronize());
  PS_ASSERT_OK_AND_ASSIGN(Buffer second, d1.Allocate(part, *s1));
  PS_ASSERT_OK(second.FreeAsync(*s1));
  PS_ASSERT_OK(s1->Synchronize());
#endif
}

// A stream is a thread; when the machine cannot start one more, CreateStream says so
// (std::thread throws; that must not end the process). Provoked in a child process whose
// address space is capped just above its current size, so that the new thread's stack
// cannot be mapped.
TEST(HostRuntimeThreads, AStreamWhoseThreadCannotStartIsResourceExhausted) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' runtimes need more address space than the cap leaves";
#else
  auto backend = Host(1);
  Device& device = backend->device(0);
  // The process has no other thread here (the backend has no stream yet), so the child
  // may allocate and format freely.
  const std::optional<int> code = testing::RunWithCappedAddressSpace(4 << 20, [&device] {
    // glibc reuses the stacks of threads that ended (a cache of a few), so keep creating
    // until one needs a new stack.
    std::vector<std::unique_ptr<Stream>> streams;
    for (int i = 0; i < 256; ++i) {
      absl::StatusOr<std::unique_ptr<Stream>> stream =
          device.CreateStream(absl::StrCat("capped-", i));
      if (stream.ok()) {
        streams.push_back(*std::move(stream));
        continue;
      }
      const std::string message(stream.status().message());
      const bool right =
          absl::IsResourceExhausted(stream.status()) &&
          message.find("host:0: cannot start the worker thread of stream 'capped-") !=
              std::string::npos &&
          // The cap is the address space, not the thread count: the advice says so.
          message.find("this process's address-space limit (ulimit -v) leaves ") !=
              std::string::npos &&
          message.find(
              " stack; the host backend runs one thread per stream: use fewer "
              "pipeline ranks and replicas (each runs four streams), or raise that "
              "limit") != std::string::npos;
      streams.clear();
      return right ? 0 : 6;
    }
    return 5;
  });
  ASSERT_TRUE(code.has_value()) << "the child did not exit";
  EXPECT_EQ(*code, 0) << "3/4: setup failed, 5: 256 streams started, 6: another "
                         "error than expected";
#endif
}

TEST_P(HostRuntime, CopyAsyncAcrossDevices) {
  auto backend = Host(2);
  PS_ASSERT_OK_AND_ASSIGN(std::vector<unsigned char> back,
                          scenarios::CopyAcrossDevices(backend->device(0), backend->device(1)));
  for (std::size_t i = 0; i < back.size(); ++i) {
    ASSERT_EQ(back[i], static_cast<unsigned char>(i * 7 + 3)) << "first mismatch at " << i;
  }
}

TEST_P(HostRuntime, FailedHostWorkPoisonsTheStream) {
  auto backend = Host();
  PS_ASSERT_OK_AND_ASSIGN(scenarios::PoisonResult result,
                          scenarios::PoisonedStream(backend->device(0)));
  EXPECT_THAT(result.log, ElementsAre("before"));
  EXPECT_THAT(result.synchronize, StatusIs(absl::StatusCode::kDataLoss,
                                           AllOf(HasSubstr("stream 'stage1' on host:0"),
                                                 HasSubstr("NaN in activations of F(1,3)"))));
  EXPECT_EQ(result.later_enqueue, result.synchronize);
  EXPECT_TRUE(result.event_completed);
}

TEST_P(HostRuntime, RecordAndFreeTakeEffectInStreamOrderOnADrainedStreamToo) {
  // On a stream whose work has all completed, a record or free takes effect on the
  // calling thread (no hand-off to the worker: the executor's fast path when the host is
  // behind the streams); the timestamp still follows the earlier work, and behind
  // pending work both still wait for it.
  auto backend = Host();
  Device& device = backend->device(0);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, device.CreateStream("s"));
  PS_ASSERT_OK_AND_ASSIGN(auto first, device.CreateEvent(true, "first"));
  PS_ASSERT_OK_AND_ASSIGN(auto second, device.CreateEvent(true, "second"));
  PS_ASSERT_OK_AND_ASSIGN(Buffer buffer, device.Allocate(1000, *stream));
  PS_ASSERT_OK(first->Record(*stream));
  PS_ASSERT_OK(stream->EnqueueBusyWait(2000));
  PS_ASSERT_OK(stream->Synchronize());

  PS_ASSERT_OK(second->Record(*stream));
  PS_ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(second->Query().value_or(false));
  PS_ASSERT_OK_AND_ASSIGN(double elapsed_ms, second->ElapsedMillis(*first));
  EXPECT_GE(elapsed_ms, 1.9);  // after the busy wait, in stream order
  PS_ASSERT_OK(buffer.FreeAsync(*stream));
  PS_ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(device.memory_stats().current_bytes, 0);

  std::atomic<bool> release{false};
  PS_ASSERT_OK(stream->EnqueueHost([&release] {
    while (!release.load()) std::this_thread::yield();
    return absl::OkStatus();
  }));
  PS_ASSERT_OK_AND_ASSIGN(Buffer pending, device.Allocate(500, *stream));
  PS_ASSERT_OK(pending.FreeAsync(*stream));
  PS_ASSERT_OK(second->Record(*stream));
  EXPECT_FALSE(second->Query().value_or(true)) << "completed ahead of pending work";
  EXPECT_EQ(device.memory_stats().current_bytes, 500);
  release.store(true);
  PS_ASSERT_OK(stream->Synchronize());
  EXPECT_TRUE(second->Query().value_or(false));
  EXPECT_EQ(device.memory_stats().current_bytes, 0);
}

TEST_P(HostRuntime, DestroyingStreamsAndEventsWithPendingWorkIsClean) {
  auto backend = Host(2);
  std::atomic<int> ran{0};
  {
    PS_ASSERT_OK_AND_ASSIGN(auto a, backend->device(0).CreateStream("a"));
    PS_ASSERT_OK_AND_ASSIGN(auto b, backend->device(1).CreateStream("b"));
    PS_ASSERT_OK_AND_ASSIGN(auto event, backend->device(0).CreateEvent());
    PS_ASSERT_OK(a->EnqueueBusyWait(20000));
    PS_ASSERT_OK(event->Record(*a));
    PS_ASSERT_OK(b->Wait(*event));
    PS_ASSERT_OK(b->EnqueueHost([&] {
      ran.fetch_add(1);
      return absl::OkStatus();
    }));
    event.reset();  // pending record and wait keep its state alive
  }                 // b joins after its wait, which a's record satisfies
  EXPECT_EQ(ran.load(), 1);
}

TEST_P(HostRuntime, ManyThreadsDriveStreamsConcurrently) {
  // Four host threads, each with its own pair of streams on its own device, ping-pong
  // through events. Exercises the locking for TSan.
  auto backend = Host(4);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Device& device = backend->device(t);
      auto a = device.CreateStream("a").value();
      auto b = device.CreateStream("b").value();
      auto ea = device.CreateEvent().value();
      auto eb = device.CreateEvent().value();
      int counter = 0;  // touched only by work ordered through the events
      for (int i = 0; i < 200; ++i) {
        if (!a->EnqueueHost([&] {
                ++counter;
                return absl::OkStatus();
              }).ok())
          ++failures;
        if (!ea->Record(*a).ok() || !b->Wait(*ea).ok()) ++failures;
        if (!b->EnqueueHost([&] {
                ++counter;
                return absl::OkStatus();
              }).ok())
          ++failures;
        if (!eb->Record(*b).ok() || !a->Wait(*eb).ok()) ++failures;
      }
      if (!a->Synchronize().ok() || !b->Synchronize().ok() || counter != 400) ++failures;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Runtime, AbandonedHostFunctionHoldsNeitherFreesNorTheBackend) {
  PS_ASSERT_OK_AND_ASSIGN(scenarios::AbandonedResult r,
                          scenarios::AbandonedHostFunction(BackendKind::kHost));
  EXPECT_EQ(scenarios::AbandonedProblems(r), "");
}

// What a stream's worker had already taken from the queue when its destructor detached
// it (a host function that ignored the abort, with a free and more work queued behind
// it) is kept for the life of the process, never run and never destroyed: the worker
// used to drop it once the function returned, which destroyed the work's captures and
// lost the freed buffer's memory (ASan's leak check failed the executor's watchdog test
// now and then, when the frees were in the worker's batch rather than in the queue).
TEST(Runtime, WorkADetachedWorkerHadTakenIsKeptNotDropped) {
  struct Shared {
    std::atomic<bool> holding{false}, gate{false}, started{false}, release{false};
    std::atomic<bool> returned{false}, capture_destroyed{false};
  };
  auto shared = std::make_shared<Shared>();
  struct Capture {
    explicit Capture(std::shared_ptr<Shared> s) : shared(std::move(s)) {}
    ~Capture() { shared->capture_destroyed = true; }
    std::shared_ptr<Shared> shared;
  };
  auto wait_for = [](const std::atomic<bool>& flag) {
    const auto start = std::chrono::steady_clock::now();
    while (!flag && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return flag.load();
  };
  auto backend = Host(1);
  Device& device = backend->device(0);
  {
    PS_ASSERT_OK_AND_ASSIGN(auto stream, device.CreateStream("stuck"));
    PS_ASSERT_OK_AND_ASSIGN(Buffer buffer, device.Allocate(256, *stream));
    // The gate holds the worker, which has taken it alone, until everything below is
    // queued: the rest is then its next batch, all of it. (Queued before the worker had
    // taken the gate, some of it could share the gate's batch and leave the rest in the
    // queue, which the destructor handles itself: host functions there are dropped.)
    PS_ASSERT_OK(stream->EnqueueHost([shared] {
      shared->holding = true;
      while (!shared->gate) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return absl::OkStatus();
    }));
    ASSERT_TRUE(wait_for(shared->holding));
    PS_ASSERT_OK(stream->EnqueueHost([shared] {
      shared->started = true;
      const auto start = std::chrono::steady_clock::now();
      while (!shared->release &&
             std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      shared->returned = true;
      return absl::OkStatus();
    }));
    PS_ASSERT_OK(buffer.FreeAsync(*stream));
    auto capture = std::make_shared<Capture>(shared);
    PS_ASSERT_OK(stream->EnqueueHost([capture] { return absl::OkStatus(); }));
    capture.reset();  // the queued function holds the last reference
    shared->gate = true;
    ASSERT_TRUE(wait_for(shared->started));
    stream->Abort(absl::DeadlineExceededError("watchdog"));
  }  // the destructor gives the grace period, then detaches the worker
  EXPECT_FALSE(shared->returned);
  shared->release = true;
  ASSERT_TRUE(wait_for(shared->returned));
  // The worker drops nothing once it sees it was detached; had it, the capture would be
  // destroyed within microseconds of the function's return.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(shared->capture_destroyed);
  // The freed buffer is still accounted (kept, never freed: the function might have used
  // it); under ASan the process's leak check at exit finds nothing lost.
  EXPECT_EQ(device.memory_stats().current_bytes, 256);
}

TEST(Runtime, ResolveBackend) {
  EXPECT_EQ(ResolveBackend("host").value(), BackendKind::kHost);
  EXPECT_EQ(ResolveBackend("cuda").value(), BackendKind::kCuda);
  EXPECT_EQ(ResolveBackend("auto").value(),
            CudaAvailable() ? BackendKind::kCuda : BackendKind::kHost);
  EXPECT_THAT(ResolveBackend("gpu"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown backend 'gpu'"), HasSubstr("auto, host, cuda"))));
  EXPECT_THAT(ResolveBackend(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("''")));
}

TEST(Runtime, BackendNames) {
  EXPECT_EQ(BackendName(BackendKind::kHost), "host");
  EXPECT_EQ(BackendName(BackendKind::kCuda), "cuda");
}

TEST(Runtime, CreateBackendRejectsBadOptions) {
  BackendOptions options;
  options.num_devices = 0;
  EXPECT_THAT(CreateBackend(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_devices >= 1")));
  options.num_devices = 1;
  options.memory_capacity_bytes = -1;
  EXPECT_THAT(CreateBackend(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory_capacity_bytes")));
  options.memory_capacity_bytes = 0;
  options.host_spin_micros = -1;
  EXPECT_THAT(CreateBackend(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("host_spin_micros must be >= 0, not -1")));
}

TEST(Runtime, CudaBackendWithoutAGpuIsUnavailable) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is usable here";
  BackendOptions options;
  options.kind = BackendKind::kCuda;
  EXPECT_THAT(CreateBackend(options),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::Not(::testing::IsEmpty())));
  EXPECT_EQ(CudaDeviceCount(), 0);
}

TEST(Runtime, HostBackendDescribesItsDevices) {
  auto backend = Host(3);
  EXPECT_EQ(backend->kind(), BackendKind::kHost);
  ASSERT_EQ(backend->device_count(), 3);
  EXPECT_EQ(backend->device(2).description(), "host:2");
  EXPECT_EQ(backend->device(2).index(), 2);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, backend->device(2).CreateStream("compute"));
  EXPECT_EQ(stream->name(), "compute");
  EXPECT_EQ(&stream->device(), &backend->device(2));
  EXPECT_EQ(stream->native_handle(), nullptr);
}

}  // namespace
}  // namespace pipesched::runtime
