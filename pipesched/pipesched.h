// pipesched's umbrella header: the whole public API. Planner-only users may include
// just the scheduler/ and trace/ headers and link pipesched::scheduler and
// pipesched::trace, which never include a CUDA header.
#pragma once

#include "pipesched/version.h"
#include "scheduler/action.h"
#include "scheduler/cost_model.h"
#include "scheduler/formats.h"
#include "scheduler/formulas.h"
#include "scheduler/registry.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "scheduler/validate.h"
#include "trace/chrome_trace.h"
#include "trace/grid.h"
#include "trace/svg.h"
#include "trace/timeline.h"
#include "runtime/runtime.h"
