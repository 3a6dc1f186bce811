#include "pipesched/scheduler/memory_fit.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/refine.h"

namespace pipesched::scheduler {
namespace {

int PeakChunkActivations(const SimResult& sim) {
  int peak = 0;
  for (const RankStats& rank : sim.ranks) peak = std::max(peak, rank.peak_live_microbatches);
  return peak;
}

absl::Status CheckFitRequest(std::string_view name, const GeneratorParams& params,
                             std::int64_t capacity_bytes) {
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
  return absl::OkStatus();
}

int BusiestRank(const SimResult& sim) {
  int busiest = 0;
  for (int r = 1; r < static_cast<int>(sim.ranks.size()); ++r) {
    if (PeakTotalBytes(sim.ranks[r]) > PeakTotalBytes(sim.ranks[busiest])) busiest = r;
  }
  return busiest;
}

}  // namespace

std::int64_t PeakBytes(const SimResult& sim) {
  std::int64_t peak = 0;
  for (const RankStats& rank : sim.ranks) peak = std::max(peak, PeakTotalBytes(rank));
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

absl::StatusOr<Refined> RefineWithinMemory(Schedule order, SimResult order_sim,
                                           const GeneratorParams* searched_params,
                                           const CostModel& costs,
                                           std::optional<std::int64_t> capacity_bytes) {
  Refined out{.unrefined_step_time = order_sim.step_time};
  absl::StatusOr<Schedule> refined = absl::UnknownError("");
  if (searched_params != nullptr) {
    GeneratorParams params = *searched_params;
    params.refine = true;
    refined = GenerateSchedule(order.name, params);
  } else {
    refined = RefineSchedule(order, costs);
  }
  PS_RETURN_IF_ERROR(refined.status());
  PS_ASSIGN_OR_RETURN(SimResult sim, Simulate(*refined, costs));
  out.too_large = capacity_bytes.has_value() && PeakBytes(sim) > *capacity_bytes &&
                  PeakBytes(order_sim) <= *capacity_bytes;
  if (out.too_large) {
    out.schedule = std::move(order);
    out.sim = std::move(order_sim);
  } else {
    out.schedule = *std::move(refined);
    out.sim = std::move(sim);
  }
  return out;
}

absl::StatusOr<MemoryFit> SearchWithinMemory(std::string_view name, const GeneratorParams& params,
                                             const CostModel& costs, std::int64_t capacity_bytes) {
  PS_RETURN_IF_ERROR(CheckFitRequest(name, params, capacity_bytes));
  GeneratorParams searched = params;
  searched.refine = false;
  PS_ASSIGN_OR_RETURN(Schedule own, GenerateSchedule(name, searched));
  PS_ASSIGN_OR_RETURN(SimResult own_sim, Simulate(own, costs));
  return SearchWithinMemory(name, params, costs, capacity_bytes, std::move(own),
                            std::move(own_sim));
}

absl::StatusOr<MemoryFit> SearchWithinMemory(std::string_view name, const GeneratorParams& params,
                                             const CostModel& costs, std::int64_t capacity_bytes,
                                             Schedule own, SimResult own_sim) {
  PS_RETURN_IF_ERROR(CheckFitRequest(name, params, capacity_bytes));
  MemoryFit fit{.schedule = std::move(own), .sim = std::move(own_sim), .searches = 1};
  fit.own_peak_bytes = PeakBytes(fit.sim);
  // With params.refine: the order that fits, refined at its limit; kept when it fits too.
  auto refined = [&](MemoryFit f) -> absl::StatusOr<MemoryFit> {
    if (!params.refine) return f;
    GeneratorParams at_limit = params;
    at_limit.max_activations = f.max_activations;
    PS_ASSIGN_OR_RETURN(Refined r, RefineWithinMemory(std::move(f.schedule), std::move(f.sim),
                                                      &at_limit, costs, capacity_bytes));
    f.schedule = std::move(r.schedule);
    f.sim = std::move(r.sim);
    f.unrefined_step_time = r.unrefined_step_time;
    f.refined_too_large = r.too_large;
    return f;
  };
  if (fit.own_peak_bytes <= capacity_bytes) return refined(std::move(fit));
  // What no limit changes: a rank's static bytes alone over the device.
  for (int r = 0; r < static_cast<int>(fit.sim.ranks.size()); ++r) {
    const std::int64_t held = fit.sim.ranks[r].static_bytes;
    if (held >= capacity_bytes && (held > capacity_bytes || fit.sim.ranks[r].peak_live_bytes > 0)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Absl(name), " cannot fit in ", HumanBytes(capacity_bytes), " per device: rank ", r,
          "'s parameters, gradients and optimizer state (static_bytes) alone take ",
          HumanBytes(held), held > capacity_bytes ? "" : ", none left for activations",
          "; give more memory, or more stages (fewer layers on each device)"));
    }
  }

