// `pipesched bench`: the bubble of every configuration of a sweep (schedule x P x M, V
// where the schedule takes it), three ways side by side -- closed form, simulator fed
// with this machine's measured costs, measured -- and where the measured idle time went
// (stages/bubble_analysis.h). Terminal table while it runs; CSV, JSON, Markdown and SVG.
// A configuration that cannot run is skipped with its reason; the sweep goes on.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/formats.h"
#include "pipesched/scheduler/formulas.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/stages/bubble_analysis.h"
#include "pipesched/stages/recompute_plan.h"
#include "pipesched/stages/trainer.h"
#include "pipesched/trace/chrome_trace.h"
#include "pipesched/trace/plot.h"
#include "pipesched/trace/stats.h"
#include "pipesched/trace/svg.h"

namespace pipesched::cli {
namespace {

// Bench's own defaults where they differ from train's: actions long compared with the
// host backend's event hand-off (tens of microseconds), a sweep of a few minutes.
constexpr int kBenchHidden = 512;
constexpr int kBenchMicrobatchSize = 64;
constexpr int kBenchSteps = 5;
// 17 blocks + head: the first block (inputs -> H) costs 1/8 of the others at the default
// 64 inputs, the head almost nothing, so 2, 4 or 8 chunks all get equal FLOPs (train's
// default of 8 blocks splits 4 + 5 layers at P=2: stage 1 does 30% more work).
constexpr int kBenchLayers = 17;

// A --from file: one configuration, with the file's P, V and M.
struct FileConfig {
  std::string path;
  scheduler::Schedule schedule;
};

struct Sweep {
  std::vector<std::string> schedules;
  std::vector<FileConfig> files;  // --from
  std::vector<int> stages, microbatches;
  int virtual_stages = 0;
  int warmup = 2, steps = kBenchSteps;
  int search_steps = 3;  // --search-steps
  int slow_rank = -1;
  double slow_factor = 1;
  // --recompute-stages=auto: each configuration recomputes the stages that make its ranks
  // fit their devices (stages::PlanRecompute).
  bool recompute_auto = false;
  stages::TrainerConfig base;
  std::string traces_dir;  // --traces: one trace + SVG per configuration, or empty
  // A job of several processes (cli/job.h), or null alone; its groups for the trainer.
  comm::Bootstrap* job = nullptr;
  const JobPlace* place = nullptr;
};

struct Row {
  std::string schedule;
  int p = 0, v = 0, m = 0;
  const FileConfig* file = nullptr;  // a --from file's configuration, else null
  std::string skipped;               // empty when it ran
  bool failed = false;               // skipped because it failed at run time (not bad input)
  // In a job: it passed the checks every process makes alike (Trainer::CheckConfig), then
  // failed, so the processes cannot go on together.
  bool stops_job = false;
  double step_ms = 0, samples_per_s = 0, makespan_ms = 0;
  double sim_ms = 0, sim_plain_ms = 0, replay_ms = 0, ideal_ms = 0;
  // Whole steps (zero-grad + actions + optimizer), simulated and replayed: against step_ms.
  double sim_step_ms = 0, replay_step_ms = 0;
  std::optional<double> closed_form;
  double simulated = 0, simulated_plain = 0, replayed = 0, measured = 0;
  double spread = 0;  // simulated with durations drawn from the step's (stages/bubble_analysis.h)
  double idle_us = 0;
  stages::IdleBreakdown idle;  // over ranks, us
  std::vector<stages::IdleBreakdown> idle_by_rank;
  std::vector<double> idle_us_by_rank;
  double handoff_us = -1;  // median over boundaries of the effective hand-off latency
  double transfer_us = 0;  // median measured transfer span
  double gap_us = -1;      // the stream gap between actions fed to the simulator
  std::vector<std::int64_t> peak_bytes, sim_peak_bytes;  // per rank
  // Ranks share devices (CUDA with fewer GPUs than P x D): the runtime measures per
  // device, so peak_bytes is per device instead (device 0, 1, ...) and not comparable
  // rank by rank with sim_peak_bytes.
  bool peak_per_device = false;
  scheduler::CostModel costs;  // what the simulator was fed
  double loss = 0;
  // The searched schedules (ScheduleInfo::uses_costs): how their order was searched
  // (CreateTrainer's note), else empty.
  std::string search_note;
  // The stages that recomputed (all with --recompute, the chosen ones with
  // --recompute-stages=auto, whose line recompute_note is).
  std::vector<int> recompute_stages;
  std::string recompute_note;
  // The median step, measured (shifted to start at 0) and as simulated, for --traces.
  trace::Timeline measured_tl, simulated_tl;
  // Every measured step, in order (JSON only): how much the three bubbles move from step
  // to step on this machine.
  struct Step {
    double step_ms = 0, measured = 0, simulated = 0, replayed = 0;
  };
  std::vector<Step> steps;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// `writes_files`: this process writes the outputs (alone, or process 0 of a job), so
// checks their paths and makes --traces.
absl::StatusOr<Sweep> SweepFromFlags(const CommandContext& ctx, bool writes_files) {
  Sweep sweep;
  PS_ASSIGN_OR_RETURN(sweep.base, TrainerConfigFromFlags(ctx));
  if (!FlagGiven(ctx, "hidden")) sweep.base.model.d_hidden = kBenchHidden;
  if (!FlagGiven(ctx, "microbatch_size")) sweep.base.microbatch_size = kBenchMicrobatchSize;
  if (!FlagGiven(ctx, "layers")) sweep.base.model.num_layers = kBenchLayers;
  // --from: each file one configuration, with its own P, V and M; the generated schedules
  // run too when --schedules names them.
  const std::string from = absl::GetFlag(FLAGS_from);
  const bool generated = from.empty() || FlagGiven(ctx, "schedules");
  if (!from.empty()) {
    std::vector<std::string> paths;
    for (absl::string_view path : absl::StrSplit(from, ',')) {
      if (path.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--from=", from, ": empty file name; give FILE[,FILE...]"));
      }
      if (std::find(paths.begin(), paths.end(), path) != paths.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--from lists ", path, " twice; name each file once"));
      }
      for (const std::string& earlier : paths) {  // the same file by another name
        std::error_code error;
        if (std::filesystem::equivalent(earlier, Std(path), error)) {
          return absl::InvalidArgumentError(absl::StrCat("--from lists ", earlier,
                                                         " twice (also as ", path,
                                                         ", the same file); name each file once"));
        }
      }
      paths.emplace_back(path);
    }
    for (const std::string& path : paths) {
      PS_ASSIGN_OR_RETURN(scheduler::Schedule schedule, LoadTrainableSchedule(path));
      sweep.files.push_back({.path = path, .schedule = std::move(schedule)});
    }
    if (!generated) {
      for (const char* f : {"stages", "microbatches", "virtual"}) {
        if (FlagGiven(ctx, f)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--", f, " applies to the generated schedules of --schedules; --from's files ",
              "have their own P, V and M: give --schedules too, or drop --", f));
        }
      }
      PS_RETURN_IF_ERROR(CheckSearchFlagsApply("", /*from_file=*/true,
                                               /*refines_any_order=*/false, SearchStepsGiven(ctx)));
    }
  }
  if (generated) {
    PS_ASSIGN_OR_RETURN(sweep.schedules,
                        SchedulesFromFlag(absl::GetFlag(FLAGS_schedules), SearchStepsGiven(ctx)));
    PS_ASSIGN_OR_RETURN(sweep.stages, IntList("stages", absl::GetFlag(FLAGS_bench_stages)));
    PS_ASSIGN_OR_RETURN(sweep.microbatches,
                        IntList("microbatches", absl::GetFlag(FLAGS_bench_microbatches)));
  }
  sweep.virtual_stages = absl::GetFlag(FLAGS_virtual);
  // --virtual applies to the schedules with several chunks per rank, the others run one:
  // a sweep with none of the former would ignore it.
  if (FlagGiven(ctx, "virtual") && sweep.virtual_stages > 0 &&
      std::none_of(sweep.schedules.begin(), sweep.schedules.end(), [](const std::string& name) {
        return scheduler::FindSchedule(name)->default_chunks > 1;
      })) {
    std::vector<std::string> chunked;
    for (const scheduler::ScheduleInfo& info : scheduler::AllSchedules()) {
      if (info.default_chunks > 1) chunked.emplace_back(info.name);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual=", sweep.virtual_stages,
                     " applies to the schedules with several chunks per "
                     "rank (",
                     absl::StrJoin(chunked, ", "),
                     "), and --schedules names none; drop --virtual "
                     "or add one of them"));
  }
  if (const std::string listed = absl::GetFlag(FLAGS_recompute_stages); !listed.empty()) {
    if (listed != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat("--recompute-stages=", listed,
                       ": bench takes auto (the stages chosen for each configuration to fit "
                       "--device-memory); a list fits one configuration, so run it with train"));
    }
    sweep.recompute_auto = true;
  }
  PS_ASSIGN_OR_RETURN(sweep.search_steps, SearchStepsFromFlags());
  sweep.warmup = absl::GetFlag(FLAGS_warmup);
  if (sweep.warmup < 0 || sweep.warmup > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup=", sweep.warmup, " is out of range: use 0 to 1000"));
  }
  if (FlagGiven(ctx, "steps")) sweep.steps = absl::GetFlag(FLAGS_steps);
  if (sweep.steps < 1 || sweep.steps > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", sweep.steps, " is out of range: use 1 to 100000"));
  }
  if (std::string slow = absl::GetFlag(FLAGS_slow_stage); !slow.empty()) {
    std::vector<std::string> parts = absl::StrSplit(slow, ':');
    int rank = 0;
    double factor = 0;
    // Decimal digits, as every number flag (abseil alone would take " 2" and "0x10").
    if (parts.size() != 2 || !IsIntegerLiteral(parts[0]) || !IsDecimalNumber(parts[1]) ||
        !absl::SimpleAtoi(parts[0], &rank) || !absl::SimpleAtod(parts[1], &factor) || rank < 0 ||
        !(factor >= 1) || !std::isfinite(factor) || factor > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slow-stage=", slow,
          ": write RANK:FACTOR with a rank >= 0 and a factor from 1 to 1000, e.g. 1:2"));
    }
    sweep.slow_rank = rank;
    sweep.slow_factor = factor;
  }
  if (!writes_files) return sweep;
  sweep.traces_dir = absl::GetFlag(FLAGS_traces);
  // Written after the sweep: a path that cannot be written is an error now, not then.
  std::vector<FlagPath> inputs = {{"--data", absl::GetFlag(FLAGS_data)},
                                  {"--init", absl::GetFlag(FLAGS_init)}};
  for (const FileConfig& file : sweep.files) inputs.push_back({"--from", file.path});
  PS_RETURN_IF_ERROR(CheckOutputs(inputs, {{"--csv", absl::GetFlag(FLAGS_csv)},
                                           {"--json", absl::GetFlag(FLAGS_json)},
                                           {"--md", absl::GetFlag(FLAGS_md)},
                                           {"--svg", absl::GetFlag(FLAGS_svg)}}));
  if (!sweep.traces_dir.empty()) {
    // Only the last component is made: a mistyped parent is an error, not a new tree.
    std::error_code ec;
    std::filesystem::path parent =
        std::filesystem::path(sweep.traces_dir).lexically_normal().parent_path();
    if (parent.empty()) parent = ".";
    if (!std::filesystem::is_directory(parent, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--traces=", sweep.traces_dir, ": ", parent.string(),
          std::filesystem::exists(parent, ec) ? " is not a directory" : " does not exist",
          "; give a directory inside an existing one (bench creates only the last)"));
    }
    std::filesystem::create_directory(sweep.traces_dir, ec);
    if (ec || !std::filesystem::is_directory(sweep.traces_dir)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--traces=", sweep.traces_dir, ": cannot create the directory (",
                       ec ? ec.message() : "a file is in the way",
                       "); give a directory path that can be written"));
    }
    // An existing directory may still not be writable: say so before the sweep, not
    // after its first configuration.
    if (::access(sweep.traces_dir.c_str(), W_OK | X_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--traces=", sweep.traces_dir, ": the directory is not writable (",
                       std::strerror(errno), "); give a directory that can be written"));
    }
  }
  return sweep;
}

