// Trainer: the built-in MLP trained by the pipeline executor, the API that
// `pipesched train` drives. It resolves the backend, generates (or takes) the schedule,
// partitions the model into P x V chunks, places replica d / rank r on device
// (d * P + r) mod device_count, feeds the data set a global batch per step
// (D x M x B samples: replica d, micro-batch m gets rows (d * M + m) * B ...), and keeps
// the measured timelines so that Planned() can replay them in the simulator.
//
//   auto trainer = Trainer::Create(config);   // parameters from config.seed
//   trainer->LoadParameters("init.safetensors");  // optional
//   for (...) { auto r = trainer->Step(); r->loss, r->step_micros, r->timeline }
//   trainer->SaveParameters("out.safetensors");
//   auto plan = trainer->Planned();            // scheduler::SimResult
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/model/chunk.h"
#include "pipesched/model/mlp.h"
#include "pipesched/model/optimizer.h"
#include "pipesched/model/safetensors.h"
#include "pipesched/model/synthetic.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/stages/executor.h"
#include "pipesched/stages/partition.h"

namespace pipesched::stages {

struct TrainerConfig {
  std::string schedule = "1f1b";  // registry name, used unless schedule_override is set
  // A schedule made elsewhere (a loaded file): its P, V and M win over the fields below.
  std::optional<scheduler::Schedule> schedule_override;
  int stages = 1;              // P
  int virtual_stages = 0;      // V; 0 = the schedule's default
  int replicas = 1;            // D
  int microbatches = 1;        // M
  int microbatch_size = 4;     // B samples per micro-batch
  model::MlpConfig model;      // num_layers (L), d_hidden (H), d_in, num_classes
  std::vector<int> partition;  // layers per chunk (the head is the last layer); empty = balanced
  model::OptimizerConfig optimizer;
  // A searched schedule's memory limit instead of its own (GeneratorParams::
  // max_activations); 0 = its own. Other schedules ignore it.
  double max_activations = 0;
  // A searched schedule's order refined by local search (GeneratorParams::refine).
  bool refine = false;
  // Activation recomputation on every stage (stages/recompute_stage_work.h): a stage
  // keeps nothing of its own from a micro-batch's F to its backward and runs the F again
  // at the start of its B or I. Less memory, one more F per backward; the same numbers.
  bool recompute = false;
  // Selective recomputation: only these virtual stages recompute (in [0, P x V), each
  // once); with `recompute` every stage does anyway.
  std::vector<int> recompute_stages;
  std::string backend = "auto";  // "auto", "host", "cuda"
  // Host backend: emulated devices; 0 = P x D (one per replica and rank). CUDA: 0 = all.
  int num_devices = 0;
  std::uint64_t seed = 0;  // parameter initialisation and synthetic data
  std::string data_path;   // safetensors with x (N, d_in) F32 and y (N) I32/I64; empty = synthetic
  std::int64_t synthetic_samples = 0;    // 0 = 8 global batches
  bool strict = false;                   // waiting on a never-recorded event is an error
  bool exact_memory_accounting = false;  // see ExecutorOptions
  double step_timeout_seconds = 60;      // hang watchdog (ExecutorOptions); 0 = none
  // Skew injection: every stage work on pipeline rank slow_rank (all its chunks, every
  // replica) really takes slow_factor times longer (stages/slow_stage_work.h). -1 = none.
  int slow_rank = -1;
  double slow_factor = 1;
  // Per-device memory cap in bytes (runtime::BackendOptions::memory_capacity_bytes): a
  // host run then has the memory of a GPU of that size on each device, a CUDA run uses
  // at most this much of each GPU. 0 = none (host: the machine's memory, shared). With a
  // cap the executor accounts memory exactly (ExecutorOptions::exact_memory_accounting):
  // the runtime counts an allocation when the host issues it, so a host running ahead
  // of the streams would otherwise hit the cap with memory a stream-ordered allocator
  // (a GPU's pool) would already have reused.
  std::int64_t device_memory_bytes = 0;
  // The activation pre-flight check (stages/memory_check.h) in Create. Off only for a
  // trainer built to read sizes from (PlanRecompute's): one that runs may exhaust memory
  // in a step.
  bool check_activation_memory = true;
  // Data parallelism across processes (comm/bootstrap.h; not owned, it must outlive the
  // Trainer): every process of the bootstrap creates its Trainer with the same
  // configuration (Create checks, naming the first field that differs) and runs
  // `replicas` replicas of the pipeline; the stages average their gradients over all
  // replicas x processes of them. Each step takes the next job batch (replicas x
  // processes x M x B samples) of the one data set every process makes or loads, and
  // process q feeds its replicas the q-th share of it, so that the parameters are those
  // of one process running every replica. null: one process.
  comm::Bootstrap* processes = nullptr;
  // A pipeline split across processes (ExecutorOptions::pipeline; host backend; not
  // owned): every process of the bootstrap creates its Trainer with the same
  // configuration (checked as for `processes`) and runs its block of the P ranks, for all
  // `replicas` replicas; each step feeds every process the same global batch (only the
  // first stage's process reads the inputs, the last stage's the labels). With
  // `processes` too, a two-dimensional job (comm::SplitJob makes both): `pipeline` holds
  // the processes of this process's pipeline, `processes` those that run the same ranks in
  // the other pipelines, and every process of pipeline g feeds its replicas the g-th share
  // of the job batch. ExportParameters (and so SaveParameters),
  // ExportOptimizerStates and checkpoint saving gather the stages from their processes
  // (an AllGather: every process receives the whole model), so every process must call
  // them; one that fails before its part (its stage's export) must call the bootstrap's
  // Fail, or the others wait for it until the bootstrap's timeout. chunk() is for this
  // process's stages. null: one process runs every rank.
  comm::Bootstrap* pipeline = nullptr;
};

class Trainer {
 public:
  // InvalidArgument with one sentence for anything that does not fit: unknown schedule
  // (NotFound listing the names), P, V, M the schedule rejects, more chunks than layers,
  // a bad partition, B < 1, a data file whose shapes disagree with the model, fewer
  // samples than one global batch, a negative device_memory_bytes; Unavailable for
  // --backend=cuda without a GPU; ResourceExhausted, before the first step, when on the
  // host backend the parameters and optimizer state or the synthetic data do not fit in
  // the machine's memory, or on any backend when the activations the schedule's plan
  // holds at its peak (stages/memory_check.h) do not fit where they live. A plan that
  // passes may still exhaust memory during a step when the host runs ahead of the
  // streams (the check is a floor) unless device_memory_bytes is set.
  // In a job of several processes (TrainerConfig::processes, ::pipeline), a failure also
  // fails the job (Bootstrap::Fail), so that the others stop with its reason rather than
  // wait for this process: any failure of its own, and, in a two-dimensional job, a check
  // that failed in one group of processes (the other group's do not see it). Not a
  // failed check of a job's one group, which every process reports itself, nor the
  // memory checks above (host memory, activations), whose verdicts every process of the
  // job hears: a plan that does not fit one process is refused by every process alike,
  // ResourceExhausted in that process's words ("process 1: ..." in the others), and the
  // job stays usable (bench goes on to its next configuration).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerConfig& config);
  // The checks of Create that need no backend, memory, data or other process: the sizes,
  // the model, the schedule (generated or validated), the backend's name, the partition,
  // the skew injection and the recomputed stages, with Create's errors for them (not
  // whether a GPU is there, nor the memory: each machine's own). For a launcher that
  // refuses a bad configuration once, before it starts the processes of a job.
  static absl::Status CheckConfig(const TrainerConfig& config);
  ~Trainer();