  // The largest limit L in [V, peak - 1] chunk activations whose order fits: L = peak or
  // more gives the same order back.
  const int chunks = fit.schedule.num_chunks();
  std::optional<MemoryFit> best;
  std::optional<MemoryFit> tightest;         // the tightest order tried that did not fit
  std::optional<absl::Status> at_one_stage;  // one stage's worth, once tried: why no order
  int no_order_below = std::numeric_limits<int>::max();  // the least limit with no order
  int searches = 1;
  enum class Outcome { kFits, kTooLarge, kNoOrder };
  // Searches within `limit`: whether its order fits; keeps what the messages need.
  auto attempt = [&](int limit) -> absl::StatusOr<Outcome> {
    GeneratorParams tighter = params;
    tighter.max_activations = static_cast<double>(limit) / chunks;
    tighter.refine = false;
    ++searches;
    absl::StatusOr<Schedule> schedule = GenerateSchedule(name, tighter);
    if (limit == chunks) at_one_stage = schedule.status();
    if (!schedule.ok()) {
      // "found no order within N live activations per rank": too tight for the search.
      // Anything else is not a matter of memory.
      if (schedule.status().code() != absl::StatusCode::kResourceExhausted) {
        return schedule.status();
      }
      no_order_below = std::min(no_order_below, limit);
      return Outcome::kNoOrder;
    }
    MemoryFit f{.max_activations = tighter.max_activations,
                .chunk_activations = limit,
                .own_peak_bytes = fit.own_peak_bytes};
    f.schedule = *std::move(schedule);
    PS_ASSIGN_OR_RETURN(f.sim, Simulate(f.schedule, costs));
    if (PeakBytes(f.sim) <= capacity_bytes) {
      best = std::move(f);
      return Outcome::kFits;
    }
    if (!tightest.has_value() || limit < tightest->chunk_activations) tightest = std::move(f);
    return Outcome::kTooLarge;
  };
  // Bisection over [lo, hi] for the largest limit that fits.
  auto bisect = [&](int lo, int hi) -> absl::Status {
    while (lo <= hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      PS_ASSIGN_OR_RETURN(const Outcome outcome, attempt(mid));
      if (outcome == Outcome::kTooLarge) {
        hi = mid - 1;
      } else {
        lo = mid + 1;  // fits: look looser; no order: looser limits may find one
      }
    }
    return absl::OkStatus();
  };
  PS_RETURN_IF_ERROR(bisect(chunks, PeakChunkActivations(fit.sim) - 1));
  // A limit with no order, and every looser one too large: the tighter ones below it were
  // never tried (a list scheduler need not fail at every tighter limit).
  if (!best.has_value() && no_order_below != std::numeric_limits<int>::max()) {
    PS_RETURN_IF_ERROR(bisect(chunks, no_order_below - 1));
  }
  if (best.has_value()) {
    best->searches = searches;
    return refined(*std::move(best));
  }
  // Nothing fits. Say how far off one stage's worth is (an empty range means the own
  // order holds no more than that already).
  if (!at_one_stage.has_value() && PeakChunkActivations(fit.sim) > chunks) {
    PS_ASSIGN_OR_RETURN(const Outcome outcome, attempt(chunks));
    if (outcome == Outcome::kFits) {
      best->searches = searches;
      return refined(*std::move(best));
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
      HumanBytes(PeakTotalBytes(last.sim.ranks[rank])),
      "; give more memory or smaller activations"));
}

