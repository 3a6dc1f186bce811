#include "cli/training.h"

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "cli/planning.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/formats.h"
#include "pipesched/scheduler/memory_fit.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/stages/bubble_analysis.h"

namespace pipesched::cli {
namespace {

absl::Status Positive(std::string_view flag, int64_t value, int64_t max) {
  if (value < 1 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", std::string(flag), "=", value, " is out of range: use 1 to ", max));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<stages::TrainerConfig> TrainerConfigFromFlags(const CommandContext& ctx) {
  stages::TrainerConfig config;
  config.replicas = absl::GetFlag(FLAGS_replicas);
  config.microbatch_size = absl::GetFlag(FLAGS_microbatch_size);
  config.model.num_layers = absl::GetFlag(FLAGS_layers);
  config.model.d_hidden = absl::GetFlag(FLAGS_hidden);
  config.model.d_in = absl::GetFlag(FLAGS_inputs);
  config.model.num_classes = absl::GetFlag(FLAGS_classes);
  PS_RETURN_IF_ERROR(Positive("replicas", config.replicas, 1024));
  PS_RETURN_IF_ERROR(Positive("microbatch-size", config.microbatch_size, 1 << 20));
  PS_RETURN_IF_ERROR(Positive("layers", config.model.num_layers, kMaxLayers));
  PS_RETURN_IF_ERROR(Positive("hidden", config.model.d_hidden, 1 << 16));
  PS_RETURN_IF_ERROR(Positive("inputs", config.model.d_in, 1 << 16));
  PS_RETURN_IF_ERROR(Positive("classes", config.model.num_classes, 1 << 20));
  if (config.model.num_classes == 1) {
    return absl::InvalidArgumentError(
        "--classes=1: a softmax over one class has nothing to learn (its loss is always 0); "
        "give at least 2");
  }
  if (std::string p = absl::GetFlag(FLAGS_partition); !p.empty()) {
    for (absl::string_view part : absl::StrSplit(p, ',')) {
      int n = 0;
      if (!IsIntegerLiteral(Std(part)) || !absl::SimpleAtoi(part, &n) || n < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--partition=", p, ": '", part,
                         "' is not a positive layer count; write one count per chunk, e.g. 3,3,3"));
      }
      config.partition.push_back(n);
    }
  }
  absl::StatusOr<model::OptimizerKind> kind =
      model::ParseOptimizerKind(absl::GetFlag(FLAGS_optimizer));
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer=", absl::GetFlag(FLAGS_optimizer), " is not one of sgd, adamw"));
  }
  config.optimizer.kind = *kind;
  if (*kind == model::OptimizerKind::kAdamW && FlagGiven(ctx, "momentum") &&
      absl::GetFlag(FLAGS_momentum) != 0) {
    // It would be silently unused: AdamW's moments have their own fixed betas (0, "none",
    // is what AdamW does anyway).
    return absl::InvalidArgumentError(
        "--momentum is SGD's; --optimizer=adamw keeps its moments with beta1 = 0.9 and "
        "beta2 = 0.999: drop --momentum, or use --optimizer=sgd");
  }
  double lr = absl::GetFlag(FLAGS_lr);
  double momentum = absl::GetFlag(FLAGS_momentum);
  double wd = absl::GetFlag(FLAGS_weight_decay);
  // The optimizer computes in fp32: a value past its range would be inf.
  constexpr double kMaxFloat = std::numeric_limits<float>::max();
  if (!(lr > 0) || !(lr <= kMaxFloat)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr=", lr, " must be a positive number that fp32 holds (at most 3.4e38)"));
  }
  if (!(momentum >= 0 && momentum < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--momentum=", momentum, " must be in [0, 1)"));
  }
  if (!(wd >= 0) || !(wd <= kMaxFloat)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--weight-decay=", wd, " must be >= 0 and a number that fp32 holds (at most 3.4e38)"));
  }
  config.optimizer.sgd.lr = static_cast<float>(lr);
  config.optimizer.sgd.momentum = static_cast<float>(momentum);
  config.optimizer.sgd.weight_decay = static_cast<float>(wd);
  config.optimizer.adamw.lr = static_cast<float>(lr);
  if (FlagGiven(ctx, "weight_decay")) config.optimizer.adamw.weight_decay = static_cast<float>(wd);
  config.backend = absl::GetFlag(FLAGS_backend);
  if (config.backend != "auto" && config.backend != "host" && config.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", config.backend, " is not one of auto, host, cuda"));
  }
  config.num_devices = absl::GetFlag(FLAGS_devices);
  if (config.num_devices < 0 || config.num_devices > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--devices=", config.num_devices,
                                                   " is out of range: use 0 (automatic) to 4096"));
  }
  if (std::string size = absl::GetFlag(FLAGS_device_memory); !size.empty()) {
    absl::StatusOr<std::int64_t> bytes = ParseByteSize(size);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device-memory=", size, ": ", bytes.status().message()));
    }
    config.device_memory_bytes = *bytes;
  }
  PS_ASSIGN_OR_RETURN(config.max_activations, MaxActivationsFromFlags());
  config.refine = absl::GetFlag(FLAGS_refine);
  config.recompute = absl::GetFlag(FLAGS_recompute);
  if (const std::string stages = absl::GetFlag(FLAGS_recompute_stages); !stages.empty()) {
    if (config.recompute) {
      return absl::InvalidArgumentError(
          "give --recompute (every stage) or --recompute-stages (some), not both");
    }
    // auto: train chooses them (stages::PlanRecompute) once the rest is known.
    if (stages != "auto") {
      PS_ASSIGN_OR_RETURN(config.recompute_stages, IntList("recompute-stages", stages));
    }
  }
  config.seed = absl::GetFlag(FLAGS_seed);
  config.data_path = absl::GetFlag(FLAGS_data);
  return config;
}

