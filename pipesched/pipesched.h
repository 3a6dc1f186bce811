// pipesched's umbrella header: the whole public API, and nothing internal.
//
//   planning   scheduler/: build (GenerateSchedule) or load (LoadScheduleFile) a
//              schedule, Validate, Simulate, PlaceAllReduce, closed-form bubbles;
//   exports    trace/: Timeline, Chrome/Perfetto JSON, SVG, terminal grid, bubble stats,
//              plots;
//   devices    runtime/: Backend, Device, Stream, Event, Buffer (host or CUDA);
//   comm       comm/: stage-to-stage transports, data-parallel all-reduce, the bootstrap
//              by which the processes of a job meet;
//   training   stages/: StageWork (your F/B/I/W callbacks), Executor (runs steps, returns
//              the measured timeline), bubble analysis of measured steps, skew
//              injection (SlowStageWork), partitioning, and the built-in MLP (model/,
//              stages/mlp_stage_work.h, stages/trainer.h, stages/checkpoint.h).
//
// Link pipesched::pipesched for all of it. Planner-only users may include just the
// pipesched/scheduler/ and pipesched/trace/ headers and link pipesched::scheduler and
// pipesched::trace, which never include a CUDA header. CUDA embedders also include
// "pipesched/runtime/cuda_runtime.h" (the cudaStream_t behind a Stream) and
// "pipesched/base/cuda_check.h"; both include <cuda_runtime_api.h>, so this header does
// not. Errors are absl::Status values; nothing throws but Backend::device with an index
// out of range. See docs/embedding.md.
#pragma once

#include "pipesched/base/file_util.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/comm/transport.h"
#include "pipesched/model/chunk.h"
#include "pipesched/model/math.h"
#include "pipesched/model/mlp.h"
#include "pipesched/model/optimizer.h"
#include "pipesched/model/reference.h"
#include "pipesched/model/safetensors.h"
#include "pipesched/model/synthetic.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/scheduler/action.h"
#include "pipesched/scheduler/compare.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/formats.h"
#include "pipesched/scheduler/formulas.h"
#include "pipesched/scheduler/lower.h"
#include "pipesched/scheduler/memory_fit.h"
#include "pipesched/scheduler/refine.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"
#include "pipesched/stages/bubble_analysis.h"
#include "pipesched/stages/checkpoint.h"
#include "pipesched/stages/executor.h"
#include "pipesched/stages/memory_check.h"
#include "pipesched/stages/mlp_stage_work.h"
#include "pipesched/stages/partition.h"
#include "pipesched/stages/recompute_plan.h"
#include "pipesched/stages/recompute_stage_work.h"
#include "pipesched/stages/slow_stage_work.h"
#include "pipesched/stages/stage_work.h"
#include "pipesched/stages/trainer.h"
#include "pipesched/trace/chrome_trace.h"
#include "pipesched/trace/grid.h"
#include "pipesched/trace/plot.h"
#include "pipesched/trace/stats.h"
#include "pipesched/trace/svg.h"
#include "pipesched/trace/timeline.h"
#include "pipesched/version.h"
