// The Trainer (stages/trainer.h).
#include "pipesched/stages/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "pipesched/base/bytes.h"
#include "pipesched/base/hash.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/model/math.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/stages/checkpoint.h"
#include "pipesched/stages/memory_check.h"
#include "pipesched/stages/mlp_stage_work.h"
#include "pipesched/stages/recompute_stage_work.h"
#include "pipesched/stages/slow_stage_work.h"

namespace pipesched::stages {
namespace {

// The MLP behind a stage work the Trainer made (possibly wrapped for skew injection and
// recomputation).
MlpStageWork& Mlp(StageWork& work) {
  if (auto* slow = dynamic_cast<SlowStageWork*>(&work)) return Mlp(slow->inner());
  if (auto* rc = dynamic_cast<RecomputeStageWork*>(&work)) return Mlp(rc->inner());
  return static_cast<MlpStageWork&>(work);
}

// Replicas of the job: this process's, times the processes.
int JobReplicas(const TrainerConfig& config) {
  return config.replicas * (config.processes != nullptr ? config.processes->size() : 1);
}

// What every process of a job must agree on, a field per line ("name=value"): what
// makes the parameters and the data the same. Local choices (devices, memory cap,
// skew injection, timeouts) are left out.
std::string JobFingerprint(const TrainerConfig& c, const scheduler::Schedule& schedule,
                           runtime::BackendKind kind) {
  std::vector<int> recompute = c.recompute_stages;
  std::sort(recompute.begin(), recompute.end());
  const model::OptimizerConfig& o = c.optimizer;
  const bool adamw = o.kind == model::OptimizerKind::kAdamW;
  auto number = [](float x) { return ShortestNumber(x); };
  return absl::StrCat(
      "schedule=", schedule.name, "\nstages=", schedule.num_ranks(),
      "\nvirtual=", schedule.num_chunks(), "\nmicrobatches=", schedule.num_microbatches,
      "\nreplicas=", c.replicas, "\nmicrobatch-size=", c.microbatch_size,
      "\nlayers=", c.model.num_layers, "\nhidden=", c.model.d_hidden, "\ninputs=", c.model.d_in,
      "\nclasses=", c.model.num_classes, "\npartition=", absl::StrJoin(c.partition, ","),
      "\noptimizer=", Absl(model::OptimizerName(o.kind)),
      "\nlr=", number(adamw ? o.adamw.lr : o.sgd.lr),
      "\nweight-decay=", number(adamw ? o.adamw.weight_decay : o.sgd.weight_decay),
      adamw ? absl::StrCat("\nbetas=", number(o.adamw.beta1), ",", number(o.adamw.beta2),
                           "\neps=", number(o.adamw.eps))
            : absl::StrCat("\nmomentum=", number(o.sgd.momentum)),
      "\nrecompute=", c.recompute ? "all" : absl::StrJoin(recompute, ","),
      "\nbackend=", Absl(runtime::BackendName(kind)), "\nseed=", c.seed, "\ndata=", c.data_path,
      "\nsynthetic-samples=", c.synthetic_samples,
      "\nprocesses per pipeline=", c.pipeline != nullptr ? c.pipeline->size() : 1,
      // Last: a differing order with the same flags is a searched or loaded schedule.
      "\nschedule order=", absl::Hex(schedule.OrderFingerprint(), absl::kZeroPad16));
}

// Every process's fingerprint equals rank 0's, or FailedPrecondition naming the first
// field that differs and both values.
absl::Status CheckSameJob(comm::Bootstrap& processes, const std::string& fingerprint) {
  return comm::CheckSameFields(processes, "trainer", fingerprint,
                               "every process of a job needs the same configuration (only the "
                               "process rank differs)");
}

// A tensor as the processes of a split pipeline send them to each other (base/bytes.h):
// its name, dtype, rank, shape and bytes.
void PutTensor(ByteWriter& out, const model::HostTensor& t) {
  out.Text(t.name);
  out.Int(static_cast<std::int64_t>(t.dtype));
  out.Int(static_cast<std::int64_t>(t.shape.size()));
  for (std::int64_t d : t.shape) out.Int(d);
  out.Text(t.bytes);
}

model::HostTensor TakeTensor(ByteReader& in) {
  model::HostTensor t;
  t.name = in.Text();
  t.dtype = static_cast<model::DType>(in.Int());
  const std::int64_t rank = in.Count(8);
  for (std::int64_t i = 0; i < rank; ++i) t.shape.push_back(in.Int());
  t.bytes = in.Text();
  return t;
}

// Samples of the synthetic data set: --synthetic-samples, else 8 global batches.
std::int64_t SyntheticSamples(const TrainerConfig& config, std::int64_t global_batch) {
  return config.synthetic_samples > 0 ? config.synthetic_samples : 8 * global_batch;
}

// `bytes` as an int64, INT64_MAX when it is more: sizes that large do not fit anyway.
std::int64_t Saturate(__int128 bytes) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  return bytes > kMax ? kMax : static_cast<std::int64_t>(bytes);
}

// Host memory the data will take: the synthetic data set (x as fp32, y as int32), or a
// --data file's size (what loading it reads), plus a step's inputs staged on the host.
// Saturates at INT64_MAX.
std::int64_t HostDataBytes(const TrainerConfig& config) {
  const __int128 g =
      static_cast<__int128>(JobReplicas(config)) * config.microbatches * config.microbatch_size;
  const __int128 d_in = config.model.d_in;
  const __int128 inputs = 2 * g * d_in * 4;
  if (config.data_path.empty()) {
    const __int128 samples =
        config.synthetic_samples > 0 ? static_cast<__int128>(config.synthetic_samples) : 8 * g;
    return Saturate(samples * (d_in + 1) * 4 + inputs);
  }
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(config.data_path, error);
  return Saturate((error ? 0 : static_cast<__int128>(size)) + inputs);
}

// On the host backend every device's memory is the machine's: refuses, before anything is
// allocated, a model whose parameters, gradients and optimizer state alone (exact: the
// chunks allocate just that) exceed what the machine has available, then the same with
// the synthetic data set and a step's inputs added. Activations and buffers come on top;
// the backend checks each allocation as it is made.
absl::Status CheckHostMemory(const TrainerConfig& config,
                             const std::vector<LayerRange>& partition) {
  const std::optional<MemoryHeadroom> headroom = HostMemoryHeadroom();
  if (!headroom.has_value()) return absl::OkStatus();
  const std::optional<std::int64_t> available = headroom->bytes;
  const model::OptimizerConfig& opt = config.optimizer;
  const int states = model::OptimizerStateBuffers(opt);
  std::int64_t params = 0;
  for (const LayerRange& r : partition) params += model::ParamCount(config.model, r.first, r.last);
  const std::int64_t need = config.replicas * model::StateBytes(params, opt);
  if (need > *available) {
    const char* state_name = opt.kind == model::OptimizerKind::kAdamW ? " and AdamW's two moments"
                             : states == 1                            ? " and SGD momentum"
                                                                      : "";
    // Only what would make it fit, besides a smaller model.
    std::string also;
    if (config.replicas > 1 && need / config.replicas <= *available) {
      also += absl::StrCat(", or fewer --replicas (at most ", *available / (need / config.replicas),
                           ")");
    }
    if (states > 0 && need / (2 + states) * 2 <= *available) {
      also += ", or --optimizer=sgd --momentum=0 (no optimizer state)";
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model does not fit in host memory: ", params, " parameters x ", config.replicas,
        " replica(s), with gradients", state_name, ", need ", HumanBytes(need), " but ",
        DescribeHeadroom(*headroom), "; use a smaller --hidden or --layers", also));
  }
  if (!config.data_path.empty()) return absl::OkStatus();
  const std::int64_t g =
      static_cast<std::int64_t>(JobReplicas(config)) * config.microbatches * config.microbatch_size;
  const std::int64_t samples = SyntheticSamples(config, g);
  const std::int64_t d_in = config.model.d_in;
  const std::int64_t data = HostDataBytes(config);
  if (Saturate(static_cast<__int128>(need) + data) <= *available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the synthetic data does not fit in host memory: ", samples, " samples of ", d_in,
      " inputs (8 global batches of replicas x microbatches x microbatch-size = ", g,
      ") and a step's inputs need ", HumanBytes(data), ", the model ", HumanBytes(need), ", but ",
      DescribeHeadroom(*headroom),
      "; use a smaller --microbatch-size, --microbatches or --inputs"));
}

}  // namespace

