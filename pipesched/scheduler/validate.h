// Validate(schedule): the schedule is complete, placed right, ordered right and cannot
// deadlock. Errors name the offending action and carry the rank x step grid with an
// arrow at it; a deadlock names each blocked rank's next action and what it waits for.
#pragma once

#include "absl/status/status.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler {

// InvalidArgument for shape problems (P, V, M, stage or micro-batch out of range, an
// ALLREDUCE whose micro-batch is not -1, an
// action on a rank its stage is not placed on, a missing or duplicate action, B mixed
// with I/W for one (stage, micro-batch), ALLREDUCE not after all the stage's backward);
// FailedPrecondition for a deadlock. OK otherwise.
absl::Status Validate(const Schedule& schedule);

}  // namespace pipesched::scheduler
