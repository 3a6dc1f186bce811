#include "stages/recompute_plan.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "runtime/runtime.h"
#include "scheduler/cost_model.h"
#include "scheduler/memory_fit.h"
#include "scheduler/simulator.h"
#include "stages/executor.h"

namespace pipesched::stages {

absl::StatusOr<RecomputePlan> PlanRecompute(const TrainerConfig& config) {
  if (config.recompute || !config.recompute_stages.empty()) {
    return absl::InvalidArgumentError(
        "choosing the stages to recompute needs a configuration that recomputes none yet "
        "(no --recompute, no --recompute-stages list)");
  }
  TrainerConfig all = config;
  all.recompute = true;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(all);
  if (absl::IsResourceExhausted(trainer.status())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "even with every stage recomputing its activations: ", trainer.status().message()));
  }
  PS_RETURN_IF_ERROR(trainer.status());
  const Executor& executor = (*trainer)->executor();

  // Each rank's own device and what it has left for activations.
  const int num_ranks = executor.num_ranks();
  RecomputePlan plan;
  plan.room_bytes.assign(num_ranks, 0);
  std::map<const runtime::Device*, std::pair<int, int>> holder;  // device -> (replica, rank)
  for (int d = 0; d < executor.num_replicas(); ++d) {
    for (int r = 0; r < num_ranks; ++r) {
      runtime::Device& device = executor.device(d, r);
      const auto [it, first] = holder.emplace(&device, std::make_pair(d, r));
      if (!first) {
        return absl::InvalidArgumentError(absl::StrCat(
            "choosing the stages to recompute fits each rank into a device of its own, but "
            "replica ",
            it->second.first, " rank ", it->second.second, " and replica ", d, " rank ", r,
            " share ", device.description(),
            ", where their peaks add up: give each rank its own device (--devices)"));
      }
      PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> left, device.AvailableBytes());
      if (!left.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "choosing the stages to recompute needs the size of each device, and ",
            device.description(),
            " shares the machine's memory: give each device a size (--device-memory=SIZE)"));
      }
      plan.room_bytes[r] = d == 0 ? *left : std::min(plan.room_bytes[r], *left);
    }
  }
  // One capacity for all ranks: the largest room, with the difference to a rank's own
  // room held as static bytes on its first stage (RankStats::static_bytes is counted
  // against the capacity next to the activations' peak).
  const std::int64_t capacity = *std::max_element(plan.room_bytes.begin(), plan.room_bytes.end());
  if (capacity < 1) {
    return absl::ResourceExhaustedError(
        "the model's parameters, gradients and optimizer state leave no device memory for "
        "activations; give more memory (--device-memory) or a smaller model (--hidden, "
        "--layers)");
  }

  // What each stage holds without recomputation and with it; unit times (a recomputing
  // B or I runs the F once more), since the peaks depend only on the programs' order.
  const scheduler::Schedule& schedule = executor.schedule();
  scheduler::CostModel plain;
  scheduler::CostModel recomputing;
  std::vector<bool> rank_seen(num_ranks, false);
  for (int s = 0; s < executor.num_stages(); ++s) {
    scheduler::StageCosts with = executor.WithMemoryCosts(s);
    const int rank = schedule.placement.RankOf(s);
    if (!rank_seen[rank]) {
      with.static_bytes = capacity - plan.room_bytes[rank];
      rank_seen[rank] = true;
    }
    scheduler::StageCosts without = with;
    without.activation_bytes += with.recompute_bytes;
    without.recompute_bytes = 0;
    with.b += with.f;
    with.i += with.f;
    plain.stages.push_back(without);
    recomputing.stages.push_back(with);
  }
  PS_ASSIGN_OR_RETURN(scheduler::RecomputeFit fit,
                      scheduler::RecomputeWithinMemory(schedule, plain, recomputing, capacity));
  plan.stages = std::move(fit.stages);
  for (int r = 0; r < num_ranks; ++r) {
    plan.peak_without.push_back(fit.without.ranks[r].peak_live_bytes);
    plan.peak_with.push_back(fit.sim.ranks[r].peak_live_bytes);
  }
  return plan;
}

}  // namespace pipesched::stages