namespace {

// The exhaustive search's bounds: at most 2^12 sets, and at most 2^23 actions simulated
// in all (about a second on this project's 2-core machines: 2^25 took 3.8 s), beyond
// which the greedy rule runs.
constexpr int kExactRecomputeCandidates = 12;
constexpr std::int64_t kExactRecomputeActions = std::int64_t{1} << 23;

std::vector<int> Listed(const std::vector<bool>& chosen) {
  std::vector<int> stages;
  for (int s = 0; s < static_cast<int>(chosen.size()); ++s) {
    if (chosen[s]) stages.push_back(s);
  }
  return stages;
}

// What `memory` holds at the plan's peaks: its ranks' PeakTotalBytes added (saturating).
std::int64_t PlannedBytes(const SharedMemory& memory, const SimResult& sim) {
  std::int64_t total = 0;
  for (int r : memory.ranks) total = SaturatingAdd(total, PeakTotalBytes(sim.ranks[r]));
  return total;
}

// The memory furthest above its capacity, -1 when all fit.
int WorstMemory(const std::vector<SharedMemory>& memories, const SimResult& sim) {
  int worst = -1;
  __int128 worst_over = 0;
  for (int m = 0; m < static_cast<int>(memories.size()); ++m) {
    const __int128 over =
        static_cast<__int128>(PlannedBytes(memories[m], sim)) - memories[m].capacity_bytes;
    if (over > 0 && (worst < 0 || over > worst_over)) {
      worst = m;
      worst_over = over;
    }
  }
  return worst;
}

// `costs` with the listed stages recomputing.
using RecomputeOn = std::function<absl::StatusOr<CostModel>(const std::vector<int>& stages)>;
// The error for memory `m`, over its capacity in `sim` with none of its stages left to
// recompute.
using NoFit = std::function<absl::Status(int m, const SimResult& sim)>;

// RecomputeWithinMemory over `memories`, recomputing the stages `candidate` marks, with
// `recompute_on` making the costs of a set of them.
absl::StatusOr<RecomputeFit> FitByRecomputing(const Schedule& schedule, const CostModel& costs,
                                              const std::vector<SharedMemory>& memories,
                                              const std::vector<bool>& candidate,
                                              const RecomputeOn& recompute_on,
                                              const NoFit& no_fit) {
  const int num_stages = schedule.num_stages();
  for (const SharedMemory& memory : memories) {
    if (memory.capacity_bytes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("a device's memory must be at least 1 byte, not ", memory.capacity_bytes,
                       memory.name.empty() ? "" : absl::StrCat(" (", memory.name, ")")));
    }
    for (int r : memory.ranks) {
      if (r < 0 || r >= schedule.num_ranks()) {
        return absl::InvalidArgumentError(absl::StrCat(memory.name, " holds rank ", r,
                                                       ", but the schedule has ranks 0 to ",
                                                       schedule.num_ranks() - 1));
      }
    }
  }
  RecomputeFit fit;
  PS_ASSIGN_OR_RETURN(fit.without, Simulate(schedule, costs));
  fit.costs = costs;
  fit.sim = fit.without;
  std::vector<bool> chosen(num_stages, false);
  // The costs and simulation with `stages` recomputing.
  auto with =
      [&](const std::vector<bool>& stages) -> absl::StatusOr<std::pair<CostModel, SimResult>> {
    PS_ASSIGN_OR_RETURN(CostModel c, recompute_on(Listed(stages)));
    PS_ASSIGN_OR_RETURN(SimResult sim, Simulate(schedule, c));
    return std::make_pair(std::move(c), std::move(sim));
  };
  if (WorstMemory(memories, fit.sim) < 0) {  // fits as it is: nothing is the shortest
    fit.exhaustive = true;
    return fit;
  }
  // The candidates that can help: on a rank of a memory that is over its capacity (the
  // others fit, and recomputing there lowers nothing any memory over it holds).
  std::vector<bool> short_rank(schedule.num_ranks(), false);
  for (const SharedMemory& memory : memories) {
    if (PlannedBytes(memory, fit.without) <= memory.capacity_bytes) continue;
    for (int r : memory.ranks) short_rank[r] = true;
  }
  std::vector<int> helpful;
  for (int s = 0; s < num_stages; ++s) {
    if (candidate[s] && short_rank[schedule.placement.RankOf(s)]) helpful.push_back(s);
  }
  // Few enough of them: every set, and of those that fit the one with the shortest step
  // (ties: fewer stages). A set that fits is not grown further, since
  // recomputing more only adds work; a set that does not fit could not be shrunk to fit.
  const int k = static_cast<int>(helpful.size());
  const std::int64_t actions = static_cast<std::int64_t>(schedule.NumActions());
  if (k > 0 && k <= kExactRecomputeCandidates &&
      (std::int64_t{1} << k) * std::max<std::int64_t>(actions, 1) <= kExactRecomputeActions) {
    std::vector<bool> trial(num_stages, false);
    for (int s : helpful) trial[s] = true;
    PS_ASSIGN_OR_RETURN(auto all, with(trial));
    if (const int worst = WorstMemory(memories, all.second); worst >= 0) {
      return no_fit(worst, all.second);
    }
    std::vector<std::uint32_t> masks;
    for (std::uint32_t mask = 1; mask < (std::uint32_t{1} << k); ++mask) masks.push_back(mask);
    std::stable_sort(masks.begin(), masks.end(), [](std::uint32_t a, std::uint32_t b) {
      return std::popcount(a) < std::popcount(b);
    });
    std::vector<std::uint32_t> fitting;
    std::optional<std::uint32_t> best;
    std::optional<std::pair<CostModel, SimResult>> best_run;
    for (std::uint32_t mask : masks) {
      if (std::any_of(fitting.begin(), fitting.end(),
                      [mask](std::uint32_t f) { return (mask & f) == f; })) {
        continue;
      }
      std::vector<bool> set(num_stages, false);
      for (int i = 0; i < k; ++i) set[helpful[i]] = (mask >> i) & 1;
      PS_ASSIGN_OR_RETURN(auto run, with(set));
      if (WorstMemory(memories, run.second) >= 0) continue;
      fitting.push_back(mask);
      // Masks come by size: on a tie of steps the fewer stages win.
      if (!best.has_value() || run.second.step_time < best_run->second.step_time) {
        best = mask;
        best_run = std::move(run);
      }
    }
    for (int i = 0; i < k; ++i) {
      if ((*best >> i) & 1) fit.stages.push_back(helpful[i]);
    }
    fit.costs = std::move(best_run->first);
    fit.sim = std::move(best_run->second);
    fit.exhaustive = true;
    return fit;
  }
  std::vector<int> order;  // stages in the order they were chosen
  for (int worst = WorstMemory(memories, fit.sim); worst >= 0;
       worst = WorstMemory(memories, fit.sim)) {
    // Of the candidate stages on the worst memory's ranks, the one whose recomputation
    // lowers what that memory holds the most; ties: the shorter step, then the lower
    // stage. A stage that holds one micro-batch at a time (the last, right before its
    // backward) lowers nothing, and is taken only when no other does.
    std::vector<bool> there(schedule.num_ranks(), false);
    for (int r : memories[worst].ranks) there[r] = true;
    int best = -1;
    std::int64_t best_bytes = 0;
    double best_step = 0;
    std::optional<std::pair<CostModel, SimResult>> best_run;
    for (int s = 0; s < num_stages; ++s) {
      if (chosen[s] || !candidate[s] || !there[schedule.placement.RankOf(s)]) continue;
      std::vector<bool> trial = chosen;
      trial[s] = true;
      PS_ASSIGN_OR_RETURN(auto run, with(trial));
      const std::int64_t bytes = PlannedBytes(memories[worst], run.second);
      if (best < 0 || bytes < best_bytes ||
          (bytes == best_bytes && run.second.step_time < best_step)) {
        best = s;
        best_bytes = bytes;
        best_step = run.second.step_time;
        best_run = std::move(run);
      }
    }
    if (best < 0) return no_fit(worst, fit.sim);
    chosen[best] = true;
    order.push_back(best);
    fit.costs = std::move(best_run->first);
    fit.sim = std::move(best_run->second);
  }
  // Drop what the later choices made unnecessary, the latest first.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    std::vector<bool> trial = chosen;
    trial[*it] = false;
    PS_ASSIGN_OR_RETURN(auto run, with(trial));
    if (WorstMemory(memories, run.second) >= 0) continue;
    chosen = trial;
    fit.costs = std::move(run.first);
    fit.sim = std::move(run.second);
  }
  fit.stages = Listed(chosen);
  return fit;
}

}  // namespace