absl::StatusOr<scheduler::CostModel> HandoffCosts(const stages::Trainer& trainer,
                                                  const stages::IdleAnalysis& idle) {
  PS_ASSIGN_OR_RETURN(scheduler::CostModel measured, trainer.MeasuredCosts());
  scheduler::CostModel costs =
      stages::WithHandoffLatency(std::move(measured), stages::MedianHandoff({&idle}));
  costs.action_gap = std::max(stages::MedianGap({&idle}), 0.0);  // -1: no sample
  return costs;
}

absl::StatusOr<scheduler::Schedule> LoadTrainableSchedule(const std::string& path) {
  PS_ASSIGN_OR_RETURN(scheduler::ScheduleFile file, scheduler::LoadScheduleFile(path));
  // The validator's first line names the problem; its grid is validate's to draw.
  if (absl::Status v = scheduler::Validate(file.schedule); !v.ok()) {
    const std::string_view message = Std(v.message());
    return absl::Status(
        v.code(), absl::StrCat("--from=", path, ": ", Absl(message.substr(0, message.find('\n'))),
                               "; `pipesched validate ", path, "` draws where"));
  }
  // Every chunk needs a layer, and --layers stops at kMaxLayers blocks (+ the head).
  if (const int chunks = file.schedule.num_stages(); chunks > kMaxLayers + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from=", path, ": the schedule has ", chunks,
                     " chunks (stages x virtual stages), but the model has at most ", kMaxLayers,
                     " blocks + head = ", kMaxLayers + 1,
                     " layers (--layers) and every chunk needs one; use a schedule with at most ",
                     kMaxLayers + 1, " chunks"));
  }
  return std::move(file.schedule);
}

absl::StatusOr<std::unique_ptr<stages::Trainer>> CreateTrainerRecomputingToFit(
    stages::TrainerConfig* config, int search_steps, std::string_view command,
    stages::RecomputePlan* plan, std::string* note) {
  const scheduler::ScheduleInfo* info =
      config->schedule_override.has_value() ? nullptr : scheduler::FindSchedule(config->schedule);
  if (info != nullptr && info->uses_costs && search_steps > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute-stages=auto chooses for the order that will run, and ", config->schedule,
        "'s is searched afterwards for the costs its first steps measure (and fits the "
        "devices' memory by its own search): give --search-steps=0 to run its unit-cost order",
        command == "train" ? ", or a --recompute-stages list" : ""));
  }
  const std::vector<int> given = config->recompute_stages;  // empty: auto needs none given
  absl::Status refused;
  for (int attempt = 0; attempt < 2; ++attempt) {
    config->recompute_stages = given;
    PS_ASSIGN_OR_RETURN(*plan, stages::PlanRecompute(*config));
    config->recompute_stages = plan->stages;
    absl::StatusOr<std::unique_ptr<stages::Trainer>> trainer =
        CreateTrainer(config, search_steps, note);
    if (trainer.ok() || !absl::IsResourceExhausted(trainer.status())) return trainer;
    refused = trainer.status();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "--recompute-stages=auto chose ",
      plan->stages.empty() ? std::string("no stage")
                           : absl::StrCat("stages ", absl::StrJoin(plan->stages, ",")),
      ", twice, but the trainer then found less memory than the plan had (the machine's "
      "shrinks as other processes take it): ",
      refused.message()));
}

