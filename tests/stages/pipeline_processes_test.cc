// A pipeline whose ranks live in different processes (ExecutorOptions::pipeline): the
// processes are threads here, each with its own host backend and bootstrap rank. Every
// schedule with P >= 2, split over 2 processes (and over P), trains as one process does:
// the same losses to the bit, parameters as sequential training's; each process's
// timeline holds its own rows, with the messages that cross; the configurations that
// cannot work are refused by name, and a process that fails stops the others.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/stages/executor.h"
#include "pipesched/stages/memory_check.h"
#include "stages/schedule_cases.h"
#include "stages/toy_stage_work.h"
#include "testing/scoped_environment.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using testing::AsInputs;
using ::testing::HasSubstr;
using testing::ToyData;
using testing::ToyFactory;
using testing::ToyOptions;
using testing::ToyReference;
using testing::ToyStage;

std::unique_ptr<runtime::Backend> HostBackend(int devices) {
  auto backend = runtime::CreateBackend(
      {.kind = runtime::BackendKind::kHost, .num_devices = devices, .strict = true});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return std::move(backend).value();
}

constexpr int kSteps = 3;
const ToyOptions kToy{.features = 3, .batch = 2, .lr = 0.05f};
constexpr std::size_t kValuesPerMicrobatch = 6;  // features x batch

// What one process of a split pipeline ends with.
struct ProcessRun {
  absl::Status status;
  std::vector<double> losses;
  std::vector<StepResult> results;
  // Per (replica, stage) this process runs: {replica, stage, a, b}.
  struct Param {
    int replica, stage;
    float a, b;
  };
  std::vector<Param> params;
};

// How RunSplit runs each process: `devices` host devices (0: one per rank and replica;
// 1: every rank and replica on one, whose memory the host waits for with
// `exact_memory_accounting`).
struct SplitOptions {
  int devices = 0;
  bool exact_memory_accounting = false;
};

// kSteps steps of `ex`, each on share `share` of `shares` equal shares of the step's
// ToyData (replicas x M micro-batches each), then the values of this process's stages.
void StepAndCollect(Executor& ex, const scheduler::Schedule& schedule, int replicas, int shares,
                    int share, ProcessRun& run) {
  const std::size_t values =
      static_cast<std::size_t>(replicas) * schedule.num_microbatches * kValuesPerMicrobatch;
  const std::size_t from = values * static_cast<std::size_t>(share);
  std::vector<float> x, t;
  for (int step = 0; step < kSteps; ++step) {
    ToyData(step, shares * replicas * schedule.num_microbatches, kValuesPerMicrobatch, x, t);
    const std::vector<float> mine_x(x.begin() + from, x.begin() + from + values);
    const std::vector<float> mine_t(t.begin() + from, t.begin() + from + values);
    absl::StatusOr<StepResult> r = ex.Step(AsInputs(mine_x, mine_t));
    if (!r.ok()) {
      run.status = r.status();
      return;
    }
    run.losses.push_back(r->loss);
    run.results.push_back(*std::move(r));
  }
  for (int d = 0; d < replicas; ++d) {
    for (int s = 0; s < schedule.num_stages(); ++s) {
      if (!ex.runs_stage(s)) continue;
      auto& toy_stage = static_cast<ToyStage&>(ex.work(d, s));
      run.params.push_back({d, s, toy_stage.a(), toy_stage.b()});
    }
  }
}

