// The hang watchdog (ExecutorOptions::step_timeout_seconds): a step that makes no
// progress ends in DeadlineExceeded naming, per rank, the action it is blocked on and
// what that action waits for, within the timeout, and leaves no thread behind. Also the
// runtime and comm pieces it stands on: Stream::Abort wakes waits and busy waits, the
// host all-reducer honours its timeout and Abort. Host backend, strict; run under TSan.
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/status.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/action.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/stages/executor.h"
#include "stages/toy_stage_work.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ToyOptions;
using testing::ToyStage;
using Clock = std::chrono::steady_clock;

// Threads of this process, from /proc/self/task.
int ThreadCount() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Polls `done` every few milliseconds for up to `seconds`; whether it came true.
bool WaitUntil(const std::function<bool()>& done, double seconds = 20) {
  const Clock::time_point start = Clock::now();
  while (!done()) {
    if (SecondsSince(start) >= seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Blocks its stream until the stream is aborted: a callback that never completes, but
// observes the cancellation token (Stream::aborted) so that its thread can be joined.
absl::Status BlockUntilAborted(runtime::Stream& stream) {
  return stream.EnqueueHost([&stream] {
    while (!stream.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::CancelledError("stuck callback: cancelled");
  });
}

// The toy stage, with hooks before its F and B callbacks of chosen micro-batches.
class HookedStage final : public ForwardingStageWork {
 public:
  // Runs after the toy's own work is enqueued (B) or before it (F), with the same io.
  using Hook = std::function<absl::Status(const MicrobatchIO& io, runtime::Stream& stream)>;
  HookedStage(std::unique_ptr<ToyStage> inner, Hook before_forward, Hook after_backward,
              std::function<void()> on_destroy = nullptr)
      : ForwardingStageWork(std::move(inner)),
        before_forward_(std::move(before_forward)),
        after_backward_(std::move(after_backward)),
        on_destroy_(std::move(on_destroy)) {}
  ~HookedStage() override {
    if (on_destroy_) on_destroy_();
  }

  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) override {
    if (before_forward_) PS_RETURN_IF_ERROR(before_forward_(io, stream));
    return inner_->Forward(io, stream);
  }
  absl::Status Backward(const MicrobatchIO& io, runtime::Stream& stream) override {
    PS_RETURN_IF_ERROR(inner_->Backward(io, stream));
    return after_backward_ ? after_backward_(io, stream) : absl::OkStatus();
  }

 private:
  Hook before_forward_, after_backward_;
  std::function<void()> on_destroy_;
};

std::unique_ptr<runtime::Backend> HostBackend(int devices) {
  auto backend = runtime::CreateBackend(
      {.kind = runtime::BackendKind::kHost, .num_devices = devices, .strict = true});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return std::move(backend).value();
}

struct StepData {
  std::vector<float> x, t;
  StepData(int microbatches, const ToyOptions& o) {
    const std::size_t n = static_cast<std::size_t>(microbatches) * o.features * o.batch;
    for (std::size_t i = 0; i < n; ++i) {
      x.push_back(0.1f * static_cast<float>(i % 7));
      t.push_back(0.05f * static_cast<float>(i % 5));
    }
  }
  StepInputs inputs() const {
    return {.inputs = std::as_bytes(std::span(x)), .targets = std::as_bytes(std::span(t))};
  }
};

constexpr double kTimeout = 0.5;
// Timeout + abort + drain, with room for a loaded machine and TSan.
constexpr double kBound = kTimeout + 3.0;

TEST(WatchdogTest, StuckStageCallbackEndsInTimeoutNamingEachRank) {
  const int threads_before = ThreadCount();
  const ToyOptions toy{.features = 2, .batch = 2};
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  {
    auto backend = HostBackend(2);
    // Stage 1's F of micro-batch 1 never completes.
    StageWorkFactory factory =
        [&toy](int stage, int,
               runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
      HookedStage::Hook hook;
      if (stage == 1) {
        hook = [](const MicrobatchIO& io, runtime::Stream& stream) {
          return io.microbatch == 1 ? BlockUntilAborted(stream) : absl::OkStatus();
        };
      }
      return std::make_unique<HookedStage>(std::make_unique<ToyStage>(stage, 2, toy, device), hook,
                                           nullptr);
    };
    PS_ASSERT_OK_AND_ASSIGN(
        auto ex, Executor::Create(schedule, *backend, factory, {.step_timeout_seconds = kTimeout}));
    EXPECT_GT(ThreadCount(), threads_before);  // the streams' workers
    StepData data(4, toy);
    const auto start = Clock::now();
    absl::StatusOr<StepResult> result = ex->Step(data.inputs());
    const double elapsed = SecondsSince(start);
    // 1F1B: rank 0 runs 0F0 0F1 0B0 0F2 0B1 ..., rank 1 runs 1F0 1B0 1F1 1B1 ...; 1F1
    // hangs, so rank 0 gets as far as 0B1, which needs the gradient of 1B1.
    EXPECT_THAT(result.status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         AllOf(HasSubstr("no action finished for"),
                               HasSubstr("rank 0: 0B1 waits for transfer SEND_B of micro-batch 1: "
                                         "event 'B/I(1,1) done' not reached (rank 1 has not "
                                         "finished 1B1)"),
                               HasSubstr("rank 1: 1F1 started and has not finished"))));
    std::cout << result.status().message() << "\n";
    EXPECT_GE(elapsed, kTimeout);
    EXPECT_LT(elapsed, kBound);
    // The executor is unusable afterwards: the next step fails at once, saying why.
    EXPECT_THAT(ex->Step(data.inputs()).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("a previous step of this executor failed (step timed "
                                         "out: no action finished for"),
                               HasSubstr("): its streams stay failed; make a new Executor"))));
  }
  EXPECT_EQ(ThreadCount(), threads_before);
}

