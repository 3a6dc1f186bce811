// Discrete-event simulation of a schedule under a cost model. Each rank runs its
// program in order; an action starts when its rank is free and its dependencies
// (DESIGN.md) are done, plus the boundary's transfer time when the dependency lives
// on another rank. Transfers are drawn on the send lane.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/trace/timeline.h"

namespace pipesched::scheduler {

struct RankStats {
  double busy = 0;                 // sum of F/B/I/W durations (ALLREDUCE overlaps, not counted)
  double idle = 0;                 // makespan - busy
  int peak_live_microbatches = 0;  // stashed activations alive at once, all stages
  // Same, weighted by StageCosts::activation_bytes, plus the workspace_bytes of a B or I
  // while it runs, the input_bytes of the rank's next F, received during the action
  // before it, and with recomputation the recompute_bytes of each F while it runs and of
  // each backward from its B or I to its end.
  std::int64_t peak_live_bytes = 0;
  // StageCosts::static_bytes of the rank's stages (chunks), held for the whole step: the
  // rank's memory at its peak is static_bytes + peak_live_bytes.
  std::int64_t static_bytes = 0;
};

// static_bytes + peak_live_bytes, saturating at INT64_MAX (each may be near it).
inline std::int64_t PeakTotalBytes(const RankStats& rank) {
  std::int64_t total = 0;
  return __builtin_add_overflow(rank.static_bytes, rank.peak_live_bytes, &total)
             ? std::numeric_limits<std::int64_t>::max()
             : total;
}

struct SimResult {
  trace::Timeline timeline;
  double makespan = 0;
  std::vector<RankStats> ranks;
  double bubble_fraction = 0;  // total idle / (P * makespan)
  double bubble_ratio = 0;     // total idle / total busy (idle relative to ideal compute)
  // The whole training step: each rank zeroes its stages' gradients (StageCosts::zero_grad,
  // in stage order) before its first action, and runs their optimizer steps
  // (StageCosts::optimizer, each after its stage's all-reduce) after its last one. The
  // timeline starts at the first action (time 0 there), as a measured one does; the step
  // starts before the zero-grads. Equal to makespan when both costs are 0.
  double step_time = 0;
  // Those zero-grads and optimizer steps that take time, as spans ("ZERO_GRAD",
  // "OPTIMIZER"; rank, compute lane, stage) on the timeline's clock: the zero-grads start
  // before 0. Not in `timeline`, whose spans are the schedule's actions;
  // trace::WithStepPhases draws them together.
  std::vector<trace::Span> phases;
};

// An activation of (stage, mb) is live from the start of F until the end of B, or of W
// when the backward is split (W still needs the stage input); its input_bytes (stage > 0)
// from the start of the compute action before that F on the same rank, if any; its
// recompute_bytes during the F and again from the start of the B or I.
// A stage whose costs give an all-reduce time (StageCosts::allreduce > 0) but that has no
// ALLREDUCE action is reduced right after its last backward on its rank, as the executor
// places it for data-parallel replicas (PlaceAllReduce): the timeline then has its
// ALLREDUCE span on the comm lane, and its optimizer step waits for it.
// InvalidArgument when a stage's input_bytes exceeds its activation_bytes.
// FailedPrecondition with the deadlock diagnosis when the schedule cannot finish;
// InvalidArgument when Validate() would reject it, when CheckCostModel() refuses `costs`
// (naming the first time outside [0, kMaxCostTime] -- negative, above it, inf or NaN --
// or byte count outside [0, kMaxCostBytes]) or CheckCostsFit does (per-stage or per-boundary
// entries for another number of stages), or when a rank's live bytes overflow int64.
absl::StatusOr<SimResult> Simulate(const Schedule& schedule, const CostModel& costs);

}  // namespace pipesched::scheduler
