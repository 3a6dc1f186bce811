// Selective activation recomputation chosen for a trainer: which stages must recompute
// (stages/recompute_stage_work.h) so that the activations fit where they live, as the
// pre-flight check (stages/memory_check.h) holds them: each device with a size, and on
// the host backend the machine's memory that every host device takes from; ranks that
// share one (a GPU holding several) are held to it together. The choice is
// scheduler::RecomputeWithinMemory's with those memories (with few candidates, of every
// set that fits the shortest step, each stage's times in proportion to its chunk's
// parameters; else greedy: the memory furthest above what it has recomputes the stage of
// its ranks that lowers what it holds most), fed with what this executor
// really holds: a recomputing stage keeps its received input and boundary buffers, and
// drops its StageWork's stash (not WithRecompute's model, which keeps the input only).
// The peaks depend on the order of each rank's program, not on timings, so no step runs.
//
//   TrainerConfig config = ...;               // config.device_memory_bytes on the host
//   auto plan = PlanRecompute(config);
//   config.recompute_stages = plan->stages;   // empty: it fits without
//   auto trainer = Trainer::Create(config);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/stages/trainer.h"

namespace pipesched::stages {

struct RecomputePlan {
  std::vector<int> stages;  // ascending virtual stages; empty: everything fits without
  int num_stages = 0;       // of the schedule: P x V
  // Per pipeline rank: its planned activation peak without recomputation and with
  // `stages` recomputing.
  std::vector<std::int64_t> peak_without, peak_with;
  // Each memory the pre-flight check holds the plan to (ActivationPlaces: a device with a
  // size, and on the host backend the machine's memory): what it has for activations and
  // what its ranks' peaks add up to there, without and with.
  struct Place {
    std::string name;  // "host:0", "cuda:0 (NVIDIA H200)", "host memory"
    std::int64_t available_bytes = 0;
    std::int64_t planned_without = 0;
    std::int64_t planned_with = 0;
  };
  std::vector<Place> places;
  // Whether every set of the stages that could help was simulated (few of them), the
  // shortest step of those that fit chosen, or none was needed; false: the greedy rule's.
  bool exhaustive = false;
};

// Builds the trainer of `config` with every stage recomputing and without the activation
// pre-flight check (its parameters and data are made, then freed on return), to learn
// each stage's bytes and what each memory has left, and chooses
// (scheduler::RecomputeWithinMemory). Ranks that share a memory (a GPU holding several,
// the machine's memory on the host backend) are held to it together, as the pre-flight
// check holds them. The order is the one Trainer::Create makes of `config` (a searched
// schedule's unit-cost order: the CLI refuses auto where a search would replace it).
// Errors: InvalidArgument when `config` recomputes already (recompute, recompute_stages)
// or when no memory's size is known; ResourceExhausted, with the pre-flight check's
// message after "even with every stage recomputing its activations: ", when that does
// not fit either; what Trainer::Create refuses, as it says it.
absl::StatusOr<RecomputePlan> PlanRecompute(const TrainerConfig& config);

}  // namespace pipesched::stages