  // Sets every parameter from a safetensors file with the model's PyTorch-style names
  // (blocks.{i}.weight/bias, head.weight/bias), on every replica; a checkpoint
  // (stages/checkpoint.h) gives its parameters, not its optimizer state, once its checksum
  // matches ("checkpoint F rejected: checksum mismatch ..." otherwise). Errors name the file
  // and the tensor: missing, wrong shape or dtype, or not a parameter of this model.
  absl::Status LoadParameters(const std::string& path);
  // The same from tensors in memory (synchronous; errors as LoadParameters).
  absl::Status ImportParameters(const std::vector<model::HostTensor>& tensors);
  // Replica 0's parameters, in model order; synchronous. With config().pipeline, gathered
  // from every process (each must call it).
  absl::StatusOr<std::vector<model::HostTensor>> ExportParameters() const;
  // Replica 0's optimizer state of every stage, in stage order, and the optimizer steps
  // taken (`*step`); with config().pipeline gathered as ExportParameters. Internal when
  // two stages took different numbers of steps.
  absl::StatusOr<std::vector<model::HostTensor>> ExportOptimizerStates(std::int64_t* step) const;
  // Atomic write (temporary file, fsync, rename). FailedPrecondition, writing nothing,
  // when a parameter is not finite (CheckFinite).
  absl::Status SaveParameters(const std::string& path) const;
  // OK, or FailedPrecondition naming the first tensor of `tensors` (F32) that holds a
  // value that is not finite, and where: training that diverged in an update after its
  // last loss (which is finite) leaves such parameters, which nothing can load.
  static absl::Status CheckFinite(const std::vector<model::HostTensor>& tensors);
  // CheckFinite of this process's stages' parameters (replica 0's; the replicas are
  // identical). Local: no exchange.
  absl::Status CheckParametersFinite() const;

  // Across processes (config().processes): FailedPrecondition unless every process holds
  // the same parameters, optimizer state (with its step count), data set and data position
  // (compared by a 64-bit hash of each; with a split pipeline, of its own stages); with
  // config().pipeline, whose processes hold different stages: the same tensors last
  // imported (ImportParameters, LoadParameters, LoadCheckpoint), optimizer step count,
  // data set and data position (both, in a two-dimensional job):
  // Create checks it once the data is made; call it again after loading parameters or a
  // checkpoint (LoadParameters, LoadCheckpoint) on every process, since each process
  // reads its own copy of the file. OK at once within one process. In a two-dimensional
  // job a failure also fails the job (as Create's).
  absl::Status CheckProcessesAgree();

