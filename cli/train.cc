// `pipesched train`: the built-in MLP trained by the pipeline executor; per-step loss and
// throughput, then the measured bubble next to the simulator's plan for the same costs.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/job.h"
#include "cli/planning.h"
#include "cli/training.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/file_util.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/scheduler/formats.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/stages/bubble_analysis.h"
#include "pipesched/stages/checkpoint.h"
#include "pipesched/stages/recompute_plan.h"
#include "pipesched/trace/chrome_trace.h"
#include "pipesched/trace/stats.h"
#include "pipesched/trace/svg.h"

// Resumable training and the hang watchdog (train only; docs/reliability.md).
ABSL_FLAG(int32_t, save_every, 0,
          "also save the checkpoint (--save) every K steps during training; 0 = only at the end");
ABSL_FLAG(std::string, resume, "",
          "continue from a checkpoint written by --save: parameters, optimizer state, step, data "
          "position");
ABSL_FLAG(std::string, save_costs, "",
          "write the measured costs (per-stage action times, hand-offs, gap between actions, "
          "bytes) as a cost-model file for `simulate --costs`");
ABSL_FLAG(double, step_timeout, 60,
          "abort a step in which nothing completes for this many seconds, naming what each rank "
          "waits for; 0 = never (and, with --processes or --mpi, no process is judged gone "
          "when its heartbeat stops for 10 s)");

namespace pipesched::cli {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string ProgressBar(int done, int total, int width = 24) {
  int filled = total > 0 ? done * width / total : width;
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "]");
}

absl::StatusOr<stages::TrainerConfig> ConfigFromFlags(const CommandContext& ctx) {
  PS_ASSIGN_OR_RETURN(stages::TrainerConfig config, TrainerConfigFromFlags(ctx));
  config.step_timeout_seconds = absl::GetFlag(FLAGS_step_timeout);
  // Below a second a busy machine's scheduling alone can look like a hang.
  if (!(config.step_timeout_seconds == 0 || config.step_timeout_seconds >= 1) ||
      !std::isfinite(config.step_timeout_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat("--step-timeout=", config.step_timeout_seconds,
                                                   " must be 0 (never) or at least 1 second"));
  }
  if (std::string from = absl::GetFlag(FLAGS_from); !from.empty()) {
    for (std::string_view f : {"schedule", "stages", "microbatches", "virtual"}) {
      if (FlagGiven(ctx, f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--from=", from, " takes P, V and M from the file; drop --", std::string(f)));
      }
    }
    PS_ASSIGN_OR_RETURN(scheduler::Schedule schedule, LoadTrainableSchedule(from));
    config.schedule_override = std::move(schedule);
  } else {
    config.schedule = absl::GetFlag(FLAGS_schedule);
    PS_RETURN_IF_ERROR(CheckScheduleNameIsNotAFile(config.schedule));
    config.stages = absl::GetFlag(FLAGS_stages);
    config.microbatches = absl::GetFlag(FLAGS_microbatches);
    config.virtual_stages = absl::GetFlag(FLAGS_virtual);
    if (config.stages < 1 || config.stages > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stages=", config.stages, " is out of range: use 1 to 1024"));
    }
    if (config.microbatches < 1 || config.microbatches > 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat("--microbatches=", config.microbatches, " is out of range: use 1 to 65536"));
    }
    if (config.virtual_stages < 0 || config.virtual_stages > 64) {
      return absl::InvalidArgumentError(absl::StrCat("--virtual=", config.virtual_stages,
                                                     " is out of range: use 0 (default) to 64"));
    }
  }
  return config;
}

struct StepRecord {
  double loss;
  double micros;
  double measured_bubble;
};

// The job's checks for train (CheckJobFlags), then train's own: a searched order, and
// at least one rank for each process of a pipeline.
absl::StatusOr<Job> CheckProcessFlags(const CommandContext& ctx) {
  PS_ASSIGN_OR_RETURN(const Job job, CheckJobFlags(ctx, "train"));
  if (job == Job::kAlone) return job;
  if (const scheduler::ScheduleInfo* info = scheduler::FindSchedule(absl::GetFlag(FLAGS_schedule));
      absl::GetFlag(FLAGS_from).empty() && info != nullptr && info->uses_costs) {
    PS_ASSIGN_OR_RETURN(const int search_steps, SearchStepsFromFlags());
    PS_RETURN_IF_ERROR(CheckOneOrderInJob(info->name, search_steps));
  }
  const bool k_given = FlagGiven(ctx, "pipeline_processes");
  const int k = absl::GetFlag(FLAGS_pipeline_processes);
  const int processes = absl::GetFlag(FLAGS_processes);
  if (absl::GetFlag(FLAGS_split_stages) || (k_given && k > 1)) {
    // Each process runs at least one rank (with --from the file's P decides, later).
    if (const int stages = absl::GetFlag(FLAGS_stages);
        absl::GetFlag(FLAGS_from).empty() && (k_given ? k : processes) > stages) {
      return absl::InvalidArgumentError(
          k_given ? absl::StrCat("--pipeline-processes=", k,
                                 " gives each process at least one pipeline rank, and there "
                                 "are --stages=",
                                 stages, "; give at most ", stages)
                  : absl::StrCat("--split-stages gives each process at least one pipeline "
                                 "rank: --processes=",
                                 processes, " is more than --stages=", stages, "; give at most ",
                                 stages, " processes"));
    }
  }
  return job;
}