model::Chunk& Trainer::chunk(int replica, int stage) const {
  return Mlp(executor_->work(replica, stage)).chunk();
}

std::int64_t Trainer::stage_state_bytes(int stage) const {
  if (runs_stage(stage)) return chunk(0, stage).state_bytes();
  return model::StateBytes(
      model::ParamCount(config_.model, partition_[stage].first, partition_[stage].last),
      config_.optimizer);
}

absl::StatusOr<std::vector<model::HostTensor>> Trainer::GatherByStage(
    std::string_view channel,
    const std::function<absl::StatusOr<std::vector<model::HostTensor>>(int stage)>& local) const {
  const int S = executor_->num_stages();
  std::vector<model::HostTensor> all;
  if (config_.pipeline == nullptr) {
    for (int s = 0; s < S; ++s) {
      PS_ASSIGN_OR_RETURN(std::vector<model::HostTensor> part, local(s));
      for (model::HostTensor& t : part) all.push_back(std::move(t));
    }
    return all;
  }
  // This process's stages: its stage number, its tensor count, its tensors.
  ByteWriter mine;
  for (int s = 0; s < S; ++s) {
    if (!runs_stage(s)) continue;
    PS_ASSIGN_OR_RETURN(const std::vector<model::HostTensor> part, local(s));
    mine.Int(s);
    mine.Int(static_cast<std::int64_t>(part.size()));
    for (const model::HostTensor& t : part) PutTensor(mine, t);
  }
  PS_ASSIGN_OR_RETURN(const std::vector<std::string> parts,
                      config_.pipeline->AllGather(channel, mine.bytes()));
  std::vector<std::optional<std::vector<model::HostTensor>>> by_stage(S);
  for (std::size_t q = 0; q < parts.size(); ++q) {
    ByteReader in(parts[q]);
    while (in.ok() && !in.empty()) {
      const std::int64_t s = in.Int();
      const std::int64_t n = in.Count(1);
      if (s < 0 || s >= S || by_stage[s].has_value()) in.Fail();
      std::vector<model::HostTensor> tensors;
      for (std::int64_t i = 0; in.ok() && i < n; ++i) tensors.push_back(TakeTensor(in));
      if (!in.ok()) {
        return absl::InternalError(absl::StrCat("process ",
                                                config_.pipeline->job_rank(static_cast<int>(q)),
                                                " sent the tensors of its stages ('", Absl(channel),
                                                "') in a form this one cannot read"));
      }
      by_stage[s] = std::move(tensors);
    }
  }
  for (int s = 0; s < S; ++s) {
    if (!by_stage[s].has_value()) {
      return absl::InternalError(absl::StrCat("no process sent the tensors of stage ", s));
    }
    for (model::HostTensor& t : *by_stage[s]) all.push_back(std::move(t));
  }
  return all;
}

