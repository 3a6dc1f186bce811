// Data parallelism across processes (TrainerConfig::processes): N processes of D replicas
// each train as one process of N x D replicas, to the bit, through either bootstrap kind
// (the processes are threads here, each with its own host backend; the CLI test runs
// real processes); a process started with other flags is named, and a failed one stops
// the others.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/status.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/stages/checkpoint.h"
#include "pipesched/stages/trainer.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TrainerConfig Config(const std::string& schedule, int replicas) {
  TrainerConfig config;
  config.schedule = schedule;
  config.stages = 2;
  config.virtual_stages = schedule == "interleaved-1f1b" ? 2 : 0;
  config.microbatches = 4;
  config.microbatch_size = 3;
  config.replicas = replicas;
  config.model = {.d_in = 8, .d_hidden = 16, .num_classes = 5, .num_layers = 4};
  config.optimizer.kind = model::OptimizerKind::kAdamW;
  config.backend = "host";
  config.strict = true;
  config.seed = 7;
  return config;
}

struct JobRun {
  std::vector<model::HostTensor> params;
  std::vector<double> losses;
  absl::Status status;
};

constexpr int kSteps = 3;

JobRun TrainAlone(TrainerConfig config) {
  JobRun run;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  if (!trainer.ok()) {
    run.status = trainer.status();
    return run;
  }
  for (int step = 0; step < kSteps; ++step) {
    absl::StatusOr<StepResult> result = (*trainer)->Step();
    if (!result.ok()) {
      run.status = result.status();
      return run;
    }
    run.losses.push_back(result->loss);
  }
  absl::StatusOr<std::vector<model::HostTensor>> params = (*trainer)->ExportParameters();
  if (params.ok()) run.params = *std::move(params);
  run.status = params.status();
  return run;
}