// One thread per bootstrap, each running its part of `schedule` (D = replicas) for
// kSteps steps on its own host backend.
std::vector<ProcessRun> RunSplit(const scheduler::Schedule& schedule, int replicas,
                                 std::vector<std::unique_ptr<comm::Bootstrap>>& bootstraps,
                                 SplitOptions how = {}) {
  const int processes = static_cast<int>(bootstraps.size());
  std::vector<ProcessRun> runs(processes);
  std::vector<std::thread> threads;
  for (int q = 0; q < processes; ++q) {
    threads.emplace_back([&, q] {
      ProcessRun& run = runs[q];
      auto backend = HostBackend(how.devices > 0 ? how.devices : schedule.num_ranks() * replicas);
      absl::StatusOr<std::unique_ptr<Executor>> ex =
          Executor::Create(schedule, *backend, ToyFactory(schedule.num_stages(), kToy),
                           {.num_replicas = replicas,
                            .exact_memory_accounting = how.exact_memory_accounting,
                            .pipeline = bootstraps[q].get()});
      if (!ex.ok()) {
        run.status = ex.status();
        return;
      }
      StepAndCollect(**ex, schedule, replicas, /*shares=*/1, /*share=*/0, run);
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// The same through in-process bootstraps.
std::vector<ProcessRun> RunSplit(const scheduler::Schedule& schedule, int replicas, int processes,
                                 SplitOptions how = {}) {
  auto bootstraps = comm::CreateInProcessBootstraps(processes, {.timeout_seconds = 30});
  EXPECT_TRUE(bootstraps.ok()) << bootstraps.status();
  return RunSplit(schedule, replicas, *bootstraps, how);
}

// The losses of the same steps in one process.
std::vector<double> LossesAlone(const scheduler::Schedule& schedule, int replicas) {
  auto backend = HostBackend(schedule.num_ranks() * replicas);
  auto ex = Executor::Create(schedule, *backend, ToyFactory(schedule.num_stages(), kToy),
                             {.num_replicas = replicas});
  EXPECT_TRUE(ex.ok()) << ex.status();
  std::vector<double> losses;
  std::vector<float> x, t;
  for (int step = 0; step < kSteps && ex.ok(); ++step) {
    ToyData(step, replicas * schedule.num_microbatches, kValuesPerMicrobatch, x, t);
    auto r = (*ex)->Step(AsInputs(x, t));
    EXPECT_TRUE(r.ok()) << r.status();
    losses.push_back(r.ok() ? r->loss : NAN);
  }
  return losses;
}

TEST(PipelineProcessesTest, EverySplitScheduleTrainsAsOneProcess) {
  int runs = 0;
  for (const testing::ScheduleCase& c : testing::AllScheduleCases()) {
    if (c.p < 2 || c.m == 8) continue;  // M = 8 adds nothing a crossing does not have at 4
    PS_ASSERT_OK_AND_ASSIGN(scheduler::Schedule schedule, testing::GenerateCase(c));
    const std::vector<double> alone = LossesAlone(schedule, c.d);
    std::vector<int> splits = {2};
    if (c.p > 2 && c.d == 1) splits.push_back(c.p);  // one rank a process (D: at 2)
    for (int processes : splits) {
      SCOPED_TRACE(absl::StrCat(c.Name(), " over ", processes, " processes"));
      ++runs;
      const std::vector<ProcessRun> split = RunSplit(schedule, c.d, processes);
      ToyReference ref(schedule.num_stages(), kToy);
      std::vector<float> x, t;
      for (int step = 0; step < kSteps; ++step) {
        ToyData(step, c.d * c.m, kValuesPerMicrobatch, x, t);
        ref.Step(x, t, c.d * c.m);
      }
      std::vector<int> seen(schedule.num_stages(), 0);
      for (int q = 0; q < processes; ++q) {
        ASSERT_TRUE(split[q].status.ok()) << "process " << q << ": " << split[q].status;
        EXPECT_EQ(split[q].losses, alone) << "process " << q;  // to the bit
        for (const ProcessRun::Param& p : split[q].params) {
          ++seen[p.stage];
          EXPECT_NEAR(p.a, ref.a[p.stage], 1e-5 * std::abs(ref.a[p.stage]) + 1e-7)
              << "stage " << p.stage << " replica " << p.replica;
          EXPECT_NEAR(p.b, ref.b[p.stage], 1e-5 * std::abs(ref.b[p.stage]) + 1e-7)
              << "stage " << p.stage << " replica " << p.replica;
        }
      }
      for (int s = 0; s < schedule.num_stages(); ++s) {
        EXPECT_EQ(seen[s], c.d) << "stage " << s << " is run by one process, per replica";
      }
    }
  }
  EXPECT_GE(runs, 30);
}

// A process of a two-dimensional job (comm::SplitJob): its run (whose timelines hold its
// whole pipeline) and where it sits.
struct GridRun : ProcessRun {
  int pipeline_rank = -1, replica_group = -1;
};

// N = K x R processes (threads) of one in-process job: R pipelines of `schedule`, each
// split across K processes, each process with `replicas` local replicas of its ranks.
// The job's batch is R x replicas x M micro-batches; pipeline group g takes the g-th
// share.
// `failing`: a process whose stages fail their F of micro-batch 1 (-1: none).
std::vector<GridRun> RunGrid(const scheduler::Schedule& schedule, int replicas, int k, int r,
                             int failing = -1) {
  const int n = k * r;
  std::vector<GridRun> runs(n);
  auto job = comm::CreateInProcessBootstraps(n, {.timeout_seconds = 120});
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return runs;
  std::vector<std::thread> threads;
  for (int q = 0; q < n; ++q) {
    threads.emplace_back([&, q] {
      GridRun& run = runs[q];
      absl::StatusOr<comm::JobGrid> grid = comm::SplitJob(*(*job)[q], k);
      if (!grid.ok()) {
        run.status = grid.status();
        return;
      }
      run.pipeline_rank = grid->pipeline->rank();
      run.replica_group = grid->replicas->rank();
      auto backend = HostBackend(schedule.num_ranks() * replicas);
      ToyOptions toy = kToy;
      if (q == failing) toy.fail_forward_of_microbatch = 1;
      absl::StatusOr<std::unique_ptr<Executor>> ex =
          Executor::Create(schedule, *backend, ToyFactory(schedule.num_stages(), toy),
                           {.num_replicas = replicas,
                            .step_timeout_seconds = 120,
                            .processes = grid->replicas.get(),
                            .pipeline = grid->pipeline.get()});
      if (!ex.ok()) {
        run.status = ex.status();
        return;
      }
      StepAndCollect(**ex, schedule, replicas, /*shares=*/r, run.replica_group, run);
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// The stage values after the same steps in one process holding every replica: [stage] ->
// {a, b} of replica 0.
std::vector<std::pair<float, float>> ParamsAlone(const scheduler::Schedule& schedule,
                                                 int replicas) {
  auto backend = HostBackend(schedule.num_ranks() * replicas);
  auto ex = Executor::Create(schedule, *backend, ToyFactory(schedule.num_stages(), kToy),
                             {.num_replicas = replicas});
  EXPECT_TRUE(ex.ok()) << ex.status();
  std::vector<std::pair<float, float>> params;
  if (!ex.ok()) return params;
  std::vector<float> x, t;
  for (int step = 0; step < kSteps; ++step) {
    ToyData(step, replicas * schedule.num_microbatches, kValuesPerMicrobatch, x, t);
    auto result = (*ex)->Step(AsInputs(x, t));
    EXPECT_TRUE(result.ok()) << result.status();
  }
  for (int s = 0; s < schedule.num_stages(); ++s) {
    auto& toy_stage = static_cast<ToyStage&>((*ex)->work(0, s));
    params.push_back({toy_stage.a(), toy_stage.b()});
  }
  return params;
}

// Two pipelines, each split across two processes (four in all), average their stages'
// gradients across the pipelines: every schedule with P >= 2 trains to the same bits as
// one process holding all the replicas; each process runs its own block of ranks for its
// replicas, and its timeline is its whole pipeline's.
TEST(PipelineProcessesTest, PipelinesSplitAcrossProcessesAverageAcrossPipelines) {
  int runs = 0;
  for (const testing::ScheduleCase& c : testing::AllScheduleCases()) {
    if (c.p < 2 || c.m != 4) continue;
    PS_ASSERT_OK_AND_ASSIGN(scheduler::Schedule schedule, testing::GenerateCase(c));
    SCOPED_TRACE(c.Name());
    ++runs;
    const std::vector<std::pair<float, float>> alone = ParamsAlone(schedule, 2 * c.d);
    const std::vector<GridRun> grid = RunGrid(schedule, c.d, /*k=*/2, /*r=*/2);
    for (int q = 0; q < 4; ++q) {
      const GridRun& run = grid[q];
      ASSERT_TRUE(run.status.ok()) << "process " << q << ": " << run.status;
      EXPECT_EQ(run.pipeline_rank, q / 2);
      EXPECT_EQ(run.replica_group, q % 2);
      std::set<int> stages;
      for (const ProcessRun::Param& p : run.params) {
        stages.insert(p.stage);
        // To the bit: the reduction sums every replica in one order, as one process does.
        EXPECT_EQ(p.a, alone[p.stage].first) << "process " << q << " stage " << p.stage;
        EXPECT_EQ(p.b, alone[p.stage].second) << "process " << q << " stage " << p.stage;
      }
      for (int s = 0; s < schedule.num_stages(); ++s) {
        const int process = schedule.placement.RankOf(s) * 2 / c.p;
        EXPECT_EQ(stages.count(s), process == q / 2 ? 1u : 0u) << "process " << q << " stage " << s;
      }
      ASSERT_EQ(run.results.size(), static_cast<std::size_t>(kSteps));
      std::set<int> rows;
      for (const trace::Span& span : run.results.back().timeline.spans) {
        if (span.op == "F") rows.insert(span.rank);
      }
      EXPECT_EQ(rows.size(), static_cast<std::size_t>(c.p * c.d)) << "process " << q;
      // The two processes of one pipeline return one loss; the pipelines' data differ.
      EXPECT_EQ(run.losses, grid[q ^ 2].losses) << "process " << q;
    }
    EXPECT_NE(grid[0].losses, grid[1].losses);
  }
  EXPECT_GE(runs, 15);
}

// Groups wired by hand so that the two replicas of a block are different blocks of their
// pipelines (process 0 and 3 are replicas, but 0 is its pipeline's first and 3 its
// second): named at Create.
TEST(PipelineProcessesTest, ReplicasOfDifferentBlocksAreRefused) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  PS_ASSERT_OK_AND_ASSIGN(auto job, comm::CreateInProcessBootstraps(4, {.timeout_seconds = 30}));
  const std::vector<std::vector<int>> pipelines = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> replicas = {{0, 3}, {1, 2}, {1, 2}, {0, 3}};
  std::vector<absl::Status> created(4);
  std::vector<std::thread> threads;
  for (int q = 0; q < 4; ++q) {
    threads.emplace_back([&, q] {
      auto pipeline = comm::CreateGroupBootstrap(*job[q], pipelines[q], "p");
      auto replica = comm::CreateGroupBootstrap(*job[q], replicas[q], "r");
      ASSERT_TRUE(pipeline.ok() && replica.ok());
      auto backend = HostBackend(2);
      created[q] =
          Executor::Create(schedule, *backend, ToyFactory(2, kToy),
                           {.processes = replica.value().get(), .pipeline = pipeline.value().get()})
              .status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int q = 0; q < 4; ++q) {
    EXPECT_THAT(std::string(created[q].message()),
                HasSubstr("'s place in its pipeline differs from process "))
        << "process " << q << ": " << created[q];
  }
}

// Process 3 (pipeline 1's stage 1) fails its F: its pipeline partner, which waits for its
// gradients, and the other pipeline's two, which wait for its all-reduce, all stop at once
// with its reason, long before any timeout (120 s).
TEST(PipelineProcessesTest, AFailureInOnePipelineStopsEveryPipeline) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<GridRun> grid = RunGrid(schedule, 1, /*k=*/2, /*r=*/2, /*failing=*/3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
  EXPECT_THAT(grid[3].status, StatusIs(absl::StatusCode::kInternal, HasSubstr("toy F of stage 1")));
  for (int q = 0; q < 3; ++q) {
    EXPECT_THAT(grid[q].status,
                StatusIs(absl::StatusCode::kAborted, HasSubstr("process 3 failed: ")))
        << "process " << q;
    EXPECT_THAT(grid[q].status.message(), HasSubstr("toy F of stage 1")) << "process " << q;
  }
}

// With exact memory accounting the host thread waits, while it issues, for the frees its
// device has reached; with every rank and replica of a process on one device it waits on
// its neighbours' work, which waits on the other process's messages. Still no schedule
// deadlocks, and each trains as one process does.
TEST(PipelineProcessesTest, ExactMemoryAccountingOnOneDeviceAProcessStillTrainsAsOne) {
  int runs = 0;
  for (const testing::ScheduleCase& c : testing::AllScheduleCases()) {
    if (c.p < 2 || c.m != 4) continue;
    PS_ASSERT_OK_AND_ASSIGN(scheduler::Schedule schedule, testing::GenerateCase(c));
    SCOPED_TRACE(c.Name());
    ++runs;
    const std::vector<double> alone = LossesAlone(schedule, c.d);
    const std::vector<ProcessRun> split =
        RunSplit(schedule, c.d, 2, {.devices = 1, .exact_memory_accounting = true});
    for (int q = 0; q < 2; ++q) {
      ASSERT_TRUE(split[q].status.ok()) << "process " << q << ": " << split[q].status;
      EXPECT_EQ(split[q].losses, alone) << "process " << q;
    }
  }
  EXPECT_GE(runs, 15);
}

// One step of `schedule` on each of `processes` threads, each with a host backend of one
// device, meeting through in-process bootstraps; stage work of 4 bytes a micro-batch
// (SleepyWork). Each process's status.
std::vector<absl::Status> OneStepEach(const scheduler::Schedule& schedule,
                                      const StageWorkFactory& factory, int processes,
                                      double step_timeout_seconds, double bootstrap_timeout) {
  std::vector<absl::Status> stepped(processes);
  auto bootstraps =
      comm::CreateInProcessBootstraps(processes, {.timeout_seconds = bootstrap_timeout});
  if (!bootstraps.ok()) return std::vector<absl::Status>(processes, bootstraps.status());
  std::vector<std::thread> threads;
  for (int q = 0; q < processes; ++q) {
    threads.emplace_back([&, q] {
      auto backend = HostBackend(1);
      auto ex = Executor::Create(
          schedule, *backend, factory,
          {.step_timeout_seconds = step_timeout_seconds, .pipeline = (*bootstraps)[q].get()});
      if (!ex.ok()) {
        stepped[q] = ex.status();
        return;
      }
      const int m = schedule.num_microbatches;
      std::vector<std::byte> x(4 * m), t(4 * m);
      stepped[q] = (*ex)->Step({.inputs = x, .targets = t}).status();
    });
  }
  for (std::thread& t : threads) t.join();
  return stepped;
}

// A process waits for the others' messages for as long as they compute: with actions of
// 50 ms, rank 0 of GPipe over 4 processes waits 0.45 s between its last F and its first
// B. A step timeout of 0.3 s counts only this process's own stalls, not that wait.
TEST(PipelineProcessesTest, TheWatchdogDoesNotCountWaitingForAnotherProcess) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("gpipe", {.num_ranks = 4, .num_microbatches = 4}));
  StageWorkFactory sleepy = [](int, int,
                               runtime::Device&) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    return std::make_unique<testing::SleepyWork>(50'000);
  };
  const std::vector<absl::Status> stepped = OneStepEach(schedule, sleepy, 4, 0.3, 30);
  for (int q = 0; q < 4; ++q) PS_EXPECT_OK(stepped[q]) << "process " << q;
}

// 1F1B over 3 processes of one stage each: stage 0's F of micro-batch 1 stalls (20 s).
// Process 0 waits in a receive too (the gradient of micro-batch 0, which stage 1 sends
// only after that F), and the others wait for it: every process is waiting for another.
// Process 0's watchdog still names its own stalled F after the step timeout, and the
// others stop with its reason.
TEST(PipelineProcessesTest, AStallOfThisProcessIsCaughtWhileItWaitsForAnotherToo) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 3, .num_microbatches = 4}));
  StageWorkFactory factory = [](int stage, int,
                                runtime::Device&) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    auto work = std::make_unique<testing::SleepyWork>(1000);
    if (stage == 0) work->SlowForwardOf(1, 20e6);
    return std::unique_ptr<StageWork>(std::move(work));
  };
  const auto start = std::chrono::steady_clock::now();
  const std::vector<absl::Status> stepped = OneStepEach(schedule, factory, 3, 0.5, 60);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
  EXPECT_THAT(stepped[0], StatusIs(absl::StatusCode::kDeadlineExceeded,
                                   HasSubstr("F1 started and has not finished")));
  for (int q = 1; q < 3; ++q) {
    EXPECT_THAT(stepped[q], StatusIs(absl::StatusCode::kAborted, HasSubstr("process 0 failed")))
        << "process " << q;
  }
}

// A process that never steps: the others' receives wait for it (their watchdog does not
// count that), until the bootstrap's timeout names the message and its sender.
TEST(PipelineProcessesTest, APeerThatNeverStepsIsNamedAtTheBootstrapsTimeout) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  PS_ASSERT_OK_AND_ASSIGN(auto pair, comm::CreateInProcessBootstraps(2, {.timeout_seconds = 1}));
  auto backend0 = HostBackend(2);
  auto backend1 = HostBackend(2);
  absl::StatusOr<std::unique_ptr<Executor>> idle;
  std::thread other([&] {
    idle = Executor::Create(schedule, *backend1, ToyFactory(2, kToy), {.pipeline = pair[1].get()});
  });
  auto ex = Executor::Create(schedule, *backend0, ToyFactory(2, kToy),
                             {.step_timeout_seconds = 0.2, .pipeline = pair[0].get()});
  other.join();
  ASSERT_TRUE(ex.ok() && idle.ok()) << ex.status() << idle.status();
  std::vector<float> x, t;
  ToyData(0, 4, kValuesPerMicrobatch, x, t);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT((*ex)->Step(AsInputs(x, t)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("waited 1 s on channel 'b-1-0-0' (message 0) for a message "
                                 "from rank 1")));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(took, 0.9);
  EXPECT_LT(took, 10);
  // The failed step told the job: the idle process's first exchange says why.
  EXPECT_THAT(pair[1]->Failure(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("process 0 failed")));
}

// A process whose step is refused before it starts (inputs of the wrong size) fails the
// job at once: the others stop with its reason. One whose stage work cannot be made (its
// device too small) stops them too, but as a refusal every process returns, heard before
// any exchange of the executor's: the job is not failed.
TEST(PipelineProcessesTest, AProcessRefusedItsInputsOrItsExecutorStopsTheOthers) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  for (const bool factory_fails : {false, true}) {
    SCOPED_TRACE(factory_fails ? "its executor" : "its inputs");
    PS_ASSERT_OK_AND_ASSIGN(auto pair, comm::CreateInProcessBootstraps(2, {.timeout_seconds = 60}));
    std::vector<absl::Status> status(2);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int q = 0; q < 2; ++q) {
      threads.emplace_back([&, q] {
        auto backend = HostBackend(2);
        StageWorkFactory factory = ToyFactory(2, kToy);
        if (q == 1 && factory_fails) {
          factory = [](int, int, runtime::Device&) -> absl::StatusOr<std::unique_ptr<StageWork>> {
            return absl::ResourceExhaustedError("stage 1 does not fit");
          };
        }
        auto ex = Executor::Create(schedule, *backend, factory,
                                   {.step_timeout_seconds = 60, .pipeline = pair[q].get()});
        if (!ex.ok()) {
          status[q] = ex.status();
          return;
        }
        std::vector<float> x, t;
        ToyData(0, 4, kValuesPerMicrobatch, x, t);
        if (q == 1) x.pop_back();  // one value short
        status[q] = (*ex)->Step(AsInputs(x, t)).status();
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
    const std::string reason = factory_fails ? "stage 1 does not fit" : "bytes of inputs";
    EXPECT_THAT(status[1], StatusIs(factory_fails ? absl::StatusCode::kResourceExhausted
                                                  : absl::StatusCode::kInvalidArgument,
                                    HasSubstr(reason)));
    if (factory_fails) {
      EXPECT_THAT(status[0], StatusIs(absl::StatusCode::kResourceExhausted,
                                      "process 1: stage 1 does not fit"));
      for (int q = 0; q < 2; ++q) {
        EXPECT_TRUE(comm::HeardByAll(status[q])) << q;
        PS_EXPECT_OK(pair[q]->Failure()) << q;
      }
    } else {
      EXPECT_THAT(status[0], StatusIs(absl::StatusCode::kAborted, HasSubstr("process 1 failed: ")));
      EXPECT_THAT(std::string(status[0].message()), HasSubstr(reason));
    }
  }
}

// The pre-flight memory check of a split executor looks at this process's devices only.
TEST(PipelineProcessesTest, ActivationPlacesAreThisProcesssOwn) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 4, .num_microbatches = 4}));
  PS_ASSERT_OK_AND_ASSIGN(auto pair, comm::CreateInProcessBootstraps(2, {.timeout_seconds = 30}));
  std::vector<std::unique_ptr<runtime::Backend>> backends;
  backends.push_back(HostBackend(4));
  backends.push_back(HostBackend(4));
  std::vector<std::vector<int>> members(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int q = 0; q < 2; ++q) {
    threads.emplace_back([&, q] {
      auto ex = Executor::Create(schedule, *backends[q], ToyFactory(4, kToy),
                                 {.pipeline = pair[q].get()});
      if (!ex.ok()) {
        status[q] = ex.status();
        return;
      }
      absl::StatusOr<std::vector<MemoryPlace>> places = ActivationPlaces(**ex, 1 << 30);
      status[q] = places.status();
      if (!places.ok()) return;
      for (const MemoryPlace& place : *places) {
        members[q].insert(members[q].end(), place.members.begin(), place.members.end());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  PS_EXPECT_OK(status[0]);
  PS_EXPECT_OK(status[1]);
  EXPECT_THAT(members[0], ::testing::UnorderedElementsAre(0, 1));
  EXPECT_THAT(members[1], ::testing::UnorderedElementsAre(2, 3));
}

// 1F1B, P = 4 over 2 processes: process 0 runs ranks 0 and 1, process 1 ranks 2 and 3.
// Both return the whole step: every row's spans (the crossing 1 -> 2 as SEND_F and
// RECV_B on rank 1, RECV_F and SEND_B on rank 2), peak bytes and devices, on one clock,
// where no F starts before its input's F has ended; the crossing's receives start at the
// matching send; and the measured costs replay it.
TEST(PipelineProcessesTest, EveryProcessReturnsTheWholeStepOnOneClock) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 4, .num_microbatches = 4}));
  const std::vector<ProcessRun> split = RunSplit(schedule, 1, 2);
  ASSERT_TRUE(split[0].status.ok()) << split[0].status;
  ASSERT_TRUE(split[1].status.ok()) << split[1].status;
  const StepResult& r = split[0].results.back();
  const StepResult& other = split[1].results.back();
  ASSERT_EQ(r.timeline.spans.size(), other.timeline.spans.size());
  for (std::size_t i = 0; i < r.timeline.spans.size(); ++i) {
    const trace::Span& a = r.timeline.spans[i];
    const trace::Span& b = other.timeline.spans[i];
    EXPECT_TRUE(a.rank == b.rank && a.op == b.op && a.stage == b.stage &&
                a.microbatch == b.microbatch && a.start == b.start && a.end == b.end)
        << "span " << i << " differs between the processes";
  }
  EXPECT_EQ(r.issue_micros, other.issue_micros);
  EXPECT_EQ(r.peak_activation_bytes, other.peak_activation_bytes);
  EXPECT_EQ(r.device_of_row, other.device_of_row);
  EXPECT_EQ(r.phases.size(), 8u);                    // ZERO_GRAD and OPTIMIZER of 4 stages
  std::map<std::pair<int, std::string>, int> count;  // (row, op)
  std::map<std::tuple<std::string, int, int>, trace::Span> by;  // (op, stage, mb)
  for (const trace::Span& span : r.timeline.spans) {
    ++count[{span.rank, span.op}];
    by[{span.op, span.stage, span.microbatch}] = span;
  }
  for (int row = 0; row < 4; ++row) {
    EXPECT_EQ((count[{row, "F"}]), 4) << "row " << row;
    EXPECT_EQ((count[{row, "B"}]), 4) << "row " << row;
    EXPECT_GT(r.peak_activation_bytes[row], 0) << "row " << row;
  }
  EXPECT_EQ(std::set<int>(r.device_of_row.begin(), r.device_of_row.end()).size(), 4u);
  EXPECT_EQ((count[{1, "SEND_F"}]), 4);
  EXPECT_EQ((count[{1, "RECV_B"}]), 4);
  EXPECT_EQ((count[{2, "RECV_F"}]), 4);
  EXPECT_EQ((count[{2, "SEND_B"}]), 4);
  EXPECT_EQ((count[{0, "SEND_F"}] + count[{2, "SEND_F"}] + count[{3, "RECV_B"}]), 0);
  auto at = [&by](const std::string& op, int stage, int mb) -> const trace::Span& {
    return by[std::make_tuple(op, stage, mb)];
  };
  for (int m = 0; m < 4; ++m) {
    for (int s = 1; s < 4; ++s) {
      EXPECT_GE(at("F", s, m).start, at("F", s - 1, m).end)
          << "F of stage " << s << " micro-batch " << m << " before its input's";
      EXPECT_GE(at("B", s - 1, m).start, at("B", s, m).end)
          << "B of stage " << s - 1 << " micro-batch " << m << " before its gradient's";
    }
    EXPECT_GE(at("RECV_F", 2, m).start, at("SEND_F", 1, m).start);
    EXPECT_GE(at("RECV_B", 1, m).start, at("SEND_B", 2, m).start);
  }
  EXPECT_EQ(split[0].losses, split[1].losses);
}

