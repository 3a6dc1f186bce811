#include "scheduler/memory_fit.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  auto total = [&](int r) { return sim.ranks[r].static_bytes + sim.ranks[r].peak_live_bytes; };
  for (int r = 1; r < static_cast<int>(sim.ranks.size()); ++r) {
    if (total(r) > total(busiest)) busiest = r;
  }
  return busiest;
}

}  // namespace

std::int64_t PeakBytes(const SimResult& sim) {
  std::int64_t peak = 0;
  for (const RankStats& rank : sim.ranks) {
    peak = std::max(peak, rank.static_bytes + rank.peak_live_bytes);
  }
  return peak;
}

std::string MaxActivationsText(int chunk_activations, int chunks) {
  const double exact = static_cast<double>(chunk_activations) / chunks;
  for (int digits = 0; digits <= 9; ++digits) {
    const double scale = std::pow(10.0, digits);
    // Rounded up, so that floor(X V) does not fall to the limit below.
    const double x = std::ceil(exact * scale - 1e-9) / scale;
    if (static_cast<int>(std::floor(x * chunks + 1e-9)) == chunk_activations) {
      return absl::StrFormat("%.*f", digits, x);
    }
  }
  return absl::StrFormat("%.17g", exact);
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
  std::optional<MemoryFit> tightest;         // the tightest order tried that did not fit
  std::optional<absl::Status> at_one_stage;  // one stage's worth, once tried: why no order
  int searches = 1;
  auto attempt = [&](int limit) -> absl::StatusOr<MemoryFit> {
    GeneratorParams tighter = params;
    tighter.max_activations = static_cast<double>(limit) / chunks;
    ++searches;
    MemoryFit f{.max_activations = tighter.max_activations,
                .chunk_activations = limit,
                .own_peak_bytes = fit.own_peak_bytes};
    PS_ASSIGN_OR_RETURN(f.schedule, GenerateSchedule(name, tighter));
    PS_ASSIGN_OR_RETURN(f.sim, Simulate(f.schedule, costs));
    return f;
  };
  // Whether `tried` fits; keeps what the message needs when it does not.
  auto fits = [&](int limit, absl::StatusOr<MemoryFit>& tried) {
    if (limit == chunks) at_one_stage = tried.status();
    if (!tried.ok()) return false;
    if (PeakBytes(tried->sim) <= capacity_bytes) return true;
    if (!tightest.has_value() || limit < tightest->chunk_activations) tightest = *tried;
    return false;
  };
  while (lo <= hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    absl::StatusOr<MemoryFit> tried = attempt(mid);
    if (fits(mid, tried)) {
      best = *std::move(tried);
      lo = mid + 1;
    } else if (!tried.ok()) {
      // No order within this limit ("found no order within N"): too tight for the search,
      // so a looser one may still fit.
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (best.has_value()) {
    best->searches = searches;
    return *std::move(best);
  }
  // Nothing fits. Say how far off one stage's worth is: tried now if the bisection did
  // not (an empty range means the own order holds no more than that already).
  if (!at_one_stage.has_value() && PeakChunkActivations(fit.sim) > chunks) {
    absl::StatusOr<MemoryFit> tried = attempt(chunks);
    if (fits(chunks, tried)) {  // where a looser limit found no order
      tried->searches = searches;
      return *std::move(tried);
    }
  }
  if (at_one_stage.has_value() && !at_one_stage->ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Absl(name), " does not fit in ", HumanBytes(capacity_bytes),
        " per device, and within one stage's worth of activations per rank it has no order: ",
        at_one_stage->message()));
  }
  const MemoryFit& last = tightest.has_value() ? *tightest : fit;
  const int rank = BusiestRank(last.sim);
  return absl::ResourceExhaustedError(absl::StrCat(
      Absl(name), " does not fit in ", HumanBytes(capacity_bytes),
      " per device even when searched within one stage's worth of activations per rank (", chunks,
      " chunk activation", chunks == 1 ? "" : "s", "): rank ", rank, " peaks at ",
      HumanBytes(last.sim.ranks[rank].static_bytes + last.sim.ranks[rank].peak_live_bytes),
      "; give more memory or smaller activations"));
}

}  // namespace pipesched::scheduler
