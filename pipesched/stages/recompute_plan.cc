#include "pipesched/stages/recompute_plan.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/model/mlp.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/memory_fit.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/stages/executor.h"
#include "pipesched/stages/memory_check.h"

namespace pipesched::stages {

absl::StatusOr<RecomputePlan> PlanRecompute(const TrainerConfig& config) {
  if (config.recompute || !config.recompute_stages.empty()) {
    return absl::InvalidArgumentError(
        "choosing the stages to recompute needs a configuration that recomputes none yet "
        "(no --recompute, no --recompute-stages list)");
  }
  TrainerConfig all = config;
  all.recompute = true;
  all.check_activation_memory = false;
  PS_ASSIGN_OR_RETURN(const std::unique_ptr<Trainer> trainer, Trainer::Create(all));
  const Executor& executor = trainer->executor();
  const scheduler::Schedule& schedule = executor.schedule();

  // The memories the pre-flight check holds the plan to, planned with every stage
  // recomputing: that must fit for any choice to.
  PS_ASSIGN_OR_RETURN(std::vector<MemoryPlace> places,
                      ActivationPlaces(executor, trainer->machine_activation_bytes()));
  // The devices first, then what several share (the machine's memory last).
  std::stable_sort(places.begin(), places.end(), [](const MemoryPlace& a, const MemoryPlace& b) {
    return a.members.size() < b.members.size();
  });
  if (places.empty()) {
    return absl::InvalidArgumentError(
        "choosing the stages to recompute needs to know how much memory the activations "
        "have, and neither the devices nor the machine say: give each device a size "
        "(--device-memory=SIZE)");
  }
  if (absl::Status fits = CheckActivationsFit({.schedule = schedule.name,
                                               .num_ranks = schedule.num_ranks(),
                                               .num_chunks = schedule.num_chunks(),
                                               .num_microbatches = executor.num_microbatches()},
                                              places);
      !fits.ok()) {
    return absl::Status(fits.code(), absl::StrCat("even with every stage recomputing its "
                                                  "activations: ",
                                                  fits.message()));
  }
  std::vector<scheduler::SharedMemory> memories;
  for (const MemoryPlace& place : places) {
    memories.push_back({.name = place.name,
                        .ranks = place.members,
                        .capacity_bytes = std::max<std::int64_t>(place.available_bytes, 1)});
  }

  // What each stage holds without recomputation and with it. The peaks depend only on
  // the programs' order; the times, in proportion to each chunk's parameters (the FLOPs of
  // its matrix products; a recomputing B or I runs the F once more), let the choice among
  // sets that fit prefer the one whose extra forwards cost the step least.
  const std::vector<LayerRange>& partition = trainer->partition();
  double mean_params = 0;
  std::vector<double> params;
  for (const LayerRange& r : partition) {
    params.push_back(static_cast<double>(model::ParamCount(config.model, r.first, r.last)));
    mean_params += params.back() / static_cast<double>(partition.size());
  }
  scheduler::CostModel plain;
  scheduler::CostModel recomputing;
  for (int s = 0; s < executor.num_stages(); ++s) {
    const double f = mean_params > 0 ? params[s] / mean_params : 1.0;
    scheduler::StageCosts with = executor.WithMemoryCosts(s, {.f = f, .b = 2 * f, .i = f, .w = f});
    scheduler::StageCosts without = with;
    without.activation_bytes += with.recompute_bytes;
    without.recompute_bytes = 0;
    without.recompute = false;
    with.b += with.f;
    with.i += with.f;
    plain.stages.push_back(without);
    recomputing.stages.push_back(with);
  }
  PS_ASSIGN_OR_RETURN(const scheduler::RecomputeFit fit,
                      scheduler::RecomputeWithinMemory(schedule, plain, recomputing, memories));
  RecomputePlan plan;
  plan.stages = fit.stages;
  plan.exhaustive = fit.exhaustive;
  plan.num_stages = executor.num_stages();
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    plan.peak_without.push_back(fit.without.ranks[r].peak_live_bytes);
    plan.peak_with.push_back(fit.sim.ranks[r].peak_live_bytes);
  }
  for (const MemoryPlace& place : places) {
    RecomputePlan::Place p{.name = place.name, .available_bytes = place.available_bytes};
    for (int r : place.members) {
      p.planned_without = SaturatingAdd(p.planned_without, plan.peak_without[r]);
      p.planned_with = SaturatingAdd(p.planned_with, plan.peak_with[r]);
    }
    plan.places.push_back(std::move(p));
  }
  return plan;
}

}  // namespace pipesched::stages
