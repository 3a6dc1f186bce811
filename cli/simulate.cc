// `pipesched simulate` and `pipesched validate`: the planner on the command line.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/planning.h"
#include "pipesched/base/file_util.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/memory_fit.h"
#include "pipesched/scheduler/refine.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/stages/memory_check.h"
#include "pipesched/trace/grid.h"

namespace pipesched::cli {
namespace {

// auto: on a terminal, unless NO_COLOR is set to anything but "" (no-color.org).
bool UseColor(const CommandContext& ctx) {
  std::string c = absl::GetFlag(FLAGS_color);
  const char* no_color = std::getenv("NO_COLOR");
  return c == "always" ||
         (c == "auto" && ctx.out_is_terminal && (no_color == nullptr || *no_color == '\0'));
}

absl::Status CheckColorFlag(const CommandContext& ctx) {
  std::string c = absl::GetFlag(FLAGS_color);
  if (c != "auto" && c != "always" && c != "never") {
    return absl::InvalidArgumentError(
        absl::StrCat("--color=", c, " is not one of auto, always, never"));
  }
  // It colours the grid only: with no grid it would be ignored without a word.
  if (FlagGiven(ctx, "color") && !absl::GetFlag(FLAGS_grid)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--color=", c, " colours the timeline grid, which --nogrid leaves out; drop one of them"));
  }
  return absl::OkStatus();
}

// --device-memory: nullopt when not given.
absl::StatusOr<std::optional<std::int64_t>> DeviceMemoryFromFlags() {
  const std::string size = absl::GetFlag(FLAGS_device_memory);
  if (size.empty()) return std::optional<std::int64_t>();
  absl::StatusOr<std::int64_t> bytes = ParseByteSize(size);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device-memory=", size, ": ", bytes.status().message()));
  }
  return std::optional<std::int64_t>(*bytes);
}

absl::Status NeedsActivationSizes() {
  return absl::InvalidArgumentError(
      "--device-memory needs the activations' sizes: give --activation-bytes (and "
      "--workspace-bytes), or a --costs file with activation_bytes");
}

// Whether every rank's peak -- its static bytes (parameters, gradients, optimizer state)
// and its activations -- fits in `capacity` (one rank per device): a line saying so, or a
// ResourceExhausted for the first rank whose static bytes alone do not fit, or
// stages::CheckActivationsFit's for the first whose activations do not fit what is left.
absl::Status CheckDeviceMemory(const CommandContext& ctx, const scheduler::Schedule& schedule,
                               const scheduler::CostModel& costs, const scheduler::SimResult& sim,
                               std::int64_t capacity) {
  const std::string cap = absl::GetFlag(FLAGS_device_memory);
  // A schedule file (validate FILE, simulate --from) fixes P and M: no flag changes them.
  const bool from_file = !ctx.positional.empty() || !absl::GetFlag(FLAGS_from).empty();
  const std::string more_stages = from_file
                                      ? "a schedule with more ranks (fewer layers on each device)"
                                      : "more --stages (fewer layers on each device)";
  std::vector<stages::MemoryPlace> places;
  int worst = 0;
  auto total = [&](int r) { return scheduler::PeakTotalBytes(sim.ranks[r]); };
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    if (total(r) > total(worst)) worst = r;
    const std::int64_t held = sim.ranks[r].static_bytes;
    // Equal leaves nothing for activations: said here, not as "0 B is available".
    if (held > capacity || (held == capacity && sim.ranks[r].peak_live_bytes > 0)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rank ", r, "'s parameters, gradients and optimizer state (static_bytes) alone take ",
          HumanBytes(held), held > capacity ? ", more than" : ", all of", " --device-memory=", cap,
          " (", HumanBytes(capacity), held > capacity ? ")" : ", none left for activations)",
          "; give more memory, or ", more_stages));
    }
    stages::MemoryPlace place = stages::RankPlace(schedule, costs, sim, r);
    place.name =
        absl::StrCat("one device (--device-memory=", cap,
                     held > 0 ? absl::StrCat(", ", HumanBytes(held), " of it static)") : ")");
    place.available_bytes = capacity - held;
    places.push_back(std::move(place));
  }
  const std::int64_t peak = sim.ranks[worst].peak_live_bytes;
  const std::int64_t held = sim.ranks[worst].static_bytes;
  if (peak == 0) return NeedsActivationSizes();
  PS_RETURN_IF_ERROR(stages::CheckActivationsFit(
      {.schedule = schedule.name,
       .num_ranks = schedule.num_ranks(),
       .num_chunks = schedule.num_chunks(),
       .num_microbatches = schedule.num_microbatches,
       .smaller = "smaller --activation-bytes or --workspace-bytes",
       .fewer_microbatches =
           from_file ? "a schedule with fewer micro-batches" : "fewer --microbatches",
       .more_stages = more_stages},
      places));
  if (held > 0) {
    *ctx.out << absl::StrFormat(
        "memory: every rank's peak fits in --device-memory=%s (largest: rank %d, %s static and "
        "%s of activations, %.0f%%)\n",
        cap, worst, HumanBytes(held), HumanBytes(peak), 100.0 * (held + peak) / capacity);
  } else {
    *ctx.out << absl::StrFormat(
        "memory: every rank's activation peak fits in --device-memory=%s (largest: rank %d, "
        "%s, %.0f%%; parameters and optimizer state come on top: give them as --static-bytes)\n",
        cap, worst, HumanBytes(peak), 100.0 * peak / capacity);
  }
  return absl::OkStatus();
}

