// The table of schedule generators. Adding a schedule = one generator file plus one
// line in registry.cc. Generators are pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler {

// The largest P and V any generator takes (a typo such as --stages=1000000 is an error,
// not gigabytes of schedule); RefineCosts takes the same.
inline constexpr int kMaxGeneratorRanks = 1 << 16;
inline constexpr int kMaxGeneratorChunks = 1 << 10;

struct GeneratorParams {
  int num_ranks = 1;         // P
  int num_microbatches = 1;  // M
  int num_chunks = 0;        // V; 0 = the schedule's default
  // The costs a cost-aware schedule (ScheduleInfo::uses_costs: zb-1p, zb-2p, zb-v-1p,
  // interleaved-zb-1p, zb-v-half, zb-v-min) is
  // searched for, per virtual stage as Simulate takes them (per-stage entries for another
  // P x V are InvalidArgument, CheckCostsFit); nullptr = unit costs. The others ignore
  // it. Not owned; read only during the call.
  const CostModel* costs = nullptr;
  // A cost-aware schedule's memory limit instead of its own: at most this many stages'
  // worth of live activations per rank (chunk activations / V, as compare's "peak act"),
  // at least 1; 0 = the schedule's own (zb-1p: P, zb-v-half: (P+2)/2, ...). The others
  // ignore it: their order fixes their memory.
  double max_activations = 0;
  // A cost-aware schedule's order, once searched, improved by local search (RefineOrder in
  // zb_search.cc): single actions moved within their rank's program while the step gets
  // shorter, at most kRefineActions actions timed in all. Never a longer step than the search's
  // order, and within the same limit of live activations (it may use more of it than the
  // search's order did). The others ignore it.
  bool refine = false;
};

// The most actions one refinement times, over all the orders it tries
// (GeneratorParams::refine): about a second on one core of this project's machines,
// whatever the schedule's size (a large one gets fewer tries).
inline constexpr std::int64_t kRefineActions = 20'000'000;

using GeneratorFn = absl::StatusOr<Schedule> (*)(const GeneratorParams&);

struct ScheduleInfo {
  std::string_view name;         // "1f1b"
  std::string_view summary;      // one line: what it is
  std::string_view constraints;  // one line: "P >= 1, M >= 1, V = 1"
  int default_chunks;            // V used when GeneratorParams::num_chunks == 0
  GeneratorFn generate;
  // Whether the schedule depends on GeneratorParams::costs: searched for them rather than
  // fixed by (P, M, V). Callers that know the costs (simulate, compare) pass them.
  bool uses_costs = false;
};

// All registered schedules, in display order.
const std::vector<ScheduleInfo>& AllSchedules();
// nullptr when unknown.
const ScheduleInfo* FindSchedule(std::string_view name);
// Runs the generator `name` (a pure function: same parameters, same schedule). NotFound
// listing the known names for an unknown schedule; the generator's InvalidArgument,
// naming the constraint, for parameters it does not support (ScheduleInfo::constraints).
absl::StatusOr<Schedule> GenerateSchedule(std::string_view name, const GeneratorParams& params);

}  // namespace pipesched::scheduler