// A stage callback that ignores the abort and only returns after the executor has given
// up on it (Stream::kAbortGraceMillis), then writes into its micro-batch's boundary
// buffer. The executor frees that buffer on the send stream, which drains at once after
// the abort; the host backend must keep the free until every stream of the device --
// this compute stream too -- is gone. ASan reports a heap-use-after-free otherwise.
TEST(WatchdogTest, CallbackThatOutlivesTheAbortKeepsItsBuffersUntilItReturns) {
  const ToyOptions toy{.features = 2, .batch = 2};
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 2}));
  auto backend = HostBackend(2);
  std::atomic<bool> wrote{false};
  {
    // Stage 1's B of micro-batch 0: the toy backward, then 3.5 s of a host function that
    // does not look at Stream::aborted(), then a write to its input-gradient region.
    StageWorkFactory factory =
        [&](int stage, int, runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
      auto inner = std::make_unique<ToyStage>(stage, 2, toy, device);
      HookedStage::Hook after_backward;
      if (stage == 1) {
        after_backward = [&wrote, bytes = inner->input_bytes()](const MicrobatchIO& io,
                                                                runtime::Stream& stream) {
          if (io.microbatch != 0) return absl::OkStatus();
          void* grad_input = io.grad_input;
          return stream.EnqueueHost([grad_input, bytes, &wrote] {
            std::this_thread::sleep_for(std::chrono::milliseconds(3500));
            std::memset(grad_input, 0, bytes);
            wrote = true;
            return absl::OkStatus();
          });
        };
      }
      return std::make_unique<HookedStage>(std::move(inner), nullptr, after_backward);
    };
    PS_ASSERT_OK_AND_ASSIGN(
        auto ex, Executor::Create(schedule, *backend, factory, {.step_timeout_seconds = kTimeout}));
    StepData data(2, toy);
    EXPECT_THAT(ex->Step(data.inputs()).status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("no action finished")));
    EXPECT_FALSE(wrote);  // the executor gave up on it (after the grace period)
    // A second step is refused before it touches a stream: its first synchronisation
    // would wait behind the host function still running (forever, for one that never
    // returns).
    EXPECT_THAT(ex->Step(data.inputs()).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("a previous step of this executor failed")));
    EXPECT_FALSE(wrote);
    // Destroying the executor: the send stream's deferred free waits for the compute
    // stream's worker.
  }
  EXPECT_TRUE(wrote);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(backend->device(d).memory_stats().current_bytes, 0) << "device " << d;
  }
}

