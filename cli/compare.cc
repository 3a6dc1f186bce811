// `pipesched compare`: every schedule (or a list) for one P and M, simulated with one
// model's per-stage costs at equal work (scheduler/compare.h), ranked by step time, with
// bubble, closed form and peak activation memory side by side.
#include "pipesched/scheduler/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "cli/planning.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/file_util.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/memory_fit.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/trace/chrome_trace.h"
#include "pipesched/trace/svg.h"

namespace pipesched::cli {
namespace {

// The planner's limits (planning.h), and the actions' as the generators count them (three
// per stage and micro-batch at most), so that a request past them is one error, not every
// schedule skipped.
constexpr std::int64_t kMaxActions = std::int64_t{1} << 24;

struct Request {
  std::vector<std::string> schedules;
  int p = 0, m = 0, v = 0;
  std::optional<std::int64_t> capacity;  // --device-memory
  double max_activations = 0;            // --max-activations, for the searched schedules
  bool refine = false;                   // --refine, for the searched schedules
  bool recompute = false;                // --recompute: the costs are WithRecompute's
};

absl::Status CheckRange(std::string_view flag, std::int64_t value, std::int64_t lo,
                        std::int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", Absl(flag), "=", value, " is out of range: use ", lo, " to ", hi));
}

absl::StatusOr<Request> RequestFromFlags(const CommandContext& ctx) {
  Request r;
  PS_ASSIGN_OR_RETURN(r.max_activations, MaxActivationsFromFlags());
  r.refine = absl::GetFlag(FLAGS_refine);
  r.recompute = absl::GetFlag(FLAGS_recompute);
  if (FlagGiven(ctx, "schedules")) {
    PS_ASSIGN_OR_RETURN(r.schedules, SchedulesFromFlag(absl::GetFlag(FLAGS_schedules)));
  } else {
    PS_ASSIGN_OR_RETURN(r.schedules, SchedulesFromFlag("all"));
  }
  r.p = absl::GetFlag(FLAGS_stages);
  r.m = absl::GetFlag(FLAGS_microbatches);
  r.v = absl::GetFlag(FLAGS_virtual);
  PS_RETURN_IF_ERROR(CheckRange("stages", r.p, 1, kMaxRanks));
  PS_RETURN_IF_ERROR(CheckRange("microbatches", r.m, 1, kMaxMicrobatches));
  PS_RETURN_IF_ERROR(CheckRange("virtual", r.v, 0, kMaxChunks));
  int chunks = r.v;
  for (const std::string& name : r.schedules) {
    if (const scheduler::ScheduleInfo* info = scheduler::FindSchedule(name); info != nullptr) {
      chunks = std::max(chunks, r.v > 0 ? r.v : info->default_chunks);
    }
  }
  const std::int64_t actions = std::int64_t{3} * r.p * std::max(chunks, 1) * r.m;
  if (actions > kMaxActions) {
    return absl::InvalidArgumentError(
        absl::StrCat("P=", r.p, " x V=", chunks, " x M=", r.m, " needs up to ", actions,
                     " actions per schedule; the generators make up to ", kMaxActions,
                     " (P x V x M up to ", kMaxActions / 3, "): lower --microbatches or --stages"));
  }
  if (const std::string size = absl::GetFlag(FLAGS_device_memory); !size.empty()) {
    absl::StatusOr<std::int64_t> bytes = ParseByteSize(size);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device-memory=", size, ": ", bytes.status().message()));
    }
    r.capacity = *bytes;
  }
  std::int64_t searched_actions = 0;  // compare runs every searched schedule in turn
  int fit_searches = 1;               // with --device-memory, an order over it is searched again
  const bool fitted = r.capacity.has_value();
  for (const std::string& name : r.schedules) {
    const scheduler::ScheduleInfo* info = scheduler::FindSchedule(name);
    if (!info->uses_costs) continue;
    const int chunks = r.v > 0 ? r.v : info->default_chunks;
    const int searches = fitted ? MaxMemoryFitSearches(std::int64_t{chunks} * r.m) : 1;
    fit_searches = std::max(fit_searches, searches);
    searched_actions += std::int64_t{3} * r.p * chunks * r.m * searches;
  }
  NoteLongSearch(ctx,
                 fit_searches > 1 ? absl::StrCat("the searched schedules' orders (each up to ",
                                                 fit_searches, " times, to fit --device-memory)")
                                  : std::string("the searched schedules' orders"),
                 searched_actions);
  PS_RETURN_IF_ERROR(CheckOutputs({{"--costs", absl::GetFlag(FLAGS_costs)}},
                                  {{"--json", absl::GetFlag(FLAGS_json)},
                                   {"--md", absl::GetFlag(FLAGS_md)},
                                   {"--svg", absl::GetFlag(FLAGS_svg)},
                                   {"--trace", absl::GetFlag(FLAGS_trace)}}));
  return r;
}

// One compared schedule's numbers, for every output.
struct Row {
  const scheduler::ComparedSchedule* c;
  double step = 0;
  // The step to 10 significant digits: what ranks and ties, so that rounding in sums of
  // chunk costs (27.00000000000001 against 27.000000000000014) does not decide them.
  double rank_key = 0;
  // The busiest rank's peak, in whole-stage activations (chunk activations / V: a chunk
  // holds 1/V of a stage's) and in bytes (its static bytes included).
  double peak_stage_activations = 0;
  std::int64_t peak_bytes = 0;
};

Row MakeRow(const scheduler::ComparedSchedule& c) {
  Row row{.c = &c,
          .step = c.sim.step_time,
          // strtod, not stod: a subnormal step (costs of 1e-310) reads back, where stod throws.
          .rank_key = std::strtod(absl::StrFormat("%.10g", c.sim.step_time).c_str(), nullptr)};
  for (const scheduler::RankStats& rank : c.sim.ranks) {
    row.peak_stage_activations =
        std::max(row.peak_stage_activations,
                 static_cast<double>(rank.peak_live_microbatches) / c.num_chunks);
    row.peak_bytes = std::max(row.peak_bytes, scheduler::PeakTotalBytes(rank));
  }
  return row;
}

// The row's name: a searched schedule held to fit --device-memory is "zb-2p@5" (at most
// 5 stages' worth of activations per rank).
// The fitted limit as --max-activations takes it back ("2.4" for 7 of 3 chunks); only
// for a fitted row.
std::string FittedLimitText(const scheduler::ComparedSchedule& c) {
  const int limit = static_cast<int>(std::lround(c.fitted_max_activations * c.num_chunks));
  return scheduler::MaxActivationsText(limit, c.num_chunks);
}

std::string Label(const scheduler::ComparedSchedule& c) {
  if (c.fitted_max_activations <= 0) return c.schedule;
  return absl::StrCat(c.schedule, "@", FittedLimitText(c));
}

std::string Percent(std::optional<double> f) {
  return f.has_value() ? absl::StrFormat("%.2f%%", 100 * *f) : "-";
}

std::string Fits(const Request& r, const Row& row) {
  if (!r.capacity.has_value()) return "";
  return row.peak_bytes <= *r.capacity ? "yes" : "no";
}

// Whether any row knows its activations' sizes (else no bytes column: "0 B" would read
// as no memory).
bool KnowsBytes(const std::vector<Row>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const Row& row) { return row.peak_bytes > 0; });
}