absl::StatusOr<RecomputeFit> RecomputeWithinMemory(const Schedule& schedule, const CostModel& costs,
                                                   std::int64_t capacity_bytes) {
  const int num_stages = schedule.num_stages();
  // Stages that can still drop bytes: not recomputing already, holding more than their
  // received input.
  std::vector<bool> candidate(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    const StageCosts& c = costs.Stage(s);
    candidate[s] = !c.recomputes() && c.activation_bytes > c.input_bytes;
  }
  // Each rank on a device of its own.
  std::vector<SharedMemory> devices;
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    devices.push_back(
        {.name = absl::StrCat("rank ", r), .ranks = {r}, .capacity_bytes = capacity_bytes});
  }
  return FitByRecomputing(
      schedule, costs, devices, candidate,
      [&](const std::vector<int>& stages) { return WithRecomputeOn(costs, stages, num_stages); },
      [&](int worst, const SimResult& sim) {
        const RankStats& rank = sim.ranks[worst];
        return absl::ResourceExhaustedError(absl::StrCat(
            "rank ", worst, " does not fit in ", HumanBytes(capacity_bytes),
            " per device even with every stage of it recomputing its activations: it peaks at ",
            HumanBytes(PeakTotalBytes(rank)), " (", HumanBytes(rank.static_bytes),
            " of it parameters, gradients and optimizer state); give more memory, smaller "
            "activations or more stages"));
      });
}