// Every process's run, on a thread each; configs[q] is process q's. `split`: the
// processes split the pipeline's stages (TrainerConfig::pipeline) instead of holding
// replicas.
std::vector<JobRun> TrainProcesses(std::vector<std::unique_ptr<comm::Bootstrap>>& processes,
                                   const std::vector<TrainerConfig>& configs, bool split = false) {
  std::vector<JobRun> runs(processes.size());
  std::vector<std::thread> threads;
  for (std::size_t q = 0; q < processes.size(); ++q) {
    threads.emplace_back([&, q] {
      TrainerConfig config = configs[q];
      (split ? config.pipeline : config.processes) = processes[q].get();
      runs[q] = TrainAlone(config);
      if (!runs[q].status.ok()) {
        processes[q]->Fail(std::string(runs[q].status.message()));
      } else {
        runs[q].status = processes[q]->Close();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

void ExpectSameBits(const std::vector<model::HostTensor>& got,
                    const std::vector<model::HostTensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name) << what;
    EXPECT_TRUE(got[i].bytes == want[i].bytes) << what << ": " << got[i].name << " differs";
  }
}

TEST(ProcessesTest, NProcessesOfDReplicasTrainAsOneProcessOfNxD) {
  for (const std::string schedule : {"1f1b", "gpipe", "zb-h1", "interleaved-1f1b"}) {
    for (const auto& [num, per] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{3, 1}}) {
      const std::string what = absl::StrCat(schedule, ", ", num, " processes of ", per);
      JobRun one = TrainAlone(Config(schedule, num * per));
      PS_ASSERT_OK(one.status) << what;
      PS_ASSERT_OK_AND_ASSIGN(auto processes, comm::CreateInProcessBootstraps(num));
      std::vector<JobRun> runs =
          TrainProcesses(processes, std::vector<TrainerConfig>(num, Config(schedule, per)));
      for (int q = 0; q < num; ++q) {
        PS_ASSERT_OK(runs[q].status) << what << ", process " << q;
        ExpectSameBits(runs[q].params, one.params, absl::StrCat(what, ", process ", q));
        ASSERT_EQ(runs[q].losses.size(), one.losses.size());
        for (int step = 0; step < kSteps; ++step) {
          // The mean of the processes' means: the same number, summed in another order.
          EXPECT_NEAR(runs[q].losses[step], one.losses[step], 1e-6 * one.losses[step])
              << what << ", step " << step;
        }
      }
    }
  }
}

// TrainerConfig::pipeline: N processes that split the pipeline's stages (each holding its
// block of ranks for every replica) train as one process does, to the bit: the same
// losses, and every process exports the whole model (its stages gathered from the others).
TEST(ProcessesTest, ProcessesThatSplitTheStagesTrainAsOneProcess) {
  for (const std::string schedule : {"1f1b", "zb-h1", "interleaved-1f1b"}) {
    for (const auto& [num, replicas] : {std::pair{2, 1}, std::pair{2, 2}}) {
      const std::string what = absl::StrCat(schedule, " over ", num, " processes, D=", replicas);
      JobRun one = TrainAlone(Config(schedule, replicas));
      PS_ASSERT_OK(one.status) << what;
      PS_ASSERT_OK_AND_ASSIGN(auto processes, comm::CreateInProcessBootstraps(num));
      std::vector<JobRun> runs = TrainProcesses(
          processes, std::vector<TrainerConfig>(num, Config(schedule, replicas)), /*split=*/true);
      for (int q = 0; q < num; ++q) {
        PS_ASSERT_OK(runs[q].status) << what << ", process " << q;
        ExpectSameBits(runs[q].params, one.params, absl::StrCat(what, ", process ", q));
        EXPECT_EQ(runs[q].losses, one.losses) << what << ", process " << q;
      }
    }
  }
}

// Every process of a two-dimensional job (comm::SplitJob(job, k)) on a thread each;
// configs[q] is process q's.
std::vector<JobRun> TrainGrid(std::vector<std::unique_ptr<comm::Bootstrap>>& job, int k,
                              const std::vector<TrainerConfig>& configs) {
  std::vector<JobRun> runs(job.size());
  std::vector<std::thread> threads;
  for (std::size_t q = 0; q < job.size(); ++q) {
    threads.emplace_back([&, q] {
      absl::StatusOr<comm::JobGrid> grid = comm::SplitJob(*job[q], k);
      if (!grid.ok()) {
        runs[q].status = grid.status();
        return;
      }
      TrainerConfig config = configs[q];
      config.pipeline = grid->pipeline.get();
      config.processes = grid->replicas.get();
      // No Fail here on an error: a failure in one group must reach the other by itself.
      runs[q] = TrainAlone(config);
      if (!runs[q].status.ok()) return;
      runs[q].status = grid->pipeline->Close();
      if (runs[q].status.ok()) runs[q].status = grid->replicas->Close();
      if (runs[q].status.ok()) runs[q].status = job[q]->Close();
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// Four processes: two pipelines, each split across two of them. They train as one
// process holding both replicas: the same parameters to the bit, and the loss the mean of
// the pipelines'. A process started with another learning rate is named by its number in
// the job, whichever of its groups finds it.
TEST(ProcessesTest, PipelinesSplitAcrossProcessesTrainAsOneProcessOfTheirReplicas) {
  for (const std::string schedule : {"1f1b", "zb-h1", "interleaved-1f1b"}) {
    JobRun one = TrainAlone(Config(schedule, 2));
    PS_ASSERT_OK(one.status) << schedule;
    PS_ASSERT_OK_AND_ASSIGN(auto job, comm::CreateInProcessBootstraps(4, {.timeout_seconds = 60}));
    std::vector<JobRun> runs =
        TrainGrid(job, /*k=*/2, std::vector<TrainerConfig>(4, Config(schedule, 1)));
    for (int q = 0; q < 4; ++q) {
      PS_ASSERT_OK(runs[q].status) << schedule << ", process " << q;
      ExpectSameBits(runs[q].params, one.params, absl::StrCat(schedule, ", process ", q));
      ASSERT_EQ(runs[q].losses.size(), one.losses.size());
      for (int step = 0; step < kSteps; ++step) {
        EXPECT_NEAR(runs[q].losses[step], one.losses[step], 1e-6 * one.losses[step])
            << schedule << ", process " << q << ", step " << step;
      }
    }
  }
  std::vector<TrainerConfig> configs(4, Config("1f1b", 1));
  configs[3].optimizer.adamw.lr *= 2;
  PS_ASSERT_OK_AND_ASSIGN(auto job, comm::CreateInProcessBootstraps(4, {.timeout_seconds = 60}));
  std::vector<JobRun> runs = TrainGrid(job, 2, configs);
  // Process 3's pipeline is {1, 3}, its replicas {2, 3}: the pipeline's check comes first.
  // Processes 1 and 3 find it (or hear it from the other first: "process 1 failed: ...");
  // 0 and 2 hear it from whichever failed first.
  for (int q = 0; q < 4; ++q) {
    EXPECT_FALSE(runs[q].status.ok()) << "process " << q;
    EXPECT_THAT(std::string(runs[q].status.message()),
                HasSubstr("process 3 was started with \"lr=0.00200000009"))
        << "process " << q;
    EXPECT_THAT(std::string(runs[q].status.message()),
                HasSubstr(", process 1 with \"lr=0.00100000004"))
        << "process " << q;
  }
}

// A split pipeline's checkpoint is the one process's, byte for byte: every process gathers
// (MakeCheckpoint). --init given to one process only is found (the processes compare what
// they loaded). (Resuming from it: CliMain.LaunchSplitsThePipelineAcrossProcesses.)
TEST(ProcessesTest, ASplitPipelinesCheckpointIsOneProcesssAndInitMustBeEverywhere) {
  TrainerConfig config = Config("1f1b", 1);
  PS_ASSERT_OK_AND_ASSIGN(auto alone, Trainer::Create(config));
  for (int step = 0; step < 2; ++step) PS_ASSERT_OK(alone->Step().status());
  PS_ASSERT_OK_AND_ASSIGN(const model::SafetensorsFile want, MakeCheckpoint(*alone));
  const std::string init = ::testing::TempDir() + "/split_init.safetensors";
  PS_ASSERT_OK(alone->SaveParameters(init));

  PS_ASSERT_OK_AND_ASSIGN(auto pair, comm::CreateInProcessBootstraps(2, {.timeout_seconds = 30}));
  std::vector<absl::StatusOr<model::SafetensorsFile>> got(2, absl::UnknownError("not run"));
  std::vector<absl::Status> agreed(2);
  std::vector<std::thread> threads;
  for (int q = 0; q < 2; ++q) {
    threads.emplace_back([&, q] {
      TrainerConfig mine = config;
      mine.pipeline = pair[q].get();
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(mine);
      if (!trainer.ok()) {
        got[q] = trainer.status();
        return;
      }
      for (int step = 0; step < 2; ++step) {
        if (absl::Status s = (*trainer)->Step().status(); !s.ok()) {
          got[q] = s;
          return;
        }
      }
      got[q] = MakeCheckpoint(**trainer);
      // Process 1 alone loads --init: the processes' stages no longer make one model.
      if (q == 1) (void)(*trainer)->LoadParameters(init);
      agreed[q] = (*trainer)->CheckProcessesAgree();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int q = 0; q < 2; ++q) {
    ASSERT_TRUE(got[q].ok()) << "process " << q << ": " << got[q].status();
    EXPECT_EQ(got[q]->metadata, want.metadata) << "process " << q;
    ExpectSameBits(got[q]->tensors, want.tensors, absl::StrCat("process ", q));
    EXPECT_THAT(agreed[q], StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("process 1's state (the parameters loaded, optimizer "
                                              "steps, data set and data position) differs from "
                                              "process 0's")))
        << "process " << q;
  }
  std::filesystem::remove(init);
}

TEST(ProcessesTest, TheFileBootstrapCarriesTheSameJob) {
  JobRun one = TrainAlone(Config("1f1b", 2));
  PS_ASSERT_OK(one.status);
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / absl::StrCat("processes_test_", ::getpid()))
          .string();
  std::filesystem::remove_all(dir);
  std::vector<std::unique_ptr<comm::Bootstrap>> processes(2);
  for (int q = 0; q < 2; ++q) {
    PS_ASSERT_OK_AND_ASSIGN(processes[q], comm::CreateFileBootstrap(dir, q, 2));
  }
  std::vector<JobRun> runs =
      TrainProcesses(processes, std::vector<TrainerConfig>(2, Config("1f1b", 1)));
  for (int q = 0; q < 2; ++q) {
    PS_ASSERT_OK(runs[q].status) << "process " << q;
    ExpectSameBits(runs[q].params, one.params, absl::StrCat("file, process ", q));
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "the bootstrap's Close left " << dir;
}

TEST(ProcessesTest, AProcessStartedWithOtherFlagsIsNamed) {
  PS_ASSERT_OK_AND_ASSIGN(auto processes, comm::CreateInProcessBootstraps(2));
  TrainerConfig other = Config("1f1b", 1);
  other.microbatches = 8;
  std::vector<JobRun> runs = TrainProcesses(processes, {Config("1f1b", 1), other});
  for (int q = 0; q < 2; ++q) {
    EXPECT_THAT(runs[q].status,
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("process 1 was started with \"microbatches=8\", process 0 "
                                   "with \"microbatches=4\": every process of a job needs the "
                                   "same configuration")))
        << "process " << q;
  }
}

TEST(ProcessesTest, AProcessThatFailsStopsTheOthers) {
  // Process 1's configuration is refused before it joins (B = 0); process 0 would wait
  // for it for the bootstrap's whole timeout, but hears of the failure at once.
  PS_ASSERT_OK_AND_ASSIGN(auto processes,
                          comm::CreateInProcessBootstraps(2, {.timeout_seconds = 10}));
  TrainerConfig bad = Config("1f1b", 1);
  bad.microbatch_size = 0;
  std::vector<JobRun> runs = TrainProcesses(processes, {Config("1f1b", 1), bad});
  EXPECT_THAT(runs[1].status, StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("micro-batch size must be at least 1")));
  EXPECT_THAT(runs[0].status,
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("process 1 failed: the micro-batch size must be at least 1")));
}

// A failure of one process's own that the others do not hear as a verdict (its step
// timeout, which the processes need not share, is refused) fails the job at Create: the
// others stop with its reason at once rather than wait for it in their next exchange
// until the timeout. Both kinds of job.
TEST(ProcessesTest, AProcessWhoseTrainerCannotBeMadeStopsTheOthers) {
  for (const bool split : {false, true}) {
    SCOPED_TRACE(split ? "split" : "replicas");
    PS_ASSERT_OK_AND_ASSIGN(auto processes,
                            comm::CreateInProcessBootstraps(2, {.timeout_seconds = 60}));
    std::vector<absl::Status> created(2);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int q = 0; q < 2; ++q) {
      threads.emplace_back([&, q] {
        TrainerConfig config = Config("1f1b", 1);
        (split ? config.pipeline : config.processes) = processes[q].get();
        if (q == 1) config.step_timeout_seconds = -1;
        absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
        created[q] = trainer.status();
        // No Fail here: Create's own.
        if (trainer.ok()) created[q] = (*trainer)->Step().status();
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);
    EXPECT_THAT(created[1],
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step timeout")));
    EXPECT_THAT(created[0], StatusIs(absl::StatusCode::kAborted, HasSubstr("process 1 failed: ")));
    EXPECT_THAT(created[0].message(), HasSubstr("step timeout"));
  }
}

// Places `config` in `job` as process `job.rank()` of pipelines of `k` processes: k = 1,
// whole replicas (TrainerConfig::processes); k = the job's size, a split pipeline
// (::pipeline); between, both groups of comm::SplitJob, kept in `*grid`.
absl::Status PlaceInJob(comm::Bootstrap& job, int k, TrainerConfig& config, comm::JobGrid* grid) {
  if (k == 1) {
    config.processes = &job;
  } else if (k == job.size()) {
    config.pipeline = &job;
  } else {
    PS_ASSIGN_OR_RETURN(*grid, comm::SplitJob(job, k));
    config.pipeline = grid->pipeline.get();
    config.processes = grid->replicas.get();
  }
  return absl::OkStatus();
}

// A job of n in-process processes in pipelines of k.
struct JobCase {
  const char* name;
  int n, k;  // processes, and processes per pipeline
};
constexpr JobCase kJobCases[] = {{"replicas", 2, 1}, {"split", 2, 2}, {"grid", 4, 2}};

// Runs body(q, config) for every process q of a job `c` at once, each on a thread of its
// own, with `base` placed as process q (PlaceInJob); what each returned, or its
// placement's failure, and the job's bootstraps (for their Failure()).
std::vector<absl::Status> RunInJob(
    const JobCase& c, const TrainerConfig& base,
    const std::function<absl::Status(int q, TrainerConfig& config)>& body,
    std::vector<std::unique_ptr<comm::Bootstrap>>* job) {
  absl::StatusOr<std::vector<std::unique_ptr<comm::Bootstrap>>> made =
      comm::CreateInProcessBootstraps(c.n, {.timeout_seconds = 60});
  if (!made.ok()) return std::vector<absl::Status>(c.n, made.status());
  *job = *std::move(made);
  std::vector<absl::Status> status(c.n);
  std::vector<std::thread> threads;
  for (int q = 0; q < c.n; ++q) {
    threads.emplace_back([&, q] {
      TrainerConfig config = base;
      comm::JobGrid grid;
      status[q] = PlaceInJob(*(*job)[q], c.k, config, &grid);
      if (status[q].ok()) status[q] = body(q, config);
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

// A plan whose activations do not fit one process's memory (its device memory cap, which
// the processes need not share) is refused by every process alike, in that process's
// words, and the job is not failed: the processes can go on together (bench skips the
// configuration and runs the next). Replicas, a split pipeline, two pipelines of two.
TEST(ProcessesTest, ActivationsThatDoNotFitOneProcessAreRefusedByAll) {
  for (const JobCase& c : kJobCases) {
    SCOPED_TRACE(c.name);
    std::vector<std::unique_ptr<comm::Bootstrap>> job;
    const std::vector<absl::Status> created = RunInJob(
        c, Config("gpipe", 1),
        [&](int q, TrainerConfig& config) {
          // The model fits 10500 bytes a device, gpipe's four micro-batches in flight do not.
          if (q == c.n - 1) config.device_memory_bytes = 10500;
          return Trainer::Create(config).status();
        },
        &job);
    ASSERT_EQ(static_cast<int>(job.size()), c.n) << created[0];
    const int last = c.n - 1;
    EXPECT_THAT(created[last], StatusIs(absl::StatusCode::kResourceExhausted,
                                        HasSubstr("gpipe's activations do not fit in host:")));
    EXPECT_THAT(created[last].message(), Not(HasSubstr("process ")));
    for (int q = 0; q < last; ++q) {
      EXPECT_THAT(created[q], StatusIs(absl::StatusCode::kResourceExhausted,
                                       HasSubstr(absl::StrCat("process ", last,
                                                              ": gpipe's activations do not fit "
                                                              "in host:"))))
          << "process " << q;
    }
    for (int q = 0; q < c.n; ++q) PS_EXPECT_OK(job[q]->Failure()) << "process " << q;
  }
}

// A model whose parameters do not fit one process's devices (its device memory cap) is
// refused by every process alike while the executor is made -- in the words of the
// process whose device it is, before any exchange of the pipeline's or the replicas'
// -- and the job is not failed: the same processes then train the next configuration
// together. Replicas, a split pipeline, two pipelines of two.
TEST(ProcessesTest, AModelThatDoesNotFitOneProcessIsRefusedByAllAndTheJobGoesOn) {
  for (const JobCase& c : kJobCases) {
    SCOPED_TRACE(c.name);
    std::vector<std::unique_ptr<comm::Bootstrap>> job;
    std::vector<absl::Status> next(c.n);
    const std::vector<absl::Status> created = RunInJob(
        c, Config("1f1b", 1),
        [&](int q, TrainerConfig& config) {
          // No stage's parameters, gradients and AdamW moments fit 2000 bytes.
          if (q == c.n - 1) config.device_memory_bytes = 2000;
          const absl::Status refused = Trainer::Create(config).status();
          config.device_memory_bytes = 0;
          absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
          next[q] = trainer.ok() ? (*trainer)->Step().status() : trainer.status();
          return refused;
        },
        &job);
    ASSERT_EQ(static_cast<int>(job.size()), c.n) << created[0];
    const int last = c.n - 1;
    const std::string refusal =
        "the model does not fit the device memory cap of 2.0 KiB (--device-memory) before any "
        "activation: host:";
    EXPECT_THAT(created[last],
                StatusIs(absl::StatusCode::kResourceExhausted, ::testing::StartsWith(refusal)));
    for (int q = 0; q < last; ++q) {
      EXPECT_THAT(created[q],
                  StatusIs(absl::StatusCode::kResourceExhausted,
                           ::testing::StartsWith(absl::StrCat("process ", last, ": ", refusal))))
          << "process " << q;
    }
    for (int q = 0; q < c.n; ++q) {
      PS_EXPECT_OK(job[q]->Failure()) << "process " << q;
      PS_EXPECT_OK(next[q]) << "process " << q;
    }
  }
}

// Process 0 of a job whose processes hold replicas draws every process's
// (Executor::GatherReplicas): the rows one process holding them all has, each with its
// replica's actions; a data-parallel job of two processes, and two pipelines of two, where
// the processes of block 1 keep their own step (block 0's gather the pipelines).
TEST(ProcessesTest, ProcessZeroGathersEveryProcesssReplicas) {
  // The compute spans of each row: (op, stage, micro-batch), sorted.
  auto compute_rows = [](const trace::Timeline& timeline) {
    std::vector<std::vector<std::tuple<std::string, int, int>>> rows(timeline.num_ranks);
    for (const trace::Span& span : timeline.spans) {
      if (span.lane != trace::kComputeLane) continue;
      rows.at(span.rank).emplace_back(span.op, span.stage, span.microbatch);
    }
    for (auto& row : rows) std::sort(row.begin(), row.end());
    return rows;
  };
  for (const JobCase& c : {JobCase{"replicas", 2, 1}, JobCase{"grid", 4, 2}}) {
    SCOPED_TRACE(c.name);
    const int pipelines = c.n / c.k;
    PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> alone,
                            Trainer::Create(Config("1f1b", pipelines)));
    PS_ASSERT_OK_AND_ASSIGN(const StepResult one, alone->Step());
    PS_ASSERT_OK_AND_ASSIGN(auto job,
                            comm::CreateInProcessBootstraps(c.n, {.timeout_seconds = 60}));
    std::vector<absl::StatusOr<StepResult>> gathered(c.n, absl::UnknownError("not run"));
    std::vector<int> own_rows(c.n, 0);
    std::vector<std::thread> threads;
    for (int q = 0; q < c.n; ++q) {
      threads.emplace_back([&, q] {
        TrainerConfig config = Config("1f1b", 1);
        comm::JobGrid grid;
        if (absl::Status placed = PlaceInJob(*job[q], c.k, config, &grid); !placed.ok()) {
          gathered[q] = placed;
          return;
        }
        absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
        if (!trainer.ok()) {
          gathered[q] = trainer.status();
          return;
        }
        absl::StatusOr<StepResult> step = (*trainer)->Step();
        if (!step.ok()) {
          gathered[q] = step.status();
          return;
        }
        own_rows[q] = step->timeline.num_ranks;
        gathered[q] = (*trainer)->executor().GatherReplicas(*step);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int q = 0; q < c.n; ++q)
      ASSERT_TRUE(gathered[q].ok()) << q << ": " << gathered[q].status();
    const trace::Timeline& all = gathered[0]->timeline;
    EXPECT_EQ(all.num_ranks, one.timeline.num_ranks);
    EXPECT_EQ(all.ranks_per_replica, 2);
    EXPECT_EQ(compute_rows(all), compute_rows(one.timeline));
    EXPECT_EQ(gathered[0]->issue_micros.size(), all.spans.size());
    EXPECT_EQ(gathered[0]->phases.size(), one.phases.size());  // a zero-grad and step a stage
    for (int q = 0; q < c.n; ++q) {
      // Block 0 (the first n / k processes) gathers; block 1 keeps its pipeline's rows.
      EXPECT_EQ(gathered[q]->timeline.num_ranks, q < pipelines ? all.num_ranks : own_rows[q])
          << "process " << q;
    }
  }
}

// After --resume each process has loaded its own copy of a checkpoint: one whose
// optimizer state (AdamW's moments, or its step count, which sets the bias correction)
// differs is refused even when the parameters agree, as its updates would drift apart.
TEST(ProcessesTest, ProcessesWhoseOptimizerStatesDifferAreRefused) {
  for (const bool only_the_step_count : {false, true}) {
    SCOPED_TRACE(only_the_step_count ? "step count" : "moments");
    PS_ASSERT_OK_AND_ASSIGN(auto processes,
                            comm::CreateInProcessBootstraps(2, {.timeout_seconds = 10}));
    std::vector<absl::Status> agreed(2);
    std::vector<std::thread> threads;
    for (int q = 0; q < 2; ++q) {
      threads.emplace_back([&, q] {
        TrainerConfig config = Config("1f1b", 1);
        config.processes = processes[q].get();
        absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
        if (!trainer.ok()) {
          agreed[q] = trainer.status();
          processes[q]->Fail(std::string(trainer.status().message()));
          return;
        }
        if (q == 1) {
          model::Chunk& chunk = (*trainer)->chunk(0, 1);
          absl::StatusOr<std::vector<model::HostTensor>> state = chunk.ExportOptimizerState();
          if (!state.ok() || state->empty() || state->front().bytes.empty()) {
            agreed[q] = absl::InternalError("no optimizer state to change");
            processes[q]->Fail(std::string(agreed[q].message()));
            return;
          }
          if (!only_the_step_count) state->front().bytes[0] ^= 1;
          agreed[q] = chunk.ImportOptimizerState(*state, only_the_step_count ? 5 : 0);
          if (!agreed[q].ok()) {
            processes[q]->Fail(std::string(agreed[q].message()));
            return;
          }
        }
        agreed[q] = (*trainer)->CheckProcessesAgree();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int q = 0; q < 2; ++q) {
      EXPECT_THAT(agreed[q], StatusIs(absl::StatusCode::kFailedPrecondition,
                                      HasSubstr("process 1's state (parameters, optimizer state, "
                                                "data set and data position) differs from "
                                                "process 0's")))
          << "process " << q;
    }
  }
}

}  // namespace
}  // namespace pipesched::stages