// A stage callback that outlives the abort, the grace period and the executor itself
// (an embedder's action that runs far longer than the step timeout), then reads the
// step's input and checks its stage: the executor keeps the stage work, the micro-batch
// buffers and the step's inputs while such a function may still run (StageWork's promise:
// they outlive the work enqueued with them). It freed them: ASan reported a
// heap-use-after-free, and the heap was corrupted for the rest of the process.
TEST(WatchdogTest, CallbackThatOutlivesTheExecutorKeepsItsStageAndInputs) {
  const ToyOptions toy{.features = 2, .batch = 2};
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 2}));
  auto backend = HostBackend(2);
  StepData data(2, toy);
  std::atomic<bool> executor_gone{false}, stage_destroyed{false};
  std::atomic<bool> returned{false}, stage_was_destroyed{false};
  std::atomic<float> read{-1};
  {
    // Stage 0's F of micro-batch 0: waits (ignoring Stream::aborted) until the executor
    // is gone, then reads its input.
    StageWorkFactory factory =
        [&](int stage, int, runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
      auto inner = std::make_unique<ToyStage>(stage, 2, toy, device);
      if (stage != 0) return std::make_unique<HookedStage>(std::move(inner), nullptr, nullptr);
      HookedStage::Hook before_forward = [&](const MicrobatchIO& io, runtime::Stream& stream) {
        if (io.microbatch != 0) return absl::OkStatus();
        const auto* x = static_cast<const float*>(io.input);
        return stream.EnqueueHost([&, x] {
          WaitUntil([&] { return executor_gone.load(); });
          stage_was_destroyed = stage_destroyed.load();
          read = x[1];
          returned = true;
          return absl::OkStatus();
        });
      };
      return std::make_unique<HookedStage>(std::move(inner), before_forward, nullptr,
                                           [&stage_destroyed] { stage_destroyed = true; });
    };
    PS_ASSERT_OK_AND_ASSIGN(
        auto ex, Executor::Create(schedule, *backend, factory, {.step_timeout_seconds = kTimeout}));
    EXPECT_THAT(ex->Step(data.inputs()).status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("no action finished")));
  }
  executor_gone = true;
  ASSERT_TRUE(WaitUntil([&] { return returned.load(); }));
  EXPECT_FALSE(stage_was_destroyed);  // the stage work outlived the function
  EXPECT_FALSE(stage_destroyed);      // and is kept: the function might have used it later
  EXPECT_FLOAT_EQ(read, data.x[1]);   // the step's input, as the F received it
}