absl::StatusOr<RecomputeFit> RecomputeWithinMemory(const Schedule& schedule, const CostModel& costs,
                                                   const CostModel& recomputing,
                                                   const std::vector<SharedMemory>& memories) {
  const int num_stages = schedule.num_stages();
  for (const auto& [model, name] : {std::pair<const CostModel*, const char*>{&costs, "costs"},
                                    {&recomputing, "recomputing costs"}}) {
    if (!model->actions.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot choose stages to recompute with per-action durations in the ", name,
                       " (a replayed step's): give per-stage costs"));
    }
    if (!model->stages.empty() && static_cast<int>(model->stages.size()) != num_stages) {
      return absl::InvalidArgumentError(absl::StrFormat("the %s have %d stages, the schedule %d",
                                                        name, model->stages.size(), num_stages));
    }
  }
  std::vector<bool> candidate(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    candidate[s] = !costs.Stage(s).recomputes() && recomputing.Stage(s).recompute_bytes > 0;
  }
  return FitByRecomputing(
      schedule, costs, memories, candidate,
      [&](const std::vector<int>& stages) -> absl::StatusOr<CostModel> {
        CostModel out = costs;
        if (out.stages.empty()) out.stages.assign(num_stages, out.uniform);
        for (int s : stages) out.stages[s] = recomputing.Stage(s);
        return out;
      },
      [&](int worst, const SimResult& sim) {
        const SharedMemory& memory = memories[worst];
        return absl::ResourceExhaustedError(absl::StrCat(
            memory.name, " does not fit: its ",
            memory.ranks.size() == 1 ? "rank peaks" : "ranks peak", " at ",
            HumanBytes(PlannedBytes(memory, sim)), " but it has ",
            HumanBytes(memory.capacity_bytes),
            ", with every stage there that can recompute recomputing; give more memory, smaller "
            "activations or more stages"));
      });
}

}  // namespace pipesched::scheduler