  // One step on the next global batch of the data set (cycling through it); blocks until
  // it has run. Errors as Executor::Step. Across processes: this process's share of the
  // next job batch, and StepResult::loss is the mean over every process's replicas.
  absl::StatusOr<StepResult> Step();
  // One step on an explicit global batch: x (D*M*B, d_in), labels (D*M*B), host memory
  // (across processes: this process's replicas' rows).
  absl::StatusOr<StepResult> Step(const float* x, const std::int32_t* labels);

  // The simulator fed with the median measured per-(stage, op) durations, transfers,
  // all-reduces and activation bytes of the steps run so far (the first step, a warm-up,
  // is left out once there are more). FailedPrecondition before any step.
  absl::StatusOr<scheduler::SimResult> Planned() const;
  // The cost model Planned() simulates with (stages::MeasuredCostModel of the kept
  // steps). FailedPrecondition before any step.
  absl::StatusOr<scheduler::CostModel> MeasuredCosts() const;

  const TrainerConfig& config() const { return config_; }
  const scheduler::Schedule& schedule() const { return executor_->schedule(); }
  const std::vector<LayerRange>& partition() const { return partition_; }
  const model::Dataset& data() const { return data_; }
  Executor& executor() const { return *executor_; }
  // The model chunk of virtual stage `stage` on replica `replica` (through any skew
  // injection wrapper); a stage this process runs (runs_stage).
  model::Chunk& chunk(int replica, int stage) const;
  bool runs_stage(int stage) const { return executor_->runs_stage(stage); }
  // What `stage`'s chunk holds for the whole run (parameters, gradients, optimizer state:
  // model::Chunk::state_bytes), for any stage, this process's or not.
  std::int64_t stage_state_bytes(int stage) const;
  runtime::Backend& backend() const { return *backend_; }
  std::int64_t global_batch() const;  // D x M x B: this process's replicas
  // Every process's replicas together: global_batch() x the processes that hold replicas
  // (TrainerConfig::processes: the pipelines of a two-dimensional job; 1 for a pipeline
  // split across every process).
  std::int64_t job_batch() const;
  int num_processes() const { return config_.processes != nullptr ? config_.processes->size() : 1; }
  int process_rank() const { return config_.processes != nullptr ? config_.processes->rank() : 0; }
  // The next sample of data() that Step() feeds (checkpoints save and restore it).
  std::int64_t data_cursor() const { return cursor_; }
  // InvalidArgument unless 0 <= cursor < data().num_samples() (a checkpoint's cursor).
  absl::Status set_data_cursor(std::int64_t cursor);
  // One line on placement, e.g. "host backend: 4 devices for P=2 x D=2" or
  // "cuda backend: 8 (replica, rank) pairs share 1 GPU round-robin", and a second line,
  // "note: ...", when more host devices compute than the process has CPU cores.
  std::string PlacementSummary() const;
  // What the machine's memory had for activations when Create checked them: what this
  // process could still take, less the data it was about to make (the places of
  // ActivationPlaces, as the pre-flight check uses them); nullopt when unknown.
  std::optional<std::int64_t> machine_activation_bytes() const { return machine_bytes_; }

 private:
  Trainer() = default;
  // Create and CheckProcessesAgree, less their failing the job; `everyone_saw`: the
  // failure is a check that every process of the job made and failed.
  static absl::StatusOr<std::unique_ptr<Trainer>> Build(const TrainerConfig& config,
                                                        bool* everyone_saw);
  absl::Status CompareAcrossProcesses();
  TrainerConfig config_;
  std::unique_ptr<runtime::Backend> backend_;
  std::vector<LayerRange> partition_;
  std::unique_ptr<Executor> executor_;
  model::Dataset data_;
  std::int64_t cursor_ = 0;      // next sample of data_
  std::uint64_t data_hash_ = 0;  // of data_, for CheckProcessesAgree
  // Of the tensors ImportParameters last took (0: none), for CheckProcessesAgree with a
  // pipeline, whose processes cannot compare the stages they hold.
  std::uint64_t imported_hash_ = 0;
  // Every stage's tensors from `local` (this process's stages; with a pipeline, the
  // others' gathered on `channel`), in stage order.
  absl::StatusOr<std::vector<model::HostTensor>> GatherByStage(
      std::string_view channel,
      const std::function<absl::StatusOr<std::vector<model::HostTensor>>(int stage)>& local) const;
  std::optional<std::int64_t> machine_bytes_;  // machine_activation_bytes()
  std::vector<trace::Timeline> timelines_;
  std::vector<std::vector<trace::Span>> phases_;  // StepResult::phases of each step
};

}  // namespace pipesched::stages
