// Pre-flight check of activation memory (stages/memory_check.h).
#include "stages/memory_check.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/host_memory.h"
#include "base/status.h"
#include "scheduler/simulator.h"

namespace pipesched::stages {

absl::Status CheckActivationsFit(const PlanShape& plan, const std::vector<MemoryPlace>& places) {
  for (const MemoryPlace& place : places) {
    if (place.planned_bytes <= place.available_bytes) continue;
    const bool machine = place.name == "host memory";
    std::vector<std::string> fixes = {"a smaller --microbatch-size, --hidden or --layers"};
    if (place.busiest_microbatches >= plan.num_microbatches) {
      fixes.push_back("fewer --microbatches");
    }
    if (place.busiest_microbatches > plan.num_ranks) {
      fixes.push_back(absl::StrCat(
          "a schedule that keeps fewer micro-batches in flight (1f1b: at most P = ", plan.num_ranks,
          " on a rank)"));
    }
    if (!machine) fixes.push_back("more --stages (fewer layers on each device)");
    std::string use = fixes.front();
    for (std::size_t k = 1; k < fixes.size(); ++k) {
      absl::StrAppend(&use, k + 1 == fixes.size() ? ", or " : ", ", fixes[k]);
    }
    return absl::ResourceExhaustedError(
        absl::StrCat(plan.schedule, "'s activations do not fit in ", place.name,
                     ": at its peak the plan holds ", HumanBytes(place.planned_bytes), " there (",
                     place.ranks, " rank(s); rank ", place.busiest_rank, " alone ",
                     HumanBytes(place.busiest_bytes), " with ", place.busiest_microbatches,
                     " of M = ", plan.num_microbatches, " micro-batches in flight) but ",
                     HumanBytes(place.available_bytes), " is available; use ", use));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MemoryPlace>> ActivationPlaces(
    const Executor& executor, std::optional<std::int64_t> machine_available_bytes) {
  const scheduler::Schedule& schedule = executor.schedule();
  scheduler::CostModel costs;  // unit times: the peaks depend on the programs' order only
  costs.uniform = {.f = 1, .b = 2, .i = 1, .w = 1};
  for (int s = 0; s < executor.num_stages(); ++s) {
    costs.stages.push_back({.f = 1,
                            .b = 2,
                            .i = 1,
                            .w = 1,
                            .activation_bytes = executor.activation_bytes(s),
                            .workspace_bytes = executor.workspace_bytes(s)});
  }
  PS_ASSIGN_OR_RETURN(const scheduler::SimResult sim, scheduler::Simulate(schedule, costs));

  std::vector<MemoryPlace> places;
  std::map<const runtime::Device*, std::size_t> place_of;  // device -> index in places
  std::optional<std::size_t> machine;                      // the shared "host memory" place
  for (int d = 0; d < executor.num_replicas(); ++d) {
    for (int r = 0; r < executor.num_ranks(); ++r) {
      runtime::Device& device = executor.device(d, r);
      std::size_t index = 0;
      if (auto it = place_of.find(&device); it != place_of.end()) {
        index = it->second;
      } else {
        PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> own, device.AvailableBytes());
        if (own.has_value()) {
          index = places.size();
          places.push_back({.name = device.description(), .available_bytes = *own});
        } else {
          if (!machine.has_value()) {
            machine = places.size();
            places.push_back(
                {.name = "host memory", .available_bytes = machine_available_bytes.value_or(-1)});
          }
          index = *machine;
        }
        place_of[&device] = index;
      }
      MemoryPlace& place = places[index];
      const scheduler::RankStats& stats = sim.ranks[r];
      place.planned_bytes += stats.peak_live_bytes;
      ++place.ranks;
      if (place.ranks == 1 || stats.peak_live_bytes > place.busiest_bytes) {
        place.busiest_rank = r;
        place.busiest_bytes = stats.peak_live_bytes;
        place.busiest_microbatches = stats.peak_live_microbatches;
      }
    }
  }
  // The machine's availability unknown: nothing to check it against.
  if (machine.has_value() && !machine_available_bytes.has_value()) {
    places.erase(places.begin() + static_cast<std::ptrdiff_t>(*machine));
  }
  return places;
}

}  // namespace pipesched::stages