std::vector<int> RecomputingStages(const stages::Executor& executor) {
  std::vector<int> stages;
  for (int s = 0; s < executor.num_stages(); ++s) {
    if (executor.recomputes(s)) stages.push_back(s);
  }
  return stages;
}

std::string RecomputePlanLine(const stages::RecomputePlan& plan) {
  std::vector<std::string> places;
  for (const stages::RecomputePlan::Place& place : plan.places) {
    places.push_back(
        absl::StrCat(place.name, " ", HumanBytes(place.planned_with),
                     place.planned_with == place.planned_without
                         ? std::string()
                         : absl::StrCat(" (", HumanBytes(place.planned_without), " without)"),
                     " of ", HumanBytes(place.available_bytes)));
  }
  return absl::StrCat(
      "--recompute-stages=auto: ",
      plan.stages.empty() ? std::string("no stage needs to recompute")
                          : absl::StrCat("recomputing stage", plan.stages.size() == 1 ? " " : "s ",
                                         absl::StrJoin(plan.stages, ","), " of ", plan.num_stages,
                                         " (", RecomputeSearchText(plan.exhaustive), ")"),
      "; planned activations of what each memory has for them: ", absl::StrJoin(places, ", "));
}

absl::StatusOr<int> SearchStepsFromFlags() {
  const int steps = absl::GetFlag(FLAGS_search_steps);
  if (steps < 0 || steps > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--search-steps=", steps, " is out of range: use 0 (keep the unit-cost order) to 100"));
  }
  return steps;
}

namespace {

// With --device-memory: the least any rank's device has left once the model is on it
// (after the measuring steps, whose activations are freed), for the search (without
// --max-activations) and the refinement to fit its activations into. nullopt without a
// cap, when ranks share a device (their peaks add up: the Trainer's own check decides) or
// a device cannot say.
absl::StatusOr<std::optional<std::int64_t>> ActivationBudget(const stages::Trainer& trainer) {
  if (trainer.config().device_memory_bytes <= 0) return std::optional<std::int64_t>();
  const stages::Executor& executor = trainer.executor();
  std::set<const runtime::Device*> seen;
  std::optional<std::int64_t> budget;
  for (int d = 0; d < executor.num_replicas(); ++d) {
    for (int r = 0; r < executor.num_ranks(); ++r) {
      runtime::Device& device = executor.device(d, r);
      if (!seen.insert(&device).second) return std::optional<std::int64_t>();
      PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> left, device.AvailableBytes());
      if (!left.has_value()) return std::optional<std::int64_t>();
      budget = budget.has_value() ? std::min(*budget, *left) : *left;
    }
  }
  return budget;
}