// Whether any rank of any row holds static bytes (then peak bytes include them: said
// under the table).
bool KnowsStaticBytes(const std::vector<Row>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const Row& row) {
    return std::any_of(row.c->sim.ranks.begin(), row.c->sim.ranks.end(),
                       [](const scheduler::RankStats& s) { return s.static_bytes > 0; });
  });
}

// What --refine bought each searched row, in rank order: "--refine: zb-v-half 67.87 ->
// 65.56 (-3.40%), ...; no shorter step found for zb-1p, zb-2p; refined orders that do not
// fit --device-memory, not kept: zb-v-min".
std::string RefinementNote(const std::vector<Row>& rows) {
  std::vector<std::string> better, same, too_large;
  for (const Row& row : rows) {
    const std::optional<double>& before = row.c->unrefined_step_time;
    if (!before.has_value()) continue;
    if (row.c->refined_too_large) {
      too_large.push_back(Label(*row.c));
    } else if (row.step < *before * (1 - 1e-9)) {  // not a rounding difference
      better.push_back(absl::StrFormat("%s %.6g -> %.6g (%+.2f%%)", Label(*row.c), *before,
                                       row.step, 100 * (row.step - *before) / *before));
    } else {
      same.push_back(Label(*row.c));
    }
  }
  std::string note = "--refine: the searched orders' steps before -> after local search: ";
  absl::StrAppend(&note, better.empty() ? "none shorter" : absl::StrJoin(better, ", "));
  if (!same.empty()) {
    absl::StrAppend(&note, "; no shorter step found for ", absl::StrJoin(same, ", "));
  }
  if (!too_large.empty()) {
    absl::StrAppend(&note, "; refined orders that do not fit --device-memory, not kept: ",
                    absl::StrJoin(too_large, ", "));
  }
  return note;
}