std::string ConfigName(const Row& row) {
  return absl::StrCat(row.schedule, " P=", row.p, row.v > 1 ? absl::StrCat(" V=", row.v) : "",
                      " M=", row.m);
}

// Runs one configuration; a status for "skip with this reason".
absl::Status RunOne(const Sweep& sweep, const CommandContext& ctx, Row& row) {
  if (row.p < 1 || row.p > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stages=", row.p, " is out of range: use 1 to 1024"));
  }
  if (row.m < 1 || row.m > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("--microbatches=", row.m, " is out of range: use 1 to 65536"));
  }
  stages::TrainerConfig config = sweep.base;
  config.schedule = row.schedule;
  config.stages = row.p;
  config.microbatches = row.m;
  // A file's order runs as it is, whatever its name.
  const scheduler::ScheduleInfo* info =
      row.file != nullptr ? nullptr : scheduler::FindSchedule(row.schedule);
  config.virtual_stages = info != nullptr && info->default_chunks > 1 ? sweep.virtual_stages : 0;
  if (row.file != nullptr) {
    config.schedule_override = row.file->schedule;
    config.virtual_stages = row.v;
  }
  config.slow_rank = sweep.slow_rank;
  config.slow_factor = sweep.slow_factor;
  if (sweep.place != nullptr) {
    // The same in every process of the job (its flags agree: Trainer::Create checks), so
    // every process skips the same configurations and steps through the others together.
    const int k = sweep.place->k;
    if (k > 1 && row.p < k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a pipeline of ", row.p, row.p == 1 ? " rank" : " ranks", " cannot be split across ", k,
          " processes (each runs at least one rank): ",
          row.file != nullptr ? absl::StrCat("give a schedule of at least ", k, " ranks")
                              : absl::StrCat("give --stages of at least ", k)));
    }
    if (info != nullptr) PS_RETURN_IF_ERROR(CheckOneOrderInJob(row.schedule, sweep.search_steps));
    config.pipeline = sweep.place->pipeline;
    config.processes = sweep.place->processes;
    PS_RETURN_IF_ERROR(stages::Trainer::CheckConfig(config));
  }
  // The searched schedules: searched for this machine's costs, measured in a few steps first.
  std::unique_ptr<stages::Trainer> trainer;
  if (sweep.recompute_auto) {
    stages::RecomputePlan plan;
    PS_ASSIGN_OR_RETURN(trainer, CreateTrainerRecomputingToFit(&config, sweep.search_steps, "bench",
                                                               &plan, &row.search_note));
    row.recompute_note = RecomputePlanLine(plan);
  } else {
    PS_ASSIGN_OR_RETURN(trainer, CreateTrainer(&config, sweep.search_steps, &row.search_note));
  }
  // From here on, in a job, a failure leaves the processes apart (reset at the end).
  row.stops_job = sweep.job != nullptr;
  row.v = trainer->schedule().num_chunks();
  row.recompute_stages = RecomputingStages(trainer->executor());
  const int p = row.p, total = sweep.warmup + sweep.steps;
  std::vector<stages::StepResult> results;
  for (int step = 1; step <= total; ++step) {
    if (ctx.out_is_terminal) {
      *ctx.out << absl::StrFormat("\r  %-28s step %d/%d%s", ConfigName(row), step, total,
                                  step <= sweep.warmup ? " (warm-up)" : "          ")
               << std::flush;
    }
    absl::StatusOr<stages::StepResult> r = trainer->Step();
    if (!r.ok()) {
      row.failed = true;
      return absl::Status(r.status().code(),
                          absl::StrCat("failed at step ", step, ": ", r.status().message()));
    }
    if (step > sweep.warmup) results.push_back(*std::move(r));
  }
  if (ctx.out_is_terminal) *ctx.out << "\r" << std::string(60, ' ') << "\r" << std::flush;

  // The median step (the lower one for an even count).
  std::vector<int> order(results.size());
  for (int i = 0; i < static_cast<int>(order.size()); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return results[a].step_micros < results[b].step_micros; });
  const std::size_t median_step = order[(order.size() - 1) / 2];
  const stages::StepResult& med = results[median_step];
  row.step_ms = med.step_micros / 1000;
  row.samples_per_s = trainer->job_batch() / (med.step_micros * 1e-6);
  row.loss = med.loss;
  // Measured bubble and its decomposition (median step); hand-offs from every step.
  std::vector<stages::IdleAnalysis> analyses;
  for (const stages::StepResult& r : results) {
    PS_ASSIGN_OR_RETURN(stages::IdleAnalysis a, stages::AnalyzeIdle(r.timeline, r.issue_micros, p));
    analyses.push_back(std::move(a));
  }
  stages::IdleAnalysis& a = analyses[median_step];
  trace::BubbleStats measured = trace::ComputeBubbleStats(med.timeline, p);
  row.measured = measured.bubble_fraction;
  row.makespan_ms = measured.makespan / 1000;
  row.idle = a.total;
  row.idle_by_rank = a.rows;
  row.idle_us_by_rank = a.idle;
  for (double idle : a.idle) row.idle_us += idle;
  double busy = 0;
  for (const trace::RowStats& r : measured.rows) busy += r.busy;
  row.ideal_ms = busy / p / 1000;

  // Simulated: the simulator fed with the median (stage, op) durations of the median
  // step -- the step whose bubble is measured, so that both see the same machine load --
  // plainly (transfers = measured copy spans) and with each boundary's effective hand-off
  // latency as its transfer time (what the machine really costs a dependency; from all
  // measured steps where the median step has no sample), and the stream's measured gap
  // between actions (the runtime's overhead between two actions of a stream).
  PS_ASSIGN_OR_RETURN(
      scheduler::CostModel plain,
      stages::MeasuredCostModel({&med.timeline}, trainer->executor(), {&med.phases}));
  std::vector<const stages::IdleAnalysis*> pointers;
  for (const stages::IdleAnalysis& x : analyses) pointers.push_back(&x);
  const std::vector<double> pooled = stages::MedianHandoff(pointers);
  auto handoff_of = [&pooled](const stages::IdleAnalysis& step) {
    std::vector<double> h = stages::MedianHandoff({&step});
    for (std::size_t b = 0; b < h.size() && b < pooled.size(); ++b) {
      if (h[b] < 0) h[b] = pooled[b];
    }
    return h;
  };
  const std::vector<double> handoff = handoff_of(a);
  // The stream's own gap between two actions (its median over the step; over all steps
  // when the step has no sample): what the runtime costs between actions.
  const double pooled_gap = stages::MedianGap(pointers);
  auto gap_of = [pooled_gap](const stages::IdleAnalysis& step) {
    const double gap = stages::MedianGap({&step});
    return gap >= 0 ? gap : pooled_gap;
  };
  row.gap_us = gap_of(a);
  std::vector<double> measured_handoffs;
  for (double h : handoff) {
    if (h >= 0) measured_handoffs.push_back(h);
  }
  row.handoff_us = measured_handoffs.empty() ? -1 : Median(measured_handoffs);
  row.transfer_us = plain.comm_uniform;
  // Imbalance against the same work split evenly (stages/bubble_analysis.h).
  PS_ASSIGN_OR_RETURN(std::vector<double> balanced,
                      stages::BalancedIdle(trainer->schedule(), plain));
  stages::SplitByBalancedReference(a, balanced);
  row.idle = a.total;
  row.idle_by_rank = a.rows;
  scheduler::CostModel effective = stages::WithHandoffLatency(plain, handoff);
  effective.action_gap = std::max(row.gap_us, 0.0);
  row.costs = effective;
  // With each stage's parameters, gradients and optimizer state, for --traces' cost file
  // (simulate and compare --device-memory then check a device whole); no timing uses it.
  if (static_cast<int>(row.costs.stages.size()) == trainer->schedule().num_stages()) {
    for (int s = 0; s < trainer->schedule().num_stages(); ++s) {
      row.costs.stages[s].static_bytes = trainer->stage_state_bytes(s);
    }
  }
  PS_ASSIGN_OR_RETURN(scheduler::SimResult sim_plain,
                      scheduler::Simulate(trainer->schedule(), plain));
  PS_ASSIGN_OR_RETURN(scheduler::SimResult sim,
                      scheduler::Simulate(trainer->schedule(), effective));
  row.simulated_plain = sim_plain.bubble_fraction;
  // Replayed: the same, but every compute action of the median step takes its own
  // measured duration instead of its (stage, op) median: sim - replayed is what the
  // spread of the actions' durations in this step did, replayed - measured what the
  // simulator does not model.
  PS_ASSIGN_OR_RETURN(
      scheduler::SimResult replay,
      scheduler::Simulate(
          trainer->schedule(),
          stages::WithHandoffs(
              stages::WithPhaseDurations(stages::WithActionDurations(effective, med.timeline, p),
                                         med.phases, p),
              a)));
  PS_ASSIGN_OR_RETURN(row.spread,
                      stages::SpreadBubble(trainer->schedule(), effective, med.timeline, p, a,
                                           SpreadDraws(trainer->schedule()), kSpreadSeed));
  row.replayed = replay.bubble_fraction;
  row.replay_ms = replay.makespan / 1000;
  row.replay_step_ms = replay.step_time / 1000;
  row.simulated = sim.bubble_fraction;
  row.sim_plain_ms = sim_plain.makespan / 1000;
  row.sim_ms = sim.makespan / 1000;
  row.sim_step_ms = sim.step_time / 1000;
  for (int r = 0; r < p; ++r) row.sim_peak_bytes.push_back(sim.ranks[r].peak_live_bytes);
  // The same three numbers for every measured step, each fed with its own step's costs
  // (the median step's are the row's).
  for (std::size_t k = 0; k < results.size(); ++k) {
    if (k == median_step) {
      row.steps.push_back({.step_ms = row.step_ms,
                           .measured = row.measured,
                           .simulated = row.simulated,
                           .replayed = row.replayed});
      continue;
    }
    PS_ASSIGN_OR_RETURN(scheduler::CostModel step_measured,
                        stages::MeasuredCostModel({&results[k].timeline}, trainer->executor(),
                                                  {&results[k].phases}));
    scheduler::CostModel step_costs =
        stages::WithHandoffLatency(std::move(step_measured), handoff_of(analyses[k]));
    step_costs.action_gap = std::max(gap_of(analyses[k]), 0.0);
    PS_ASSIGN_OR_RETURN(scheduler::SimResult step_sim,
                        scheduler::Simulate(trainer->schedule(), step_costs));
    PS_ASSIGN_OR_RETURN(
        scheduler::SimResult step_replay,
        scheduler::Simulate(
            trainer->schedule(),
            stages::WithHandoffs(stages::WithPhaseDurations(stages::WithActionDurations(
                                                                step_costs, results[k].timeline, p),
                                                            results[k].phases, p),
                                 analyses[k])));
    row.steps.push_back(
        {.step_ms = results[k].step_micros / 1000,
         .measured = trace::ComputeBubbleStats(results[k].timeline, p).bubble_fraction,
         .simulated = step_sim.bubble_fraction,
         .replayed = step_replay.bubble_fraction});
  }
  if (!sweep.traces_dir.empty()) {
    // Replica 0 (rows 0..P-1), the rows the simulator plans, shifted to start at 0.
    row.measured_tl = {.time_unit = med.timeline.time_unit, .num_ranks = p};
    std::vector<int> index(med.timeline.spans.size(), -1);  // old span index -> new
    for (std::size_t k = 0; k < med.timeline.spans.size(); ++k) {
      trace::Span span = med.timeline.spans[k];
      if (span.rank >= p) continue;
      span.start -= measured.start;
      span.end -= measured.start;
      index[k] = static_cast<int>(row.measured_tl.spans.size());
      row.measured_tl.spans.push_back(span);
    }
    // With the step's zero-grads and optimizer steps, from the step's start.
    std::vector<trace::Span> phases;
    for (trace::Span s : med.phases) {
      if (s.rank >= p) continue;
      s.start -= measured.start;
      s.end -= measured.start;
      phases.push_back(s);
    }
    for (const trace::Flow& flow : med.timeline.flows) {
      if (index[flow.from] >= 0 && index[flow.to] >= 0) {
        row.measured_tl.flows.push_back({.from = index[flow.from], .to = index[flow.to]});
      }
    }
    row.measured_tl.name = absl::StrCat(ConfigName(row), " (measured, median step)");
    row.measured_tl = trace::WithStepPhases(std::move(row.measured_tl), phases);
    trace::Timeline simulated = std::move(sim.timeline);  // not read again
    simulated.name = absl::StrCat(ConfigName(row), " (simulated from measured costs)");
    simulated.time_unit = "us";
    row.simulated_tl = trace::WithStepPhases(std::move(simulated), sim.phases);
  }

  // Closed form with the stages' mean costs (uniform), where the schedule has one.
  scheduler::FormulaInputs in{.num_ranks = p, .num_chunks = row.v, .num_microbatches = row.m};
  in.costs = {};
  const double n = static_cast<double>(plain.stages.size());
  in.costs.f = in.costs.b = in.costs.i = in.costs.w = 0;
  for (const scheduler::StageCosts& c : plain.stages) {
    in.costs.f += c.f / n;
    in.costs.b += c.b / n;
    in.costs.i += c.i / n;
    in.costs.w += c.w / n;
    in.costs.allreduce += c.allreduce / n;
  }
  // A file's closed form is its generator's only where the file holds that very order.
  const std::string& named_as = row.file != nullptr ? row.file->schedule.name : row.schedule;
  row.closed_form = scheduler::ClosedFormBubbleFraction(named_as, in);
  if (row.file != nullptr && row.closed_form.has_value() &&
      !scheduler::RunsItsNamesOrder(row.file->schedule)) {
    row.closed_form.reset();
  }

  // Peak activation memory from one more step with exact accounting (the host waits for
  // stream-ordered frees before issuing: exact, but it would perturb the timed steps), on
  // a trainer of its own, made once the timed one is gone: both at once would hold the
  // model twice, and the second would be refused a host memory the first one holds.
  trainer.reset();
  config.exact_memory_accounting = true;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<stages::Trainer> exact, stages::Trainer::Create(config));
  PS_ASSIGN_OR_RETURN(stages::StepResult exact_step, exact->Step());
  const std::vector<int>& device_of = exact_step.device_of_row;
  const int devices =
      device_of.empty() ? 0 : *std::max_element(device_of.begin(), device_of.end()) + 1;
  row.peak_per_device = devices < static_cast<int>(device_of.size());
  if (row.peak_per_device) {
    row.peak_bytes.assign(devices, 0);
    for (std::size_t i = 0; i < device_of.size(); ++i) {
      row.peak_bytes[device_of[i]] = exact_step.peak_activation_bytes[i];
    }
  } else {
    row.peak_bytes.assign(exact_step.peak_activation_bytes.begin(),
                          exact_step.peak_activation_bytes.begin() + p);
  }
  row.stops_job = false;
  return absl::OkStatus();
}