// The order of `info` searched for the costs measured in `steps` steps of `trainer`, which
// runs its unit-cost order as searched (CreateTrainer) and is gone on return, and the note
// saying so; with `refine`, refined (within the devices' memory too, when it is held to it).
absl::StatusOr<scheduler::Schedule> SearchForMeasuredCosts(const scheduler::ScheduleInfo& info,
                                                           std::unique_ptr<stages::Trainer> trainer,
                                                           int steps, bool refine,
                                                           std::string* note) {
  stages::StepResult last;
  for (int step = 0; step < steps; ++step) {
    PS_ASSIGN_OR_RETURN(last, trainer->Step());
  }
  const scheduler::Schedule& run = trainer->schedule();  // with its ALLREDUCEs when D > 1
  PS_ASSIGN_OR_RETURN(stages::IdleAnalysis idle,
                      stages::AnalyzeIdle(last.timeline, last.issue_micros, run.num_ranks()));
  PS_ASSIGN_OR_RETURN(const scheduler::CostModel costs, HandoffCosts(*trainer, idle));
  scheduler::GeneratorParams shape{.num_ranks = run.num_ranks(),
                                   .num_microbatches = run.num_microbatches,
                                   .num_chunks = run.num_chunks(),
                                   .max_activations = trainer->config().max_activations};
  PS_ASSIGN_OR_RETURN(scheduler::Schedule unit, info.generate(shape));
  // Named when it is a handcrafted order (zb-h1's, zb-v's, interleaved-zb's where that
  // fits and the search finds nothing shorter for unit costs).
  std::string unit_name;
  for (const char* handcrafted : {"zb-h1", "zb-v", "interleaved-zb"}) {
    absl::StatusOr<scheduler::Schedule> order = scheduler::GenerateSchedule(handcrafted, shape);
    if (order.ok() && order->placement == unit.placement && order->programs == unit.programs) {
      unit_name = absl::StrCat(" (", handcrafted, "'s)");
    }
  }
  shape.costs = &costs;
  PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> budget, ActivationBudget(*trainer));
  PS_ASSIGN_OR_RETURN(scheduler::Schedule searched, info.generate(shape));
  // What each device has left for activations; none at all is CreateTrainer's to report.
  const std::optional<std::int64_t> room =
      budget.has_value() && *budget > 0 ? budget : std::optional<std::int64_t>();
  std::optional<scheduler::MemoryFit> fit;
  bool refined_too_large = false;
  if (room.has_value() && shape.max_activations == 0) {
    PS_ASSIGN_OR_RETURN(scheduler::SimResult own, scheduler::Simulate(searched, costs));
    scheduler::GeneratorParams refined_shape = shape;
    refined_shape.refine = refine;  // the fit chooses its limit from the orders as searched
    absl::StatusOr<scheduler::MemoryFit> fitted = scheduler::SearchWithinMemory(
        info.name, refined_shape, costs, *room, searched, std::move(own));
    // Nothing fits: the own order goes on to CreateTrainer, which falls back to the
    // unit-cost order or says what does not fit.
    if (fitted.ok()) {
      fit = *std::move(fitted);
      searched = fit->schedule;
      refined_too_large = fit->refined_too_large;
    } else if (fitted.status().code() != absl::StatusCode::kResourceExhausted) {
      return fitted.status();
    }
  }
  if (refine && !fit.has_value()) {
    PS_ASSIGN_OR_RETURN(scheduler::SimResult sim, scheduler::Simulate(searched, costs));
    PS_ASSIGN_OR_RETURN(
        scheduler::Refined refined,
        scheduler::RefineWithinMemory(searched, std::move(sim), &shape, costs, room));
    searched = std::move(refined.schedule);
    refined_too_large = refined.too_large;
  }
  if (refined_too_large) {
    *note += absl::StrFormat(
        "%s: --refine's order peaks above what each device has left; kept the searched order\n",
        searched.name);
  }
  if (fit.has_value() && fit->max_activations > 0) {
    *note += absl::StrFormat(
        "%s: its order for the measured costs peaks at %s, more than the %s each device has "
        "left under --device-memory: searched within %s stage%s worth of activations per "
        "rank instead, the loosest that fits\n",
        searched.name, HumanBytes(fit->own_peak_bytes), HumanBytes(*budget),
        scheduler::MaxActivationsText(fit->chunk_activations, searched.num_chunks()),
        fit->chunk_activations == searched.num_chunks() ? "'s" : "s'");
  }
  // Both as generated (no all-reduces), so that the two plans compare like for like.
  PS_ASSIGN_OR_RETURN(scheduler::SimResult before, scheduler::Simulate(unit, costs));
  PS_ASSIGN_OR_RETURN(scheduler::SimResult after, scheduler::Simulate(searched, costs));
  *note += absl::StrFormat(
      "%s: searched%s for the costs measured in %d step%s of its unit-cost order%s: "
      "planned makespan %.3f ms against %.3f ms%s\n",
      searched.name, refine && !refined_too_large ? " and refined (--refine)" : "", steps,
      steps == 1 ? "" : "s", unit_name, after.makespan / 1000, before.makespan / 1000,
      searched.programs == unit.programs ? " (the same order)" : "");
  return searched;
}

