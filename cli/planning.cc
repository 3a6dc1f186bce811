#include "cli/planning.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/file_util.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/formulas.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/trace/chrome_trace.h"
#include "pipesched/trace/svg.h"

namespace pipesched::cli {
namespace {

// Actions per generated schedule, the generators' own limit (planning.h has the others).
constexpr int64_t kMaxActions = int64_t{1} << 24;

absl::Status CheckRange(std::string_view flag, int64_t value, int64_t lo, int64_t hi,
                        std::string_view what) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat("--", Absl(flag), "=", value,
                                                   " is out of range: ", Absl(what),
                                                   " must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckCost(std::string_view flag, double value) {
  if (!(value >= 0) || value > scheduler::kMaxCostTime) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", absl::StrReplaceAll(Absl(flag), {{"_", "-"}}), "=", ShortestNumber(value),
        " is not a valid time; use a number in [0, ", scheduler::kMaxCostTime, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<scheduler::ScheduleFile> ScheduleFromFlags(const CommandContext& ctx,
                                                          const scheduler::CostModel* costs,
                                                          const std::string& costs_source) {
  std::string from = absl::GetFlag(FLAGS_from);
  if (!from.empty()) {
    for (std::string_view f : {"schedule", "stages", "microbatches", "virtual"}) {
      if (FlagGiven(ctx, f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--from=", from, " takes P, V and M from the file; drop --", Absl(f)));
      }
    }
    PS_RETURN_IF_ERROR(CheckSearchFlagsApply("", /*from_file=*/true, /*refines_any_order=*/true));
    PS_ASSIGN_OR_RETURN(scheduler::ScheduleFile file, scheduler::LoadScheduleFile(from));
    // Named for the file, as validate names it (the message keeps the validator's grid).
    if (absl::Status v = scheduler::Validate(file.schedule); !v.ok()) {
      return absl::Status(v.code(), absl::StrCat(from, ": ", v.message()));
    }
    return file;
  }
  int p = absl::GetFlag(FLAGS_stages);
  int m = absl::GetFlag(FLAGS_microbatches);
  int v = absl::GetFlag(FLAGS_virtual);
  PS_RETURN_IF_ERROR(CheckRange("stages", p, 1, kMaxRanks, "the number of pipeline ranks P"));
  PS_RETURN_IF_ERROR(CheckRange("microbatches", m, 1, kMaxMicrobatches, "M"));
  PS_RETURN_IF_ERROR(CheckRange("virtual", v, 0, kMaxChunks, "chunks per rank V (0 = default)"));
  std::string name = absl::GetFlag(FLAGS_schedule);
  PS_RETURN_IF_ERROR(CheckScheduleNameIsNotAFile(name));
  // V as the generator will run it: --virtual, or the schedule's default (zb-v's is 2).
  const scheduler::ScheduleInfo* info = scheduler::FindSchedule(name);
  const int chunks = v > 0 ? v : (info != nullptr ? std::max(info->default_chunks, 1) : 1);
  // About three actions (F and B, or F, I and W) per stage and micro-batch.
  int64_t actions = int64_t{3} * p * chunks * m;
  if (actions > kMaxActions) {
    return absl::InvalidArgumentError(
        absl::StrCat("P=", p, " x V=", chunks, " x M=", m, " needs about ", actions,
                     " actions; the planner handles up to ", kMaxActions, " (P x V x M up to ",
                     kMaxActions / 3, "): lower --microbatches or --stages"));
  }
  PS_ASSIGN_OR_RETURN(const double max_activations, MaxActivationsFromFlags());
  PS_RETURN_IF_ERROR(CheckSearchFlagsApply(name, /*from_file=*/false, /*refines_any_order=*/true));
  if (info != nullptr && info->uses_costs && costs != nullptr) {
    // Said as the cost file's fault, as CheckCostsForSchedule says it for the others.
    if (absl::Status fit = scheduler::CheckCostsFit(*costs, p, chunks); !fit.ok()) {
      return costs_source.empty()
                 ? fit
                 : absl::InvalidArgumentError(absl::StrCat(costs_source, ": ", fit.message()));
    }
  }
  if (info != nullptr && info->uses_costs) NoteLongSearch(ctx, name + "'s order", actions);
  PS_ASSIGN_OR_RETURN(scheduler::Schedule schedule,
                      scheduler::GenerateSchedule(name, {.num_ranks = p,
                                                         .num_microbatches = m,
                                                         .num_chunks = v,
                                                         .costs = costs,
                                                         .max_activations = max_activations}));
  return scheduler::ScheduleFile{.schedule = std::move(schedule), .costs = std::nullopt};
}

namespace {

// No generator's name, but a path or a schedule file's name (any case).
bool LooksLikeAFile(std::string_view name) {
  return scheduler::FindSchedule(name) == nullptr &&
         (name.find('/') != std::string_view::npos ||
          absl::EndsWithIgnoreCase(Absl(name), ".csv") ||
          absl::EndsWithIgnoreCase(Absl(name), ".json"));
}

}  // namespace

absl::Status CheckScheduleNameIsNotAFile(const std::string& name) {
  if (!LooksLikeAFile(name)) return absl::OkStatus();  // the generator lists the names
  return absl::InvalidArgumentError(absl::StrCat("--schedule=", name,
                                                 " names a file, not a schedule generator; "
                                                 "load a schedule file with --from=",
                                                 name));
}

absl::StatusOr<double> MaxActivationsFromFlags() {
  const double limit = absl::GetFlag(FLAGS_max_activations);
  if (limit == 0 || (limit >= 1 && limit <= 65536)) return limit;
  return absl::InvalidArgumentError(absl::StrCat(
      "--max-activations=", ShortestNumber(limit),
      " is out of range: use 0 (each searched schedule's own limit) or 1 to 65536 stages' "
      "worth of activations per rank"));
}

bool SearchStepsGiven(const CommandContext& ctx) {
  return FlagGiven(ctx, "search_steps") && absl::GetFlag(FLAGS_search_steps) != 0;
}

absl::Status CheckSearchFlagsApply(std::string_view schedule, bool from_file,
                                   bool refines_any_order, bool search_steps_given) {
  const bool limit = absl::GetFlag(FLAGS_max_activations) != 0;
  const bool refine = !refines_any_order && absl::GetFlag(FLAGS_refine);
  if (!limit && !refine && !search_steps_given) return absl::OkStatus();
  const scheduler::ScheduleInfo* info = scheduler::FindSchedule(schedule);
  if (!from_file && info == nullptr) return absl::OkStatus();  // the generator names it
  if (from_file || !info->uses_costs) {
    std::vector<std::string> searched;
    for (const scheduler::ScheduleInfo& known : scheduler::AllSchedules()) {
      if (known.uses_costs) searched.emplace_back(known.name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        limit    ? "--max-activations"
        : refine ? "--refine"
                 : "--search-steps",
        " applies to the searched schedules (", absl::StrJoin(searched, ", "), "), not to ",
        from_file ? std::string("a schedule file") : std::string(schedule),
        limit ? ", whose order fixes its memory" : ", whose order is given, not searched",
        "; drop the flag or name a searched schedule"));
  }
  return absl::OkStatus();
}

std::string RecomputeSearchText(bool exhaustive) {
  return exhaustive ? "of every set that fits, the shortest step"
                    : "chosen greedily, not proven the shortest step";
}

void NoteLongSearch(const CommandContext& ctx, std::string_view what, std::int64_t actions) {
  // Up to about 2.5 s per million actions on this project's 2-core machines (zb-v-1p: 0.8
  // at P=8, 1.8-2.3 at P=64-512; docs/schedules.md), 27 passes at most.
  constexpr std::int64_t kLongSearchActions = 5'000'000;
  constexpr double kSecondsPerMillion = 2.5;
  if (actions <= kLongSearchActions) return;
  const double millions = static_cast<double>(actions) / 1e6;
  *ctx.err << absl::StrFormat(
      "pipesched: note: the search for %s covers about %.1f million actions (up to 27 passes "
      "of a list scheduler): expect up to about %.0f s on a 2-core machine; fewer "
      "micro-batches or ranks search faster\n",
      Absl(what), millions, millions * kSecondsPerMillion);
}

void NoteLongSimulations(const CommandContext& ctx, std::string_view what, std::int64_t simulations,
                         std::int64_t actions) {
  // About 0.1 us per simulated action on this project's 2-core machines (1f1b, P=128,
  // M=128: 218 simulations of 32768 actions in 0.67 s); a note past about 2 s.
  constexpr double kSecondsPerMillion = 0.1;
  const double millions = static_cast<double>(simulations) * static_cast<double>(actions) / 1e6;
  if (millions * kSecondsPerMillion < 2) return;
  *ctx.err << absl::StrFormat(
      "pipesched: note: %s simulates up to %d times %d actions: expect up to about %.0f s on a "
      "2-core machine; fewer micro-batches or ranks plan faster\n",
      Absl(what), simulations, actions, millions * kSecondsPerMillion);
}

std::string MarkdownCell(std::string_view text) {
  std::string cell;
  for (char c : text) {
    if (c == '|') {
      cell += "\\|";
    } else {
      cell.push_back(c == '\n' || c == '\r' ? ' ' : c);
    }
  }
  return cell;
}

int MaxMemoryFitSearches(std::int64_t peak_chunk_activations) {
  return 2 + 2 * static_cast<int>(std::bit_width(static_cast<std::uint64_t>(
                     std::max<std::int64_t>(peak_chunk_activations, 1))));
}

absl::StatusOr<std::vector<std::string>> SchedulesFromFlag(const std::string& text,
                                                           bool search_steps_given) {
  std::vector<std::string> names;
  if (text == "all") {
    for (const scheduler::ScheduleInfo& info : scheduler::AllSchedules()) {
      names.emplace_back(info.name);
    }
  } else {
    for (absl::string_view s : absl::StrSplit(text, ',')) {
      if (s.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--schedules=", text, ": empty schedule name"));
      }
      if (std::find(names.begin(), names.end(), s) != names.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--schedules lists ", s, " twice; name each schedule once"));
      }
      if (scheduler::FindSchedule(Std(s)) == nullptr) {
        std::vector<std::string> known;
        for (const scheduler::ScheduleInfo& info : scheduler::AllSchedules()) {
          known.emplace_back(info.name);
        }
        if (LooksLikeAFile(Std(s))) {
          return absl::InvalidArgumentError(
              absl::StrCat("--schedules lists ", s,
                           ", a file, not a schedule generator; schedule files are read by "
                           "--from=FILE (bench, simulate, train) and by validate FILE"));
        }
        return absl::InvalidArgumentError(
            absl::StrCat("--schedules: unknown schedule \"", s,
                         "\"; known schedules: ", absl::StrJoin(known, ", "), ", or all"));
      }
      names.emplace_back(s);
    }
  }
  if ((absl::GetFlag(FLAGS_max_activations) != 0 || absl::GetFlag(FLAGS_refine) ||
       search_steps_given) &&
      std::none_of(names.begin(), names.end(), [](const std::string& name) {
        return scheduler::FindSchedule(name)->uses_costs;
      })) {
    PS_RETURN_IF_ERROR(CheckSearchFlagsApply(names.front(), /*from_file=*/false,
                                             /*refines_any_order=*/false, search_steps_given));
  }
  return names;
}

absl::StatusOr<std::vector<int>> IntList(std::string_view flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int n = 0;
    // Digits only, as the scalar flags (abseil would take " 2" too).
    if (!IsIntegerLiteral(Std(part)) || !absl::SimpleAtoi(part, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", Absl(flag), "=", text, ": '", part, "' ",
                       IsIntegerLiteral(Std(part)) ? "is far too large" : "is not an integer",
                       "; write e.g. 2,4"));
    }
    if (std::find(out.begin(), out.end(), n) != out.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", Absl(flag), "=", text, " lists ", n, " twice; name each value once"));
    }
    out.push_back(n);
  }
  return out;
}

namespace {

// The first of `costs`' stage entries (or its uniform one, without a list) whose B is not
// its I + W, to the rounding of the sum; "where" is "stage S: ", or empty for the uniform.
struct SplitMismatch {
  std::string where;
  const scheduler::StageCosts* costs;
};
std::optional<SplitMismatch> FirstSplitMismatch(const scheduler::CostModel& costs) {
  auto mismatched = [](const scheduler::StageCosts& c) {
    const double split = c.i + c.w;
    return std::abs(c.b - split) > 1e-9 * std::max(c.b, split);
  };
  if (costs.stages.empty()) {
    if (mismatched(costs.uniform)) return SplitMismatch{"", &costs.uniform};
    return std::nullopt;
  }
  for (std::size_t s = 0; s < costs.stages.size(); ++s) {
    if (mismatched(costs.stages[s])) {
      return SplitMismatch{absl::StrCat("stage ", s, ": "), &costs.stages[s]};
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<scheduler::CostModel> CostsFromFlags(const CommandContext& ctx,
                                                    const scheduler::ScheduleFile& file,
                                                    std::string_view file_path) {
  std::string source;
  PS_ASSIGN_OR_RETURN(scheduler::CostModel costs,
                      UncheckedCostsFromFlags(ctx, file, file_path, &source));
  return CheckCostsForSchedule(ctx, std::move(costs), source, file);
}

absl::StatusOr<scheduler::CostModel> CheckCostsForSchedule(const CommandContext& ctx,
                                                           scheduler::CostModel costs,
                                                           const std::string& source,
                                                           const scheduler::ScheduleFile& file) {
  if (absl::Status fit =
          scheduler::CheckCostsFit(costs, file.schedule.num_ranks(), file.schedule.num_chunks());
      !fit.ok()) {
    return source.empty() ? fit
                          : absl::InvalidArgumentError(absl::StrCat(source, ": ", fit.message()));
  }
  // A schedule that splits the backward runs I and W where B was given: B must be their sum,
  // or the B the user gave would silently not be used (compare refuses it for all schedules).
  if (file.schedule.SplitsBackward()) {
    if (std::optional<SplitMismatch> bad = FirstSplitMismatch(costs)) {
      const scheduler::StageCosts& c = *bad->costs;
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s%sB=%g is not I + W = %g (I=%g, W=%g): %s splits the backward into I and W, so B "
          "would not be used; give I and W that add up to B (--cost-b alone sets I = W = B/2)",
          source.empty() ? "" : source + ": ", bad->where, c.b, c.i + c.w, c.i, c.w,
          file.schedule.name));
    }
  } else if (FlagGiven(ctx, "cost_i") || FlagGiven(ctx, "cost_w")) {
    // A schedule that runs B reads neither I nor W: --cost-i=3 alone changed nothing,
    // with no word. Given, they must describe the same backward as B (as compare requires).
    if (std::optional<SplitMismatch> bad = FirstSplitMismatch(costs)) {
      const scheduler::StageCosts& c = *bad->costs;
      return absl::InvalidArgumentError(absl::StrFormat(
          "%sB=%g is not I + W = %g (I=%g, W=%g): %s runs B, so --cost-i and --cost-w would "
          "not be used; give --cost-b=%g too, or I and W that add up to B",
          bad->where, c.b, c.i + c.w, c.i, c.w, file.schedule.name, c.i + c.w));
    }
  }
  return costs;
}

absl::StatusOr<scheduler::CostModel> UncheckedCostsFromFlags(const CommandContext& ctx,
                                                             const scheduler::ScheduleFile& file,
                                                             std::string_view file_path,
                                                             std::string* source) {
  scheduler::CostModel costs;
  std::string path = absl::GetFlag(FLAGS_costs);
  if (!path.empty()) {
    PS_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    absl::StatusOr<scheduler::CostModel> parsed = scheduler::ParseCostModelJson(text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
    }
    costs = *std::move(parsed);
    *source = path;
  } else if (file.costs.has_value()) {
    costs = *file.costs;
    *source = absl::StrCat(Absl(file_path), ": key \"costs\"");
  }
  struct {
    std::string_view flag;
    absl::Flag<double>* value;
    double scheduler::StageCosts::*field;
  } const kTimes[] = {{"cost_f", &FLAGS_cost_f, &scheduler::StageCosts::f},
                      {"cost_b", &FLAGS_cost_b, &scheduler::StageCosts::b},
                      {"cost_i", &FLAGS_cost_i, &scheduler::StageCosts::i},
                      {"cost_w", &FLAGS_cost_w, &scheduler::StageCosts::w},
                      {"cost_allreduce", &FLAGS_cost_allreduce, &scheduler::StageCosts::allreduce},
                      {"cost_zero_grad", &FLAGS_cost_zero_grad, &scheduler::StageCosts::zero_grad},
                      {"cost_optimizer", &FLAGS_cost_optimizer, &scheduler::StageCosts::optimizer}};
  for (const auto& t : kTimes) {
    if (!FlagGiven(ctx, t.flag)) continue;
    const double v = absl::GetFlag(*t.value) + 0.0;  // -0 reads as 0
    PS_RETURN_IF_ERROR(CheckCost(t.flag, v));
    costs.uniform.*t.field = v;
    for (scheduler::StageCosts& s : costs.stages) s.*t.field = v;
  }
  if (FlagGiven(ctx, "cost_b") && !FlagGiven(ctx, "cost_i") && !FlagGiven(ctx, "cost_w")) {
    // --cost-b alone: the split schedules' I and W each take half, so all do equal work.
    costs.uniform.i = costs.uniform.w = costs.uniform.b / 2;
    for (scheduler::StageCosts& s : costs.stages) s.i = s.w = s.b / 2;
  }
  if (FlagGiven(ctx, "cost_comm")) {
    const double v = absl::GetFlag(FLAGS_cost_comm) + 0.0;
    PS_RETURN_IF_ERROR(CheckCost("cost_comm", v));
    costs.comm_uniform = v;
    costs.comm.clear();
  }
  if (FlagGiven(ctx, "cost_action_gap")) {
    const double v = absl::GetFlag(FLAGS_cost_action_gap) + 0.0;
    PS_RETURN_IF_ERROR(CheckCost("cost_action_gap", v));
    costs.action_gap = v;
  }
  struct ByteFlag {
    const char* flag;
    const char* dashed;
    absl::Flag<int64_t>* value;
    std::int64_t scheduler::StageCosts::*field;
  };
  const ByteFlag kBytes[] = {
      {"activation_bytes", "--activation-bytes", &FLAGS_activation_bytes,
       &scheduler::StageCosts::activation_bytes},
      {"workspace_bytes", "--workspace-bytes", &FLAGS_workspace_bytes,
       &scheduler::StageCosts::workspace_bytes},
      {"input_bytes", "--input-bytes", &FLAGS_input_bytes, &scheduler::StageCosts::input_bytes},
      {"static_bytes", "--static-bytes", &FLAGS_static_bytes,
       &scheduler::StageCosts::static_bytes}};
  for (const ByteFlag& b : kBytes) {
    if (!FlagGiven(ctx, b.flag)) continue;
    int64_t v = absl::GetFlag(*b.value);
    if (v < 0 || v > scheduler::kMaxCostBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(b.dashed, "=", v, v < 0 ? " is negative" : " is too large",
                       "; use a byte count in [0, ", scheduler::kMaxCostBytes, "] (2^50, 1 PiB)"));
    }
    costs.uniform.*b.field = v;
    for (scheduler::StageCosts& s : costs.stages) s.*b.field = v;
  }
  if (FlagGiven(ctx, "input_bytes") && costs.stages.empty() &&
      costs.uniform.input_bytes > costs.uniform.activation_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input-bytes=", costs.uniform.input_bytes, " exceeds the activation bytes ",
        costs.uniform.activation_bytes,
        ": the received input is part of a micro-batch's activations; give --activation-bytes "
        "of at least --input-bytes"));
  }
  if (absl::GetFlag(FLAGS_recompute)) {
    absl::StatusOr<scheduler::CostModel> recomputing = scheduler::WithRecompute(costs);
    if (!recomputing.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source->empty() ? "" : absl::StrCat(*source, ": "), recomputing.status().message()));
    }
    costs = *std::move(recomputing);
  }
  return costs;
}