// A step that fails while it is still being issued (here stage 1's B of micro-batch 0
// cannot be issued) while a host function enqueued earlier does not return: that
// function (stage 1's F of micro-batch 0) reads the input the step received for it after
// the abort's grace period. The executor dropped the step's micro-batch buffers as soon
// as the step failed: the host backend freed that input under the running function (a
// heap-use-after-free under ASan; a reused block's bytes in a plain build), and on CUDA
// the free waits for every device, so the step itself hung behind the function.
TEST(WatchdogTest, StepThatFailsWhileIssuingKeepsBuffersAnAbandonedFunctionUses) {
  const ToyOptions toy{.features = 2, .batch = 2};
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 2}));
  auto backend = HostBackend(2);
  StepData data(2, toy);
  // Shared with the function, which may outlive this test's frame should it end early.
  struct Seen {
    std::atomic<bool> release{false}, returned{false};
    std::atomic<float> before{-1}, after{-1};
  };
  auto seen = std::make_shared<Seen>();
  const std::size_t input_bytes =
      static_cast<std::size_t>(toy.features) * toy.batch * sizeof(float);
  {
    StageWorkFactory factory =
        [&](int stage, int, runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
      auto inner = std::make_unique<ToyStage>(stage, 2, toy, device);
      if (stage != 1) return std::make_unique<HookedStage>(std::move(inner), nullptr, nullptr);
      HookedStage::Hook before_forward = [&](const MicrobatchIO& io, runtime::Stream& stream) {
        if (io.microbatch != 0) return absl::OkStatus();
        const auto* x = static_cast<const float*>(io.input);
        return stream.EnqueueHost([seen, x] {
          seen->before = x[0];
          WaitUntil([&] { return seen->release.load(); });
          seen->after = x[0];
          seen->returned = true;
          return absl::OkStatus();
        });
      };
      // Fails once the function is running (an abort would skip it before it starts).
      HookedStage::Hook after_backward = [&](const MicrobatchIO& io, runtime::Stream&) {
        if (io.microbatch != 0) return absl::OkStatus();
        WaitUntil([&] { return seen->before != -1; });
        return absl::InternalError("injected: cannot issue 1B0");
      };
      return std::make_unique<HookedStage>(std::move(inner), before_forward, after_backward);
    };
    PS_ASSERT_OK_AND_ASSIGN(
        auto ex, Executor::Create(schedule, *backend, factory, {.step_timeout_seconds = kTimeout}));
    const Clock::time_point start = Clock::now();
    EXPECT_THAT(ex->Step(data.inputs()).status(),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("injected: cannot issue 1B0")));
    EXPECT_LT(SecondsSince(start), kBound + runtime::Stream::kAbortGraceMillis / 1000.0);
    EXPECT_NE(seen->before, -1);  // the function ran
    EXPECT_FALSE(seen->returned);
    // Blocks of the input's size, written over: what a freed input would become.
    PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<runtime::Stream> stream,
                            backend->device(1).CreateStream("reuse"));
    std::vector<runtime::Buffer> reuse;
    for (int k = 0; k < 16; ++k) {
      absl::StatusOr<runtime::Buffer> b = backend->device(1).Allocate(input_bytes, *stream);
      ASSERT_TRUE(b.ok()) << b.status();
      PS_ASSERT_OK(stream->Synchronize());
      std::vector<float> pattern(input_bytes / sizeof(float), -7.0f);
      PS_ASSERT_OK(backend->device(1).CopyFromHost(b->data(), pattern.data(), input_bytes));
      reuse.push_back(std::move(b).value());
    }
    seen->release = true;
    ASSERT_TRUE(WaitUntil([&] { return seen->returned.load(); }));
    EXPECT_NE(seen->before, -7.0f);
    EXPECT_EQ(seen->after, seen->before);  // the input was still the one received
  }
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(backend->device(d).memory_stats().current_bytes, 0) << "device " << d;
  }
}

