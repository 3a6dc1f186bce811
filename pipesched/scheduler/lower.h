// Lowering passes over a Schedule: rewrite a compute-only schedule into what the
// executor runs. Pure functions on plain data, like the generators.
//
// PlaceAllReduce puts one data-parallel ALLREDUCE per stage right after that stage's
// last backward action (B, or W when the backward is split) in its rank's program, so
// that the stage's gradient reduction starts as soon as its gradients are final and
// overlaps the backward of the stages that come after it on that rank:
//   rank 0 | 0F0 0F1 0B0 0B1            ->  0F0 0F1 0B0 0B1 0ALLREDUCE
//   rank 0 | 0F0 2F0 2B0 0B0 (V=2 loop) ->  0F0 2F0 2B0 2ALLREDUCE 0B0 0ALLREDUCE
#pragma once

#include "absl/status/statusor.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler {

// For num_replicas > 1: a copy of `schedule` with an ALLREDUCE for every stage that does
// not have one yet, placed right after the stage's last B or W on its rank (ALLREDUCEs
// already in the schedule stay where they are). For num_replicas == 1: the schedule
// unchanged (nothing to reduce). InvalidArgument for num_replicas < 1, for a shape that
// Validate() refuses (P, V or M below 1, P*V too large, programs.size() != P, fewer than
// P*V*M actions), or a stage with no backward action in its rank's program (such a
// schedule is not valid).
absl::StatusOr<Schedule> PlaceAllReduce(const Schedule& schedule, int num_replicas);

// `schedule` with each B replaced by its I and W back to back on the same rank
// (0B1 -> 0I1 0W1): the same work where the costs' B = I + W, and the form that
// RefineSchedule (refine.h) reorders, moving W's into later bubbles. Every other action
// stays where it is; a schedule without B's comes back unchanged.
Schedule SplitBackward(Schedule schedule);

}  // namespace pipesched::scheduler