bool NoRankWorks(const scheduler::SimResult& sim) {
  return std::all_of(sim.ranks.begin(), sim.ranks.end(),
                     [](const scheduler::RankStats& r) { return !(r.busy > 0); });
}

void PrintSimulation(const CommandContext& ctx, const scheduler::Schedule& schedule,
                     const scheduler::CostModel& costs, const scheduler::SimResult& sim) {
  std::ostream& out = *ctx.out;
  out << absl::StrFormat("schedule %s  P=%d V=%d M=%d  placement=%s  actions=%d\n", schedule.name,
                         schedule.num_ranks(), schedule.num_chunks(), schedule.num_microbatches,
                         schedule.placement.Describe(), schedule.NumActions());
  std::optional<double> formula = scheduler::ClosedFormFor(schedule, costs);
  out << absl::StrFormat("makespan %.6g   bubble fraction %.4f (simulated)", sim.makespan,
                         sim.bubble_fraction);
  if (formula.has_value()) {
    out << absl::StrFormat("   %.4f (closed form)", *formula);
  } else {
    out << "   (no closed form for this order and these costs)";
  }
  out << absl::StrFormat("   bubble ratio %.4f\n", sim.bubble_ratio);
  if (sim.step_time != sim.makespan) {
    out << absl::StrFormat("step time %.6g   (makespan + zero-grad before + optimizer after)\n",
                           sim.step_time);
  }
  bool bytes = false;
  bool held = false;
  std::vector<int> recomputing;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    bytes |= costs.Stage(s).activation_bytes > 0 || costs.Stage(s).workspace_bytes > 0 ||
             costs.Stage(s).recompute_bytes > 0;
    held |= costs.Stage(s).static_bytes > 0;
    if (costs.Stage(s).recomputes()) recomputing.push_back(s);
  }
  if (!recomputing.empty()) {
    out << "activation recomputation"
        << (static_cast<int>(recomputing.size()) == schedule.num_stages()
                ? std::string()
                : absl::StrCat(recomputing.size() == 1 ? " on stage " : " on stages ",
                               absl::StrJoin(recomputing, ","), " of ", schedule.num_stages()))
        << ": an F keeps only its received input; each B or I runs the F again first and "
           "holds what it rebuilt until the backward ends\n";
  }
  out << absl::StrFormat("%-6s %12s %12s %8s %10s%s%s\n", "rank", "busy", "idle", "bubble",
                         "peak act", bytes ? "   peak act bytes" : "",
                         held ? "   static bytes" : "");
  for (size_t r = 0; r < sim.ranks.size(); ++r) {
    const scheduler::RankStats& rs = sim.ranks[r];
    out << absl::StrFormat("%-6d %12.6g %12.6g %8.4f %10d", r, rs.busy, rs.idle,
                           sim.makespan > 0 ? rs.idle / sim.makespan : 0.0,
                           rs.peak_live_microbatches);
    if (bytes) out << absl::StrFormat("   %s", HumanBytes(rs.peak_live_bytes));
    if (held) out << absl::StrFormat("   %s", HumanBytes(rs.static_bytes));
    out << "\n";
  }
}