// The job's bootstrap (null alone); --step-timeout=0 (wait for ever: a debugger, say)
// judges no heartbeat either.
absl::StatusOr<std::unique_ptr<comm::Bootstrap>> JoinFromFlags(const CommandContext& ctx) {
  PS_ASSIGN_OR_RETURN(const Job job, CheckProcessFlags(ctx));
  return JoinJob(job, absl::GetFlag(FLAGS_step_timeout) != 0);
}

// The files train writes: --save first, then the reports.
std::vector<FlagPath> OutputFlags() {
  return {{"--save", absl::GetFlag(FLAGS_save)},
          {"--trace", absl::GetFlag(FLAGS_trace)},
          {"--svg", absl::GetFlag(FLAGS_svg)},
          {"--json", absl::GetFlag(FLAGS_json)},
          {"--save-costs", absl::GetFlag(FLAGS_save_costs)}};
}

// Where to check train's output paths: in the process that writes them, or in the
// launcher, which checks files and directories but leaves devices and descriptors
// (/dev/stdout, /dev/fd/N, /proc/self/fd/N) to the processes: theirs are not its own.
enum class Outputs { kNotOurs, kOurs, kLauncher };

// train's checks of its own flags (beyond the trainer's configuration), made before the
// trainer is created; `where`: whether (and how) its output paths are checked here.
absl::Status CheckRunFlags(const CommandContext& ctx, const stages::TrainerConfig& config,
                           Outputs where) {
  PS_RETURN_IF_ERROR(CheckSearchFlagsApply(config.schedule, config.schedule_override.has_value(),
                                           /*refines_any_order=*/false, SearchStepsGiven(ctx)));
  const int steps = absl::GetFlag(FLAGS_steps);
  if (steps < 1 || steps > 10'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", steps, " is out of range: use 1 to 10000000"));
  }
  const std::string save = absl::GetFlag(FLAGS_save);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  const std::string resume = absl::GetFlag(FLAGS_resume);
  const std::string save_costs = absl::GetFlag(FLAGS_save_costs);
  if (save_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save-every=", save_every, " must be >= 0 (0 = only at the end)"));
  }
  if (save_every > 0 && save.empty()) {
    return absl::InvalidArgumentError("--save-every needs --save=FILE to say where");
  }
  // Outputs are written during or after the run: a path that cannot be written is an
  // error now, not after the training. Only the process that writes them checks (with
  // --processes the others may run where process 0's paths do not exist).
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--save", save},
                                   {"--save-costs", save_costs},
                                   {"--trace", absl::GetFlag(FLAGS_trace)},
                                   {"--svg", absl::GetFlag(FLAGS_svg)},
                                   {"--json", absl::GetFlag(FLAGS_json)}}) {
    if (path.empty() || where == Outputs::kNotOurs) continue;
    if (where == Outputs::kLauncher && IsProcessesOwnDescriptor(path)) continue;
    PS_RETURN_IF_ERROR(CheckOutputPath(flag, path));
  }
  // The launcher says once what every process would: an input that is not there, or
  // cannot be read. (What is in it, each process reads and checks.)
  if (where == Outputs::kLauncher) {
    PS_RETURN_IF_ERROR(CheckLaunchInputs({{"--data", absl::GetFlag(FLAGS_data)},
                                          {"--init", absl::GetFlag(FLAGS_init)},
                                          {"--resume", resume},
                                          {"--from", absl::GetFlag(FLAGS_from)}}));
  }
  // --save may be --resume or --init: a run that continues its own checkpoint or
  // parameters in place.
  const std::vector<FlagPath> outputs = OutputFlags();
  const std::vector<FlagPath> reports(outputs.begin() + 1, outputs.end());  // all but --save
  PS_RETURN_IF_ERROR(CheckFilesDistinct(
      {{"--data", absl::GetFlag(FLAGS_data)}, {"--from", absl::GetFlag(FLAGS_from)}}, outputs));
  PS_RETURN_IF_ERROR(
      CheckFilesDistinct({{"--init", absl::GetFlag(FLAGS_init)}, {"--resume", resume}}, reports));
  if (!resume.empty() && !absl::GetFlag(FLAGS_init).empty()) {
    return absl::InvalidArgumentError(
        "--resume restores the parameters already; drop --init (or --resume)");
  }
  return SearchStepsFromFlags().status();
}