std::string Markdown(const Request& r, const std::vector<Row>& rows) {
  const bool bytes = KnowsBytes(rows);
  std::string md = absl::StrCat(
      "| schedule | V | makespan | step time | vs best | bubble | closed form | peak act "
      "(stages) |",
      bytes ? " peak bytes |" : "", r.capacity.has_value() ? " fits |" : "",
      "\n|---|---|---|---|---|---|---|---|", bytes ? "---|" : "",
      r.capacity.has_value() ? "---|" : "", "\n");
  for (const Row& row : rows) {
    absl::StrAppend(&md,
                    absl::StrFormat("| %s | %d | %.6g | %.6g | %.3f | %.2f%% | %s | %.1f |",
                                    Label(*row.c), row.c->num_chunks, row.c->sim.makespan, row.step,
                                    row.step / rows.front().step, 100 * row.c->sim.bubble_fraction,
                                    Percent(row.c->closed_form), row.peak_stage_activations),
                    bytes ? absl::StrCat(" ", HumanBytes(row.peak_bytes), " |") : "",
                    r.capacity.has_value() ? absl::StrCat(" ", Fits(r, row), " |") : "", "\n");
  }
  if (KnowsStaticBytes(rows)) {
    absl::StrAppend(&md,
                    "\npeak bytes: the busiest rank's static bytes (parameters, gradients, "
                    "optimizer state) and activations at its peak.\n");
  }
  if (r.refine) absl::StrAppend(&md, "\n", RefinementNote(rows), ".\n");
  if (std::any_of(rows.begin(), rows.end(),
                  [](const Row& row) { return row.c->fitted_max_activations > 0; })) {
    absl::StrAppend(&md,
                    "\nNAME@X: the searched schedule NAME held to X stages' worth of activations "
                    "per rank, the loosest whose order fits in --device-memory=",
                    absl::GetFlag(FLAGS_device_memory), ".\n");
  }
  return md;
}

bool Recomputes(const scheduler::CostModel& costs) {
  bool any = costs.uniform.recomputes();
  for (const scheduler::StageCosts& s : costs.stages) any |= s.recomputes();
  return any;
}

std::string RecomputeNote(const scheduler::CostModel& costs) {
  return Recomputes(costs) ? ", with activation recomputation (B and I include F again)" : "";
}

// The costs as the header line tells them: the uniform numbers, or where the lists came
// from when there are per-stage or per-boundary ones (the uniform ones are then unused).
std::string DescribeCosts(const scheduler::CostModel& costs, const std::string& source) {
  if (!costs.stages.empty() || !costs.comm.empty()) {
    return absl::StrCat(
        "costs per pipeline stage from ", source.empty() ? "--costs" : source, " (",
        costs.stages.empty() ? "uniform stages" : absl::StrCat(costs.stages.size(), " stages"),
        costs.comm.empty() ? absl::StrFormat(", transfer %g", costs.comm_uniform)
                           : absl::StrCat(", ", costs.comm.size(),
                                          costs.comm.size() == 1 ? " boundary" : " boundaries"),
        ")", RecomputeNote(costs));
  }
  const scheduler::StageCosts& u = costs.uniform;
  std::string text =
      absl::StrFormat("costs per pipeline stage: F %g, B %g (I %g, W %g), transfer %g", u.f, u.b,
                      u.i, u.w, costs.comm_uniform);
  if (u.allreduce > 0) absl::StrAppend(&text, absl::StrFormat(", all-reduce %g", u.allreduce));
  if (u.zero_grad > 0) absl::StrAppend(&text, absl::StrFormat(", zero-grad %g", u.zero_grad));
  if (u.optimizer > 0) absl::StrAppend(&text, absl::StrFormat(", optimizer %g", u.optimizer));
  if (costs.action_gap > 0) absl::StrAppend(&text, absl::StrFormat(", gap %g", costs.action_gap));
  return absl::StrCat(text, RecomputeNote(costs));
}