Trainer::~Trainer() {
  executor_.reset();  // streams, events and buffers before their backend
}

std::int64_t Trainer::global_batch() const {
  return static_cast<std::int64_t>(config_.replicas) * executor_->num_microbatches() *
         config_.microbatch_size;
}

std::int64_t Trainer::job_batch() const { return global_batch() * num_processes(); }

namespace {

// What Trainer::CheckConfig finds, for Create to go on with.
struct CheckedConfig {
  scheduler::Schedule schedule;
  // The backend: nullopt for "auto" when not resolved (CheckConfig does not look for a GPU).
  std::optional<runtime::BackendKind> kind;
  std::vector<LayerRange> partition;
  std::vector<bool> recomputes;  // [stage]
};

// The configuration's own checks, first part: sizes, the model, the schedule and the
// backend's name (resolving "auto" only when `resolve_auto`). Create compares the job
// across processes after this part, so that a process started with other flags is named
// rather than failing on its own in the second part.
absl::StatusOr<CheckedConfig> CheckShape(const TrainerConfig& config, bool resolve_auto) {
  if (config.microbatch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the micro-batch size must be at least 1, not ", config.microbatch_size));
  }
  // The upper limits keep every size product (parameters x replicas, samples x inputs)
  // inside 64 bits; both are far above what a machine runs.
  constexpr int kMaxReplicas = 4096;
  constexpr int kMaxMicrobatchSize = 1 << 20;
  if (config.replicas < 1 || config.replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(absl::StrCat("the number of replicas must be in [1, ",
                                                   kMaxReplicas, "], not ", config.replicas));
  }
  if (config.microbatch_size > kMaxMicrobatchSize) {
    return absl::InvalidArgumentError(absl::StrCat("the micro-batch size must be at most ",
                                                   kMaxMicrobatchSize, ", not ",
                                                   config.microbatch_size));
  }
  PS_RETURN_IF_ERROR(config.model.Validate());
  // Negative counts are not "the default" (0 is).
  if (config.num_devices < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of devices must be 0 (one per rank and replica) or more, not ",
                     config.num_devices));
  }
  // Up to 2^40 samples: their bytes stay within 64 bits for any model width.
  constexpr std::int64_t kMaxSyntheticSamples = std::int64_t{1} << 40;
  if (config.synthetic_samples < 0 || config.synthetic_samples > kMaxSyntheticSamples) {
    return absl::InvalidArgumentError(
        absl::StrCat("the synthetic data set's size must be 0 (8 global batches) to ",
                     kMaxSyntheticSamples, " samples, not ", config.synthetic_samples));
  }
  if (config.slow_rank >= 0 && !(config.slow_factor >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the slow-down factor must be at least 1, not ", config.slow_factor));
  }
  if (config.device_memory_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the device memory cap must be positive (or 0 for none), not ",
                     config.device_memory_bytes));
  }

  CheckedConfig checked;
  scheduler::Schedule& schedule = checked.schedule;
  if (config.schedule_override) {
    schedule = *config.schedule_override;
    // Before its shape is used: a hand-made schedule's P x V may not even fit an int.
    PS_RETURN_IF_ERROR(scheduler::Validate(schedule));
  } else {
    PS_ASSIGN_OR_RETURN(schedule, scheduler::GenerateSchedule(
                                      config.schedule, {.num_ranks = config.stages,
                                                        .num_microbatches = config.microbatches,
                                                        .num_chunks = config.virtual_stages,
                                                        .max_activations = config.max_activations,
                                                        .refine = config.refine}));
  }
  if (config.backend == "auto" && !resolve_auto) return checked;
  PS_ASSIGN_OR_RETURN(checked.kind, runtime::ResolveBackend(config.backend));
  return checked;
}