// Validates, simulates, prints and writes the outputs of one schedule.
// `auto_choice`: what --recompute-stages=auto chose, for --json; null without it.
// `verdict`: printed first, once the flags are known to fit (validate's "F: valid").
absl::Status SimulateAndReport(const CommandContext& ctx, const scheduler::Schedule& schedule,
                               const scheduler::CostModel& costs,
                               const RecomputeChoice* auto_choice = nullptr,
                               std::string_view verdict = "") {
  PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> capacity, DeviceMemoryFromFlags());
  PS_RETURN_IF_ERROR(scheduler::Validate(schedule));
  PS_ASSIGN_OR_RETURN(scheduler::SimResult sim, scheduler::Simulate(schedule, costs));
  // Idle time against no work at all is no bubble (its ratio would divide by 0): refused,
  // as compare refuses it. (validate's answer, the verdict, stands without one.)
  if (verdict.empty() && NoRankWorks(sim)) {
    return absl::InvalidArgumentError(
        "every action of the schedule takes 0 time, so there is no bubble to measure: give "
        "the stages some work (--cost-f, --cost-b, or a --costs file with times)");
  }
  // Known now, so said before the grid and the table rather than after them (unless the
  // static bytes alone do not fit: CheckDeviceMemory says that first, after the output).
  if (capacity.has_value() &&
      std::all_of(sim.ranks.begin(), sim.ranks.end(), [&](const scheduler::RankStats& r) {
        return r.peak_live_bytes == 0 && r.static_bytes <= *capacity;
      })) {
    return NeedsActivationSizes();
  }
  *ctx.out << verdict;
  // Drawn with the zero-grads and optimizer steps when the costs have them: the step.
  // (Moved: a timeline at the planner's limits is hundreds of MB, and only drawing
  // reads it from here on.)
  const trace::Timeline drawn = trace::WithStepPhases(std::move(sim.timeline), sim.phases);
  if (absl::GetFlag(FLAGS_grid)) {
    trace::GridOptions options;
    options.color = UseColor(ctx);
    *ctx.out << trace::RenderTimelineGrid(drawn, options);
  }
  PrintSimulation(ctx, schedule, costs, sim);
  std::string title =
      absl::StrFormat("%s  P=%d V=%d M=%d  bubble %.1f%%", schedule.name, schedule.num_ranks(),
                      schedule.num_chunks(), schedule.num_microbatches, 100 * sim.bubble_fraction);
  PS_RETURN_IF_ERROR(WriteScheduleOutputs(ctx, schedule, costs, {&drawn}, title));
  if (std::string p = absl::GetFlag(FLAGS_json); !p.empty()) {
    PS_RETURN_IF_ERROR(WriteFileAtomic(p, SimulationJson(schedule, costs, sim, auto_choice)));
    SayWrote(*ctx.out, p);
  }
  // Last, so that a plan that does not fit still gets its grid and pictures.
  if (capacity.has_value()) {
    PS_RETURN_IF_ERROR(CheckDeviceMemory(ctx, schedule, costs, sim, *capacity));
  }
  return absl::OkStatus();
}