// A schedule that deadlocks at run time but not statically. The executor alone cannot
// deadlock on a schedule scheduler::Validate accepts: it issues in a topological order of
// the validated dependency graph and every stream is a FIFO consistent with that order.
// A run-time deadlock needs a dependency the schedule does not declare -- here an
// embedder's own synchronisation between stages (stage 1's F of micro-batch 1 waits on
// the host until stage 0's B of micro-batch 0 has run, as a hand-rolled weight-tying
// exchange might). With GPipe's order (rank 0: 0F0 0F1 0B1 0B0) that closes a cycle:
// 1F1 -> 0B0 -> (rank 0's order) 0B1 -> (data) 1B1 -> (rank 1's order) 1F1.
TEST(WatchdogTest, ScheduleThatDeadlocksOnlyAtRunTimeEndsInTimeout) {
  const int threads_before = ThreadCount();
  const ToyOptions toy{.features = 2, .batch = 2};
  scheduler::Schedule schedule;
  schedule.name = "hand-made gpipe";
  schedule.num_microbatches = 2;
  schedule.placement.num_ranks = 2;
  auto program = [](std::vector<std::string> texts) {
    std::vector<scheduler::Action> out;
    for (const std::string& t : texts) out.push_back(scheduler::ParseAction(t).value());
    return out;
  };
  schedule.programs = {program({"0F0", "0F1", "0B1", "0B0"}),
                       program({"1F0", "1F1", "1B1", "1B0"})};
  PS_ASSERT_OK(scheduler::Validate(schedule));  // statically fine
  {
    auto backend = HostBackend(2);
    auto latch = std::make_shared<std::atomic<bool>>(false);
    StageWorkFactory factory =
        [&toy, latch](int stage, int,
                      runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
      HookedStage::Hook before_forward, after_backward;
      if (stage == 1) {
        before_forward = [latch](const MicrobatchIO& io, runtime::Stream& stream) -> absl::Status {
          if (io.microbatch != 1) return absl::OkStatus();
          return stream.EnqueueHost([latch, &stream] {
            while (!latch->load() && !stream.aborted()) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            return latch->load() ? absl::OkStatus() : absl::CancelledError("latch: cancelled");
          });
        };
      } else {
        after_backward = [latch](const MicrobatchIO& io, runtime::Stream& stream) -> absl::Status {
          if (io.microbatch != 0) return absl::OkStatus();
          return stream.EnqueueHost([latch] {
            latch->store(true);
            return absl::OkStatus();
          });
        };
      }
      return std::make_unique<HookedStage>(std::make_unique<ToyStage>(stage, 2, toy, device),
                                           before_forward, after_backward);
    };
    PS_ASSERT_OK_AND_ASSIGN(
        auto ex, Executor::Create(schedule, *backend, factory, {.step_timeout_seconds = kTimeout}));
    StepData data(2, toy);
    const auto start = Clock::now();
    absl::StatusOr<StepResult> result = ex->Step(data.inputs());
    const double elapsed = SecondsSince(start);
    EXPECT_THAT(result.status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         AllOf(HasSubstr("rank 0: 0B1 waits for transfer SEND_B of micro-batch 1: "
                                         "event 'B/I(1,1) done' not reached (rank 1 has not "
                                         "finished 1B1)"),
                               HasSubstr("rank 1: 1F1 started and has not finished"))));
    std::cout << result.status().message() << "\n";
    EXPECT_GE(elapsed, kTimeout);
    EXPECT_LT(elapsed, kBound);
  }
  EXPECT_EQ(ThreadCount(), threads_before);
}

// D = 2: replica 1's F fails. Without the watchdog's stream check, replica 0 would wait
// at the all-reduce rendezvous for the whole timeout; the step ends at once instead.
TEST(WatchdogTest, FailedReplicaEndsTheStepAtOnceWithItsError) {
  const int threads_before = ThreadCount();
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  {
    auto backend = HostBackend(4);
    StageWorkFactory factory =
        [](int stage, int replica,
           runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
      ToyOptions toy{.features = 2, .batch = 2};
      if (replica == 1 && stage == 0) toy.fail_forward_of_microbatch = 2;
      return std::make_unique<ToyStage>(stage, 2, toy, device);
    };
    PS_ASSERT_OK_AND_ASSIGN(auto ex,
                            Executor::Create(schedule, *backend, factory,
                                             {.num_replicas = 2, .step_timeout_seconds = 30}));
    StepData data(8, ToyOptions{.features = 2, .batch = 2});
    const auto start = Clock::now();
    EXPECT_THAT(ex->Step(data.inputs()).status(),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("toy F of stage 0 failed")));
    EXPECT_LT(SecondsSince(start), 5.0);
  }
  EXPECT_EQ(ThreadCount(), threads_before);
}