// With --search-steps=0 and --refine a searched schedule runs its unit-cost order refined
// for unit costs (the Trainer's generator did it; `refined` is the order it runs): a line
// saying what that bought, from both orders simulated with unit costs. Empty when the
// order without --refine cannot be made (the run goes on without the line).
std::string UnitCostRefineNote(const stages::TrainerConfig& config,
                               const scheduler::Schedule& refined) {
  absl::StatusOr<scheduler::Schedule> plain =
      scheduler::GenerateSchedule(config.schedule, {.num_ranks = config.stages,
                                                    .num_microbatches = config.microbatches,
                                                    .num_chunks = config.virtual_stages,
                                                    .max_activations = config.max_activations});
  const scheduler::CostModel unit;
  absl::StatusOr<scheduler::SimResult> was =
      plain.ok() ? scheduler::Simulate(*plain, unit) : plain.status();
  absl::StatusOr<scheduler::SimResult> is = scheduler::Simulate(refined, unit);
  if (!was.ok() || !is.ok()) return "";
  const std::string what = absl::StrCat(
      config.schedule, ": --search-steps=0: the order searched for unit costs, with --refine: ");
  if (is->step_time < was->step_time * (1 - 1e-9)) {
    return absl::StrFormat("%sits unit-cost step %.6g -> %.6g (%+.2f%%)\n", what, was->step_time,
                           is->step_time, 100 * (is->step_time - was->step_time) / was->step_time);
  }
  return absl::StrFormat("%sno shorter unit-cost step than %.6g\n", what, was->step_time);
}

}  // namespace

absl::StatusOr<std::unique_ptr<stages::Trainer>> CreateTrainer(stages::TrainerConfig* config,
                                                               int search_steps,
                                                               std::string* note) {
  const scheduler::ScheduleInfo* info = scheduler::FindSchedule(config->schedule);
  if (config->schedule_override || info == nullptr || !info->uses_costs || search_steps <= 0) {
    absl::StatusOr<std::unique_ptr<stages::Trainer>> trainer = stages::Trainer::Create(*config);
    const bool unit_refined =
        config->refine && !config->schedule_override && info != nullptr && info->uses_costs;
    if (trainer.ok() && unit_refined) *note += UnitCostRefineNote(*config, (*trainer)->schedule());
    if (trainer.ok() || !config->refine ||
        trainer.status().code() != absl::StatusCode::kResourceExhausted) {
      return trainer;
    }
    // A refinement never costs the fit: the order as searched, where it fits.
    config->refine = false;
    trainer = stages::Trainer::Create(*config);
    if (trainer.ok()) {
      *note += absl::StrCat(config->schedule,
                            ": --refine's order does not fit the devices' memory; running the "
                            "order as searched, which does\n");
    }
    return trainer;
  }
  // The trainer of the unit-cost order as searched (refining it would only slow the
  // measuring down), for the measuring steps. A configuration that cannot run fails here
  // with its own message, as it would without the search.
  stages::TrainerConfig measuring_config = *config;
  measuring_config.refine = false;
  absl::StatusOr<std::unique_ptr<stages::Trainer>> measuring =
      stages::Trainer::Create(measuring_config);
  if (!measuring.ok()) return measuring.status();
  absl::StatusOr<scheduler::Schedule> searched =
      SearchForMeasuredCosts(*info, *std::move(measuring), search_steps, config->refine, note);
  if (!searched.ok()) {
    return absl::Status(
        searched.status().code(),
        absl::StrCat("measuring the costs to search ", config->schedule, " for (", search_steps,
                     " steps; --search-steps=0 skips it): ", searched.status().message()));
  }
  stages::TrainerConfig with_order = *config;
  with_order.schedule_override = *std::move(searched);
  absl::StatusOr<std::unique_ptr<stages::Trainer>> trainer = stages::Trainer::Create(with_order);
  if (trainer.ok()) {
    config->schedule_override = std::move(with_order.schedule_override);
    return trainer;
  }
  if (trainer.status().code() != absl::StatusCode::kResourceExhausted) return trainer;
  *note += absl::StrCat(config->schedule,
                        ": the searched order's activations do not fit the devices' memory; "
                        "running its unit-cost order, which does\n");
  *config = measuring_config;  // the order the measuring steps ran
  return stages::Trainer::Create(*config);
}

}  // namespace pipesched::cli