// Before anything runs: every output of simulate or validate can be written, and none is
// the schedule file, the cost file or another output (each would be replaced by what the
// command writes).
absl::Status CheckOutputsDistinct(std::vector<FlagPath> inputs) {
  inputs.push_back({"--costs", absl::GetFlag(FLAGS_costs)});
  return CheckOutputs(inputs, {{"--trace", absl::GetFlag(FLAGS_trace)},
                               {"--svg", absl::GetFlag(FLAGS_svg)},
                               {"--csv", absl::GetFlag(FLAGS_csv)},
                               {"--schedule-json", absl::GetFlag(FLAGS_schedule_json)},
                               {"--json", absl::GetFlag(FLAGS_json)}});
}

// --recompute-stages: a list recomputes those virtual stages (scheduler::WithRecomputeOn);
// auto those that make every rank fit --device-memory, the shortest step of every set
// (or greedily, with many candidates: RecomputeWithinMemory), with a line saying which and what it
// costs. Not with --recompute (every stage) nor for a searched schedule (searched for costs without
// it; it fits a device by its own search).
// With auto, `choice` gets what it chose, for --json.
absl::Status RecomputeStages(const CommandContext& ctx, const scheduler::Schedule& schedule,
                             bool searched, scheduler::CostModel* costs,
                             std::optional<RecomputeChoice>* choice) {
  const std::string text = absl::GetFlag(FLAGS_recompute_stages);
  if (absl::GetFlag(FLAGS_recompute)) {
    return absl::InvalidArgumentError(
        "give --recompute (every stage) or --recompute-stages (some), not both");
  }
  if (searched) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute-stages applies to orders that are given, not to ", schedule.name,
        ", which is searched for costs without it: use --recompute for every stage, or "
        "--device-memory alone to search it within the device"));
  }
  if (text != "auto") {
    PS_ASSIGN_OR_RETURN(const std::vector<int> stages, IntList("recompute-stages", text));
    PS_ASSIGN_OR_RETURN(*costs, scheduler::WithRecomputeOn(*costs, stages, schedule.num_stages()));
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> capacity, DeviceMemoryFromFlags());
  if (!capacity.has_value()) {
    return absl::InvalidArgumentError(
        "--recompute-stages=auto chooses the stages that make each rank fit --device-memory: "
        "give --device-memory, or list the stages");
  }
  bool sized = false;
  for (int s = 0; s < schedule.num_stages(); ++s) sized |= costs->Stage(s).activation_bytes > 0;
  if (!sized) return NeedsActivationSizes();  // else "fits without recomputing" would say
  // Greedy past a few candidates: each round tries the candidates on the worst rank (V at
  // most) and keeps one, then each kept one may be dropped again: (V + 1) simulations per
  // candidate stage at most, and the first two.
  std::int64_t candidates = 0;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    const scheduler::StageCosts& c = costs->Stage(s);
    candidates += !c.recomputes() && c.activation_bytes > c.input_bytes;
  }
  NoteLongSimulations(ctx, "--recompute-stages=auto", (schedule.num_chunks() + 1) * candidates + 2,
                      static_cast<std::int64_t>(schedule.NumActions()));
  PS_ASSIGN_OR_RETURN(scheduler::RecomputeFit fit,
                      scheduler::RecomputeWithinMemory(schedule, *costs, *capacity));
  const std::string device = absl::StrCat("--device-memory=", absl::GetFlag(FLAGS_device_memory));
  // Costs may recompute some stages already (measured so): what auto adds is "further".
  bool some_already = false;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    some_already |= costs->Stage(s).recomputes();
  }
  const char* further = some_already ? " further" : "";
  if (fit.stages.empty()) {
    *ctx.out << absl::StrFormat("%s: fits %s without recomputing any%s stage\n", schedule.name,
                                device, further);
  } else {
    const double was = fit.without.step_time, is = fit.sim.step_time;
    *ctx.out << absl::StrFormat(
        "%s: recomputing%s %s %s of %d fits %s: the busiest rank peaks at %s instead of %s; "
        "step %.6g instead of %.6g (%+.2f%%) (--recompute-stages=%s); %s\n",
        schedule.name, further, fit.stages.size() == 1 ? "stage" : "stages",
        absl::StrJoin(fit.stages, ","), schedule.num_stages(), device,
        HumanBytes(scheduler::PeakBytes(fit.sim)), HumanBytes(scheduler::PeakBytes(fit.without)),
        is, was, was > 0 ? 100 * (is - was) / was : 0.0, absl::StrJoin(fit.stages, ","),
        RecomputeSearchText(fit.exhaustive));
  }
  RecomputeChoice& chosen = choice->emplace();
  chosen.stages = fit.stages;
  chosen.step_time_without = fit.without.step_time;
  chosen.step_time_with = fit.sim.step_time;
  for (const scheduler::RankStats& r : fit.without.ranks) {
    chosen.peak_bytes_without.push_back(r.peak_live_bytes);
  }
  for (const scheduler::RankStats& r : fit.sim.ranks) {
    chosen.peak_bytes_with.push_back(r.peak_live_bytes);
  }
  chosen.exhaustive = fit.exhaustive;
  *costs = std::move(fit.costs);
  return absl::OkStatus();
}