std::string Pct(double f) { return absl::StrFormat("%.1f%%", 100 * f); }
std::string Pct(const std::optional<double>& f) { return f ? Pct(*f) : "n/a"; }

// Share of the idle time, in percent of it.
double Share(double part, double idle) { return idle > 0 ? 100 * part / idle : 0; }

// Each rank's peak, in the unit that fits it ("20.0 KiB/26.0 KiB"): a small model's
// peaks of a few KiB read 0.0 in MiB.
std::string PeakBytes(const std::vector<std::int64_t>& bytes) {
  std::vector<std::string> parts;
  for (std::int64_t b : bytes) parts.push_back(HumanBytes(b));
  return absl::StrJoin(parts, "/");
}

// Per rank, or "... per device" when ranks share devices.
std::string PeakText(const Row& r) {
  return r.peak_per_device ? PeakBytes(r.peak_bytes) + " per device" : PeakBytes(r.peak_bytes);
}

constexpr char kHeaderFormat[] =
    "%-17s %2s %2s %3s %9s %9s  %6s %6s %6s %6s %6s %6s   %5s %5s %5s %5s %5s %6s  %s\n";

void PrintHeader(std::ostream& out) {
  out << absl::StrFormat(kHeaderFormat, "schedule", "P", "V", "M", "step ms", "samples/s", "closed",
                         "sim", "spread", "replay", "meas", "d pp", "dep", "xfer", "ar", "host",
                         "imb", "expl", "peak activations/rank");
}