// The second part: the partition, the skew injection and the recomputed stages.
absl::Status CheckStages(const TrainerConfig& config, CheckedConfig& checked) {
  const int P = checked.schedule.num_ranks(), S = checked.schedule.num_stages();
  PS_ASSIGN_OR_RETURN(checked.partition, PartitionMlp(config.model, S, config.partition));
  if (config.slow_rank >= 0 && config.slow_factor != 1 &&
      checked.kind == runtime::BackendKind::kCuda) {
    // SlowStageWork holds the stream in a host function; CUDA may run the host functions
    // of all streams one at a time, so every rank (and every stream-ordered free, which
    // also uses one) would wait for the slow rank's holds.
    return absl::InvalidArgumentError(
        "slowing a stage down needs the host backend (on CUDA its hold would stall every "
        "stream of the GPU); use --backend=host");
  }
  if (config.slow_rank >= P) {
    return absl::InvalidArgumentError(absl::StrCat("cannot slow down rank ", config.slow_rank,
                                                   ": the pipeline has ranks 0 to ", P - 1));
  }
  checked.recomputes.assign(S, config.recompute);
  for (int s : config.recompute_stages) {
    if (s < 0 || s >= S) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot recompute stage ", s, ": the pipeline has stages 0 to ", S - 1, " (P x V)"));
    }
    if (checked.recomputes[s] && !config.recompute) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", s, " is listed twice for recomputation"));
    }
    checked.recomputes[s] = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Trainer::CheckConfig(const TrainerConfig& config) {
  PS_ASSIGN_OR_RETURN(CheckedConfig checked, CheckShape(config, /*resolve_auto=*/false));
  return CheckStages(config, checked);
}