absl::Status Train(const CommandContext& ctx, comm::Bootstrap* processes) {
  std::ostream& out = *ctx.out;
  PS_ASSIGN_OR_RETURN(stages::TrainerConfig config, ConfigFromFlags(ctx));
  // --split-stages and --pipeline-processes: the processes split each pipeline, K to a
  // pipeline, instead of holding whole replicas; with K < N the pipelines are
  // data-parallel replicas of each other (groups of the job: comm::SplitJob).
  JobPlace place;
  if (processes != nullptr) {
    PS_ASSIGN_OR_RETURN(place, PlaceInJob(*processes));
  }
  const int k = place.k;
  const bool split = k > 1;
  config.pipeline = place.pipeline;
  config.processes = place.processes;
  // Process 0 writes the job's files; the others' parameters are the same, and their
  // timelines are their own replicas' only.
  const bool writes_files = processes == nullptr || processes->rank() == 0;
  // Split, a save gathers the stages: the other processes of process 0's pipeline take
  // part (the other pipelines' hold the same).
  const bool gathers_for_save =
      split && !writes_files && (config.processes == nullptr || config.processes->rank() == 0);
  PS_RETURN_IF_ERROR(CheckRunFlags(ctx, config, writes_files ? Outputs::kOurs : Outputs::kNotOurs));
  const int steps = absl::GetFlag(FLAGS_steps);
  const std::string save = absl::GetFlag(FLAGS_save);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  const std::string resume = absl::GetFlag(FLAGS_resume);
  const std::string save_costs = absl::GetFlag(FLAGS_save_costs);
  const std::vector<FlagPath> outputs = OutputFlags();
  PS_ASSIGN_OR_RETURN(const int search_steps, SearchStepsFromFlags());
  // --recompute-stages=auto: the stages whose recomputation makes the planned activations
  // fit where they live, chosen before anything runs.
  std::optional<stages::RecomputePlan> recompute_plan;
  std::string search_note;
  std::unique_ptr<stages::Trainer> trainer;
  if (absl::GetFlag(FLAGS_recompute_stages) == "auto") {
    recompute_plan.emplace();
    PS_ASSIGN_OR_RETURN(trainer, CreateTrainerRecomputingToFit(&config, search_steps, "train",
                                                               &*recompute_plan, &search_note));
  } else {
    PS_ASSIGN_OR_RETURN(trainer, CreateTrainer(&config, search_steps, &search_note));
  }
  if (std::string init = absl::GetFlag(FLAGS_init); !init.empty()) {
    PS_RETURN_IF_ERROR(trainer->LoadParameters(init));
  }
  std::int64_t resumed_at = 0;
  if (!resume.empty()) {
    PS_ASSIGN_OR_RETURN(stages::CheckpointInfo info, stages::LoadCheckpoint(resume, *trainer));
    resumed_at = info.step;
  }
  if (processes != nullptr) {
    // Each process read its own copy of --init or --resume (every process checks, with or
    // without them: one given to only some processes is what this finds).
    absl::Status same = trainer->CheckProcessesAgree();
    if (!same.ok()) {
      return absl::Status(same.code(), absl::StrCat(same.message(),
                                                    " (after --init and --resume: give every "
                                                    "process the same ones)"));
    }
    // Every step is an exchange of every process, and, split, so is every save (process 0
    // gathers the stages): a process that stopped sooner, or saved where the others did not,
    // would leave them waiting for the rendezvous timeout.
    PS_RETURN_IF_ERROR(comm::CheckAgreement(
        *processes, "train-run",
        split ? "run (--steps, --save-every, and whether --save is given)" : "run (--steps)",
        split ? absl::StrCat("--steps=", steps, " --save-every=", save_every,
                             save.empty() ? " no --save" : " --save")
              : absl::StrCat("--steps=", steps)));
  }
  const scheduler::Schedule& schedule = trainer->schedule();
  const int p = schedule.num_ranks();
  std::vector<std::string> chunks;
  for (const stages::LayerRange& r : trainer->partition()) {
    chunks.push_back(absl::StrCat(r.last - r.first));
  }
  out << absl::StrFormat(
      "train %s  P=%d V=%d D=%d M=%d B=%d  global batch %d\n"
      "model: %d inputs, %d blocks of width %d, %d classes; layers per chunk [%s]\n%s\n",
      schedule.name, p, schedule.num_chunks(), config.replicas, schedule.num_microbatches,
      config.microbatch_size, trainer->global_batch(), config.model.d_in, config.model.num_layers,
      config.model.d_hidden, config.model.num_classes, absl::StrJoin(chunks, ","),
      trainer->PlacementSummary());
  if (split) {
    const int n = processes->size(), q = processes->rank();
    int first = p, last = -1;  // this process's block of ranks
    for (int r = 0; r < p; ++r) {
      if (trainer->executor().runs_rank(r)) {
        first = std::min(first, r);
        last = std::max(last, r);
      }
    }
    out << absl::StrFormat(
        "process %d of %d (%s): pipeline ranks %d to %d of %d; activations and gradients "
        "between the processes' stages go as the job's messages\n",
        q, n, MeetingPlace(*processes), first, last, p);
    if (k < n) {
      std::vector<int> members;
      for (int i = 0; i < k; ++i) members.push_back(config.pipeline->job_rank(i));
      out << absl::StrFormat(
          "pipeline %d of %d (processes %s); gradients averaged over the %d pipelines' %d "
          "replicas; job batch %d\n",
          config.processes->rank(), n / k, absl::StrJoin(members, ","), n / k,
          n / k * config.replicas, trainer->job_batch());
    }
    std::vector<std::string> unwritten;
    for (const auto& [flag, path] : outputs) {
      if (!path.empty()) unwritten.emplace_back(flag);
    }
    if (!writes_files && !unwritten.empty()) {
      out << "process 0 writes " << absl::StrJoin(unwritten, ", ")
          << (k < n ? "; the measured figures below are this pipeline's\n"
                    : "; the measured figures below are the whole job's\n");
    }
  } else if (processes != nullptr) {
    std::vector<std::string> unwritten;
    for (const auto& [flag, path] : outputs) {
      if (!path.empty()) unwritten.emplace_back(flag);
    }
    out << absl::StrFormat(
        "process %d of %d (%s): replicas %d to %d of the job's %d x %d = %d; job "
        "batch %d; gradients averaged over every process's replicas\n",
        processes->rank(), processes->size(), MeetingPlace(*processes),
        processes->rank() * config.replicas, (processes->rank() + 1) * config.replicas - 1,
        processes->size(), config.replicas, processes->size() * config.replicas,
        trainer->job_batch());
    if (!writes_files && !unwritten.empty()) {
      out << "process 0 writes " << absl::StrJoin(unwritten, ", ")
          << "; the measured figures below are this process's replicas'\n";
    }
  }
  if (recompute_plan.has_value()) {
    out << RecomputePlanLine(*recompute_plan) << "\n";
  }
  if (config.recompute || !config.recompute_stages.empty()) {
    std::vector<int> listed = config.recompute_stages;
    std::sort(listed.begin(), listed.end());
    out << "activation recomputation"
        << (config.recompute
                ? std::string()
                : absl::StrCat(listed.size() == 1 ? " on stage " : " on stages ",
                               absl::StrJoin(listed, ","), " of ", schedule.num_stages()))
        << ": a stage keeps only the micro-batch's input and boundary buffers from its F to its "
           "backward; each B or I runs the F again first\n";
  }
  out << search_note;
  if (!resume.empty()) {
    out << "resumed from " << resume << " after step " << resumed_at << "\n";
  }

  std::vector<StepRecord> records;
  stages::StepResult last;
  for (int step = 1; step <= steps; ++step) {
    PS_ASSIGN_OR_RETURN(stages::StepResult result, trainer->Step());
    if (!std::isfinite(result.loss)) {
      // The first loss comes before any update of this run: no learning rate made it.
      return absl::InternalError(absl::StrCat(
          "step ", step, ": the loss is ", result.loss,
          step == 1 ? absl::StrCat(
                          " before any update: the forward pass overflows fp32 with these "
                          "inputs and parameters",
                          !resume.empty() || !absl::GetFlag(FLAGS_init).empty() ||
                                  !absl::GetFlag(FLAGS_data).empty()
                              ? " (they are finite: checked when loaded); "
                              : "; ",
                          !resume.empty() || !absl::GetFlag(FLAGS_init).empty()
                              ? absl::StrCat("the parameters loaded from ",
                                             !resume.empty() ? resume : absl::GetFlag(FLAGS_init),
                                             " are too large for them")
                              : "",
                          (!resume.empty() || !absl::GetFlag(FLAGS_init).empty()) &&
                                  !absl::GetFlag(FLAGS_data).empty()
                              ? ", or "
                              : "",
                          !absl::GetFlag(FLAGS_data).empty() ? "scale the inputs (--data) down"
                          : resume.empty() && absl::GetFlag(FLAGS_init).empty()
                              ? "the synthetic data and seeded initial values should not do "
                                "this: please report it"
                              : "")
                    : absl::StrCat("; training diverged (inputs, labels and initial values are "
                                   "checked when loaded): lower --lr or --weight-decay",
                                   absl::GetFlag(FLAGS_data).empty()
                                       ? ""
                                       : ", or scale the inputs (--data) down: large ones "
                                         "make large gradients")));
    }
    trace::BubbleStats measured = trace::ComputeBubbleStats(result.timeline, p);
    records.push_back({result.loss, result.step_micros, measured.bubble_fraction});
    double samples_per_s = trainer->job_batch() / (result.step_micros * 1e-6);
    if (ctx.out_is_terminal) {
      out << absl::StrFormat("\rstep %d/%d %s loss %.4f  %.0f samples/s  %.2f ms   ", step, steps,
                             ProgressBar(step, steps), result.loss, samples_per_s,
                             result.step_micros / 1000)
          << (step == steps ? "\n" : "") << std::flush;
    } else {
      // Flushed: a log or `pipesched launch` reading a pipe sees each step as it ends.
      out << absl::StrFormat("step %d/%d  loss %.4f  %.0f samples/s  %.2f ms\n", step, steps,
                             result.loss, samples_per_s, result.step_micros / 1000)
          << std::flush;
    }
    last = std::move(result);
    if (gathers_for_save && save_every > 0 && step % save_every == 0 && step < steps) {
      // Process 0 gathers the stages to save them: its pipeline's processes take part.
      PS_RETURN_IF_ERROR(stages::MakeCheckpoint(*trainer).status());
    }
    if (writes_files && save_every > 0 && step % save_every == 0 && step < steps) {
      PS_RETURN_IF_ERROR(stages::SaveCheckpoint(*trainer, save));
      if (!ctx.out_is_terminal)
        out << "saved " << save << " after step " << resumed_at + step << "\n";
    }
  }
  // The last update comes after the last loss: a run that diverged there has finite
  // losses and parameters that are not (which no --init or --resume could load).
  if (absl::Status finite = trainer->CheckParametersFinite(); !finite.ok()) {
    return absl::InternalError(absl::StrCat("after step ", resumed_at + steps, " the parameter ",
                                            finite.message(), ": lower --lr or --weight-decay"));
  }

  // Steady state: leave the first step (warm-up) out when there are more; the medians
  // say which steps they are of.
  const int first_counted = records.size() > 1 ? 2 : 1;
  const int last_counted = static_cast<int>(records.size());
  const std::string counted = first_counted == last_counted
                                  ? absl::StrCat("step ", last_counted)
                                  : absl::StrCat("steps ", first_counted, "-", last_counted);
  std::vector<double> micros, bubbles;
  for (size_t i = first_counted - 1; i < records.size(); ++i) {
    micros.push_back(records[i].micros);
    bubbles.push_back(records[i].measured_bubble);
  }
  double median_micros = Median(micros);
  PS_ASSIGN_OR_RETURN(scheduler::SimResult planned, trainer->Planned());
  trace::BubbleStats measured = trace::ComputeBubbleStats(last.timeline, p);
  out << absl::StrFormat("median step %.3f ms, %.0f samples/s (%s); loss %.4f -> %.4f\n",
                         median_micros / 1000, trainer->job_batch() / (median_micros * 1e-6),
                         counted, records.front().loss, records.back().loss);
  // The same plan with each boundary's transfer time replaced by the effective hand-off
  // latency measured in the last step (event hand-off + copy + wake-up of the consumer),
  // and the stream's measured gap between actions: what a dependency and an action
  // really cost on this machine (stages/bubble_analysis.h).
  PS_ASSIGN_OR_RETURN(stages::IdleAnalysis idle,
                      stages::AnalyzeIdle(last.timeline, last.issue_micros, p));
  PS_ASSIGN_OR_RETURN(const scheduler::CostModel handoff_costs, HandoffCosts(*trainer, idle));
  const double measured_gap = stages::MedianGap({&idle});  // -1: no sample (JSON: null)
  PS_ASSIGN_OR_RETURN(scheduler::SimResult with_handoff,
                      scheduler::Simulate(trainer->schedule(), handoff_costs));
  // The same costs, with every action's duration, hand-off and gap drawn from the last
  // step's: the bubble to expect where action times vary (stages::SpreadBubble).
  PS_ASSIGN_OR_RETURN(const double spread,
                      stages::SpreadBubble(trainer->schedule(), handoff_costs, last.timeline, p,
                                           idle, SpreadDraws(trainer->schedule()), kSpreadSeed));
  out << absl::StrFormat(
      "bubble fraction: measured %.4f (median over %s); planned %.4f from the measured "
      "action and copy times, %.4f with the measured hand-offs between ranks and gaps "
      "between actions, %.4f expected with the last step's spread of durations\n",
      Median(bubbles), counted, planned.bubble_fraction, with_handoff.bubble_fraction, spread);
  // The whole step: the plans' makespans plus each rank's zero-grad before its first
  // action and optimizer step after its last (medians of the steps), against the host's
  // wall time of a step.
  std::vector<std::string> zero_grad_ms(p), optimizer_ms(p);
  {
    std::vector<double> zero_grad_us(p, 0), optimizer_us(p, 0);
    for (int s = 0; s < schedule.num_stages(); ++s) {
      zero_grad_us[schedule.placement.RankOf(s)] += handoff_costs.Stage(s).zero_grad;
      optimizer_us[schedule.placement.RankOf(s)] += handoff_costs.Stage(s).optimizer;
    }
    for (int r = 0; r < p; ++r) {
      zero_grad_ms[r] = absl::StrFormat("%.3f", zero_grad_us[r] / 1000);
      optimizer_ms[r] = absl::StrFormat("%.3f", optimizer_us[r] / 1000);
    }
  }
  out << absl::StrFormat(
      "step time: measured %.3f ms (median over %s); planned %.3f ms, %.3f with the "
      "hand-offs and gaps: the plan's makespan plus, per rank, zero-grad %s ms before and "
      "optimizer step %s ms after\n",
      median_micros / 1000, counted, planned.step_time / 1000, with_handoff.step_time / 1000,
      absl::StrJoin(zero_grad_ms, "/"), absl::StrJoin(optimizer_ms, "/"));
  // The last step replayed action by action (each compute action's own measured duration,
  // each dependency's measured hand-off where it was the last blocker, each stream gap
  // where the stream itself was): what is left against the measured step is what the
  // simulator does not model (late host issue), not the spread of the actions',
  // hand-offs' and gaps' durations.
  PS_ASSIGN_OR_RETURN(
      scheduler::SimResult replayed,
      scheduler::Simulate(
          trainer->schedule(),
          stages::WithHandoffs(
              stages::WithPhaseDurations(
                  stages::WithActionDurations(handoff_costs, last.timeline, p), last.phases, p),
              idle)));
  out << absl::StrFormat(
      "last step: bubble fraction measured %.4f, replayed %.4f from its own action "
      "durations, hand-offs and gaps; makespan measured %.3f ms, replayed %.3f ms; step "
      "measured %.3f ms, replayed %.3f ms (with its own zero-grads and optimizer steps)\n",
      measured.bubble_fraction, replayed.bubble_fraction, measured.makespan / 1000,
      replayed.makespan / 1000, last.step_micros / 1000, replayed.step_time / 1000);
  // What the replay leaves out is the host issuing late: say how much idle time that was
  // when it shows (more than 1% of the makespan), and why when the executor made it so.
  if (replayed.makespan < measured.makespan * 0.99) {
    double idle_us = 0;
    for (double x : idle.idle) idle_us += x;
    out << absl::StrFormat(
        "  the replay does not model the host issuing late%s: %.3f ms of the ranks' %.3f ms "
        "of idle time waited for the host to issue (bench's 'host' column)\n",
        trainer->config().exact_memory_accounting || trainer->config().device_memory_bytes > 0
            ? " (with --device-memory memory is accounted exactly: the host waits for the "
              "frees before each allocation)"
            : "",
        idle.total.host / 1000, idle_us / 1000);
  }
  auto idle_share = [](const scheduler::SimResult& sim, int r) {
    return sim.makespan > 0 ? sim.ranks[r].idle / sim.makespan : 0.0;
  };
  out << absl::StrFormat("%-6s %14s %14s %10s %10s %14s\n", "rank", "busy us", "idle us",
                         "last step", "planned", "+hand-off");
  for (int r = 0; r < p; ++r) {
    double measured_rank = measured.makespan > 0 ? measured.rows[r].idle / measured.makespan : 0;
    out << absl::StrFormat("%-6d %14.1f %14.1f %10.4f %10.4f %14.4f\n", r, measured.rows[r].busy,
                           measured.rows[r].idle, measured_rank, idle_share(planned, r),
                           idle_share(with_handoff, r));
  }

  // Memory per rank (replica 0): what the chunks hold for the whole run -- parameters,
  // gradients, optimizer state -- and the activations the plan holds at its peak
  // (stashes, received inputs, boundary buffers, a backward's workspace; scheduler::RankStats).
  std::vector<std::int64_t> state_bytes(p, 0);
  for (int s = 0; s < schedule.num_stages(); ++s) {
    state_bytes[schedule.placement.RankOf(s)] += trainer->stage_state_bytes(s);
  }
  auto human = [](const std::vector<std::int64_t>& bytes) {
    std::vector<std::string> parts;
    for (std::int64_t b : bytes) parts.push_back(HumanBytes(b));
    return absl::StrJoin(parts, " / ");
  };
  std::vector<std::int64_t> planned_peak;
  for (int r = 0; r < p; ++r) planned_peak.push_back(planned.ranks[r].peak_live_bytes);
  out << "memory per rank: parameters, gradients and optimizer state " << human(state_bytes)
      << "; activations at the planned peak " << human(planned_peak) << "\n";

  // A job whose processes hold replicas: process 0 draws every process's, as one process
  // holding them all would (each block's processes gather their pipelines' rows), when it
  // draws at all -- which only it knows (its --trace and --svg).
  int drawn_replicas = config.replicas;
  if (config.processes != nullptr && config.processes->size() > 1) {
    const bool draws =
        writes_files && (!absl::GetFlag(FLAGS_trace).empty() || !absl::GetFlag(FLAGS_svg).empty());
    PS_ASSIGN_OR_RETURN(const std::string wanted,
                        comm::Broadcast(*processes, "train-draw", draws ? "1" : "0", /*root=*/0));
    if (wanted == "1") {
      PS_ASSIGN_OR_RETURN(last, trainer->executor().GatherReplicas(last));
      drawn_replicas = config.replicas * config.processes->size();
    }
  }
  // Draw planned and measured whole steps (zero-grads, actions, optimizer steps) on one
  // axis, each from its first zero-grad.
  trace::Timeline measured_tl = last.timeline;
  measured_tl.name = absl::StrCat(schedule.name, " (measured, last step)");
  measured_tl = trace::WithStepPhases(std::move(measured_tl), last.phases);
  trace::Timeline planned_tl = std::move(planned.timeline);  // not read again
  planned_tl.name = absl::StrCat(schedule.name, " (planned from measured costs)");
  planned_tl.time_unit = "us";
  planned_tl = trace::WithStepPhases(std::move(planned_tl), planned.phases);
  std::vector<const trace::Timeline*> timelines = {&planned_tl, &measured_tl};
  auto write = [&](const std::string& path, const std::string& content) -> absl::Status {
    PS_RETURN_IF_ERROR(WriteFileAtomic(path, content));
    SayWrote(out, path);
    return absl::OkStatus();
  };
  if (!writes_files) {
    // Process 0 gathers the stages to save them: its pipeline's processes take part.
    if (gathers_for_save && !save.empty()) {
      PS_RETURN_IF_ERROR(stages::MakeCheckpoint(*trainer).status());
    }
    return absl::OkStatus();
  }
  if (std::string path = absl::GetFlag(FLAGS_trace); !path.empty()) {
    PS_RETURN_IF_ERROR(write(path, trace::ToChromeTrace(timelines)));
  }
  if (std::string path = absl::GetFlag(FLAGS_svg); !path.empty()) {
    trace::SvgOptions options;
    options.title =
        absl::StrFormat("%s  P=%d V=%d D=%d M=%d: planned vs measured", schedule.name, p,
                        schedule.num_chunks(), drawn_replicas, schedule.num_microbatches);
    options.subtitle =
        absl::StrFormat("bubble fraction planned %.1f%%, measured %.1f%% (the last step, drawn%s)",
                        100 * planned.bubble_fraction, 100 * measured.bubble_fraction,
                        drawn_replicas > 1 ? "; measured on replica 0" : "");
    PS_RETURN_IF_ERROR(write(path, trace::ToSvg(timelines, options)));
  }
  if (!save.empty()) {
    PS_RETURN_IF_ERROR(stages::SaveCheckpoint(*trainer, save));
    SayWrote(out, save, absl::StrCat("(checkpoint after step ", resumed_at + steps, ")"));
  }
  // The costs of the "+hand-off" plan, in microseconds: `simulate --costs` with them and
  // this schedule reproduces that plan, and with another schedule of the same P x V
  // predicts it on this machine.
  if (!save_costs.empty()) {
    // With each stage's parameters, gradients and optimizer state, so that simulate and
    // compare --device-memory check a device's memory whole.
    scheduler::CostModel saved = handoff_costs;
    if (static_cast<int>(saved.stages.size()) != schedule.num_stages()) {
      saved.stages.assign(schedule.num_stages(), saved.uniform);  // the same model, per stage
    }
    for (int s = 0; s < schedule.num_stages(); ++s) {
      saved.stages[s].static_bytes = trainer->stage_state_bytes(s);
    }
    PS_RETURN_IF_ERROR(WriteFileAtomic(save_costs, scheduler::ToCostModelJson(saved)));
    SayWrote(out, save_costs, "(measured costs in us, for simulate --costs)");
  }
  if (std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json j;
    j["schedule"] = schedule.name;
    j["stages"] = p;
    j["virtual"] = schedule.num_chunks();
    j["replicas"] = config.replicas;
    j["microbatches"] = schedule.num_microbatches;
    j["microbatch_size"] = config.microbatch_size;
    j["global_batch"] = trainer->global_batch();
    // Each with `replicas` replicas, or, split, its block of every replica's ranks.
    j["processes"] = processes != nullptr ? processes->size() : 1;
    j["split_stages"] = split;
    j["pipeline_processes"] = k;
    j["job_batch"] = trainer->job_batch();
    j["recompute"] = config.recompute;
    // The stages that did, whichever flag said so.
    j["recompute_stages"] = RecomputingStages(trainer->executor());
    if (recompute_plan.has_value()) {  // --recompute-stages=auto's choice, planned bytes
      nlohmann::json places = nlohmann::json::array();
      for (const stages::RecomputePlan::Place& place : recompute_plan->places) {
        places.push_back({{"name", place.name},
                          {"available_bytes", place.available_bytes},
                          {"planned_bytes_without", place.planned_without},
                          {"planned_bytes_with", place.planned_with}});
      }
      j["recompute_plan"] = {{"peak_bytes_without", recompute_plan->peak_without},
                             {"peak_bytes_with", recompute_plan->peak_with},
                             {"places", places},
                             {"exhaustive", recompute_plan->exhaustive}};
    }
    j["backend"] = std::string(runtime::BackendName(trainer->backend().kind()));
    nlohmann::json losses = nlohmann::json::array(), step_ms = nlohmann::json::array(),
                   bubble = nlohmann::json::array();
    for (const StepRecord& r : records) {
      losses.push_back(r.loss);
      step_ms.push_back(r.micros / 1000);
      bubble.push_back(r.measured_bubble);
    }
    j["losses"] = losses;
    j["step_ms"] = step_ms;
    j["measured_bubble_fraction_per_step"] = bubble;
    // The steps (1-based, of this run) the medians are of: the first is left out when
    // there are more (warm-up).
    j["median_of_steps"] = {first_counted, last_counted};
    j["median_step_ms"] = median_micros / 1000;
    j["samples_per_second"] = trainer->job_batch() / (median_micros * 1e-6);
    j["measured_bubble_fraction"] = Median(bubbles);
    j["planned_bubble_fraction"] = planned.bubble_fraction;
    j["planned_with_handoff_bubble_fraction"] = with_handoff.bubble_fraction;
    j["planned_spread_bubble_fraction"] = spread;
    j["planned_step_ms"] = planned.step_time / 1000;
    j["planned_with_handoff_step_ms"] = with_handoff.step_time / 1000;
    // The stream gap that plan used (null when no action of the last step had everything
    // it needed when its rank's previous action ended).
    j["action_gap_us"] = measured_gap >= 0 ? nlohmann::json(measured_gap) : nlohmann::json();
    j["last_step_measured_bubble_fraction"] = measured.bubble_fraction;
    j["last_step_replayed_bubble_fraction"] = replayed.bubble_fraction;
    j["last_step_makespan_ms"] = measured.makespan / 1000;
    j["last_step_replayed_makespan_ms"] = replayed.makespan / 1000;
    j["last_step_ms"] = last.step_micros / 1000;
    j["last_step_replayed_step_ms"] = replayed.step_time / 1000;
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < p; ++r) {
      ranks.push_back({{"measured_busy_us", measured.rows[r].busy},
                       {"measured_idle_us", measured.rows[r].idle},
                       {"planned_busy_us", planned.ranks[r].busy},
                       {"planned_idle_us", planned.ranks[r].idle},
                       {"state_bytes", state_bytes[r]},
                       {"planned_peak_activation_bytes", planned_peak[r]}});
    }
    j["ranks"] = ranks;
    PS_RETURN_IF_ERROR(
        write(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTrainCommandLine(const std::vector<std::string>& command) {
  std::ostringstream ignored;
  PS_ASSIGN_OR_RETURN(const std::optional<CommandContext> parsed,
                      ParseLaunchedCommand(command, "train", &ignored));
  if (!parsed.has_value()) return absl::OkStatus();  // --help
  const CommandContext& ctx = *parsed;
  PS_RETURN_IF_ERROR(CheckProcessFlags(ctx).status());
  PS_ASSIGN_OR_RETURN(const stages::TrainerConfig config, ConfigFromFlags(ctx));
  PS_RETURN_IF_ERROR(CheckRunFlags(ctx, config, Outputs::kLauncher));
  return stages::Trainer::CheckConfig(config);
}

int RunTrain(const CommandContext& ctx) {
  if (int code; RejectArguments(ctx, "train", code)) return code;
  absl::StatusOr<std::unique_ptr<comm::Bootstrap>> processes = JoinFromFlags(ctx);
  if (!processes.ok()) return ReportError(ctx, processes.status());
  std::ostream silent(nullptr);  // no buffer: writes go nowhere
  const absl::Status s = LeaveJob(
      processes->get(), Train(ContextInJob(ctx, processes->get(), &silent), processes->get()));
  return s.ok() ? kExitOk : ReportError(ctx, s);
}

}  // namespace pipesched::cli