// The clock offset between two processes of one host is 0 by their boot ids; measured
// anyway (PIPESCHED_MEASURE_CLOCK_OFFSET=1), threads that share one clock come out within
// a fraction of a millisecond of 0, and the step's spans still keep their order.
TEST(PipelineProcessesTest, TheClockOffsetOfOneHostIsZeroAndMeasuresNearZero) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("gpipe", {.num_ranks = 2, .num_microbatches = 2}));
  for (bool measure : {false, true}) {
    SCOPED_TRACE(measure ? "measured" : "by boot id");
    pipesched::testing::ScopedEnvironment env(std::map<std::string, std::optional<std::string>>{
        {"PIPESCHED_MEASURE_CLOCK_OFFSET",
         measure ? std::optional<std::string>("1") : std::nullopt}});
    PS_ASSERT_OK_AND_ASSIGN(auto pair, comm::CreateInProcessBootstraps(2, {.timeout_seconds = 30}));
    std::vector<double> offsets(2, -1);
    std::vector<std::thread> threads;
    for (int q = 0; q < 2; ++q) {
      threads.emplace_back([&, q] {
        auto backend = HostBackend(2);
        auto ex =
            Executor::Create(schedule, *backend, ToyFactory(2, kToy), {.pipeline = pair[q].get()});
        ASSERT_TRUE(ex.ok()) << ex.status();
        offsets[q] = (*ex)->clock_offset_micros();
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(offsets[0], 0);
    if (measure) {
      EXPECT_LT(std::abs(offsets[1]), 2000) << offsets[1];
    } else {
      EXPECT_EQ(offsets[1], 0);
    }
  }
}

// The file kind (what `pipesched launch` gives) carries the messages as files: ZB-H1 (I and
// W apart), P = 2 with D = 2 over 2 processes trains as one process does.
TEST(PipelineProcessesTest, TheFileBootstrapCarriesThePipelineToo) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("zb-h1", {.num_ranks = 2, .num_microbatches = 4}));
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           absl::StrCat("pipeline_processes_test_", ::getpid()))
                              .string();
  std::filesystem::remove_all(dir);
  std::vector<std::unique_ptr<comm::Bootstrap>> bootstraps(2);
  std::vector<std::thread> joining;
  for (int q = 0; q < 2; ++q) {
    joining.emplace_back([&, q] {
      auto b = comm::CreateFileBootstrap(dir, q, 2, {.timeout_seconds = 30});
      ASSERT_TRUE(b.ok()) << b.status();
      bootstraps[q] = *std::move(b);
    });
  }
  for (std::thread& t : joining) t.join();
  ASSERT_TRUE(bootstraps[0] && bootstraps[1]);
  const std::vector<ProcessRun> split = RunSplit(schedule, 2, bootstraps);
  const std::vector<double> alone = LossesAlone(schedule, 2);
  for (int q = 0; q < 2; ++q) {
    ASSERT_TRUE(split[q].status.ok()) << split[q].status;
    EXPECT_EQ(split[q].losses, alone) << "process " << q;
  }
  std::vector<absl::Status> closed(2);
  std::vector<std::thread> closing;
  for (int q = 0; q < 2; ++q) closing.emplace_back([&, q] { closed[q] = bootstraps[q]->Close(); });
  for (std::thread& t : closing) t.join();
  PS_EXPECT_OK(closed[0]);
  PS_EXPECT_OK(closed[1]);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(PipelineProcessesTest, WhatCannotBeSplitIsRefused) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  auto backend = HostBackend(2);
  PS_ASSERT_OK_AND_ASSIGN(auto three, comm::CreateInProcessBootstraps(3));
  EXPECT_THAT(
      Executor::Create(schedule, *backend, ToyFactory(2, kToy), {.pipeline = three[0].get()}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("a pipeline of 2 ranks cannot be split across 3 processes: give "
                         "at most 2")));
  // One bootstrap for both: refused, not left to wait in an all-reduce that never pairs.
  PS_ASSERT_OK_AND_ASSIGN(auto both, comm::CreateInProcessBootstraps(2));
  EXPECT_THAT(Executor::Create(schedule, *backend, ToyFactory(2, kToy),
                               {.processes = both[0].get(), .pipeline = both[0].get()}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ExecutorOptions::pipeline and ::processes are one bootstrap")));
  // The two processes generated different schedules: named before any step.
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule gpipe,
      scheduler::GenerateSchedule("gpipe", {.num_ranks = 2, .num_microbatches = 4}));
  PS_ASSERT_OK_AND_ASSIGN(auto pair, comm::CreateInProcessBootstraps(2, {.timeout_seconds = 30}));
  std::vector<absl::Status> created(2);
  std::vector<std::thread> threads;
  for (int q = 0; q < 2; ++q) {
    threads.emplace_back([&, q] {
      auto own = HostBackend(2);
      created[q] = Executor::Create(q == 0 ? schedule : gpipe, *own, ToyFactory(2, kToy),
                                    {.pipeline = pair[q].get()})
                       .status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int q = 0; q < 2; ++q) {
    EXPECT_THAT(created[q], StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("process 1's schedule differs from process 0's")))
        << "process " << q;
  }
}

// Process 1's stage fails its F of micro-batch 1: process 0, which waits for that
// micro-batch's gradient, stops with process 1's reason, long before any timeout.
TEST(PipelineProcessesTest, AProcessWhoseStepFailsStopsTheOthers) {
  PS_ASSERT_OK_AND_ASSIGN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule("1f1b", {.num_ranks = 2, .num_microbatches = 4}));
  const auto start = std::chrono::steady_clock::now();
  auto bootstraps = comm::CreateInProcessBootstraps(2, {.timeout_seconds = 120});
  ASSERT_TRUE(bootstraps.ok());
  std::vector<absl::Status> stepped(2);
  std::vector<std::thread> threads;
  for (int q = 0; q < 2; ++q) {
    threads.emplace_back([&, q] {
      auto backend = HostBackend(2);
      ToyOptions toy = kToy;
      if (q == 1) toy.fail_forward_of_microbatch = 1;
      auto ex = Executor::Create(schedule, *backend, ToyFactory(2, toy),
                                 {.step_timeout_seconds = 120, .pipeline = (*bootstraps)[q].get()});
      if (!ex.ok()) {
        stepped[q] = ex.status();
        return;
      }
      std::vector<float> x, t;
      ToyData(0, 4, kValuesPerMicrobatch, x, t);
      stepped[q] = (*ex)->Step(AsInputs(x, t)).status();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(stepped[1], StatusIs(absl::StatusCode::kInternal, HasSubstr("toy F of stage 1")));
  EXPECT_THAT(stepped[0], StatusIs(absl::StatusCode::kAborted, HasSubstr("process 1 failed: ")));
  EXPECT_THAT(stepped[0].message(), HasSubstr("toy F of stage 1"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
}

}  // namespace
}  // namespace pipesched::stages
