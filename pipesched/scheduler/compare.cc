// Refining one model's per-stage costs to V chunks per rank, and simulating every
// schedule with them (compare.h).
#include "pipesched/scheduler/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/formulas.h"
#include "pipesched/scheduler/memory_fit.h"
#include "pipesched/scheduler/registry.h"

namespace pipesched::scheduler {
namespace {

// Without bytes + parts - 1, which overflows near INT64_MAX.
std::int64_t DivideRoundingUp(std::int64_t bytes, int parts) {
  return bytes / parts + (bytes % parts > 0 ? 1 : 0);
}

// One chunk of V of a stage: its share of the stage's work and stashed activations.
StageCosts Chunk(const StageCosts& stage, int v) {
  StageCosts c = stage;
  c.f /= v;
  c.b /= v;
  c.i /= v;
  c.w /= v;
  c.allreduce /= v;
  c.zero_grad /= v;
  c.optimizer /= v;
  c.activation_bytes = DivideRoundingUp(stage.activation_bytes, v);
  c.static_bytes = DivideRoundingUp(stage.static_bytes, v);
  // A recomputing stage keeps only boundary tensors (its input, its output's buffers),
  // which every chunk has whole, and rebuilds the rest of its share of all the stage's
  // activations: kept + rebuilt is what the chunk would keep without recomputation.
  c.recompute = stage.recomputes();  // also when the chunk's share rebuilds nothing
  if (stage.recompute_bytes > 0) {
    const std::int64_t share = DivideRoundingUp(stage.activation_bytes + stage.recompute_bytes, v);
    c.activation_bytes = std::min(stage.activation_bytes, share);
    c.recompute_bytes = share - c.activation_bytes;
  }
  // The received input is part of the stash (Simulate checks it): a chunk too thin to
  // hold the stage's whole input tensor is taken to hold only its share.
  c.input_bytes = std::min(stage.input_bytes, c.activation_bytes);
  return c;
}

// B against I + W, to a relative 1e-9 (measured files store I = W = B / 2 in doubles).
absl::Status CheckSplit(const StageCosts& c, std::string_view where) {
  const double split = c.i + c.w;
  if (std::abs(c.b - split) <= 1e-9 * std::max(c.b, split)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "cost model: %sB=%g is not I + W = %g (I=%g, W=%g): schedules that split the backward "
      "would do other work than those that do not; give I and W that add up to B",
      where, c.b, split, c.i, c.w));
}

}  // namespace

absl::Status CheckOneChunkCosts(const CostModel& per_stage, int num_ranks) {
  const int p = num_ranks;
  if (!per_stage.stages.empty() && static_cast<int>(per_stage.stages.size()) != p) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cost model: \"stages\" has %d entries; comparing schedules takes one per pipeline "
        "stage of a one-chunk cut (P=%d), or none for uniform costs",
        per_stage.stages.size(), p));
  }
  if (!per_stage.comm.empty() && static_cast<int>(per_stage.comm.size()) != p - 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cost model: \"comm\" has %d entries; comparing schedules takes one per boundary "
        "between the P=%d stages (%d), or one number for all",
        per_stage.comm.size(), p, p - 1));
  }
  if (!per_stage.actions.empty() || !per_stage.transfers.empty() || !per_stage.gaps.empty()) {
    return absl::InvalidArgumentError(
        "cost model: per-action replay costs cannot be refined into chunks");
  }
  if (absl::Status valid = CheckCostModel(per_stage); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cost model: ", valid.message()));
  }
  if (per_stage.stages.empty()) PS_RETURN_IF_ERROR(CheckSplit(per_stage.uniform, ""));
  for (int s = 0; s < static_cast<int>(per_stage.stages.size()); ++s) {
    PS_RETURN_IF_ERROR(CheckSplit(per_stage.stages[s], absl::StrCat("stage ", s, ": ")));
  }
  if (absl::Status input = CheckInputBytes(per_stage, p); !input.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cost model: ", input.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<CostModel> RefineCosts(const CostModel& per_stage, int num_ranks, int num_chunks) {
  const int p = num_ranks;
  const int v = num_chunks;
  if (p < 1 || v < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("refining costs needs P >= 1 and V >= 1 (got P=", p, ", V=", v, ")"));
  }
  // The generators' bounds, which keep P*V below 2^26.
  if (p > kMaxGeneratorRanks || v > kMaxGeneratorChunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refining costs supports at most P=", kMaxGeneratorRanks, " ranks and V=",
        kMaxGeneratorChunks, " chunks per rank, as the generators (got P=", p, ", V=", v, ")"));
  }
  PS_RETURN_IF_ERROR(CheckOneChunkCosts(per_stage, p));
  if (v == 1) return per_stage;
  CostModel out;
  out.uniform = Chunk(per_stage.uniform, v);
  for (int k = 0; k < p * v && !per_stage.stages.empty(); ++k) {
    out.stages.push_back(Chunk(per_stage.stages[k / v], v));
  }
  out.comm_uniform = per_stage.comm_uniform;
  if (!per_stage.comm.empty()) {
    const double mean = std::accumulate(per_stage.comm.begin(), per_stage.comm.end(), 0.0) /
                        static_cast<double>(per_stage.comm.size());
    for (int k = 0; k + 1 < p * v; ++k) {
      // Boundary k -> k+1 is the stages' boundary (k+1)/V - 1 when k+1 starts a stage.
      out.comm.push_back((k + 1) % v == 0 ? per_stage.comm[(k + 1) / v - 1] : mean);
    }
  }
  out.action_gap = per_stage.action_gap;
  return out;
}

