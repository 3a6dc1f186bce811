// pipesched's umbrella header: the whole public API, and nothing internal.
//
//   planning   scheduler/: build (GenerateSchedule) or load (LoadScheduleFile) a
//              schedule, Validate, Simulate, PlaceAllReduce, closed-form bubbles;
//   exports    trace/: Timeline, Chrome/Perfetto JSON, SVG, terminal grid, bubble stats,
//              plots;
//   devices    runtime/: Backend, Device, Stream, Event, Buffer (host or CUDA);
//   comm       comm/: stage-to-stage transports, data-parallel all-reduce;
//   training   stages/: StageWork (your F/B/I/W callbacks), Executor (runs steps, returns
//              the measured timeline), bubble analysis of measured steps, skew
//              injection (SlowStageWork), partitioning, and the built-in MLP (model/,
//              stages/mlp_stage_work.h, stages/trainer.h, stages/checkpoint.h).
//
// Link pipesched::pipesched for all of it. Planner-only users may include just the
// scheduler/ and trace/ headers and link pipesched::scheduler and pipesched::trace,
// which never include a CUDA header. CUDA embedders also include
// "runtime/cuda_runtime.h" (the cudaStream_t behind a Stream) and "base/cuda_check.h";
// both include <cuda_runtime_api.h>, so this header does not. Errors are absl::Status
// values; nothing throws but Backend::device with an index out of range. See
// docs/embedding.md.
#pragma once

#include "base/file_util.h"
#include "base/host_memory.h"
#include "base/status.h"
#include "base/strings.h"
#include "comm/all_reduce.h"
#include "comm/transport.h"
#include "model/chunk.h"
#include "model/math.h"
#include "model/mlp.h"
#include "model/optimizer.h"
#include "model/reference.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "pipesched/version.h"
#include "runtime/runtime.h"
#include "scheduler/action.h"
#include "scheduler/compare.h"
#include "scheduler/cost_model.h"
#include "scheduler/formats.h"
#include "scheduler/formulas.h"
#include "scheduler/lower.h"
#include "scheduler/memory_fit.h"
#include "scheduler/refine.h"
#include "scheduler/registry.h"
#include "scheduler/schedule.h"
#include "scheduler/simulator.h"
#include "scheduler/validate.h"
#include "stages/bubble_analysis.h"
#include "stages/checkpoint.h"
#include "stages/executor.h"
#include "stages/memory_check.h"
#include "stages/mlp_stage_work.h"
#include "stages/partition.h"
#include "stages/recompute_plan.h"
#include "stages/recompute_stage_work.h"
#include "stages/slow_stage_work.h"
#include "stages/stage_work.h"
#include "stages/trainer.h"
#include "trace/chrome_trace.h"
#include "trace/grid.h"
#include "trace/plot.h"
#include "trace/stats.h"
#include "trace/svg.h"
#include "trace/timeline.h"
