#include "scheduler/memory_fit.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/host_memory.h"
#include "base/status.h"
#include "base/strings.h"

namespace pipesched::scheduler {
namespace {

int PeakChunkActivations(const SimResult& sim) {
  int peak = 0;
  for (const RankStats& rank : sim.ranks) peak = std::max(peak, rank.peak_live_microbatches);
  return peak;
}

int BusiestRank(const SimResult& sim) {
  int busiest = 0;
  for (int r = 1; r < static_cast<int>(sim.ranks.size()); ++r) {
    if (sim.ranks[r].peak_live_bytes > sim.ranks[busiest].peak_live_bytes) busiest = r;
  }
  return busiest;
}

}  // namespace

std::int64_t PeakBytes(const SimResult& sim) {
  std::int64_t peak = 0;
  for (const RankStats& rank : sim.ranks) peak = std::max(peak, rank.peak_live_bytes);
  return peak;
}

absl::StatusOr<MemoryFit> SearchWithinMemory(std::string_view name, const GeneratorParams& params,
                                             const CostModel& costs, std::int64_t capacity_bytes) {
  const ScheduleInfo* info = FindSchedule(name);
  if (info != nullptr && !info->uses_costs) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(name),
                     "'s order fixes its memory: only a searched schedule can be "
                     "searched within a device's memory"));
  }
  if (params.max_activations != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("searching ", Absl(name),
                     " within a device's memory chooses its activation limit; "
                     "give no max_activations of its own (it has ",
                     params.max_activations, ")"));
  }
  if (capacity_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a device's memory must be positive to search within, not ", capacity_bytes));
  }
  MemoryFit fit;
  PS_ASSIGN_OR_RETURN(fit.schedule, GenerateSchedule(name, params));
  PS_ASSIGN_OR_RETURN(fit.sim, Simulate(fit.schedule, costs));
  fit.searches = 1;
  fit.own_peak_bytes = PeakBytes(fit.sim);
  if (fit.own_peak_bytes <= capacity_bytes) return fit;

  // The largest limit L in [V, peak - 1] chunk activations whose order fits: L = peak or
  // more gives the same order back.
  const int chunks = fit.schedule.num_chunks();
  int lo = chunks;
  int hi = PeakChunkActivations(fit.sim) - 1;
  std::optional<MemoryFit> best;
  std::optional<MemoryFit> tightest;  // the last order that did not fit, for the message
  absl::Status at_one_stage;          // why one stage's worth gave no order, if it did not
  int searches = 1;
  auto attempt = [&](int limit) -> absl::StatusOr<MemoryFit> {
    GeneratorParams tighter = params;
    tighter.max_activations = static_cast<double>(limit) / chunks;
    ++searches;
    MemoryFit f{.max_activations = tighter.max_activations, .own_peak_bytes = fit.own_peak_bytes};
    PS_ASSIGN_OR_RETURN(f.schedule, GenerateSchedule(name, tighter));
    PS_ASSIGN_OR_RETURN(f.sim, Simulate(f.schedule, costs));
    return f;
  };
  while (lo <= hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    // A limit the search finds no order within is one that does not fit either.
    absl::StatusOr<MemoryFit> tried = attempt(mid);
    if (tried.ok() && PeakBytes(tried->sim) <= capacity_bytes) {
      best = *std::move(tried);
      lo = mid + 1;
    } else {
      if (tried.ok()) {
        tightest = *std::move(tried);
      } else if (mid == chunks) {
        at_one_stage = tried.status();
      }
      hi = mid - 1;
    }
  }
  if (best.has_value()) {
    best->searches = searches;
    return *std::move(best);
  }
  // Nothing fits. The bisection never moved `lo`, so it tried one stage's worth last; an
  // empty range means the order at the own limit held no more than that already.
  if (!at_one_stage.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Absl(name), " does not fit in ", HumanBytes(capacity_bytes),
        " per device, and within one stage's worth of activations per rank it has no order: ",
        at_one_stage.message()));
  }
  const MemoryFit& last = tightest.has_value() ? *tightest : fit;
  const int rank = BusiestRank(last.sim);
  return absl::ResourceExhaustedError(absl::StrCat(
      Absl(name), " does not fit in ", HumanBytes(capacity_bytes),
      " per device even when searched within one stage's worth of activations per rank (", chunks,
      " chunk activation", chunks == 1 ? "" : "s", "): rank ", rank, " peaks at ",
      HumanBytes(last.sim.ranks[rank].peak_live_bytes),
      "; give more memory or smaller activations"));
}

}  // namespace pipesched::scheduler