// A searched schedule whose order at its own limit does not fit --device-memory is searched
// again within fewer activations per rank (scheduler::SearchWithinMemory), with a note on
// what was done; one that cannot fit at all is left as it is, for CheckDeviceMemory to
// refuse with its advice. Not with --from or --max-activations (a limit of the user's).
// `max_activations` becomes the fitted limit when there is one. With --refine the order
// that fits, its own included, comes back refined where the refined one fits too, and
// `fit` says so.
absl::Status FitToDeviceMemory(const CommandContext& ctx, const scheduler::CostModel& search_costs,
                               const scheduler::CostModel& costs, scheduler::Schedule* schedule,
                               double* max_activations,
                               std::optional<scheduler::MemoryFit>* refined_fit) {
  PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> capacity, DeviceMemoryFromFlags());
  const scheduler::ScheduleInfo* info = scheduler::FindSchedule(schedule->name);
  if (!capacity.has_value() || info == nullptr || !info->uses_costs ||
      absl::GetFlag(FLAGS_max_activations) != 0) {
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(scheduler::SimResult own, scheduler::Simulate(*schedule, costs));
  const std::int64_t peak = scheduler::PeakBytes(own);
  const bool refine = absl::GetFlag(FLAGS_refine);
  if (peak == 0 || (peak <= *capacity && !refine)) return absl::OkStatus();
  const std::string cap = absl::GetFlag(FLAGS_device_memory);
  if (peak > *capacity) {
    int own_limit = 0;
    for (const scheduler::RankStats& r : own.ranks) {
      own_limit = std::max(own_limit, r.peak_live_microbatches);
    }
    const int searches = MaxMemoryFitSearches(own_limit);
    NoteLongSearch(ctx,
                   absl::StrCat(Absl(schedule->name), "'s order within --device-memory=", cap,
                                " (up to ", searches, " searches)"),
                   static_cast<std::int64_t>(schedule->NumActions()) * searches);
  }
  absl::StatusOr<scheduler::MemoryFit> fit =
      scheduler::SearchWithinMemory(schedule->name,
                                    {.num_ranks = schedule->num_ranks(),
                                     .num_microbatches = schedule->num_microbatches,
                                     .num_chunks = schedule->num_chunks(),
                                     .costs = &search_costs,
                                     .refine = absl::GetFlag(FLAGS_refine)},
                                    costs, *capacity, *schedule, std::move(own));
  if (!fit.ok()) {
    if (fit.status().code() != absl::StatusCode::kResourceExhausted) return fit.status();
    *ctx.err << "pipesched: note: " << fit.status().message() << "\n";
    return absl::OkStatus();
  }
  if (fit->max_activations == 0) {  // the own order fits; refined
    *schedule = fit->schedule;
    *refined_fit = *std::move(fit);
    return absl::OkStatus();
  }
  const std::string limit =
      scheduler::MaxActivationsText(fit->chunk_activations, schedule->num_chunks());
  *ctx.out << absl::StrFormat(
      "%s: its own order peaks at %s, more than --device-memory=%s: searched within %s "
      "stage%s worth of activations per rank instead (--max-activations=%s), the loosest "
      "that fits (%d searches)\n",
      schedule->name, HumanBytes(peak), cap, limit,
      fit->chunk_activations == schedule->num_chunks() ? "'s" : "s'", limit, fit->searches);
  *schedule = fit->schedule;
  *max_activations = fit->max_activations;
  if (refine) *refined_fit = *std::move(fit);
  return absl::OkStatus();
}