std::string SimulationJson(const scheduler::Schedule& schedule, const scheduler::CostModel& costs,
                           const scheduler::SimResult& sim, const RecomputeChoice* auto_choice) {
  nlohmann::json j;
  j["schedule"] = schedule.name;
  j["stages"] = schedule.num_ranks();
  j["virtual"] = schedule.num_chunks();
  j["microbatches"] = schedule.num_microbatches;
  j["placement"] = schedule.placement.KindName();
  if (schedule.placement.kind == scheduler::PlacementKind::kExplicit) {
    j["stage_ranks"] = schedule.placement.stage_ranks;
  }
  j["actions"] = schedule.NumActions();
  j["makespan"] = sim.makespan;
  j["step_time"] = sim.step_time;
  j["bubble_fraction"] = sim.bubble_fraction;
  j["bubble_ratio"] = sim.bubble_ratio;
  std::optional<double> formula = scheduler::ClosedFormFor(schedule, costs);
  j["formula_bubble_fraction"] = formula.has_value() ? nlohmann::json(*formula) : nlohmann::json();
  nlohmann::json peaks = nlohmann::json::array();
  nlohmann::json peak_bytes = nlohmann::json::array();
  nlohmann::json ranks = nlohmann::json::array();
  for (const scheduler::RankStats& rs : sim.ranks) {
    peaks.push_back(rs.peak_live_microbatches);
    peak_bytes.push_back(rs.peak_live_bytes);
    ranks.push_back({{"busy", rs.busy},
                     {"idle", rs.idle},
                     {"peak_activations", rs.peak_live_microbatches},
                     {"peak_activation_bytes", rs.peak_live_bytes},
                     {"static_bytes", rs.static_bytes}});
  }
  j["peak_activations"] = peaks;
  j["peak_activation_bytes"] = peak_bytes;
  j["ranks"] = ranks;
  // The virtual stages whose costs recompute: a cost file's measured so, and those the
  // flags (or auto) recompute, with or without activation sizes.
  std::vector<int> recomputing;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    if (costs.Stage(s).recomputes()) recomputing.push_back(s);
  }
  j["recompute_stages"] = recomputing;
  j["recompute_plan"] = nullptr;
  if (auto_choice != nullptr) {
    j["recompute_plan"] = {{"stages", auto_choice->stages},
                           {"step_time_without", auto_choice->step_time_without},
                           {"step_time_with", auto_choice->step_time_with},
                           {"peak_bytes_without", auto_choice->peak_bytes_without},
                           {"peak_bytes_with", auto_choice->peak_bytes_with},
                           {"exhaustive", auto_choice->exhaustive}};
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

absl::Status WriteScheduleOutputs(const CommandContext& ctx, const scheduler::Schedule& schedule,
                                  const scheduler::CostModel& costs,
                                  const std::vector<const trace::Timeline*>& timelines,
                                  const std::string& svg_title) {
  auto write = [&](const std::string& path, const std::string& content) -> absl::Status {
    PS_RETURN_IF_ERROR(WriteFileAtomic(path, content));
    SayWrote(*ctx.out, path);
    return absl::OkStatus();
  };
  if (std::string p = absl::GetFlag(FLAGS_trace); !p.empty()) {
    PS_RETURN_IF_ERROR(write(p, trace::ToChromeTrace(timelines)));
  }
  if (std::string p = absl::GetFlag(FLAGS_svg); !p.empty()) {
    trace::SvgOptions options;
    options.title = svg_title;
    PS_RETURN_IF_ERROR(write(p, trace::ToSvg(timelines, options)));
  }
  if (std::string p = absl::GetFlag(FLAGS_csv); !p.empty()) {
    PS_RETURN_IF_ERROR(write(p, scheduler::ToPytorchCsv(schedule)));
  }
  if (std::string p = absl::GetFlag(FLAGS_schedule_json); !p.empty()) {
    PS_RETURN_IF_ERROR(write(p, scheduler::ToScheduleJson(schedule, &costs)));
  }
  return absl::OkStatus();
}

}  // namespace pipesched::cli
