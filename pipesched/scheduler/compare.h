// Comparing schedules at equal work: every registered schedule (or a list) for one P and
// M, simulated with one model's costs. A cost model for Simulate describes virtual stages,
// so an interleaved schedule given the same numbers would run a model V times deeper;
// here the costs describe the P stages of a one-chunk cut (each rank's whole share of
// the model), and a schedule with V chunks per rank runs each chunk at 1/V of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/simulator.h"

namespace pipesched::scheduler {

// Whether `per_stage` describes the P stages of a one-chunk cut as comparing needs them:
// "stages" empty or P entries, "comm" empty or P - 1 (per model boundary), no per-action
// replay maps, every time and byte count within CheckCostModel()'s ranges, every stage's
// B equal to its I + W (so that schedules that split the
// backward do the same work as those that do not), and no stage > 0 receiving more
// input_bytes than its activation_bytes. InvalidArgument naming the list or the stage
// and what would fit otherwise.
absl::Status CheckOneChunkCosts(const CostModel& per_stage, int num_ranks);

// `per_stage` (uniform, or one entry per stage of P, one transfer per boundary of P - 1)
// cut into V chunks per stage: chunk k (virtual stage k, in model order) takes stage
// k / V's F, B, I, W, all-reduce, zero-grad and optimizer times and activation and static
// bytes divided by V (bytes rounded up); its workspace and input bytes (one boundary
// tensor; the input at most the chunk's activation bytes, of which it is part), the
// transfer time of a boundary between stages, and the action gap stay as they are. A
// stage that recomputes (recompute_bytes > 0) keeps only boundary tensors from F to
// backward: each of its chunks keeps the stage's activation bytes whole, up to its share
// S of activation + recompute bytes, and rebuilds S minus what it keeps (so kept +
// rebuilt is what it would keep without recomputation).
// A boundary inside a stage takes the mean of the per-boundary times (the same tensor
// crosses it). V = 1 returns `per_stage`. InvalidArgument for P or V below 1 or above
// the generators' limits (kMaxGeneratorRanks, kMaxGeneratorChunks) and where
// CheckOneChunkCosts refuses `per_stage`.
absl::StatusOr<CostModel> RefineCosts(const CostModel& per_stage, int num_ranks, int num_chunks);

struct ComparedSchedule {
  std::string schedule;
  int num_chunks = 0;   // V as generated; 0 when the generator refused
  absl::Status status;  // OK, or why this schedule could not be compared
  SimResult sim;        // when status is OK; its timeline only when asked for
  std::optional<double> closed_form;
  // Only with CompareSchedules' device_memory_bytes, for a searched schedule whose order
  // at its own limit does not fit: > 0 on the extra row that follows its own, the limit
  // (stages' worth) SearchWithinMemory held it to so that it fits; and on the own row,
  // when no limit fits, SearchWithinMemory's ResourceExhausted saying so.
  double fitted_max_activations = 0;
  absl::Status fit_status;
  // Only with CompareOptions::refine, for a searched schedule: the step time of its order
  // as searched, before the refinement (sim.step_time is the refined order's, or the same
  // when the refined order did not fit the device: refined_too_large).
  std::optional<double> unrefined_step_time;
  bool refined_too_large = false;
};

struct CompareOptions {
  // Keep each row's timeline (tens of bytes per action, for every schedule at once), to
  // draw them; cleared otherwise.
  bool keep_timelines = false;
  // To the searched schedules as GeneratorParams::max_activations (0: their own limits).
  double max_activations = 0;
  // With no max_activations: a searched schedule whose busiest rank peaks above it gets a
  // second row, its order searched within the loosest limit that fits (memory_fit.h;
  // ComparedSchedule::fitted_max_activations), right after its own.
  std::optional<std::int64_t> device_memory_bytes;
  // To the searched schedules as GeneratorParams::refine, their own rows and fitted ones.
  // With device_memory_bytes the fit chooses its limit from the orders as searched, and a
  // refined order that does not fit where the searched one does is not kept
  // (SearchWithinMemory).
  bool refine = false;
};

// Generates each named schedule for P ranks, M micro-batches and V chunks (0: each
// schedule's default), refines `per_stage` to its V and simulates it. One entry per
// name, in the order given; a schedule that refuses the shape, whose costs do not fit
// or that fails to simulate has its reason in `status`. Names are looked up in the
// registry (unknown ones get NotFound listing the known schedules). `options` as there.
std::vector<ComparedSchedule> CompareSchedules(const std::vector<std::string>& names, int num_ranks,
                                               int num_microbatches, int num_chunks,
                                               const CostModel& per_stage,
                                               const CompareOptions& options = {});

}  // namespace pipesched::scheduler