// With --refine: a searched schedule is refined at its limit (`max_activations`, or its
// own) by its generator, or was by the memory fit (`fit`); any other order -- a file, a
// handcrafted one -- by scheduler::RefineSchedule, within its busiest rank's peak. With
// --device-memory a refined order is kept only where it fits too (RefineWithinMemory).
// One line says what the refinement bought against the order without it.
absl::Status RefineAndNote(const CommandContext& ctx, const scheduler::CostModel* search_costs,
                           const scheduler::CostModel& costs, double max_activations,
                           std::optional<scheduler::MemoryFit> fit, scheduler::Schedule* schedule) {
  const scheduler::ScheduleInfo* info = scheduler::FindSchedule(schedule->name);
  const bool searched = search_costs != nullptr && info != nullptr && info->uses_costs;
  scheduler::Refined refined;
  if (fit.has_value()) {
    refined = {.schedule = std::move(fit->schedule),
               .sim = std::move(fit->sim),
               .unrefined_step_time = fit->unrefined_step_time.value_or(fit->sim.step_time),
               .too_large = fit->refined_too_large};
  } else {
    PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> capacity, DeviceMemoryFromFlags());
    PS_ASSIGN_OR_RETURN(scheduler::SimResult sim, scheduler::Simulate(*schedule, costs));
    const scheduler::GeneratorParams params{.num_ranks = schedule->num_ranks(),
                                            .num_microbatches = schedule->num_microbatches,
                                            .num_chunks = schedule->num_chunks(),
                                            .costs = search_costs,
                                            .max_activations = max_activations};
    PS_ASSIGN_OR_RETURN(
        refined, scheduler::RefineWithinMemory(*schedule, std::move(sim),
                                               searched ? &params : nullptr, costs, capacity));
  }
  *schedule = std::move(refined.schedule);
  const double was = refined.unrefined_step_time, is = refined.sim.step_time;
  const char* order = searched ? "the searched order's" : "its order's";
  if (refined.too_large) {
    *ctx.out << absl::StrFormat("%s: --refine's order peaks above --device-memory=%s: kept %s\n",
                                schedule->name, absl::GetFlag(FLAGS_device_memory),
                                searched ? "the searched order" : "its order");
  } else if (is < was * (1 - 1e-9)) {  // not a rounding difference
    *ctx.out << absl::StrFormat(
        "%s: --refine shortened %s step from %.6g to %.6g (%+.2f%%)%s\n", schedule->name, order,
        was, is, 100 * (is - was) / was,
        searched ? "" : ", within its busiest rank's peak of live activations");
  } else {
    *ctx.out << absl::StrFormat("%s: --refine found no shorter step than %s %.6g\n", schedule->name,
                                order, was);
  }
  return absl::OkStatus();
}

}  // namespace

