// Pre-flight check of activation memory (stages/memory_check.h).
#include "pipesched/stages/memory_check.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/simulator.h"

namespace pipesched::stages {
namespace {

constexpr char kMachine[] = "host memory";

}  // namespace

absl::Status CheckActivationsFit(const PlanShape& plan, const std::vector<MemoryPlace>& places) {
  const std::int64_t all = static_cast<std::int64_t>(plan.num_chunks) * plan.num_microbatches;
  for (const MemoryPlace& place : places) {
    if (place.planned_bytes <= place.available_bytes) continue;
    const bool machine = place.name == kMachine;
    std::vector<std::string> fixes = {plan.smaller};
    if (place.busiest_activations >= all) fixes.push_back(plan.fewer_microbatches);
    // 1F1B keeps at most P micro-batches, each the rank's chunks' activations, on a rank.
    if (place.busiest_microbatch_bytes > 0 &&
        place.busiest_bytes / place.busiest_microbatch_bytes > plan.num_ranks) {
      fixes.push_back(absl::StrCat(
          "a schedule that keeps fewer micro-batches in flight (1f1b: at most P = ", plan.num_ranks,
          " on a rank)"));
    }
    if (!machine) {
      fixes.push_back(place.ranks > 1 ? plan.more_devices : plan.more_stages);
    }
    std::string use = fixes.front();
    for (std::size_t k = 1; k < fixes.size(); ++k) {
      absl::StrAppend(&use, k + 1 == fixes.size() ? ", or " : ", ", fixes[k]);
    }
    const std::string held =
        plan.num_chunks == 1
            ? absl::StrCat(place.busiest_activations, " of M = ", plan.num_microbatches,
                           " micro-batches in flight")
            : absl::StrCat(place.busiest_activations, " of V x M = ", plan.num_chunks, " x ",
                           plan.num_microbatches, " chunk activations in flight");
    // Close sizes round to the same text ("4.00 MiB ... but 4.00 MiB"): then in bytes too.
    std::string planned = HumanBytes(place.planned_bytes);
    std::string available = HumanBytes(place.available_bytes);
    if (planned == available) {
      absl::StrAppend(&planned, " (", place.planned_bytes, " B)");
      absl::StrAppend(&available, " (", place.available_bytes, " B)");
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        plan.schedule, "'s activations do not fit in ", place.name, ": at its peak the plan holds ",
        planned, " there (", place.ranks, " rank(s); rank ", place.busiest_rank, " alone ",
        HumanBytes(place.busiest_bytes), " with ", held, ") but ", available, " is available; use ",
        use));
  }
  return absl::OkStatus();
}

MemoryPlace RankPlace(const scheduler::Schedule& schedule, const scheduler::CostModel& costs,
                      const scheduler::SimResult& sim, int rank) {
  const scheduler::RankStats& stats = sim.ranks[rank];
  std::int64_t microbatch_bytes = 0;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    if (schedule.placement.RankOf(s) == rank) {
      microbatch_bytes = SaturatingAdd(microbatch_bytes, costs.Stage(s).activation_bytes);
    }
  }
  return {.planned_bytes = stats.peak_live_bytes,
          .ranks = 1,
          .busiest_rank = rank,
          .busiest_activations = stats.peak_live_microbatches,
          .busiest_bytes = stats.peak_live_bytes,
          .busiest_microbatch_bytes = microbatch_bytes};
}

absl::StatusOr<std::vector<MemoryPlace>> ActivationPlaces(
    const Executor& executor, std::optional<std::int64_t> machine_available_bytes) {
  const scheduler::Schedule& schedule = executor.schedule();
  scheduler::CostModel costs;  // unit times: the peaks depend on the programs' order only
  for (int s = 0; s < executor.num_stages(); ++s) {
    costs.stages.push_back(executor.WithMemoryCosts(s));
  }
  PS_ASSIGN_OR_RETURN(const scheduler::SimResult sim, scheduler::Simulate(schedule, costs));
  std::vector<MemoryPlace> rank_places;
  for (int r = 0; r < executor.num_ranks(); ++r) {
    rank_places.push_back(RankPlace(schedule, costs, sim, r));
  }

  std::vector<MemoryPlace> places;
  std::map<const runtime::Device*, std::optional<std::size_t>> own_place;  // device -> place
  std::optional<std::size_t> machine;  // index of "host memory" in places
  auto add = [](MemoryPlace& place, const MemoryPlace& rank) {
    place.planned_bytes = SaturatingAdd(place.planned_bytes, rank.planned_bytes);
    ++place.ranks;
    place.members.push_back(rank.busiest_rank);
    if (place.ranks == 1 || rank.busiest_bytes > place.busiest_bytes) {
      place.busiest_rank = rank.busiest_rank;
      place.busiest_activations = rank.busiest_activations;
      place.busiest_bytes = rank.busiest_bytes;
      place.busiest_microbatch_bytes = rank.busiest_microbatch_bytes;
    }
  };
  for (int d = 0; d < executor.num_replicas(); ++d) {
    for (int r = 0; r < executor.num_ranks(); ++r) {
      if (!executor.runs_rank(r)) continue;  // another process's memory
      runtime::Device& device = executor.device(d, r);
      auto it = own_place.find(&device);
      if (it == own_place.end()) {
        PS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> own, device.AvailableBytes());
        std::optional<std::size_t> index;
        if (own.has_value()) {
          index = places.size();
          places.push_back({.name = device.description(), .available_bytes = *own});
        }
        it = own_place.emplace(&device, index).first;
      }
      if (it->second.has_value()) add(places[*it->second], rank_places[r]);
      if (device.kind() == runtime::BackendKind::kHost && machine_available_bytes.has_value()) {
        if (!machine.has_value()) {
          machine = places.size();
          places.push_back({.name = kMachine, .available_bytes = *machine_available_bytes});
        }
        add(places[*machine], rank_places[r]);
      }
    }
  }
  return places;
}

}  // namespace pipesched::stages
