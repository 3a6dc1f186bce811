// Validate(): the shape and completeness checks of DependencyIndex::Build, then the
// in-order dependency walk; the simulator runs the very same two steps, so a schedule
// validates if and only if it simulates.
#include "pipesched/scheduler/validate.h"

#include "pipesched/base/status.h"
#include "pipesched/scheduler/dependency_walk.h"

namespace pipesched::scheduler {

absl::Status Validate(const Schedule& schedule) {
  PS_ASSIGN_OR_RETURN(const internal::DependencyIndex index,
                      internal::DependencyIndex::Build(schedule));
  return internal::WalkInOrder(schedule, index, [](int, int, int, const Action&) {});
}

}  // namespace pipesched::scheduler
