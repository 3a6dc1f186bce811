// Searched schedules held to a device's memory in bytes. The searches (zb-1p, zb-2p,
// zb-v-1p, ...; ScheduleInfo::uses_costs) limit each rank's live activations by count:
// their own limit, or GeneratorParams::max_activations. What a user knows is the bytes a
// device has, and stages whose activations differ in size (the head's, a received input,
// a backward's workspace) make a count a poor stand-in. SearchWithinMemory finds the
// loosest count whose searched order peaks within the bytes, as Simulate counts them.
// It is not a search over bytes itself: the order is still found by the list scheduler
// for a count, and the bytes only choose the count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/scheduler/simulator.h"

namespace pipesched::scheduler {

struct MemoryFit {
  Schedule schedule;
  SimResult sim;  // Simulate(schedule, costs); its timeline as Simulate returns it
  // The limit the order was searched within, in stages' worth (chunk activations / V, as
  // GeneratorParams::max_activations); 0 when the schedule's own limit already fits.
  double max_activations = 0;
  // The same limit in chunk activations per rank (max_activations x V); 0 as above.
  int chunk_activations = 0;
  // The busiest rank's peak bytes of the order at the schedule's own limit (what did not
  // fit, when max_activations > 0).
  std::int64_t own_peak_bytes = 0;
  int searches = 0;  // orders searched, the one at the own limit included
  // With GeneratorParams::refine: the step of the order as searched, before the
  // refinement; unset otherwise. When the refined order peaks above the device
  // (refined_too_large) the searched one is kept, and this is its own step.
  std::optional<double> unrefined_step_time;
  bool refined_too_large = false;
};

// The busiest rank's memory at its peak: PeakTotalBytes (static bytes and activations).
std::int64_t PeakBytes(const SimResult& sim);

// The shortest decimal X that --max-activations=X (GeneratorParams::max_activations,
// floor(X V) chunk activations) turns back into `chunk_activations` on `chunks` chunks:
// "5", "1.5", "2.4" for 7 of 3 (7/3 printed to six digits would floor to 6).
std::string MaxActivationsText(int chunk_activations, int chunks);

// Generates the searched schedule `name` with `params` (params.costs: the costs it is
// searched for) and simulates it with `costs` (the same costs per virtual stage, with
// their activation, workspace, input and static bytes). When its busiest rank peaks
// (PeakBytes: static bytes included) above `capacity_bytes`, searches again within fewer
// live activations per rank, bisecting over whole chunk activations from one stage's
// worth (V) to one below the first order's peak, and keeps the loosest limit whose order
// fits. A limit the search finds no order within (its ResourceExhausted) counts as too
// tight; when nothing looser fits, the limits below it are bisected too. The bisection
// takes a looser limit never to peak lower, which the list scheduler does not promise:
// where that fails, a looser fitting limit may be missed, but the order returned always
// fits.
// With params.refine, the bisection runs on the orders as searched (a refined order may
// use more of a limit, so it would choose a tighter one), and only the order returned is
// refined, at its limit, and kept refined when it still fits (MemoryFit::
// unrefined_step_time).
// InvalidArgument for a schedule whose order fixes its memory (not searched), for
// params.max_activations != 0 (a limit of its own) and for a capacity below 1 byte;
// ResourceExhausted when a rank's static bytes alone take the device ("zb-2p cannot fit
// in 8.00 MiB per device: rank 0's parameters, gradients and optimizer state
// (static_bytes) alone take 10.00 MiB; ..."), and when even one stage's worth does not
// fit: "zb-2p does not fit in 2.00 MiB per device even when searched within one stage's
// worth of activations per rank (1 chunk activation): rank 0 peaks at 2.50 MiB; give more
// memory or smaller activations" (or, when the search finds no order within one stage's
// worth, its reason); any other error of a search or a simulation as it is.
absl::StatusOr<MemoryFit> SearchWithinMemory(std::string_view name, const GeneratorParams& params,
                                             const CostModel& costs, std::int64_t capacity_bytes);

// What refining an order bought, within a device's memory (RefineWithinMemory).
struct Refined {
  Schedule schedule;               // the refined order, or the one given when that did not fit
  SimResult sim;                   // Simulate(schedule, costs)
  double unrefined_step_time = 0;  // the given order's step
  // The refined order peaked above the device where the given one did not: not kept.
  bool too_large = false;
};

// `order` (simulated with `costs` as `order_sim`) refined: a searched schedule by its
// generator with `searched_params` (the parameters it was generated with; refine is set
// here), any other order by RefineSchedule (refine.h) within its own peak
// (`searched_params` null). With `capacity_bytes`, the refined order is kept only when its
// busiest rank fits (PeakBytes) or the given order's does not either: a refinement never
// costs a fit.
absl::StatusOr<Refined> RefineWithinMemory(Schedule order, SimResult order_sim,
                                           const GeneratorParams* searched_params,
                                           const CostModel& costs,
                                           std::optional<std::int64_t> capacity_bytes);

// Selective activation recomputation within a device's memory: the stages to recompute
// (WithRecomputeOn) so that every rank of `schedule` fits `capacity_bytes` (PeakBytes:
// static bytes included), its order as it is.
struct RecomputeFit {
  std::vector<int> stages;  // ascending; empty when the schedule fits without recomputing
  CostModel costs;          // `costs` with those stages recomputing
  SimResult sim;            // Simulate(schedule, costs)
  SimResult without;        // Simulate(schedule, `costs` as given)
  // Whether `stages` is the set that fits with the shortest step: every set of the stages
  // that could help was tried (few enough of them), or none was needed; false: the
  // greedy rule's choice.
  bool exhaustive = false;
};

// The stages that can help are those of the ranks that peak above the capacity (ranks
// that fit are left alone, since a recomputing stage's longer B and I also lengthen the
// pipeline); stages whose costs recompute already are left as they are. When they are
// few (at most 12, and 2^k simulations within 2^23 actions in all) every set of them is
// simulated, and of those that fit the one with the shortest step is returned (ties:
// fewer stages; a set is not grown past one that fits, since recomputing more only adds
// work): RecomputeFit::exhaustive. Otherwise greedy, a stage at a time: while a rank peaks
// above the capacity, the rank that peaks highest recomputes the stage of its own whose
// recomputation lowers its peak the most (simulated; ties: the shorter step, then the
// lower stage); then every chosen stage that the later ones made unnecessary is dropped
// again, the latest first -- not proven minimal: no stage of the set returned can be
// dropped alone. ResourceExhausted, naming
// the rank and its peak, when a rank does not fit with all its stages recomputing (or
// its static bytes alone take the device); InvalidArgument for a capacity below 1 byte,
// and what Simulate and WithRecomputeOn refuse (costs that recompute already).
absl::StatusOr<RecomputeFit> RecomputeWithinMemory(const Schedule& schedule, const CostModel& costs,
                                                   std::int64_t capacity_bytes);

// A memory some ranks' activations share: a device of one rank, a GPU that several ranks
// were placed on, or the machine's memory that every host device takes from.
struct SharedMemory {
  std::string name;  // for the message: "host:0", "cuda:0 (NVIDIA H200)", "host memory"
  // The pipeline rank of each (replica, rank) there; their peaks (PeakTotalBytes) add up.
  // A rank may appear several times (its replicas on one GPU).
  std::vector<int> ranks;
  std::int64_t capacity_bytes = 0;  // what it has for them
};

// The same, with what each stage costs when it recomputes given rather than derived
// (WithRecomputeOn keeps only the received input): recomputing.Stage(s) replaces
// costs.Stage(s) for each stage chosen; for a runtime that keeps more than the input, as
// pipesched's executor does (its boundary buffers; stages::PlanRecompute). And with the
// memories the ranks live in given: while one holds more than its capacity (its ranks'
// peaks added), the one furthest above recomputes the stage of its ranks that lowers what
// it holds the most (or, with few candidates, every set is tried, as above). The candidates are the
// stages that do not recompute in `costs` and do in `recomputing` (recompute_bytes > 0).
// ResourceExhausted naming the memory when it does not fit with all its candidates recomputing;
// InvalidArgument for a capacity below 1 byte, a rank outside the schedule, per-action overrides in
// either cost model, or a per-stage list whose length is not the schedule's stages.
absl::StatusOr<RecomputeFit> RecomputeWithinMemory(const Schedule& schedule, const CostModel& costs,
                                                   const CostModel& recomputing,
                                                   const std::vector<SharedMemory>& memories);

// The same, from the order at the schedule's own limit (as searched: not refined) and its
// simulation with `costs`, when the caller has them already (that search is not run
// again).
absl::StatusOr<MemoryFit> SearchWithinMemory(std::string_view name, const GeneratorParams& params,
                                             const CostModel& costs, std::int64_t capacity_bytes,
                                             Schedule own, SimResult own_sim);

}  // namespace pipesched::scheduler