std::string Json(const Request& r, const std::vector<Row>& rows,
                 const std::vector<scheduler::ComparedSchedule>& all) {
  nlohmann::json j;
  j["stages"] = r.p;
  j["microbatches"] = r.m;
  j["recompute"] = r.recompute;
  j["device_memory_bytes"] = r.capacity.has_value() ? nlohmann::json(*r.capacity) : nullptr;
  j["ranked"] = nlohmann::json::array();
  for (const Row& row : rows) {
    nlohmann::json peaks = nlohmann::json::array();
    nlohmann::json peak_bytes = nlohmann::json::array();
    nlohmann::json static_bytes = nlohmann::json::array();
    for (const scheduler::RankStats& rank : row.c->sim.ranks) {
      peaks.push_back(rank.peak_live_microbatches);
      peak_bytes.push_back(rank.peak_live_bytes);
      static_bytes.push_back(rank.static_bytes);
    }
    nlohmann::json e = {{"schedule", row.c->schedule},
                        {"label", Label(*row.c)},
                        {"virtual", row.c->num_chunks},
                        {"makespan", row.c->sim.makespan},
                        {"step_time", row.step},
                        {"vs_best", row.step / rows.front().step},
                        {"bubble_fraction", row.c->sim.bubble_fraction},
                        {"bubble_ratio", row.c->sim.bubble_ratio},
                        {"peak_activations", peaks},
                        {"peak_activation_bytes", peak_bytes},
                        {"static_bytes", static_bytes},
                        {"peak_stage_activations", row.peak_stage_activations}};
    e["closed_form"] =
        row.c->closed_form.has_value() ? nlohmann::json(*row.c->closed_form) : nullptr;
    if (r.capacity.has_value()) e["fits"] = row.peak_bytes <= *r.capacity;
    // The limit the order was searched within, in stages' worth: --max-activations, or
    // the one fitted to --device-memory; null for a schedule's own.
    // (A fitted one as its label gives it: 2.4, which floors to the same 7 of 3 chunk
    // activations as 7/3 does.)
    const scheduler::ScheduleInfo* info = scheduler::FindSchedule(row.c->schedule);
    double limit = info != nullptr && info->uses_costs ? r.max_activations : 0;
    if (row.c->fitted_max_activations > 0) limit = std::stod(FittedLimitText(*row.c));
    e["max_activations"] = limit > 0 ? nlohmann::json(limit) : nullptr;
    e["peak_bytes"] = row.peak_bytes;  // the busiest rank's static bytes and activations
    // With --refine, a searched row's step before the refinement.
    e["unrefined_step_time"] = row.c->unrefined_step_time.has_value()
                                   ? nlohmann::json(*row.c->unrefined_step_time)
                                   : nlohmann::json();
    e["refined_too_large"] = row.c->refined_too_large;
    // Why a searched schedule that does not fit has no fitted row.
    e["fit_error"] = row.c->fit_status.ok()
                         ? nlohmann::json()
                         : nlohmann::json(std::string(row.c->fit_status.message()));
    j["ranked"].push_back(e);
  }
  j["skipped"] = nlohmann::json::array();
  for (const scheduler::ComparedSchedule& c : all) {
    if (c.status.ok()) continue;
    j["skipped"].push_back({{"schedule", c.schedule}, {"reason", std::string(c.status.message())}});
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// Whether a compared schedule splits the backward into I and W (every one searched for
// its costs does; one that refuses the shape runs nothing: CompareSchedules reports it).
// Only then must B be I + W.
bool AnySplitsBackward(const Request& r) {
  for (const std::string& name : r.schedules) {
    const scheduler::ScheduleInfo* info = scheduler::FindSchedule(name);
    if (info != nullptr && info->uses_costs) return true;
  }
  for (const std::string& name : r.schedules) {
    absl::StatusOr<scheduler::Schedule> schedule = scheduler::GenerateSchedule(
        name, {.num_ranks = r.p, .num_microbatches = r.m, .num_chunks = r.v});
    if (schedule.ok() && schedule->SplitsBackward()) return true;
  }
  return false;
}

absl::Status Compare(const CommandContext& ctx) {
  PS_ASSIGN_OR_RETURN(const Request r, RequestFromFlags(ctx));
  // The costs describe the P stages of a one-chunk cut (CheckOneChunkCosts).
  std::string source;
  PS_ASSIGN_OR_RETURN(scheduler::CostModel costs,
                      UncheckedCostsFromFlags(ctx, scheduler::ScheduleFile{}, "", &source));
  // A file's I and W that do not add up to its B are no one's business when every
  // schedule compared runs B: they are set to B's halves (as --cost-b alone sets them),
  // which nothing reads. Given as flags, they were meant: still checked.
  if (!FlagGiven(ctx, "cost_i") && !FlagGiven(ctx, "cost_w") &&
      !scheduler::CheckOneChunkCosts(costs, r.p).ok() && !AnySplitsBackward(r)) {
    costs.uniform.i = costs.uniform.w = costs.uniform.b / 2;
    for (scheduler::StageCosts& s : costs.stages) s.i = s.w = s.b / 2;
  }
  if (absl::Status fit = scheduler::CheckOneChunkCosts(costs, r.p); !fit.ok()) {
    return source.empty() ? fit
                          : absl::InvalidArgumentError(absl::StrCat(source, ": ", fit.message()));
  }
  if (r.capacity.has_value()) {
    bool sized = costs.uniform.activation_bytes > 0 || costs.uniform.recompute_bytes > 0;
    for (const scheduler::StageCosts& s : costs.stages) {
      sized |= s.activation_bytes > 0 || s.recompute_bytes > 0;
    }
    if (!sized) {
      return absl::InvalidArgumentError(
          "--device-memory needs the activations' sizes: give --activation-bytes (and "
          "--workspace-bytes), or a --costs file with activation_bytes");
    }
  }
  std::vector<scheduler::ComparedSchedule> compared = scheduler::CompareSchedules(
      r.schedules, r.p, r.m, r.v, costs,
      {.keep_timelines = !absl::GetFlag(FLAGS_svg).empty() || !absl::GetFlag(FLAGS_trace).empty(),
       .max_activations = r.max_activations,
       .device_memory_bytes = r.capacity,
       .refine = r.refine});
  std::vector<Row> rows;
  for (const scheduler::ComparedSchedule& c : compared) {
    if (c.status.ok()) rows.push_back(MakeRow(c));
  }
  // Fastest first; among equal steps, the least memory.
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.rank_key, a.peak_bytes, a.peak_stage_activations) <
           std::tie(b.rank_key, b.peak_bytes, b.peak_stage_activations);
  });

  if (!rows.empty() && !(rows.front().step > 0)) {
    return absl::InvalidArgumentError(
        "every schedule's step is 0: give the stages some work (--cost-f, --cost-b, or a "
        "--costs file with times)");
  }
  // Transfers alone (F = B = 0) make idle time against no work: no bubble to rank by.
  for (const scheduler::ComparedSchedule& c : compared) {
    if (c.status.ok() && NoRankWorks(c.sim)) {
      return absl::InvalidArgumentError(
          "every action takes 0 time, so there is no bubble to compare: give the stages some "
          "work (--cost-f, --cost-b, or a --costs file with times)");
    }
  }
  std::ostream& out = *ctx.out;
  out << absl::StrFormat(
      "compare P=%d M=%d: %s; a schedule with V chunks per rank runs each chunk at 1/V of "
      "them\n",
      r.p, r.m, DescribeCosts(costs, source));
  const bool bytes = KnowsBytes(rows);
  // The names' column fits the longest label ("interleaved-zb-1p@1.5").
  int width = 17;
  for (const Row& row : rows) width = std::max(width, static_cast<int>(Label(*row.c).size()));
  out << absl::StrFormat("%-*s %2s %11s %11s %8s %8s %8s %10s%s%s\n", width, "schedule", "V",
                         "makespan", "step time", "vs best", "bubble", "closed", "peak act",
                         bytes ? "  peak bytes" : "", r.capacity.has_value() ? "  fits" : "");
  for (const Row& row : rows) {
    out << absl::StrFormat("%-*s %2d %11.6g %11.6g %8.3f %7.2f%% %8s %10.1f", width, Label(*row.c),
                           row.c->num_chunks, row.c->sim.makespan, row.step,
                           row.step / rows.front().step, 100 * row.c->sim.bubble_fraction,
                           Percent(row.c->closed_form), row.peak_stage_activations);
    if (bytes) out << absl::StrFormat("  %10s", HumanBytes(row.peak_bytes));
    if (r.capacity.has_value()) out << absl::StrFormat("  %4s", Fits(r, row));
    out << "\n";
  }
  for (const scheduler::ComparedSchedule& c : compared) {
    if (!c.status.ok()) out << "skipped " << c.schedule << ": " << c.status.message() << "\n";
  }
  if (rows.empty()) {
    // The first reason on the error line itself: stdout may be a file nobody reads.
    const absl::Status& first = compared.front().status;
    return absl::InvalidArgumentError(absl::StrCat(
        "no schedule could run P=", r.p, " M=", r.m, r.v > 0 ? absl::StrCat(" V=", r.v) : "", ": ",
        first.message(),
        compared.size() > 1 ? absl::StrCat(" (and ", compared.size() - 1, " more, listed above)")
                            : ""));
  }
  out << "peak act: the busiest rank's live activations in whole stages (chunk activations / "
         "V)\n";
  if (KnowsStaticBytes(rows)) {
    out << "peak bytes: the busiest rank's static bytes (parameters, gradients, optimizer "
           "state) and activations at its peak\n";
  }
  if (r.max_activations > 0) {
    out << absl::StrFormat(
        "the searched schedules keep at most %g stages' worth per rank (--max-activations)\n",
        r.max_activations);
  }
  if (r.refine) out << RefinementNote(rows) << "\n";
  std::vector<std::string> fitted;
  for (const scheduler::ComparedSchedule& c : compared) {
    if (c.fitted_max_activations > 0) fitted.push_back(Label(c));
    if (!c.fit_status.ok()) out << c.fit_status.message() << "\n";
  }
  if (!fitted.empty()) {
    out << absl::StrFormat(
        "NAME@X: the searched schedule NAME held to X stages' worth of activations per rank, "
        "the loosest whose order fits in --device-memory=%s (%s)\n",
        absl::GetFlag(FLAGS_device_memory), absl::StrJoin(fitted, ", "));
  }
  out << absl::StrFormat("fastest: %s (V=%d)", Label(*rows.front().c), rows.front().c->num_chunks);
  for (std::size_t i = 1; i < rows.size() && rows[i].rank_key == rows.front().rank_key; ++i) {
    out << absl::StrFormat(i == 1 ? ", tied with %s (V=%d)" : ", %s (V=%d)", Label(*rows[i].c),
                           rows[i].c->num_chunks);
  }
  if (r.capacity.has_value()) {
    auto fits = std::find_if(rows.begin(), rows.end(),
                             [&](const Row& row) { return row.peak_bytes <= *r.capacity; });
    if (fits == rows.end()) {
      out << absl::StrFormat("; none fits in --device-memory=%s\n",
                             absl::GetFlag(FLAGS_device_memory));
    } else {
      out << absl::StrFormat(
          "; fastest that fits in --device-memory=%s: %s (V=%d), %.3f x the "
          "fastest's step\n",
          absl::GetFlag(FLAGS_device_memory), Label(*fits->c), fits->c->num_chunks,
          fits->step / rows.front().step);
    }
  } else {
    out << "\n";
  }

  auto write = [&](const std::string& path, const std::string& content) -> absl::Status {
    PS_RETURN_IF_ERROR(WriteFileAtomic(path, content));
    SayWrote(out, path);
    return absl::OkStatus();
  };
  // Pictures: the ranked schedules one under the other on one time scale.
  std::vector<trace::Timeline> drawn;
  for (const Row& row : rows) {
    trace::Timeline t = trace::WithStepPhases(row.c->sim.timeline, row.c->sim.phases);
    t.name = absl::StrFormat("%s V=%d: step %.6g, bubble %.1f%%", Label(*row.c), row.c->num_chunks,
                             row.step, 100 * row.c->sim.bubble_fraction);
    drawn.push_back(std::move(t));
  }
  std::vector<const trace::Timeline*> pointers;
  for (const trace::Timeline& t : drawn) pointers.push_back(&t);
  if (std::string p = absl::GetFlag(FLAGS_svg); !p.empty()) {
    trace::SvgOptions options;
    options.title = absl::StrFormat("P=%d M=%d: schedules at equal work, fastest first", r.p, r.m);
    PS_RETURN_IF_ERROR(write(p, trace::ToSvg(pointers, options)));
  }
  if (std::string p = absl::GetFlag(FLAGS_trace); !p.empty()) {
    PS_RETURN_IF_ERROR(write(p, trace::ToChromeTrace(pointers)));
  }
  if (std::string p = absl::GetFlag(FLAGS_md); !p.empty()) {
    PS_RETURN_IF_ERROR(write(p, Markdown(r, rows)));
  }
  if (std::string p = absl::GetFlag(FLAGS_json); !p.empty()) {
    PS_RETURN_IF_ERROR(write(p, Json(r, rows, compared)));
  }
  return absl::OkStatus();
}

}  // namespace

int RunCompare(const CommandContext& ctx) {
  int code = 0;
  if (RejectArguments(ctx, "compare", code)) return code;
  absl::Status s = Compare(ctx);
  return s.ok() ? kExitOk : ReportError(ctx, s);
}

}  // namespace pipesched::cli