TEST(WatchdogTest, NegativeTimeoutIsRejected) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 1, .num_microbatches = 1}));
  auto backend = HostBackend(1);
  StageWorkFactory factory =
      [](int stage, int, runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    return std::make_unique<ToyStage>(stage, 1, ToyOptions{}, device);
  };
  EXPECT_THAT(Executor::Create(schedule, *backend, factory, {.step_timeout_seconds = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step timeout")));
}

TEST(StreamAbortTest, WakesAWaitOnAnEventThatNeverCompletesAndABusyWait) {
  const int threads_before = ThreadCount();
  {
    auto backend = HostBackend(1);
    runtime::Device& device = backend->device(0);
    PS_ASSERT_OK_AND_ASSIGN(auto blocker, device.CreateStream("blocker"));
    PS_ASSERT_OK_AND_ASSIGN(auto waiter, device.CreateStream("waiter"));
    PS_ASSERT_OK_AND_ASSIGN(auto sleeper, device.CreateStream("sleeper"));
    PS_ASSERT_OK_AND_ASSIGN(auto never, device.CreateEvent(false, "never"));
    PS_ASSERT_OK(BlockUntilAborted(*blocker));
    PS_ASSERT_OK(never->Record(*blocker));
    PS_ASSERT_OK(waiter->Wait(*never));
    PS_ASSERT_OK(sleeper->EnqueueBusyWait(600e6));  // ten minutes
    PS_ASSERT_OK_AND_ASSIGN(auto after, device.CreateEvent(false, "after"));
    PS_ASSERT_OK(after->Record(*waiter));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    PS_ASSERT_OK_AND_ASSIGN(bool done, after->Query());
    EXPECT_FALSE(done);
    EXPECT_TRUE(waiter->status().ok());

    const auto start = Clock::now();
    for (runtime::Stream* s : {blocker.get(), waiter.get(), sleeper.get()}) {
      s->Abort(absl::DeadlineExceededError("watchdog"));
      EXPECT_TRUE(s->aborted());
    }
    // Records still run after an abort: `after` completes once the wait is woken.
    while (!after->Query().value()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_THAT(waiter->Synchronize(),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("stream 'waiter'")));
    EXPECT_FALSE(sleeper->Synchronize().ok());
    EXPECT_THAT(blocker->Synchronize(),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("watchdog")));
    EXPECT_LT(SecondsSince(start), 2.0);
    EXPECT_THAT(waiter->EnqueueHost([] { return absl::OkStatus(); }),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("watchdog")));
  }
  EXPECT_EQ(ThreadCount(), threads_before);
}

TEST(HostAllReduceTest, HonoursItsTimeoutAndAbort) {
  auto backend = HostBackend(2);
  std::vector<runtime::Device*> devices = {&backend->device(0), &backend->device(1)};
  PS_ASSERT_OK_AND_ASSIGN(auto s0, devices[0]->CreateStream("p0"));
  PS_ASSERT_OK_AND_ASSIGN(auto s1, devices[1]->CreateStream("p1"));
  std::vector<float> a(3, 1.0f), b(3, 3.0f);
  for (double timeout : {0.2, 0.0}) {
    SCOPED_TRACE(timeout);
    PS_ASSERT_OK_AND_ASSIGN(auto reducer,
                            comm::CreateAllReducer(devices, {.timeout_seconds = timeout}));
    // Participant 1 never arrives: its stream is stuck before its part.
    auto release = std::make_shared<std::atomic<bool>>(false);
    PS_ASSERT_OK(s1->EnqueueHost([release] {
      while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return absl::OkStatus();
    }));
    std::vector<comm::ReducePart> parts = {{a.data(), s0.get()}, {b.data(), s1.get()}};
    const auto start = Clock::now();
    PS_ASSERT_OK(reducer->AllReduceAverage(parts, 3));
    if (timeout == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      reducer->Abort();
      EXPECT_THAT(s0->Synchronize(),
                  StatusIs(absl::StatusCode::kCancelled, HasSubstr("only 1 of 2 participants")));
    } else {
      EXPECT_THAT(s0->Synchronize(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                              HasSubstr("only 1 of 2 participants arrived")));
      EXPECT_GE(SecondsSince(start), timeout);
    }
    EXPECT_LT(SecondsSince(start), 3.0);
    release->store(true);
    // Participant 1 arrives late and fails at once rather than waiting.
    EXPECT_FALSE(s1->Synchronize().ok());
    // Fresh streams for the next round (both are poisoned now).
    PS_ASSERT_OK_AND_ASSIGN(s0, devices[0]->CreateStream("p0"));
    PS_ASSERT_OK_AND_ASSIGN(s1, devices[1]->CreateStream("p1"));
  }
}

}  // namespace
}  // namespace pipesched::stages