int RunSimulate(const CommandContext& ctx) {
  if (!ctx.positional.empty()) {
    return ReportError(
        ctx, UnexpectedArgument(ctx.positional[0],
                                absl::StrCat("to simulate a file use --from=", ctx.positional[0])));
  }
  if (absl::Status s = CheckColorFlag(ctx); !s.ok()) return ReportError(ctx, s);
  if (absl::Status s = CheckOutputsDistinct({{"--from", absl::GetFlag(FLAGS_from)}}); !s.ok()) {
    return ReportError(ctx, s);
  }
  // A generated schedule that is searched for its costs is searched once, for the costs the
  // flags give; CostsFromFlags then checks them against the schedule.
  // A --costs file is read once: it may be a pipe.
  std::optional<scheduler::CostModel> search_costs;
  std::string source;
  if (absl::GetFlag(FLAGS_from).empty()) {
    absl::StatusOr<scheduler::CostModel> unchecked =
        UncheckedCostsFromFlags(ctx, scheduler::ScheduleFile{}, "", &source);
    if (!unchecked.ok()) return ReportError(ctx, unchecked.status());
    search_costs = *std::move(unchecked);
  }
  absl::StatusOr<scheduler::ScheduleFile> file =
      ScheduleFromFlags(ctx, search_costs.has_value() ? &*search_costs : nullptr, source);
  if (!file.ok()) return ReportError(ctx, file.status());
  // A generated schedule has no costs of its own: those read above are the flags' costs.
  absl::StatusOr<scheduler::CostModel> costs =
      search_costs.has_value() ? CheckCostsForSchedule(ctx, *search_costs, source, *file)
                               : CostsFromFlags(ctx, *file, absl::GetFlag(FLAGS_from));
  if (!costs.ok()) return ReportError(ctx, costs.status());
  std::optional<RecomputeChoice> auto_choice;
  if (FlagGiven(ctx, "recompute_stages")) {
    const scheduler::ScheduleInfo* info = scheduler::FindSchedule(file->schedule.name);
    const bool searched = search_costs.has_value() && info != nullptr && info->uses_costs;
    if (absl::Status s = RecomputeStages(ctx, file->schedule, searched, &*costs, &auto_choice);
        !s.ok()) {
      return ReportError(ctx, s);
    }
  }
  double max_activations = absl::GetFlag(FLAGS_max_activations);
  std::optional<scheduler::MemoryFit> refined_fit;
  if (search_costs.has_value()) {
    if (absl::Status s = FitToDeviceMemory(ctx, *search_costs, *costs, &file->schedule,
                                           &max_activations, &refined_fit);
        !s.ok()) {
      return ReportError(ctx, s);
    }
  }
  if (absl::GetFlag(FLAGS_refine)) {
    absl::Status s = RefineAndNote(ctx, search_costs.has_value() ? &*search_costs : nullptr, *costs,
                                   max_activations, std::move(refined_fit), &file->schedule);
    if (!s.ok()) return ReportError(ctx, s);
  }
  absl::Status s = SimulateAndReport(ctx, file->schedule, *costs,
                                     auto_choice.has_value() ? &*auto_choice : nullptr);
  return s.ok() ? kExitOk : ReportError(ctx, s);
}

int RunValidate(const CommandContext& ctx) {
  if (ctx.positional.size() != 1) {
    return ReportError(ctx, absl::InvalidArgumentError(
                                "validate takes one schedule file: pipesched validate FILE"));
  }
  if (absl::Status s = CheckColorFlag(ctx); !s.ok()) return ReportError(ctx, s);
  const std::string& path = ctx.positional[0];
  if (absl::Status s = CheckOutputsDistinct({{"the schedule file", path}}); !s.ok()) {
    return ReportError(ctx, s);
  }
  absl::StatusOr<scheduler::ScheduleFile> file = scheduler::LoadScheduleFile(path);
  if (!file.ok()) return ReportError(ctx, file.status());
  absl::StatusOr<scheduler::CostModel> costs = CostsFromFlags(ctx, *file, path);
  if (!costs.ok()) return ReportError(ctx, costs.status());
  if (absl::Status v = scheduler::Validate(file->schedule); !v.ok()) {
    *ctx.out << path << ": INVALID\n";
    return ReportError(ctx, absl::Status(v.code(), absl::StrCat(path, ": ", v.message())));
  }
  // Said after the flags are known to fit: cli.md promises their errors before any output.
  absl::Status s =
      SimulateAndReport(ctx, file->schedule, *costs, nullptr, absl::StrCat(path, ": valid\n"));
  return s.ok() ? kExitOk : ReportError(ctx, s);
}

}  // namespace pipesched::cli
