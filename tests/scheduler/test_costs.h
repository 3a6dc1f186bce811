// Cost models shared by the scheduler tests.
#pragma once

#include "scheduler/cost_model.h"

namespace pipesched::scheduler::testing {

// Four uneven stages with transfers of 0.1, docs/schedules.md's refinement example: the
// searched zb-1p order takes 48.9 at M=12, refined 48.2.
inline CostModel UnevenFourStages() {
  CostModel costs;
  costs.stages = {{.f = 1.2, .b = 2.3, .i = 1.4, .w = 0.9},
                  {.f = 0.8, .b = 2.0, .i = 1.1, .w = 0.9},
                  {.f = 1.5, .b = 2.2, .i = 1.5, .w = 0.7},
                  {.f = 1.0, .b = 1.8, .i = 1.0, .w = 0.8}};
  costs.comm_uniform = 0.1;
  return costs;
}

}  // namespace pipesched::scheduler::testing