namespace {

// The bootstraps of `config` that hold other processes: 0 (alone), 1 (a job of one kind,
// or one of a two-dimensional job's groups of one) or 2.
int GroupsOfSeveral(const TrainerConfig& config) {
  int n = 0;
  for (const comm::Bootstrap* group : {config.pipeline, config.processes}) {
    n += group != nullptr && group->size() > 1;
  }
  return n;
}

// The bootstrap whose Fail stops the job's other processes (null alone).
comm::Bootstrap* JobToFail(const TrainerConfig& config) {
  if (config.pipeline != nullptr && config.pipeline->size() > 1) return config.pipeline;
  if (config.processes != nullptr && config.processes->size() > 1) return config.processes;
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerConfig& config) {
  bool everyone_saw = false;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Build(config, &everyone_saw);
  // The others would wait for this process: after a failure of its own (memory, its
  // devices, a data file), and, in a two-dimensional job, after a check that failed in
  // one group (the other group's processes do not see it).
  if (comm::Bootstrap* job = JobToFail(config); !t.ok() && job != nullptr && !everyone_saw) {
    job->Fail(std::string(t.status().message()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Build(const TrainerConfig& config,
                                                        bool* everyone_saw) {
  // A check of the one group of a job's processes fails in every process at once.
  const bool one_group = GroupsOfSeveral(config) == 1;
  auto t = std::unique_ptr<Trainer>(new Trainer());
  t->config_ = config;
  PS_ASSIGN_OR_RETURN(CheckedConfig checked, CheckShape(config, /*resolve_auto=*/true));
  const scheduler::Schedule& schedule = checked.schedule;
  const runtime::BackendKind kind = *checked.kind;
  const int P = schedule.num_ranks(), D = config.replicas;
  // First, before anything is allocated: a process started with other flags fails here,
  // not in a collective that never matches. Both ways of a two-dimensional job: its
  // pipelines' processes and its replicas' cover every process (and Create fails the job
  // for the processes of the group that did not see it).
  for (comm::Bootstrap* group : {config.pipeline, config.processes}) {
    if (group != nullptr && group->size() > 1) {
      absl::Status same = CheckSameJob(*group, JobFingerprint(config, schedule, kind));
      if (!same.ok()) {
        *everyone_saw = one_group && absl::IsFailedPrecondition(same);
        return same;
      }
    }
  }
  PS_RETURN_IF_ERROR(CheckStages(config, checked));
  t->config_.stages = P;
  t->config_.virtual_stages = schedule.num_chunks();
  t->config_.microbatches = schedule.num_microbatches;
  t->partition_ = checked.partition;
  // Each process's machine, heard by all: a job that does not fit one is refused by
  // every process alike (not a failure of the job: bench skips such a configuration).
  if (absl::Status fits = comm::AgreeOnVerdict(
          {config.pipeline, config.processes}, "trainer-host-memory",
          kind == runtime::BackendKind::kHost ? CheckHostMemory(t->config_, t->partition_)
                                              : absl::OkStatus());
      !fits.ok()) {
    *everyone_saw = comm::HeardByAll(fits);  // not a failed exchange
    return fits;
  }
  runtime::BackendOptions options{
      .kind = kind, .strict = config.strict, .memory_capacity_bytes = config.device_memory_bytes};
  options.num_devices = config.num_devices > 0 ? config.num_devices
                                               : (kind == runtime::BackendKind::kHost ? P * D : 0);
  PS_ASSIGN_OR_RETURN(t->backend_, runtime::CreateBackend(options));

  const TrainerConfig& c = t->config_;
  const std::vector<bool> recomputes = checked.recomputes;
  const std::vector<LayerRange> partition = t->partition_;
  const scheduler::Placement placement = schedule.placement;
  StageWorkFactory factory =
      [&c, partition, placement, recomputes](
          int stage, int, runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
    model::ChunkOptions chunk{.config = c.model,
                              .first_layer = partition[stage].first,
                              .last_layer = partition[stage].last,
                              .seed = c.seed,
                              .optimizer = c.optimizer};
    absl::StatusOr<std::unique_ptr<StageWork>> made =
        MlpStageWork::Create(chunk, c.microbatch_size, device);
    if (!made.ok() && c.device_memory_bytes > 0 && absl::IsResourceExhausted(made.status())) {
      // The stages' parameters, gradients and optimizer state come first: name the cap
      // here, in the process whose device it is (the others hear this line).
      return absl::ResourceExhaustedError(absl::StrCat(
          "the model does not fit the device memory cap of ", HumanBytes(c.device_memory_bytes),
          " (--device-memory) before any activation: ", made.status().message(),
          "; give a larger --device-memory, or a smaller model (--hidden, --layers)"));
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<StageWork> work, std::move(made));
    if (recomputes[stage]) {
      // Inside the skew injection: a slow stage recomputes slowly too.
      PS_ASSIGN_OR_RETURN(work, RecomputeStageWork::Create(std::move(work)));
    }
    if (c.slow_rank >= 0 && placement.RankOf(stage) == c.slow_rank && c.slow_factor != 1) {
      PS_ASSIGN_OR_RETURN(std::unique_ptr<SlowStageWork> slow,
                          SlowStageWork::Create(std::move(work), c.slow_factor));
      return std::unique_ptr<StageWork>(std::move(slow));
    }
    return std::unique_ptr<StageWork>(std::move(work));
  };
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(
      schedule, *t->backend_, factory,
      {.num_replicas = D,
       .exact_memory_accounting = config.exact_memory_accounting || config.device_memory_bytes > 0,
       .step_timeout_seconds = config.step_timeout_seconds,
       .more_memory = config.device_memory_bytes > 0
                          ? absl::StrCat("a larger --device-memory (now ",
                                         HumanBytes(config.device_memory_bytes), ")")
                          : std::string(),
       .processes = config.processes,
       .pipeline = config.pipeline});
  // A refusal of every process's (each heard the others' allocations): the job stays whole.
  *everyone_saw = comm::HeardByAll(executor.status());
  PS_RETURN_IF_ERROR(executor.status());
  t->executor_ = *std::move(executor);

  // What the stages' math needs to run on all P x D compute streams at once (on the host,
  // OpenBLAS's work buffers: a step that cannot map one hangs) is made now, and before
  // the memory left for activations is read below.
  if (absl::Status math = model::PrepareMath(t->backend_->kind(), P * D); !math.ok()) {
    return absl::Status(math.code(),
                        absl::StrCat(math.message(), " (the pipeline multiplies on its ", P * D,
                                     " compute streams at once: --stages x --replicas)"));
  }

  // Activations are allocated step by step: refuse now a plan whose peak cannot fit,
  // rather than in the step that exhausts the memory (minutes into a large run on a CPU),
  // and before making the data. The parameters are in memory by now; the data will take
  // what HostDataBytes says.
  std::optional<std::int64_t> machine = HostMemoryAvailableBytes();
  if (machine.has_value()) {
    const std::int64_t data = HostDataBytes(t->config_);
    // Data that does not fit is the data's problem (CheckHostMemory, the loader's limit),
    // not the activations'.
    machine = data <= *machine ? std::optional<std::int64_t>(*machine - data) : std::nullopt;
  }
  t->machine_bytes_ = machine;
  if (config.check_activation_memory) {
    PS_ASSIGN_OR_RETURN(std::vector<MemoryPlace> places, ActivationPlaces(*t->executor_, machine));
    // Heard by every process, as the host memory above.
    if (absl::Status fits = comm::AgreeOnVerdict(
            {config.pipeline, config.processes}, "trainer-activations",
            CheckActivationsFit({.schedule = t->executor_->schedule().name,
                                 .num_ranks = P,
                                 .num_chunks = t->executor_->schedule().num_chunks(),
                                 .num_microbatches = t->executor_->num_microbatches()},
                                places));
        !fits.ok()) {
      *everyone_saw = comm::HeardByAll(fits);
      return fits;
    }
  }

  // Data: the whole job's (every process makes or loads the same data set and takes its
  // share of each job batch).
  const std::int64_t g = t->job_batch();
  if (!config.data_path.empty()) {
    PS_ASSIGN_OR_RETURN(t->data_, model::LoadDataset(config.data_path));
    if (t->data_.d_in != config.model.d_in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data file ", config.data_path, ": x has ", t->data_.d_in,
          " features per sample but the model takes ", config.model.d_in, " (--inputs)"));
    }
    for (std::int32_t y : t->data_.y) {
      if (y < 0 || y >= config.model.num_classes) {
        return absl::InvalidArgumentError(
            absl::StrCat("data file ", config.data_path, ": label ", y, " in y is outside [0, ",
                         config.model.num_classes, ") (--classes=", config.model.num_classes, ")"));
      }
    }
  } else {
    PS_ASSIGN_OR_RETURN(t->data_, model::MakeSynthetic({.d_in = config.model.d_in,
                                                        .num_classes = config.model.num_classes,
                                                        .num_samples = SyntheticSamples(config, g),
                                                        .seed = config.seed}));
  }
  if (t->num_processes() > 1 || (config.pipeline != nullptr && config.pipeline->size() > 1)) {
    Fnv1a64 data;
    data.Add(t->data_.x.data(), t->data_.x.size() * sizeof(float));
    data.Add(t->data_.y.data(), t->data_.y.size() * sizeof(std::int32_t));
    t->data_hash_ = data.value();
  }
  if (t->data_.num_samples() < g) {
    const int N = t->num_processes();
    return absl::InvalidArgumentError(absl::StrCat(
        "the data set has ", t->data_.num_samples(), " samples but one step needs ", g,
        N > 1 ? absl::StrCat(" (", config.pipeline != nullptr ? "pipelines" : "processes",
                             " x replicas x microbatches x microbatch-size = ", N, " x ", D, " x ")
              : absl::StrCat(" (replicas x microbatches x microbatch-size = ", D, " x "),
        t->executor_->num_microbatches(), " x ", config.microbatch_size, ")"));
  }
  if (absl::Status same = t->CompareAcrossProcesses(); !same.ok()) {
    *everyone_saw = one_group && absl::IsFailedPrecondition(same);
    return same;
  }
  return t;
}

absl::Status Trainer::CheckProcessesAgree() {
  absl::Status same = CompareAcrossProcesses();
  // As in Create: the other group of a two-dimensional job would wait for this process.
  if (comm::Bootstrap* job = JobToFail(config_);
      !same.ok() && job != nullptr && GroupsOfSeveral(config_) == 2) {
    job->Fail(std::string(same.message()));
  }
  return same;
}

absl::Status Trainer::CompareAcrossProcesses() {
  if (config_.pipeline != nullptr && config_.pipeline->size() > 1) {
    // The processes hold different stages: they compare what they loaded them from (one
    // given --init or --resume that another was not is what this finds), the optimizer
    // steps their stages took (a checkpoint's, after --resume; 0 after --init) and the data.
    std::int64_t steps = -1;
    for (int s = 0; s < executor_->num_stages() && steps < 0; ++s) {
      if (runs_stage(s)) steps = chunk(0, s).step_count();
    }
    PS_RETURN_IF_ERROR(comm::CheckAgreement(
        *config_.pipeline, "state",
        "state (the parameters loaded, optimizer steps, data set and data position)",
        absl::StrCat(absl::Hex(imported_hash_, absl::kZeroPad16), " ", steps, " ",
                     absl::Hex(data_hash_, absl::kZeroPad16), " ", cursor_)));
  }
  if (num_processes() == 1) return absl::OkStatus();
  // The processes of a replica group hold the same stages (all of them, unless a pipeline
  // is split): they compare those.
  Fnv1a64 h;
  for (int s = 0; s < executor_->num_stages(); ++s) {
    if (!runs_stage(s)) continue;
    PS_ASSIGN_OR_RETURN(const std::vector<model::HostTensor> params,
                        chunk(0, s).ExportParameters());
    for (const model::HostTensor& tensor : params) {
      h.Add(tensor.name);
      h.Add(tensor.bytes);
    }
  }
  // The optimizer's state and step count (AdamW's bias correction): a checkpoint's, after
  // --resume; replica 0's, as the parameters (the replicas are identical).
  Fnv1a64 optimizer;
  for (int s = 0; s < executor_->num_stages(); ++s) {
    if (!runs_stage(s)) continue;
    const model::Chunk& c = chunk(0, s);
    PS_ASSIGN_OR_RETURN(const std::vector<model::HostTensor> state, c.ExportOptimizerState());
    for (const model::HostTensor& tensor : state) {
      optimizer.Add(tensor.name);
      optimizer.Add(tensor.bytes);
    }
    optimizer.Add(absl::StrCat(c.step_count(), ";"));
  }
  return comm::CheckAgreement(*config_.processes, "state",
                              "state (parameters, optimizer state, data set and data position)",
                              absl::StrCat(absl::Hex(h.value(), absl::kZeroPad16), " ",
                                           absl::Hex(optimizer.value(), absl::kZeroPad16), " ",
                                           absl::Hex(data_hash_, absl::kZeroPad16), " ", cursor_));
}

std::string Trainer::PlacementSummary() const {
  const int P = executor_->num_ranks(), D = config_.replicas;
  const int devices = backend_->device_count();
  const std::string backend(runtime::BackendName(backend_->kind()));
  std::string summary =
      devices >= P * D
          ? absl::StrCat(backend, " backend: ", P * D, " device(s) for P=", P, " x D=", D,
                         devices > P * D ? absl::StrCat(" (", devices - P * D, " of the ", devices,
                                                        " devices are not used)")
                                         : "")
          : absl::StrCat(backend, " backend: ", P * D, " (replica, rank) pairs share ", devices,
                         " device(s) round-robin; each keeps its own streams");
  // Host devices compute on CPU threads: more busy devices than cores and they slow each
  // other down, which the plan (each device computing on its own) does not model.
  const int busy_devices = std::min(devices, P * D);
  const int cpus = HostCpuCount();
  if (backend_->kind() == runtime::BackendKind::kHost && busy_devices > cpus) {
    absl::StrAppend(&summary, "\nnote: the ", busy_devices, " host devices compute on ", cpus,
                    " CPU core(s): ranks computing at once slow each other down, which the plan "
                    "does not model");
  }
  return summary;
}

absl::StatusOr<StepResult> Trainer::Step(const float* x, const std::int32_t* labels) {
  if (x == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError(
        "Trainer::Step(x, labels) needs both arrays (global batch x inputs floats, global "
        "batch labels); got a null pointer");
  }
  const std::int64_t g = global_batch();
  StepInputs in{
      .inputs = std::as_bytes(std::span(x, static_cast<std::size_t>(g * config_.model.d_in))),
      .targets = std::as_bytes(std::span(labels, static_cast<std::size_t>(g)))};
  PS_ASSIGN_OR_RETURN(StepResult result, executor_->Step(in));
  if (num_processes() > 1) {
    // The job's loss: the mean of the processes' means (each over as many micro-batches).
    std::string mine(sizeof(double), '\0');
    std::memcpy(mine.data(), &result.loss, sizeof(double));
    PS_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                        config_.processes->AllGather("loss", mine));
    double sum = 0;
    for (const std::string& bytes : all) {
      double loss = 0;
      if (bytes.size() != sizeof(double)) {
        return absl::InternalError("a process sent a loss that is not 8 bytes");
      }
      std::memcpy(&loss, bytes.data(), sizeof(double));
      sum += loss;
    }
    result.loss = sum / static_cast<double>(all.size());
  }
  timelines_.push_back(result.timeline);
  phases_.push_back(result.phases);
  return result;
}

absl::Status Trainer::set_data_cursor(std::int64_t cursor) {
  if (cursor < 0 || cursor >= data_.num_samples()) {
    return absl::InvalidArgumentError(absl::StrCat("data cursor ", cursor,
                                                   " is outside the data set's samples [0, ",
                                                   data_.num_samples(), ")"));
  }
  cursor_ = cursor;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::Step() {
  const std::int64_t g = global_batch();
  const int d_in = config_.model.d_in;
  const std::int64_t n = data_.num_samples();
  // This process's replicas are the job's replicas q x D ... q x D + D - 1: its rows of
  // the job batch start q x D x M x B in.
  const std::int64_t first = cursor_ + process_rank() * g;
  std::vector<float> x(static_cast<std::size_t>(g * d_in));
  std::vector<std::int32_t> y(static_cast<std::size_t>(g));
  for (std::int64_t i = 0; i < g; ++i) {
    const std::int64_t row = (first + i) % n;
    std::copy(data_.x.begin() + row * d_in, data_.x.begin() + (row + 1) * d_in,
              x.begin() + i * d_in);
    y[i] = data_.y[row];
  }
  cursor_ = (cursor_ + job_batch()) % n;
  return Step(x.data(), y.data());
}

absl::StatusOr<std::vector<model::HostTensor>> Trainer::ExportParameters() const {
  return GatherByStage("trainer-parameters", [this](int s) {
    return Mlp(executor_->work(0, s)).chunk().ExportParameters();
  });
}

absl::StatusOr<std::vector<model::HostTensor>> Trainer::ExportOptimizerStates(
    std::int64_t* step) const {
  // Each stage's state, then its step count as a tensor of its own ("~step", which no
  // state tensor is named), so that one exchange carries both.
  static constexpr char kStep[] = "~step";
  PS_ASSIGN_OR_RETURN(
      std::vector<model::HostTensor> all,
      GatherByStage(
          "trainer-optimizer", [this](int s) -> absl::StatusOr<std::vector<model::HostTensor>> {
            const model::Chunk& c = chunk(0, s);
            PS_ASSIGN_OR_RETURN(std::vector<model::HostTensor> state, c.ExportOptimizerState());
            state.push_back(
                model::HostTensor::I64(kStep, {1}, std::vector<std::int64_t>{c.step_count()}));
            return state;
          }));
  std::vector<model::HostTensor> state;
  std::optional<std::int64_t> first;
  int stage = 0;
  for (model::HostTensor& t : all) {
    if (t.name != kStep) {
      state.push_back(std::move(t));
      continue;
    }
    std::int64_t count = 0;
    if (t.bytes.size() != sizeof count)
      return absl::InternalError("a stage's step count is not 8 bytes");
    std::memcpy(&count, t.bytes.data(), sizeof count);
    if (first.has_value() && count != *first) {
      return absl::InternalError(absl::StrCat("stage ", stage, " took ", count,
                                              " optimizer steps but stage 0 took ", *first));
    }
    first = count;
    ++stage;
  }
  *step = first.value_or(0);
  return state;
}

absl::Status Trainer::ImportParameters(const std::vector<model::HostTensor>& tensors) {
  std::set<std::string> expected;
  for (const model::ParamSpec& spec :
       model::ParamSpecs(config_.model, 0, config_.model.num_model_layers())) {
    expected.insert(spec.name);
  }
  for (const model::HostTensor& tensor : tensors) {
    if (!expected.count(tensor.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", tensor.name, "' is not a parameter of this model (", config_.model.num_layers,
          " blocks + head; names blocks.{i}.weight/bias, head.weight/bias)"));
    }
  }
  // Every stage checks the tensors before any copies them: a bad file leaves the model as
  // it was (replicas share the stages' shapes, so replica 0's checks stand for all). With
  // a pipeline, this process's stages (each process imports its own).
  for (int s = 0; s < executor_->num_stages(); ++s) {
    if (!runs_stage(s)) continue;
    PS_RETURN_IF_ERROR(Mlp(executor_->work(0, s)).chunk().CheckParameters(tensors));
  }
  for (int d = 0; d < config_.replicas; ++d) {
    for (int s = 0; s < executor_->num_stages(); ++s) {
      if (!runs_stage(s)) continue;
      MlpStageWork& work = Mlp(executor_->work(d, s));
      PS_RETURN_IF_ERROR(work.chunk().ImportParameters(tensors));
    }
  }
  Fnv1a64 imported;
  for (const model::HostTensor& tensor : tensors) {
    imported.AddField(tensor.name);
    imported.Add(tensor.bytes);
  }
  imported_hash_ = imported.value();
  return absl::OkStatus();
}

absl::Status Trainer::LoadParameters(const std::string& path) {
  PS_ASSIGN_OR_RETURN(model::SafetensorsFile file, model::ReadSafetensors(path));
  // A checkpoint's parameters are only as good as its checksum, as for --resume.
  PS_RETURN_IF_ERROR(VerifyCheckpointChecksum(file, path));
  if (auto format = file.metadata.find("format");
      format != file.metadata.end() && format->second == "pipesched-checkpoint") {
    // A checkpoint (stages/checkpoint.h): its parameters only, not its optimizer state.
    std::erase_if(file.tensors,
                  [](const model::HostTensor& t) { return t.name.rfind("optimizer.", 0) == 0; });
  }
  absl::Status s = ImportParameters(file.tensors);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  return absl::OkStatus();
}

absl::Status Trainer::CheckFinite(const std::vector<model::HostTensor>& tensors) {
  for (const model::HostTensor& t : tensors) {
    if (t.dtype != model::DType::kF32) continue;
    for (std::size_t k = 0; k < t.bytes.size() / sizeof(float); ++k) {
      float v;
      std::memcpy(&v, t.bytes.data() + k * sizeof(float), sizeof(float));
      if (!std::isfinite(v)) {
        return absl::FailedPreconditionError(
            absl::StrCat("'", t.name, "' holds ", v, " at element ", k,
                         ": training diverged (an update after the last finite loss)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::CheckParametersFinite() const {
  for (int s = 0; s < executor_->num_stages(); ++s) {
    if (!runs_stage(s)) continue;
    PS_ASSIGN_OR_RETURN(const std::vector<model::HostTensor> params,
                        chunk(0, s).ExportParameters());
    PS_RETURN_IF_ERROR(CheckFinite(params));
  }
  return absl::OkStatus();
}

absl::Status Trainer::SaveParameters(const std::string& path) const {
  model::SafetensorsFile file;
  PS_ASSIGN_OR_RETURN(file.tensors, ExportParameters());
  if (absl::Status finite = CheckFinite(file.tensors); !finite.ok()) {
    return absl::Status(finite.code(), absl::StrCat("not saving ", path, ": ", finite.message()));
  }
  file.metadata["format"] = "pt";
  file.metadata["producer"] = "pipesched";
  return model::WriteSafetensors(path, file);
}

absl::StatusOr<scheduler::CostModel> Trainer::MeasuredCosts() const {
  if (timelines_.empty()) {
    return absl::FailedPreconditionError("no step has run yet: nothing measured to plan from");
  }
  std::vector<const trace::Timeline*> used;
  std::vector<const std::vector<trace::Span>*> phases;
  for (std::size_t i = timelines_.size() > 1 ? 1 : 0; i < timelines_.size(); ++i) {
    used.push_back(&timelines_[i]);
    phases.push_back(&phases_[i]);
  }
  return MeasuredCostModel(used, *executor_, phases);
}

absl::StatusOr<scheduler::SimResult> Trainer::Planned() const {
  PS_ASSIGN_OR_RETURN(const scheduler::CostModel costs, MeasuredCosts());
  PS_ASSIGN_OR_RETURN(scheduler::SimResult sim, scheduler::Simulate(executor_->schedule(), costs));
  sim.timeline.time_unit = "us";
  sim.timeline.name = absl::StrCat(executor_->schedule().name, " (planned from measured costs)");
  return sim;
}

}  // namespace pipesched::stages