void PrintRow(std::ostream& out, const Row& r) {
  if (!r.skipped.empty()) {
    out << absl::StrFormat("%-17s %2d %2s %3d  %s: %s\n", r.schedule, r.p,
                           r.v > 0 ? absl::StrCat(r.v) : "-", r.m, r.failed ? "failed" : "skipped",
                           r.skipped);
    return;
  }
  out << absl::StrFormat(kHeaderFormat, r.schedule, absl::StrCat(r.p), absl::StrCat(r.v),
                         absl::StrCat(r.m), absl::StrFormat("%.2f", r.step_ms),
                         absl::StrFormat("%.0f", r.samples_per_s), Pct(r.closed_form),
                         Pct(r.simulated), Pct(r.spread), Pct(r.replayed), Pct(r.measured),
                         absl::StrFormat("%+.1f", 100 * (r.simulated - r.measured)),
                         absl::StrFormat("%.0f%%", Share(r.idle.dependency, r.idle_us)),
                         absl::StrFormat("%.0f%%", Share(r.idle.transfer, r.idle_us)),
                         absl::StrFormat("%.0f%%", Share(r.idle.allreduce, r.idle_us)),
                         absl::StrFormat("%.0f%%", Share(r.idle.host, r.idle_us)),
                         absl::StrFormat("%.0f%%", Share(r.idle.imbalance, r.idle_us)),
                         absl::StrFormat("%.1f%%", Share(r.idle.total(), r.idle_us)), PeakText(r));
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string Join(const std::vector<std::int64_t>& v, std::string_view sep) {
  return absl::StrJoin(v, Absl(sep));
}

constexpr const char* kColumns[] = {"schedule",
                                    "stages",
                                    "virtual",
                                    "microbatches",
                                    "microbatch_size",
                                    "replicas",
                                    "recompute",
                                    "recompute_stages",
                                    "slow_stage",
                                    "slow_factor",
                                    "status",
                                    "reason",
                                    "step_ms",
                                    "samples_per_s",
                                    "makespan_ms",
                                    "simulated_makespan_ms",
                                    "simulated_plain_makespan_ms",
                                    "replayed_makespan_ms",
                                    "simulated_step_ms",
                                    "replayed_step_ms",
                                    "ideal_ms",
                                    "bubble_closed_form",
                                    "bubble_simulated",
                                    "bubble_simulated_plain",
                                    "bubble_simulated_spread",
                                    "bubble_replayed",
                                    "bubble_measured",
                                    "idle_us",
                                    "idle_dependency_us",
                                    "idle_transfer_us",
                                    "idle_allreduce_us",
                                    "idle_host_us",
                                    "idle_imbalance_us",
                                    "idle_explained",
                                    "handoff_us",
                                    "transfer_us",
                                    "action_gap_us",
                                    "peak_activation_bytes",
                                    "peak_activation_bytes_per_device",
                                    "simulated_peak_activation_bytes"};

nlohmann::json RowJson(const Row& r, const Sweep& sweep) {
  nlohmann::json j;
  j["schedule"] = r.schedule;
  j["from"] = r.file != nullptr ? nlohmann::json(r.file->path) : nlohmann::json();
  j["stages"] = r.p;
  j["virtual"] = r.v;
  j["microbatches"] = r.m;
  j["microbatch_size"] = sweep.base.microbatch_size;
  j["replicas"] = sweep.base.replicas;
  j["recompute"] = sweep.base.recompute;
  j["slow_stage"] = sweep.slow_rank >= 0 ? nlohmann::json(sweep.slow_rank) : nlohmann::json();
  j["slow_factor"] = sweep.slow_factor;
  j["status"] = r.skipped.empty() ? "ok" : (r.failed ? "failed" : "skipped");
  j["reason"] = r.skipped;
  // The searched schedules: how the order that ran was searched (one line per decision), else "".
  j["search"] = std::string(absl::StripTrailingAsciiWhitespace(r.search_note));
  if (!r.skipped.empty()) return j;
  j["recompute_stages"] = r.recompute_stages;  // those that did, whichever flag said so
  j["step_ms"] = r.step_ms;
  j["samples_per_s"] = r.samples_per_s;
  j["makespan_ms"] = r.makespan_ms;
  j["simulated_makespan_ms"] = r.sim_ms;
  j["simulated_plain_makespan_ms"] = r.sim_plain_ms;
  j["replayed_makespan_ms"] = r.replay_ms;
  j["simulated_step_ms"] = r.sim_step_ms;
  j["replayed_step_ms"] = r.replay_step_ms;
  j["ideal_ms"] = r.ideal_ms;
  j["bubble_closed_form"] = r.closed_form ? nlohmann::json(*r.closed_form) : nlohmann::json();
  j["bubble_simulated"] = r.simulated;
  j["bubble_simulated_plain"] = r.simulated_plain;
  j["bubble_simulated_spread"] = r.spread;
  j["bubble_replayed"] = r.replayed;
  j["bubble_measured"] = r.measured;
  j["idle_us"] = r.idle_us;
  j["idle_dependency_us"] = r.idle.dependency;
  j["idle_transfer_us"] = r.idle.transfer;
  j["idle_allreduce_us"] = r.idle.allreduce;
  j["idle_host_us"] = r.idle.host;
  j["idle_imbalance_us"] = r.idle.imbalance;
  j["idle_explained"] = r.idle_us > 0 ? r.idle.total() / r.idle_us : 1.0;
  // Null where no cross-rank dependency was measured (P=1).
  j["handoff_us"] = r.handoff_us >= 0 ? nlohmann::json(r.handoff_us) : nlohmann::json();
  j["transfer_us"] = r.transfer_us;
  // Null where no action followed another with everything it needed ready.
  j["action_gap_us"] = r.gap_us >= 0 ? nlohmann::json(r.gap_us) : nlohmann::json();
  // Per rank, or null when ranks share devices; then per device in the next field.
  j["peak_activation_bytes"] = r.peak_per_device ? nlohmann::json() : nlohmann::json(r.peak_bytes);
  j["peak_activation_bytes_per_device"] =
      r.peak_per_device ? nlohmann::json(r.peak_bytes) : nlohmann::json();
  j["simulated_peak_activation_bytes"] = r.sim_peak_bytes;
  nlohmann::json costs = nlohmann::json::array();
  for (const scheduler::StageCosts& c : r.costs.stages) {
    costs.push_back({{"f_us", c.f}, {"b_us", c.b}, {"i_us", c.i}, {"w_us", c.w}});
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (std::size_t k = 0; k < r.idle_by_rank.size(); ++k) {
    const stages::IdleBreakdown& b = r.idle_by_rank[k];
    ranks.push_back({{"idle_us", r.idle_us_by_rank[k]},
                     {"dependency_us", b.dependency},
                     {"transfer_us", b.transfer},
                     {"allreduce_us", b.allreduce},
                     {"host_us", b.host},
                     {"imbalance_us", b.imbalance}});
  }
  j["idle_by_rank"] = ranks;                  // JSON only
  j["simulator_stage_costs"] = costs;         // JSON only: per virtual stage
  j["simulator_boundary_us"] = r.costs.comm;  // per boundary: hand-off latency
  nlohmann::json steps = nlohmann::json::array();
  for (const Row::Step& st : r.steps) {
    steps.push_back({{"step_ms", st.step_ms},
                     {"bubble_measured", st.measured},
                     {"bubble_simulated", st.simulated},
                     {"bubble_replayed", st.replayed}});
  }
  j["steps"] = steps;  // JSON only: every measured step
  return j;
}

std::string ToCsv(const std::vector<Row>& rows, const Sweep& sweep) {
  std::string out = absl::StrJoin(kColumns, ",") + "\n";
  for (const Row& r : rows) {
    nlohmann::json j = RowJson(r, sweep);
    std::vector<std::string> fields;
    for (const char* c : kColumns) {
      if (!j.contains(c) || j[c].is_null()) {
        fields.emplace_back();
      } else if (j[c].is_string()) {
        fields.push_back(CsvField(j[c].get<std::string>()));
      } else if (j[c].is_array()) {  // the byte counts per rank
        fields.push_back(Join(j[c].get<std::vector<std::int64_t>>(), ";"));
      } else if (j[c].is_number_float()) {
        fields.push_back(absl::StrFormat("%.6g", j[c].get<double>()));
      } else {
        fields.push_back(j[c].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      }
    }
    out += absl::StrJoin(fields, ",") + "\n";
  }
  return out;
}

std::string ToMarkdown(const std::vector<Row>& rows) {
  std::string md =
      "| schedule | P | V | M | step ms | samples/s | closed form | simulated | spread | "
      "replayed | measured | sim - meas (pp) | spread - meas (pp) | dependency | transfer | "
      "all-reduce | host | imbalance | explained | peak activations per rank "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::string skipped;
  for (const Row& r : rows) {
    if (!r.skipped.empty()) {
      absl::StrAppend(&skipped, "- ", ConfigName(r), ": ", r.skipped, "\n");
      continue;
    }
    absl::StrAppend(
        &md, absl::StrFormat("| %s | %d | %d | %d | %.2f | %.0f | %s | %s | %s | %s | %s | %+.1f | "
                             "%+.1f | %.0f%% | %.0f%% | %.0f%% | %.0f%% | %.0f%% | %.1f%% | %s |\n",
                             MarkdownCell(r.schedule), r.p, r.v, r.m, r.step_ms, r.samples_per_s,
                             Pct(r.closed_form), Pct(r.simulated), Pct(r.spread), Pct(r.replayed),
                             Pct(r.measured), 100 * (r.simulated - r.measured),
                             100 * (r.spread - r.measured), Share(r.idle.dependency, r.idle_us),
                             Share(r.idle.transfer, r.idle_us), Share(r.idle.allreduce, r.idle_us),
                             Share(r.idle.host, r.idle_us), Share(r.idle.imbalance, r.idle_us),
                             Share(r.idle.total(), r.idle_us), PeakText(r)));
  }
  if (!skipped.empty()) absl::StrAppend(&md, "\nSkipped:\n\n", skipped);
  return md;
}

std::string ToPlots(const std::vector<Row>& rows, const Sweep& sweep, const std::string& subtitle) {
  std::vector<trace::Plot> panels;
  std::map<std::string, int> color;
  for (const std::string& s : sweep.schedules) color.emplace(s, static_cast<int>(color.size()));
  std::set<int> ps;
  for (const Row& r : rows) {
    if (r.skipped.empty()) ps.insert(r.p);
  }
  const trace::Marker markers[] = {trace::Marker::kCircle, trace::Marker::kSquare,
                                   trace::Marker::kTriangle, trace::Marker::kDiamond};
  auto marker_of = [&](const std::string& s) { return markers[color[s] % 4]; };
  for (int p : ps) {
    trace::Plot plot;
    plot.title = absl::StrCat("P=", p, ": bubble fraction vs micro-batches");
    plot.x_label = "micro-batches M";
    plot.y_label = "bubble fraction (idle / (P x makespan))";
    plot.x_log2 = true;
    plot.y_percent = true;
    plot.y_min = 0;
    for (const std::string& s : sweep.schedules) {
      trace::PlotSeries sim{
          .name = s, .color = trace::PaletteColor(color[s]), .marker = trace::Marker::kNone};
      trace::PlotSeries closed{.color = sim.color, .dashed = true, .marker = trace::Marker::kNone};
      trace::PlotSeries meas{
          .color = sim.color, .line = false, .marker = marker_of(s), .marker_size = 5};
      for (const Row& r : rows) {
        if (r.schedule != s || r.p != p || !r.skipped.empty()) continue;
        sim.x.push_back(r.m);
        sim.y.push_back(r.simulated);
        meas.x.push_back(r.m);
        meas.y.push_back(r.measured);
        meas.tooltips.push_back(absl::StrCat(ConfigName(r), ": measured ", Pct(r.measured),
                                             ", simulated ", Pct(r.simulated), ", closed form ",
                                             Pct(r.closed_form)));
        if (r.closed_form) {
          closed.x.push_back(r.m);
          closed.y.push_back(*r.closed_form);
        }
      }
      if (sim.x.empty()) continue;
      plot.series.push_back(std::move(sim));
      plot.series.push_back(std::move(closed));
      plot.series.push_back(std::move(meas));
    }
    plot.legend_keys = {
        {.name = "simulated (measured costs)", .color = "#555555", .marker = trace::Marker::kNone},
        {.name = "closed form", .color = "#555555", .dashed = true, .marker = trace::Marker::kNone},
        {.name = "measured", .color = "#555555", .line = false, .marker_size = 5}};
    panels.push_back(std::move(plot));
  }
  trace::Plot scatter;
  scatter.title = "simulated vs measured, every configuration";
  scatter.x_label = "simulated bubble fraction";
  scatter.y_label = "measured bubble fraction";
  scatter.x_percent = scatter.y_percent = true;
  scatter.x_min = scatter.y_min = 0;
  scatter.diagonal = true;
  scatter.diagonal_band = 0.03;
  for (const std::string& s : sweep.schedules) {
    trace::PlotSeries pts{.name = s,
                          .color = trace::PaletteColor(color[s]),
                          .line = false,
                          .marker = marker_of(s),
                          .marker_size = 5};
    for (const Row& r : rows) {
      if (r.schedule != s || !r.skipped.empty()) continue;
      pts.x.push_back(r.simulated);
      pts.y.push_back(r.measured);
      pts.tooltips.push_back(absl::StrCat(ConfigName(r), ": simulated ", Pct(r.simulated),
                                          " (spread ", Pct(r.spread), "), measured ",
                                          Pct(r.measured)));
    }
    if (!pts.x.empty()) scatter.series.push_back(std::move(pts));
  }
  scatter.legend_keys = {{.name = "y = x (band: +-3 pp)",
                          .color = "#888888",
                          .dashed = true,
                          .marker = trace::Marker::kNone}};
  panels.push_back(std::move(scatter));
  return trace::ToSvgFigure(panels, {.title = "pipesched bench: predicted vs measured bubble",
                                     .subtitle = subtitle,
                                     .columns = std::min<int>(3, panels.size())});
}

// File name stem of a configuration: "1f1b-p2-m8", "zb-v-p2-v2-m16".
// The configuration's file name in --traces: a --from file's row name may hold its path
// (and a JSON schedule's name anything), so all but letters, digits, '.', '-' and '_'
// become '_'.
std::string FileStem(const Row& r) {
  std::string name = r.schedule;
  for (char& c : name) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '-' || c == '_';
    if (!plain) c = '_';
  }
  if (name.empty() || name[0] == '.') name.insert(0, "_");  // no hidden or empty names
  return absl::StrCat(name, "-p", r.p, r.v > 1 ? absl::StrCat("-v", r.v) : "", "-m", r.m);
}

// --traces: the configuration's simulated and measured median step on one time axis,
// and the costs the simulator was fed (a cost-model file: `simulate --costs` with it
// redraws the simulated step, or another schedule of the same P x V on these costs).
absl::Status WriteTraces(const Sweep& sweep, const Row& r, std::ostream& out) {
  const std::vector<const trace::Timeline*> timelines = {&r.simulated_tl, &r.measured_tl};
  const std::string stem = (std::filesystem::path(sweep.traces_dir) / FileStem(r)).string();
  PS_RETURN_IF_ERROR(WriteFileAtomic(stem + ".json", trace::ToChromeTrace(timelines)));
  trace::SvgOptions options;
  options.title = absl::StrCat(ConfigName(r), ": simulated vs measured (median step)");
  options.subtitle = absl::StrFormat("bubble fraction simulated %.1f%%, measured %.1f%%",
                                     100 * r.simulated, 100 * r.measured);
  PS_RETURN_IF_ERROR(WriteFileAtomic(stem + ".svg", trace::ToSvg(timelines, options)));
  PS_RETURN_IF_ERROR(WriteFileAtomic(stem + ".costs.json", scheduler::ToCostModelJson(r.costs)));
  out << "  wrote " << stem << ".json, .svg and .costs.json\n";
  return absl::OkStatus();
}

std::string LoadAverage() {
  absl::StatusOr<std::string> text = ReadFile("/proc/loadavg");
  if (!text.ok()) return "unknown";
  std::vector<std::string> parts = absl::StrSplit(*text, ' ');
  return parts.size() >= 3 ? absl::StrCat(parts[0], " ", parts[1], " ", parts[2]) : "unknown";
}

// The sweep, alone or as one process of `job` (null alone), whose process 0 reports it:
// the table, the files. Errors are the caller's to report; otherwise the exit code
// (kExitBadInput when nothing could run, kExitFailure when a configuration failed).
absl::StatusOr<int> Bench(const CommandContext& given, comm::Bootstrap* job) {
  const bool reports = job == nullptr || job->rank() == 0;
  std::ostream silent(nullptr);  // no buffer: writes go nowhere
  CommandContext ctx = given;
  if (!reports) {
    ctx.out = &silent;
    ctx.out_is_terminal = false;
  }
  std::ostream& out = *ctx.out;
  JobPlace place;
  if (job != nullptr) {
    PS_ASSIGN_OR_RETURN(place, PlaceInJob(*job));
  }
  PS_ASSIGN_OR_RETURN(Sweep sweep, SweepFromFlags(ctx, reports));
  if (job != nullptr) {
    sweep.job = job;
    sweep.place = &place;
    // Every process steps through the same configurations, as many steps each, and
    // makes the same decisions about them: the same flags (the --from files' orders too).
    std::vector<std::string> files;
    for (const FileConfig& f : sweep.files) {
      files.push_back(absl::StrFormat("%s P=%d V=%d M=%d order %016x", f.schedule.name,
                                      f.schedule.num_ranks(), f.schedule.num_chunks(),
                                      f.schedule.num_microbatches, f.schedule.OrderFingerprint()));
    }
    PS_RETURN_IF_ERROR(
        CheckSameFlags(*job, "bench",
                       // Paths that may differ between hosts: what the files hold is
                       // compared (the --from orders here, the data by the trainer).
                       {"process_rank", "rendezvous", "rendezvous_timeout", "devices", "csv",
                        "json", "md", "svg", "traces", "from", "data"},
                       absl::StrCat("--from's schedules=", absl::StrJoin(files, "; "))));
  }
  const stages::TrainerConfig& b = sweep.base;
  const int pipelines = job != nullptr ? job->size() / place.k : 1;
  const std::string model = absl::StrFormat(
      "MLP %d inputs, %d blocks of width %d, %d classes; micro-batch %d; D=%d; backend %s%s%s",
      b.model.d_in, b.model.num_layers, b.model.d_hidden, b.model.num_classes, b.microbatch_size,
      b.replicas, b.backend,
      b.recompute            ? "; activation recomputation"
      : sweep.recompute_auto ? "; activation recomputation where the activations do not fit"
                             : "",
      job != nullptr
          ? absl::StrFormat("; job of %d processes, %d per pipeline", job->size(), place.k)
          : "");
  if (!reports) {
    *given.out << absl::StrFormat("bench: process %d of %d (%s); process 0 reports the sweep\n",
                                  job->rank(), job->size(), MeetingPlace(*job))
               << std::flush;
  }
  const std::string load = LoadAverage();
  out << "bench: " << model << "\n"
      << absl::StrFormat(
             "%d warm-up + %d measured steps per configuration, median step%s; load "
             "average %s\n",
             sweep.warmup, sweep.steps,
             sweep.slow_rank >= 0
                 ? absl::StrFormat("; rank %d slowed %gx", sweep.slow_rank, sweep.slow_factor)
                 : "",
             load)
      << "bubble = idle / (P x makespan); sim: simulator on the step's (stage, op) medians, "
         "spread: its mean over draws of the step's durations, replay: on each action's own; "
         "d pp = sim - meas\n"
         "idle shares: dep(endency) xfer (transfer/hand-off) ar (all-reduce) host (issue) "
         "imb(alance); expl = their sum / measured idle\n";
  if (job != nullptr) {
    out << absl::StrFormat("job: %d processes (%s); ", job->size(), MeetingPlace(*job))
        << (place.k == job->size()
                ? "they split each pipeline's ranks in blocks; every process's rows are gathered "
                  "at each step's end, on process 0's clock, so the figures are the whole "
                  "pipeline's\n"
            : place.k > 1
                ? absl::StrFormat(
                      "%d pipelines of %d processes, averaging their gradients; the figures are "
                      "process 0's pipeline's (its processes' rows gathered on process 0's "
                      "clock)\n",
                      pipelines, place.k)
                : "each holds whole replicas, averaging their gradients; the figures are "
                  "process 0's replicas'\n");
  }
  // Host devices compute on CPU threads; configurations with more busy devices than
  // cores run ranks that slow each other down, which no simulation here models.
  const absl::StatusOr<runtime::BackendKind> kind = runtime::ResolveBackend(b.backend);
  // The configurations: schedules x P x M, then the --from files.
  std::vector<Row> planned;
  for (const std::string& s : sweep.schedules) {
    for (int p : sweep.stages) {
      for (int m : sweep.microbatches) planned.push_back({.schedule = s, .p = p, .m = m});
    }
  }
  for (const FileConfig& file : sweep.files) {
    // Named as its file names it, unless a generated schedule or an earlier file took
    // that name (their rows and plotted series would merge).
    std::string name = file.schedule.name;
    if (std::any_of(planned.begin(), planned.end(),
                    [&name](const Row& r) { return r.schedule == name; })) {
      name = absl::StrCat(name, " (", file.path, ")");
    }
    planned.push_back({.schedule = name,
                       .p = file.schedule.num_ranks(),
                       .v = file.schedule.num_chunks(),
                       .m = file.schedule.num_microbatches,
                       .file = &file});
  }
  int most_ranks = 1;
  for (const Row& row : planned) most_ranks = std::max(most_ranks, row.p);
  const int most_devices = most_ranks * b.replicas * pipelines;
  const int busy_devices = b.num_devices > 0 ? std::min(b.num_devices, most_devices) : most_devices;
  const int cpus = HostCpuCount();
  if (kind.ok() && *kind == runtime::BackendKind::kHost && busy_devices > cpus) {
    out << absl::StrFormat(
        "note: %d CPU core(s); configurations with more than %d devices (P x D%s) run ranks "
        "that slow each other down when they compute at once, which the simulations do not "
        "model\n",
        cpus, cpus, pipelines > 1 ? " x pipelines" : "");
  }
  PrintHeader(out);
  std::vector<Row> rows;
  const int total = static_cast<int>(planned.size());
  int ran = 0, failed = 0;
  // In a job: the failure that stopped the sweep (the processes cannot go on together).
  absl::Status stopped;
  for (Row& row : planned) {
    absl::Status st = RunOne(sweep, ctx, row);
    if (!st.ok()) {
      row.skipped = std::string(st.message());
      if (ctx.out_is_terminal) out << "\r" << std::string(60, ' ') << "\r";
      // A refusal that every process saw alike is a skip; a job that failed (this
      // process, or another: Trainer::Create and the executor fail it) ends the sweep.
      if (job != nullptr && (row.stops_job || !job->Failure().ok())) {
        row.failed = true;
        stopped = absl::Status(st.code(), absl::StrCat(ConfigName(row), ": ", st.message()));
      }
    }
    ran += st.ok();
    failed += row.failed;
    PrintRow(out, row);
    if (st.ok() && !row.recompute_note.empty()) out << "  " << row.recompute_note << "\n";
    for (absl::string_view line : absl::StrSplit(row.search_note, '\n', absl::SkipEmpty())) {
      out << "  " << line << "\n";
    }
    if (st.ok() && !sweep.traces_dir.empty()) {
      PS_RETURN_IF_ERROR(WriteTraces(sweep, row, out));
      row.measured_tl = {};
      row.simulated_tl = {};
    }
    out << std::flush;
    rows.push_back(std::move(row));
    if (!stopped.ok()) break;
  }
  out << absl::StrFormat("%d of %d configurations ran", ran, total);
  if (!stopped.ok()) {
    const int left = total - static_cast<int>(rows.size());
    out << absl::StrFormat("; the job stopped at %s (a process failed)", ConfigName(rows.back()))
        << (left > 0 ? absl::StrFormat(", and the %d after it did not run", left) : "");
  } else if (ran < total) {
    out << absl::StrFormat(", %d skipped", total - ran);
  }
  out << absl::StrFormat("; load average now %s\n", LoadAverage());
  if (ran == 0 && !stopped.ok()) return stopped;
  if (ran == 0) {
    // The first reason on the error line itself: stdout may be a file nobody reads.
    const Row& first = rows.front();
    *ctx.err << absl::StrFormat(
        "pipesched: nothing in the sweep could run: %s P=%d M=%d: %s%s\n", first.schedule, first.p,
        first.m, first.skipped,
        rows.size() > 1 ? absl::StrFormat(" (and %d more, listed above)", rows.size() - 1) : "");
    return kExitBadInput;
  }
  auto write = [&](const std::string& path, const std::string& content) -> absl::Status {
    PS_RETURN_IF_ERROR(WriteFileAtomic(path, content));
    SayWrote(out, path);
    return absl::OkStatus();
  };
  if (!reports) {
    PS_RETURN_IF_ERROR(stopped);
    return failed > 0 ? kExitFailure : kExitOk;
  }
  absl::Status written = [&]() -> absl::Status {
    if (std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
      PS_RETURN_IF_ERROR(write(path, ToCsv(rows, sweep)));
    }
    if (std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
      nlohmann::json j;
      j["model"] = model;
      j["warmup"] = sweep.warmup;
      j["steps"] = sweep.steps;
      j["load_average"] = load;
      j["host_cpus"] = cpus;
      j["processes"] = job != nullptr ? job->size() : 1;
      j["pipeline_processes"] = place.k;
      j["configurations"] = nlohmann::json::array();
      for (const Row& r : rows) j["configurations"].push_back(RowJson(r, sweep));
      PS_RETURN_IF_ERROR(
          write(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
    }
    if (std::string path = absl::GetFlag(FLAGS_md); !path.empty()) {
      PS_RETURN_IF_ERROR(write(path, ToMarkdown(rows)));
    }
    if (std::string path = absl::GetFlag(FLAGS_svg); !path.empty()) {
      PS_RETURN_IF_ERROR(write(path, ToPlots(rows, sweep, absl::StrCat(model, "; load ", load))));
    }
    return absl::OkStatus();
  }();
  PS_RETURN_IF_ERROR(written);
  PS_RETURN_IF_ERROR(stopped);  // after the files: what ran before the failure is in them
  return failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace

absl::Status CheckBenchCommandLine(const std::vector<std::string>& command) {
  std::ostringstream ignored;
  PS_ASSIGN_OR_RETURN(const std::optional<CommandContext> parsed,
                      ParseLaunchedCommand(command, "bench", &ignored));
  if (!parsed.has_value()) return absl::OkStatus();  // --help
  PS_RETURN_IF_ERROR(CheckJobFlags(*parsed, "bench").status());
  PS_RETURN_IF_ERROR(CheckLaunchInputs({{"--data", absl::GetFlag(FLAGS_data)}}));
  return SweepFromFlags(*parsed, /*writes_files=*/false).status();
}

int RunBench(const CommandContext& ctx) {
  if (int code; RejectArguments(ctx, "bench", code)) return code;
  absl::StatusOr<Job> kind = CheckJobFlags(ctx, "bench");
  if (!kind.ok()) return ReportError(ctx, kind.status());
  absl::StatusOr<std::unique_ptr<comm::Bootstrap>> job = JoinJob(*kind, /*judge_heartbeats=*/true);
  if (!job.ok()) return ReportError(ctx, job.status());
  std::ostream silent(nullptr);  // no buffer: writes go nowhere
  absl::StatusOr<int> code = Bench(ContextInJob(ctx, job->get(), &silent), job->get());
  const absl::Status left = LeaveJob(job->get(), code.status());
  return left.ok() ? *code : ReportError(ctx, left);
}

}  // namespace pipesched::cli