std::vector<ComparedSchedule> CompareSchedules(const std::vector<std::string>& names, int num_ranks,
                                               int num_microbatches, int num_chunks,
                                               const CostModel& per_stage,
                                               const CompareOptions& options) {
  std::vector<ComparedSchedule> out;
  auto finish = [&](ComparedSchedule& row, const Schedule& schedule, const CostModel& costs) {
    if (!options.keep_timelines) {
      row.sim.timeline = trace::Timeline{};
      row.sim.phases.clear();
    }
    row.closed_form = ClosedFormFor(schedule, costs);
  };
  for (const std::string& name : names) {
    ComparedSchedule& row = out.emplace_back();
    row.schedule = name;
    GeneratorParams params{.num_ranks = num_ranks,
                           .num_microbatches = num_microbatches,
                           .num_chunks = num_chunks,
                           .max_activations = options.max_activations};
    // A schedule searched for its costs (ScheduleInfo::uses_costs) is searched for the ones it is
    // ranked by; a refinement that fails fails again below, and is reported there.
    absl::StatusOr<CostModel> search_costs;
    if (const ScheduleInfo* info = FindSchedule(name); info != nullptr && info->uses_costs) {
      search_costs = RefineCosts(per_stage, num_ranks,
                                 num_chunks > 0 ? num_chunks : std::max(info->default_chunks, 1));
      if (search_costs.ok()) params.costs = &*search_costs;
    }
    const bool refine = options.refine && params.costs != nullptr;
    // The order as searched first: the memory fit chooses its limit from those, and the
    // refined order is told against it.
    absl::StatusOr<Schedule> schedule = GenerateSchedule(name, params);
    if (!schedule.ok()) {
      row.status = schedule.status();
      continue;
    }
    row.num_chunks = schedule->num_chunks();
    absl::StatusOr<CostModel> costs = RefineCosts(per_stage, num_ranks, row.num_chunks);
    if (!costs.ok()) {
      row.status = costs.status();
      continue;
    }
    absl::StatusOr<SimResult> sim = Simulate(*schedule, *costs);
    if (!sim.ok()) {
      row.status = sim.status();
      continue;
    }
    row.sim = *std::move(sim);
    params.refine = refine;
    if (!options.keep_timelines) row.sim.timeline = trace::Timeline{};  // not drawn: not copied
    // The own row refined at the schedule's limit, not where that costs it the device.
    auto refine_own = [&]() -> absl::Status {
      if (!refine) return absl::OkStatus();
      PS_ASSIGN_OR_RETURN(
          Refined r, RefineWithinMemory(*std::move(schedule), std::move(row.sim), &params, *costs,
                                        options.device_memory_bytes));
      *schedule = std::move(r.schedule);
      row.sim = std::move(r.sim);
      row.unrefined_step_time = r.unrefined_step_time;
      row.refined_too_large = r.too_large;
      return absl::OkStatus();
    };
    const std::int64_t peak = PeakBytes(row.sim);
    // With --refine a fitting own order goes through the fit too, which keeps it refined
    // only where the refined order fits as well.
    const bool fit_it = options.device_memory_bytes.has_value() && options.max_activations == 0 &&
                        params.costs != nullptr && peak > 0 &&
                        (peak > *options.device_memory_bytes || refine);
    absl::StatusOr<MemoryFit> fit = absl::UnknownError("not fitted");
    if (fit_it) {
      fit = SearchWithinMemory(name, params, *costs, *options.device_memory_bytes, *schedule,
                               row.sim);
      if (!fit.ok() && peak <= *options.device_memory_bytes) {  // not a matter of memory
        row.status = fit.status();
        continue;
      }
      if (!fit.ok()) row.fit_status = fit.status();
    }
    if (fit.ok() && fit->max_activations == 0) {  // the own order fits
      *schedule = std::move(fit->schedule);
      row.sim = std::move(fit->sim);
      row.unrefined_step_time = fit->unrefined_step_time;
      row.refined_too_large = fit->refined_too_large;
      finish(row, *schedule, *costs);
      continue;
    }
    if (absl::Status refined = refine_own(); !refined.ok()) {
      row.status = refined;
      continue;
    }
    finish(row, *schedule, *costs);
    if (!fit.ok()) continue;
    ComparedSchedule& fitted = out.emplace_back();
    fitted.schedule = name;
    fitted.num_chunks = fit->schedule.num_chunks();
    fitted.sim = std::move(fit->sim);
    fitted.fitted_max_activations = fit->max_activations;
    fitted.unrefined_step_time = fit->unrefined_step_time;
    fitted.refined_too_large = fit->refined_too_large;
    finish(fitted, fit->schedule, *costs);
  }
  return out;
}

}  // namespace pipesched::scheduler
