// Refining a schedule's order for a cost model: the local search that --refine runs on
// the searched schedules (GeneratorParams::refine), for any schedule whose backward is
// split -- a file, a handcrafted order, one of your own. Single F, I and W actions move
// within their rank's program while the step gets shorter (docs/schedules.md,
// "Refinement"); the rank placement, the micro-batches and the memory peak stay.
#pragma once

#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler {

// `schedule` with its programs reordered by local search for `costs`: never a longer step
// (Simulate's step_time) and never more live activations on any rank than the busiest
// rank of `schedule` holds (its peak_live_microbatches), valid, the same every time. It
// times at most kRefineActions actions (registry.h), about a second on one core.
// Validate's error for a schedule it refuses; InvalidArgument when CheckCostModel refuses
// the costs, or when the schedule has actions other than F, I and W (a B: SplitBackward in
// lower.h splits it into I and W;
// lowered transfers or all-reduces: refine the schedule before lowering).
absl::StatusOr<Schedule> RefineSchedule(const Schedule& schedule, const CostModel& costs);

}  // namespace pipesched::scheduler
